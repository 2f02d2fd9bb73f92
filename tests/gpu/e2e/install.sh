#!/usr/bin/env bash
# Device call 1 of the H200 end-to-end run (tests/gpu/e2e/README.md): install
# the batches carried with this call (.whl/a) into /tmp/site. Later calls on
# the same warm machine install the rest themselves (run-e2e.sh).
# usage, from the repository root on the H200: bash tests/gpu/e2e/install.sh
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
# shellcheck source=tests/gpu/e2e/lib.sh
source tests/gpu/e2e/lib.sh
start=$(date +%s)
# Its non-zero status here only means batches b and c have not arrived yet
# (they come with call 2); the listing below says what is there.
install_batches
echo "install took $(( $(date +%s) - start )) s; $SITE: $(du -sh "$SITE" | cut -f1)"
dists=("$SITE"/*.dist-info)
echo "distributions installed: ${#dists[@]}"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
exit 0
