#!/usr/bin/env bash
# Part 2 of the H200 end-to-end run (tests/gpu/e2e/README.md): the same short
# video-like load against three servers started in turn, (a) the plugin left
# out (SGLANG_PLUGINS=none), (b) MOSS_VL_CROSS_ATTN_PLAN=mask, (c) =staircase
# (FlashInfer segments), (d) the default triton plan; throughput and TTFT ratios. Then, while time is left,
# tests/gpu and the GPU benchmark in this environment (SGLang 0.5.17 imports
# here, so SGLang's own mask builder is compared too).
# Results: $OUT/e2e-ab.log, results.json (part 1's checks too when it ran on
# this machine), metrics.txt, logs.tar.gz.
#
# usage, from the repository root on the H200, after run-e2e.sh on the same machine:
#   bash tests/gpu/e2e/run-e2e-ab.sh [all|ab|gpu-tests]     (default: all)
# E2E_BUDGET_S (570) bounds the run; E2E_AB_S (25) is each variant's load,
# E2E_AB_FRAMES (16) the frames per request, E2E_AB_USERS (8) the users,
# E2E_AB_SGLANG_ARGS more SGLang flags for the three servers.
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
# shellcheck source=tests/gpu/e2e/lib.sh
source tests/gpu/e2e/lib.sh

MODE=${1:-all}
case "$MODE" in all|ab|gpu-tests) ;; *)
    echo "run-e2e-ab.sh: mode '$MODE': expected all, ab or gpu-tests" >&2
    exit 2;;
esac
AB_S=${E2E_AB_S:-25}
AB_FRAMES=${E2E_AB_FRAMES:-16}
AB_USERS=${E2E_AB_USERS:-8}
# More SGLang flags for all three servers, e.g. --disable-radix-cache so every
# request prefills its frames instead of finding them cached.
read -r -a AB_EXTRA <<<"${E2E_AB_SGLANG_ARGS:-}"
SGLANG_ARGS+=("${AB_EXTRA[@]}")

# run_variant NAME EXPECT [VAR=value ...]: start, warm up, load, /metrics, stop.
run_variant() {
    local name=$1 expect=$2
    shift 2
    local section=ab-$name
    step "A/B $name: ${*:-default environment}"
    if [ "$(remaining)" -lt $(( AB_S + 100 )) ]; then
        "${CHECKS[@]}" note --section "$section" --name "variant measured" --ok fail \
            --detail "skipped: $(remaining) s left"
        return 1
    fi
    if [ "$expect" = off ]; then
        # moss-vl serve keeps an operator's non-empty SGLANG_PLUGINS.
        env "$@" moss-vl serve "${SERVE_ARGS[@]}" --dry-run --output json -- "${SGLANG_ARGS[@]}" \
            >"$WORK/dry-run-$name.json"
        "${CHECKS[@]}" dry-run --section "dry-run-$name" --file "$WORK/dry-run-$name.json" \
            --expect-plugins none
    fi
    start_server "$name" "$@" || return 1
    # JIT caches persist on this machine (part 1 compiled most kernels).
    wait_healthy "$name" "$(at_least_10 "$(min 300 $(( $(remaining) - AB_S - 60 )))")" \
        || { stop_server; return 1; }
    if [ "$expect" = off ]; then
        "${CHECKS[@]}" plugin-log --section "plugin-$name" --log "$SERVER_LOG" --expect off
    else
        "${CHECKS[@]}" plugin-log --section "plugin-$name" --log "$SERVER_LOG" \
            --sglang-version "$SGLANG_EXPECTED"
    fi
    # Kernels a plan needs first (the mask plan's custom-mask prefill) compile
    # here, outside the measured window.
    timeout "$(at_least_10 "$(min 300 $(( $(remaining) - AB_S - 30 )))")" \
        "${CHECKS[@]}" warmup --section "$section" \
        --url "$URL" --frames "$AB_FRAMES" --max-tokens 32 \
        || { stop_server; return 1; }
    local dir=$WORK/reports/$section rc=0
    rm -rf "$dir"
    mkdir -p "$dir"
    timeout $(( AB_S + 60 )) python3 -m locust -f loadtest/locustfile.py --headless --host "$URL" \
        --users "$AB_USERS" --spawn-rate "$AB_USERS" --run-time "${AB_S}s" --stop-timeout 15 \
        --csv "$dir/moss-vl" --only-summary \
        --scenarios video=1 --video-frames "$AB_FRAMES" --max-tokens 32 --slo-ttft-p95 0 \
        >"$dir/locust.log" 2>&1 || rc=$?
    grep -E '^SLO |^ *(POST|TTFT) +video' "$dir/locust.log"
    "${CHECKS[@]}" locust --section "$section" --csv-prefix "$dir/moss-vl" --scenario video \
        --ab "$name" --exit-code "$rc"
    "${CHECKS[@]}" metrics --section "$section" --url "$URL" --expect "$expect" \
        --save "$WORK/metrics.txt"
    stop_server
}

