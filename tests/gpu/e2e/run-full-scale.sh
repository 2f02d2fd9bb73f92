#!/usr/bin/env bash
# Full scale on the H200: the 11B MOSS-VL architecture with random weights, served
# by the real SGLang 0.5.17 through `moss-vl serve --device cuda` (CUDA graphs on),
# measured with bench_serving.py, plugin off and plugin on, the server restarted
# per variant. Results: $OUT/full-scale.log, full-scale.jsonl, logs.tar.gz.
#
# usage, from the repository root on the H200, after install.sh (batch a) and
# run-e2e.sh (batches b, c) ran on the same warm machine:
#   bash tests/gpu/e2e/run-full-scale.sh
# E2E_BUDGET_S (570) bounds the whole run; FULL_VARIANTS (triton,plugin_off)
# and FULL_WORKLOADS pick what runs. Variants: upstream (python -m
# sglang.launch_server with the flags upstream documents, no plugin), plugin_off
# (the CUDA preset, SGLANG_PLUGINS=none), triton, staircase, mask.
# FULL_LM_HEAD_SCALE (50) peaks the random checkpoint's outputs, so that the greedy
# texts of two variants are comparable (bench_serving.py --compare-to, printed at
# the end against upstream and plugin_off: graph decode against eager for text-only
# rows). Rows of a run with FULL_EXTRA_ARGS are named "<variant> [<args>]".
# FULL_LOGPROBS=1: every request also asks for its tokens' top-2 logprobs, so the
# comparison gives each divergence its position and top-2 gap (a near-tie or not);
# it costs decode time, so a run for speed numbers leaves it off.
# FULL_CONCURRENCY (1,8), FULL_ROUNDS (2): bench_serving.py's; FULL_WARMUP_CONCURRENCY
# (1): warm-up requests at once per workload, 2x the tokenizer workers to warm each.
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
# shellcheck source=tests/gpu/e2e/lib.sh
source tests/gpu/e2e/lib.sh

FULL_MODEL=${FULL_MODEL:-/tmp/moss-vl-full}
JSONL=$WORK/full-scale.jsonl
FULL_VARIANTS=${FULL_VARIANTS:-triton,plugin_off}
FULL_LM_HEAD_SCALE=${FULL_LM_HEAD_SCALE:-50}
LOGPROBS=()
[ "${FULL_LOGPROBS:-0}" = 1 ] && LOGPROBS=(--logprobs)
# FULL_EXTRA_ARGS: SGLang flags for every variant, e.g. "--mm-processor-worker-num 8".
read -r -a FULL_EXTRA <<<"${FULL_EXTRA_ARGS:-}"
# The published model's serving flags (REFERENCE.md), CUDA graphs kept; the
# three backend flags are the H200 batch's limits (lib.sh says why).
# FULL_CONTEXT_LENGTH (32768): 65536 for FULL_WORKLOADS=video-720p (56,384 encoder tokens).
FULL_CONTEXT_LENGTH=${FULL_CONTEXT_LENGTH:-32768}
SERVE_ARGS=(
    --device cuda --model-path "$FULL_MODEL" --served-model-name moss-vl --port "$PORT"
    --mem-fraction-static 0.6 --context-length "$FULL_CONTEXT_LENGTH"
)
SGLANG_ARGS=(
    --attention-backend flashinfer --mm-attention-backend triton_attn
    --sampling-backend pytorch --cuda-graph-max-bs 16 --skip-server-warmup
    "${FULL_EXTRA[@]}"
)

full() {
    step "install (batches already on this machine)"
    install_batches || return 3
    env_setup
    stop_stale_server
    # FULL_APPEND=1: a second call on the same machine adds its variants to the first's.
    [ "${FULL_APPEND:-0}" = 1 ] || rm -f "$JSONL"

    step "full-size checkpoint (random weights drawn on the GPU, written shard by shard)"
    if [ ! -f "$FULL_MODEL/model.safetensors.index.json" ]; then
        /usr/bin/time -f "checkpoint: %e s, max RSS %M KiB" timeout 240 \
            python3 -m moss_vl.testing "$FULL_MODEL" --size full --device cuda \
            --lm-head-scale "$FULL_LM_HEAD_SCALE" || return 1
    fi
    du -sh "$FULL_MODEL"

    cat "$FULL_MODEL/moss_vl_testing.json" 2>/dev/null
    local variant label env_args
    for variant in ${FULL_VARIANTS//,/ }; do
        SERVER_CMD=()
        case $variant in
            upstream)
                env_args=(SGLANG_PLUGINS=none)
                # REFERENCE.md's flags, the port and sizes of this run, and the
                # H200 batch's backend limits (lib.sh says why); --enable-metrics
                # for bench_serving's stage times (SGLang's own histograms).
                SERVER_CMD=(python3 -m sglang.launch_server --model-path "$FULL_MODEL"
                    --served-model-name moss-vl --port "$PORT" --trust-remote-code
                    --enable-multimodal --enable-metrics --dtype bfloat16 --mem-fraction-static 0.6
                    --context-length "$FULL_CONTEXT_LENGTH" --prefill-attention-backend flashinfer
                    "${SGLANG_ARGS[@]}") ;;
            plugin_off) env_args=(SGLANG_PLUGINS=none) ;;
            mask) env_args=(MOSS_VL_CROSS_ATTN_PLAN=mask) ;;
            staircase) env_args=(MOSS_VL_CROSS_ATTN_PLAN=staircase) ;;
            *) env_args=() ;;
        esac
        if [ "$(remaining)" -lt 150 ]; then
            echo "skipping $variant: $(remaining) s left"
            continue
        fi
        # Rows of a run with extra flags carry them in their name, so that an
        # appended run never passes for the plain variant.
        label=$variant${FULL_EXTRA_ARGS:+ [$FULL_EXTRA_ARGS]}
        step "server: $label"
        start_server "full-$variant" "${env_args[@]}" || return 1
        wait_healthy "full-$variant" "$(at_least_10 $(( $(remaining) - 60 )))" || return 1
        nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed "s/^/$label memory.used: /"
        step "workloads: $label"
        timeout "$(at_least_10 $(( $(remaining) - 30 )))" python3 tests/gpu/e2e/bench_serving.py \
            --variant "$label" --workloads "${FULL_WORKLOADS:-single-image,video,text,mixed-decode}" \
            --concurrency "${FULL_CONCURRENCY:-1,8}" --rounds "${FULL_ROUNDS:-2}" --out "$JSONL" \
            --deadline $(( E2E_DEADLINE - 60 )) --warmup-concurrency "${FULL_WARMUP_CONCURRENCY:-1}" \
            "${LOGPROBS[@]}"
        curl -s "$URL/metrics" | grep -E '^moss_vl:(mask_bytes|cross_attention_mask_path)' \
            | sed "s/^/$label /" >>"$WORK/metrics.txt"
        stop_server
    done
    SERVER_CMD=()
    # Both plugin-off launches are baselines (prints nothing for one not run).
    step "greedy texts against upstream and plugin_off (LM head x$FULL_LM_HEAD_SCALE)"
    python3 tests/gpu/e2e/bench_serving.py --out "$JSONL" --compare-to upstream
    python3 tests/gpu/e2e/bench_serving.py --out "$JSONL" --compare-to plugin_off
    cp "$JSONL" "$OUTDIR/full-scale.jsonl" 2>/dev/null
    true
}

e2e_main full full-scale.log "${E2E_BUDGET_S:-570}"
