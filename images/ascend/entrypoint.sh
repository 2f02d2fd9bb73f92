#!/bin/bash
# Entrypoint of the Ascend image: load CANN's environment, then become
# `moss-vl serve` (exec: signals reach SGLang, its exit code is the pod's).
#
# MOSS_VL_ASCEND_SET_ENV names the toolkit's set_env.sh; the NNAL (ATB) and
# AscendNPU-IR (bisheng, used by triton-ascend) scripts are sourced too when
# the base image has them.
set -euo pipefail

set_env="${MOSS_VL_ASCEND_SET_ENV:-/usr/local/Ascend/ascend-toolkit/set_env.sh}"
if [[ ! -f "${set_env}" ]]; then
    echo "moss-vl: CANN environment script ${set_env} not found (MOSS_VL_ASCEND_SET_ENV);" \
         "point it at the toolkit's set_env.sh" >&2
    exit 1
fi

# CANN's scripts read variables they do not define (LD_LIBRARY_PATH, ...).
set +u
# shellcheck source=/dev/null
source "${set_env}"
for extra in /usr/local/Ascend/nnal/atb/set_env.sh \
             /usr/local/Ascend/cann-*/share/info/ascendnpu-ir/bin/set_env.sh; do
    # shellcheck source=/dev/null
    if [[ -f "${extra}" ]]; then source "${extra}"; fi
done
set -u

exec moss-vl serve "$@"
