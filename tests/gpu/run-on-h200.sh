#!/usr/bin/env bash
# The whole GPU pass in one device call: install the carried wheels, run
# tests/gpu, run the GPU benchmarks (synthetic scales, prompt-shaped layouts).
# Output and results go to $OUT (or ./gpu-out).
# Usage (from the repository root, on the H200): bash tests/gpu/run-on-h200.sh
#   GPU_WHEELS (.whl): where the carried wheels are; GPU_SITE (/tmp/site): where
#   they go (another directory on a machine that holds the e2e batches there);
#   GPU_STEPS (tests,bench,layouts): which parts run; LAYOUTS_ARGS: extra
#   arguments of the layouts benchmark (--sweep, --variants).
set -uo pipefail
out=${OUT:-gpu-out}
wheels=${GPU_WHEELS:-.whl}
site=${GPU_SITE:-/tmp/site}
steps=,${GPU_STEPS:-tests,bench,layouts},
mkdir -p "$out"
if [ -n "${GPU_SITE:-}" ] || ! python3 -c "import flashinfer" 2>/dev/null; then
    if [ ! -d "$site/flashinfer" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
            "$wheels"/*.whl || exit 9
    fi
    export PYTHONPATH=$site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'flashinfer', flashinfer.__version__)" | tee -a "$out/machine.txt"
tests_rc=0 bench_rc=0 layouts_rc=0
if [[ $steps == *,tests,* ]]; then
    python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" 2>&1 | tee "$out/tests.txt"
    tests_rc=${PIPESTATUS[0]}
fi
if [[ $steps == *,bench,* ]]; then
    python3 benchmarks/bench_cross_attention_gpu.py "$out/bench.json" 2>&1 | tee "$out/bench.txt"
    bench_rc=${PIPESTATUS[0]}
fi
if [[ $steps == *,layouts,* ]]; then
    # shellcheck disable=SC2086  # LAYOUTS_ARGS is a list of flags
    python3 benchmarks/bench_cross_attention_layouts_gpu.py "$out/layouts.json" ${LAYOUTS_ARGS:-} 2>&1 \
        | tee "$out/layouts.txt"
    layouts_rc=${PIPESTATUS[0]}
fi
echo "tests rc=$tests_rc bench rc=$bench_rc layouts rc=$layouts_rc"
exit $(( tests_rc != 0 || bench_rc != 0 || layouts_rc != 0 ))
