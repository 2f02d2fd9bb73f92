#!/usr/bin/env bash
# How the preset's HTTP workers start on the H200: `moss-vl serve --device cuda` on the
# tiny checkpoint (the workers load no weights, so the model's size does not matter),
# once as the preset runs it and once with SGLang's own 10 s worker health check
# (SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT=10, which the preset leaves to an operator
# who sets it). For each: the workers uvicorn killed as unresponsive ("Child process
# [N] died"), the workers started, and the seconds from the supervisor's start to the
# last worker's "Application startup complete". Results: $OUT/worker-start.log.
#
# usage, from the repository root on the H200, after install.sh (batch a), with
# batches b and c carried in this call: bash tests/gpu/e2e/run-worker-start.sh
# WORKER_START_TIMEOUT_S (150): how long one start may take, from `moss-vl serve` to every
# worker up (the tiny server reached its supervisor ~50 s after the start on a fresh machine).
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
# shellcheck source=tests/gpu/e2e/lib.sh
source tests/gpu/e2e/lib.sh

# "[2026-12-02 14:37:02] ..." -> seconds since the epoch.
stamp() { date -d "$(sed -E 's/^\[([^]]*)\].*/\1/' <<<"$1")" +%s; }

# watch_workers NAME EXPECTED: wait for EXPECTED started workers, then report.
watch_workers() {
    local name=$1 expected=$2 waited=0 up parent last
    while [ "$waited" -lt "${WORKER_START_TIMEOUT_S:-150}" ] && alive "$SERVER_PID"; do
        up=$(grep -c "Application startup complete" "$SERVER_LOG")
        [ "$up" -ge "$expected" ] && break
        sleep 2
        waited=$(( waited + 2 ))
    done
    # A worker killed after this point would be missed: give the supervisor one more
    # round of pings.
    sleep 5
    up=$(grep -c "Application startup complete" "$SERVER_LOG")
    parent=$(grep -m1 "Started parent process" "$SERVER_LOG")
    last=$(grep "Application startup complete" "$SERVER_LOG" | tail -1)
    echo "$name: workers up $up of $expected;" \
         "killed as unresponsive: $(grep -c 'Child process \[[0-9]*\] died' "$SERVER_LOG");" \
         "worker processes started: $(grep -c 'Started server process' "$SERVER_LOG");" \
         "supervisor start to last worker up: $( [ -n "$parent" ] && [ -n "$last" ] \
             && echo $(( $(stamp "$last") - $(stamp "$parent") )) s || echo n/a)"
    grep -E "Started parent process|Child process|Started server process|Application startup complete" \
        "$SERVER_LOG" | cut -c1-120 | sed "s/^/  $name | /"
}

worker_start() {
    step "install (batches b and c come with this call)"
    install_batches || return 3
    env_setup
    stop_stale_server
    ensure_checkpoint || return 1
    local workers
    workers=$(moss-vl serve "${SERVE_ARGS[@]}" --dry-run --output json -- "${SGLANG_ARGS[@]}" \
        | python3 -c 'import json,sys; c=json.load(sys.stdin); a=c["argv"]
print(a[a.index("--tokenizer-worker-num")+1] if "--tokenizer-worker-num" in a else 1)
print("preset env:", c["env"], file=sys.stderr)')
    echo "the preset's --tokenizer-worker-num here: $workers"
    local case
    for case in preset sglang-default; do
        step "server: $case"
        if [ "$case" = preset ]; then
            start_server "workers-$case" || return 1
        else
            start_server "workers-$case" SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT=10 || return 1
        fi
        watch_workers "$case" "$workers"
        stop_server
    done
}

e2e_main worker_start worker-start.log "${E2E_BUDGET_S:-420}"
