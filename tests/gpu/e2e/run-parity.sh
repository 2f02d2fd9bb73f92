#!/usr/bin/env bash
# Parity on the H200 (issue 18): the served model against `moss-vl infer`, for three
# servers started in turn: (a) the default triton plan, (b)
# MOSS_VL_CROSS_ATTN_PLAN=mask, (c) the plugin left out (SGLANG_PLUGINS=none). For
# each, `python -m moss_vl.parity` compares teacher-forced logprobs of the prompt and
# a fixed continuation over its built-in prompts (>= 16: text only, single image,
# multi-image, multi-turn with images) and 32 greedy tokens, on a tiny checkpoint
# whose LM head is scaled (peaked outputs: greedy paths do not hinge on bf16 ties).
# The transformers side runs on the same GPU (bf16, the checkpoint's modeling file).
# Results: $OUT/parity.log, parity-<variant>.json in logs.tar.gz, results.json.
#
# usage, from the repository root on the H200, batch a installed by install.sh and
# batches b and c carried (as for run-e2e.sh):
#   bash tests/gpu/e2e/run-parity.sh
# E2E_BUDGET_S (570) bounds the run; E2E_PARITY_SCALE (50) the LM-head scale;
# E2E_PARITY_STEPS (32) the greedy steps; E2E_PARITY_VARIANTS (triton,mask,plugin_off)
# the servers; E2E_PARITY_ONLY (all) prompt-name fragments, space-separated. The
# video prompts need PyAV: carry .whl/d (a call of its own, tests/gpu/e2e/README.md).
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
# shellcheck source=tests/gpu/e2e/lib.sh
source tests/gpu/e2e/lib.sh

SCALE=${E2E_PARITY_SCALE:-50}
STEPS=${E2E_PARITY_STEPS:-32}
MODEL=$WORK/tiny-moss-vl-peaked
SERVE_ARGS=(
    --device cuda --model-path "$MODEL" --served-model-name moss-vl --port "$PORT"
    --mem-fraction-static 0.2 --context-length 4096
)

# parity_variant NAME [VAR=value ...]: start, compare, stop.
parity_variant() {
    local name=$1
    shift
    step "parity $name: ${*:-default environment}"
    if [ "$(remaining)" -lt 120 ]; then
        echo "parity $name: skipped, $(remaining) s left"
        return 1
    fi
    start_server "parity-$name" "$@" || return 1
    wait_healthy "parity-$name" "$(at_least_10 "$(min 330 $(( $(remaining) - 90 )))")" \
        || { stop_server; return 1; }
    timeout "$(at_least_10 $(( $(remaining) - 30 )))" python3 -m moss_vl.parity \
        --url "$URL" --model-path "$MODEL" --device cuda --dtype bfloat16 \
        --greedy-steps "$STEPS" --label "$name" --out "$WORK/parity-$name.json" \
        ${E2E_PARITY_ONLY:+--only $E2E_PARITY_ONLY}
    local rc=$?
    stop_server
    return $rc
}

part_parity() {
    step "install (skipped where installed)"
    install_batches || return 3
    env_setup
    stop_stale_server
    step "peaked tiny checkpoint (LM head x $SCALE)"
    [ -f "$MODEL/model.safetensors" ] \
        || timeout 180 python3 -m moss_vl.testing "$MODEL" --lm-head-scale "$SCALE" || return 1
    local failed=0 variant
    for variant in ${E2E_PARITY_VARIANTS//,/ }; do
        case $variant in
            plugin_off) parity_variant plugin_off SGLANG_PLUGINS=none || failed=1 ;;
            triton | staircase | mask)
                parity_variant "$variant" MOSS_VL_CROSS_ATTN_PLAN="$variant" || failed=1 ;;
            *) echo "parity: unknown variant $variant"; failed=1 ;;
        esac
    done
    step "parity summary"
    for f in "$WORK"/parity-*.json; do
        [ -f "$f" ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["label"], len(r["prompts"]) - r["failures"], "/", len(r["prompts"]), "agree")' "$f"
    done
    return $failed
}

E2E_PARITY_VARIANTS=${E2E_PARITY_VARIANTS:-triton,mask,plugin_off}
# Sourced by run-video-parity.sh, which runs part_parity inside its own budget.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    e2e_main part_parity parity.log "${E2E_BUDGET_S:-570}"
fi
