#!/usr/bin/env bash
# The whole GPU pass in one device call: install the carried wheels, run
# tests/gpu, run the GPU benchmarks (synthetic scales, prompt-shaped layouts).
# Output and results go to $OUT (or ./gpu-out).
# Usage (from the repository root, on the H200): bash tests/gpu/run-on-h200.sh
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
if ! python3 -c "import flashinfer" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 9
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'flashinfer', flashinfer.__version__)" | tee -a "$out/machine.txt"
python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" 2>&1 | tee "$out/tests.txt"
tests_rc=${PIPESTATUS[0]}
python3 benchmarks/bench_cross_attention_gpu.py "$out/bench.json" 2>&1 | tee "$out/bench.txt"
bench_rc=${PIPESTATUS[0]}
python3 benchmarks/bench_cross_attention_layouts_gpu.py "$out/layouts.json" 2>&1 | tee "$out/layouts.txt"
layouts_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc bench rc=$bench_rc layouts rc=$layouts_rc"
exit $(( tests_rc != 0 || bench_rc != 0 || layouts_rc != 0 ))
