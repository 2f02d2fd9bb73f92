#!/usr/bin/env bash
# Part 1 of the H200 end-to-end run (tests/gpu/e2e/README.md): install batches
# b and c, write the tiny MOSS-VL checkpoint, start `moss-vl serve --device cuda`
# (real SGLang 0.5.17, plugin loaded), check chat completions, /metrics, and run
# the project's load test for 60 s. Results: $OUT/e2e.log, results.json,
# metrics.txt, logs.tar.gz. Exit 0 when every required check passed.
#
# usage, from the repository root on the H200, batch a installed by install.sh:
#   bash tests/gpu/e2e/run-e2e.sh
# E2E_BUDGET_S (570) bounds the whole run; E2E_LOAD_S (60) the load test.
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
# shellcheck source=tests/gpu/e2e/lib.sh
source tests/gpu/e2e/lib.sh

part1() {
    step "install batches b and c into $SITE"
    install_batches || return 3
    env_setup
    stop_stale_server
    rm -f "$RESULTS" "$WORK/metrics.txt"

    step "versions"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "${CHECKS[@]}" env --sglang "$SGLANG_EXPECTED"

    step "tiny MOSS-VL checkpoint"
    ensure_checkpoint || return 1

    step "moss-vl serve --dry-run"
    moss-vl serve "${SERVE_ARGS[@]}" --dry-run --output json -- "${SGLANG_ARGS[@]}" \
        >"$WORK/dry-run.json"
    cat "$WORK/dry-run.json"
    "${CHECKS[@]}" dry-run --file "$WORK/dry-run.json" --expect-plugins moss_vl

    step "start the server (plugin loaded, default plan: triton)"
    start_server triton || return 1
    # FlashInfer JIT-compiles its kernels on the first forward (about 3 min),
    # which the first /health triggers; keep 170 s for what follows.
    wait_healthy triton "$(at_least_10 "$(min 330 $(( $(remaining) - 170 )))")" || return 1
    "${CHECKS[@]}" plugin-log --section plugin --log "$SERVER_LOG" \
        --sglang-version "$SGLANG_EXPECTED"

    step "chat completions"
    # The first image request compiles the cross-attention kernels.
    timeout "$(at_least_10 $(( $(remaining) - 80 )))" "${CHECKS[@]}" chat --url "$URL" \
        --max-tokens 32

    step "/metrics after the chat requests"
    "${CHECKS[@]}" metrics --url "$URL" --expect triton --expect-cache-hits \
        --save "$WORK/metrics.txt"

    local load_s
    load_s=$(min "${E2E_LOAD_S:-60}" $(( $(remaining) - 50 )))
    step "load test: ${load_s} s, 8 users"
    if [ "$load_s" -lt 15 ]; then
        "${CHECKS[@]}" note --section loadtest --name "load test ran" --ok fail \
            --detail "skipped: ${load_s} s for it (E2E_LOAD_S or the time left)"
        return 1
    fi
    local reports=$WORK/reports/loadtest rc=0 dir
    rm -rf "$reports"
    if command -v make >/dev/null; then
        # The project's own target; LOADTEST_VENV empty: use this interpreter.
        make --no-print-directory loadtest LOADTEST_VENV= VPY=python3 HOST="$URL" USERS=8 \
            SPAWN_RATE=4 DURATION="${load_s}s" LOADTEST_STOP_TIMEOUT=15 \
            LOADTEST_REPORTS="$reports" LOADTEST_ARGS=--only-summary || rc=$?
        # make loadtest writes one timestamped folder under LOADTEST_REPORTS.
        local runs=("$reports"/*/)
        dir=${runs[-1]}
    else
        # What `make loadtest` runs, for an image without make.
        dir=$reports/run/
        mkdir -p "$dir"
        python3 -m locust -f loadtest/locustfile.py --headless --host "$URL" --users 8 \
            --spawn-rate 4 --run-time "${load_s}s" --stop-timeout 15 \
            --csv "$dir/moss-vl" --html "$dir/report.html" --only-summary 2>&1 \
            | tee "$dir/locust.log"
        rc=${PIPESTATUS[0]}
        grep '^SLO ' "$dir/locust.log" >"$dir/slo.txt"
        cat "$dir/slo.txt"
    fi
    "${CHECKS[@]}" locust --section loadtest --csv-prefix "${dir%/}/moss-vl" \
        --slo "${dir%/}/slo.txt" --exit-code "$rc"

    step "/metrics after the load test"
    "${CHECKS[@]}" metrics --section metrics-after-load --url "$URL" --expect triton \
        --expect-cache-hits --save "$WORK/metrics.txt"

    step "stop the server"
    stop_server

    step "summary (results: $OUTDIR)"
    "${CHECKS[@]}" summary
}

e2e_main part1 e2e.log "${E2E_BUDGET_S:-570}"