gpu_tests() {
    local t
    t=$(( $(remaining) - 20 ))
    step "tests/gpu (${t} s left)"
    if [ "$t" -lt 120 ]; then
        "${CHECKS[@]}" note --section gpu-tests --name "tests/gpu ran" --ok fail --optional \
            --detail "skipped: ${t} s left; run: bash tests/gpu/e2e/run-e2e-ab.sh gpu-tests"
        return 1
    fi
    local rc=0
    timeout "$t" python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" -rs \
        >"$WORK/gpu-tests.txt" 2>&1 || rc=$?
    cat "$WORK/gpu-tests.txt"
    "${CHECKS[@]}" note --section gpu-tests --name "python3 -m pytest tests/gpu" \
        --ok "$([ "$rc" = 0 ] && echo pass || echo fail)" \
        --detail "exit $rc: $(tail -n 1 "$WORK/gpu-tests.txt")"

    t=$(( $(remaining) - 15 ))
    step "benchmarks/bench_cross_attention_gpu.py (${t} s left)"
    if [ "$t" -lt 60 ]; then
        "${CHECKS[@]}" note --section gpu-bench --name "GPU benchmark ran" --ok fail --optional \
            --detail "skipped: ${t} s left; run: bash tests/gpu/e2e/run-e2e-ab.sh gpu-tests"
        return 1
    fi
    rc=0
    timeout "$t" python3 benchmarks/bench_cross_attention_gpu.py "$WORK/bench.json" \
        >"$WORK/bench.txt" 2>&1 || rc=$?
    cat "$WORK/bench.txt"
    "${CHECKS[@]}" note --section gpu-bench --name "benchmarks/bench_cross_attention_gpu.py" \
        --ok "$([ "$rc" = 0 ] && echo pass || echo fail)" --detail "exit $rc"
}

part2() {
    step "install (skipped where installed)"
    install_batches || return 3
    env_setup
    stop_stale_server
    "${CHECKS[@]}" env --section "env-$MODE" --sglang "$SGLANG_EXPECTED"

    if [ "$MODE" != gpu-tests ]; then
        ensure_checkpoint || return 1
        run_variant plugin_off off SGLANG_PLUGINS=none
        run_variant mask mask MOSS_VL_CROSS_ATTN_PLAN=mask
        run_variant staircase staircase MOSS_VL_CROSS_ATTN_PLAN=staircase
        run_variant triton triton
        step "A/B: ${AB_USERS} users, video scenario, ${AB_FRAMES} frames, ${AB_S} s each"
        "${CHECKS[@]}" ab-report
    fi
    if [ "$MODE" != ab ]; then
        gpu_tests
    fi
    step "summary (results: $OUTDIR)"
    "${CHECKS[@]}" summary
}

e2e_main part2 e2e-ab.log "${E2E_BUDGET_S:-570}"
