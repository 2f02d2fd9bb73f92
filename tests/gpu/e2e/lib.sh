# shellcheck shell=bash
# Shared by install.sh, run-e2e.sh and run-e2e-ab.sh (sourced, from the repository
# root on the H200; tests/gpu/e2e/README.md). Nothing here reaches a registry:
# the wheels travel in .whl/a, .whl/b and .whl/c.

SITE=${SITE:-/tmp/site}
# Outlives one device call on a warm machine: the checkpoint, results.json,
# server logs and Locust reports of earlier parts.
WORK=${E2E_WORK:-/tmp/moss-vl-e2e}
OUTDIR=${OUT:-$WORK/out}
MODEL=$WORK/tiny-moss-vl
PORT=${E2E_PORT:-30000}
URL=http://127.0.0.1:$PORT
RESULTS=$WORK/results.json
CHECKS=(python3 tests/gpu/e2e/e2e_checks.py --results "$RESULTS")
export SGLANG_EXPECTED=0.5.17

# moss-vl serve's own flags, then the SGLang flags after `--`.
SERVE_ARGS=(
    --device cuda --model-path "$MODEL" --served-model-name moss-vl --port "$PORT"
    --mem-fraction-static 0.2 --context-length 4096
)
SGLANG_ARGS=(
    # Decode on FlashInfer too: on Hopper SGLang 0.5.17 would pick FA3 for
    # decode (the preset sets only the prefill backend), and batch a carries
    # sgl_kernel without its FA3 kernels.
    --attention-backend flashinfer
    # The vision tower likewise defaults to FA3 on Hopper.
    --mm-attention-backend triton_attn
    # FlashInfer's sampling kernels would be one more JIT compile.
    --sampling-backend pytorch
    --disable-cuda-graph
    --skip-server-warmup
)

E2E_START=$(date +%s)
E2E_DEADLINE=$E2E_START
SERVER_PID=

elapsed() { echo $(( $(date +%s) - E2E_START )); }
remaining() { echo $(( E2E_DEADLINE - $(date +%s) )); }
step() { echo; echo "[+$(elapsed)s, $(remaining)s left] ==== $*"; }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }
# A step's timeout: SECONDS, but never under 10 (timeout rejects <= 0).
at_least_10() { if [ "$1" -lt 10 ]; then echo 10; else echo "$1"; fi; }

# Install every wheel of the batches present that is not installed yet (same
# file, by sha256, remembered in $SITE/.installed-wheels), so a repeated call or
# a rebuilt moss-vl wheel costs seconds.
install_batches() {
    local marks=$SITE/.installed-wheels batch w sum wheels
    mkdir -p "$SITE" "$marks"
    # d: PyAV alone (34 MiB), for the video checks; it travels in its own call.
    for batch in .whl/a .whl/b .whl/c .whl/d; do
        [ -d "$batch" ] || continue
        wheels=()
        for w in "$batch"/*.whl; do
            [ -e "$w" ] || continue
            sum=$(sha256sum "$w" | cut -d' ' -f1)
            [ "$(cat "$marks/${w##*/}" 2>/dev/null)" = "$sum" ] || wheels+=("$w")
        done
        if [ "${#wheels[@]}" -eq 0 ]; then
            echo "install: $batch already installed in $SITE"
            continue
        fi
        echo "install: $batch: ${#wheels[@]} wheel(s) into $SITE"
        PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile \
            --no-cache-dir --disable-pip-version-check --upgrade --target "$SITE" "${wheels[@]}" \
            || return 1
        for w in "${wheels[@]}"; do
            sha256sum "$w" | cut -d' ' -f1 >"$marks/${w##*/}"
        done
    done
    # pip --target --upgrade replaces $SITE/bin with the last wheel's (PyAV's, in
    # batch d): give moss-vl its console script back.
    if [ -d "$SITE/moss_vl" ] && [ ! -x "$SITE/bin/moss-vl" ]; then
        mkdir -p "$SITE/bin"
        printf '#!/usr/bin/env python3\nimport sys\nfrom moss_vl.cli import main\nsys.exit(main())\n' \
            >"$SITE/bin/moss-vl"
        chmod 0755 "$SITE/bin/moss-vl"
    fi
    local missing=() pkg
    # One package of each batch (a: sgl_kernel, transformers; b: sglang,
    # flashinfer; c: moss_vl, locust).
    for pkg in sgl_kernel transformers sglang flashinfer moss_vl locust; do
        [ -d "$SITE/$pkg" ] || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "install: $SITE lacks ${missing[*]}: a batch never reached this machine." \
             "Batch a arrives in call 1 and stays only while the machine is warm (30 s" \
             "after a call); after a cold start, repeat call 1 (tests/gpu/e2e/README.md)."
        return 1
    fi
}

env_setup() {
    # The carried packages first: transformers 5.12.1 and tokenizers 0.22.2
    # must win over the image's 5.17 / 0.23 (SGLang 0.5.17 breaks on 5.17).
    # moss_vl comes from the wheel, not src/, as a user would install it.
    export PYTHONPATH=$SITE
    export PATH=$SITE/bin:$PATH
    export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
    unset SGLANG_PLUGINS MOSS_VL_CROSS_ATTN_PLAN MOSS_VL_DISABLE_HOOKS
}

port_open() {
    python3 -c "import socket,sys; s=socket.socket(); s.settimeout(1); sys.exit(0 if s.connect_ex(('127.0.0.1', $PORT)) == 0 else 1)"
}

# start_server NAME [VAR=value ...]: moss-vl serve in its own process group
# (job control), log in $WORK/server-NAME.log. The group lets stop_server end
# the scheduler and detokenizer processes too, and only those. A non-empty
# SERVER_CMD array replaces `moss-vl serve ...` (SGLang launched as upstream does).
SERVER_CMD=()
start_server() {
    local name=$1
    shift
    SERVER_LOG=$WORK/server-$name.log
    if port_open; then
        echo "start_server: port $PORT is already in use; not starting $name"
        return 1
    fi
    local cmd=(moss-vl serve "${SERVE_ARGS[@]}" -- "${SGLANG_ARGS[@]}")
    [ "${#SERVER_CMD[@]}" -eq 0 ] || cmd=("${SERVER_CMD[@]}")
    set -m
    env -u SGLANG_PLUGINS -u MOSS_VL_CROSS_ATTN_PLAN "$@" "${cmd[@]}" >"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    set +m
    echo "$SERVER_PID" >"$WORK/server.pid"
    echo "server $name: pid $SERVER_PID, env: ${*:-(none)}, log $SERVER_LOG"
}

# Running, not exited (an exited child stays a zombie until `wait`).
alive() {
    local state
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$state" ] && [ "$state" != Z ]
}

stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    if alive "$SERVER_PID"; then
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null
        for _ in $(seq 1 20); do
            alive "$SERVER_PID" || break
            sleep 1
        done
    fi
    # Whatever of the group is left (a scheduler that ignored TERM).
    kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 15); do
        port_open || break
        sleep 1
    done
    echo "server stopped (pid $SERVER_PID)"
    SERVER_PID=
    rm -f "$WORK/server.pid"
}

# A server an earlier, killed call of ours left behind (its group id is in
# server.pid; checked to be SGLang before it is signalled).
stop_stale_server() {
    local pid
    pid=$(cat "$WORK/server.pid" 2>/dev/null) || return 0
    if [ -n "$pid" ] && alive "$pid" \
            && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q sglang; then
        echo "stopping the server an earlier call left running (pid $pid)"
        SERVER_PID=$pid
        stop_server
    fi
    rm -f "$WORK/server.pid"
}

# wait_healthy NAME TIMEOUT: /health 200, or the server's last lines.
wait_healthy() {
    local name=$1 timeout=$2
    if "${CHECKS[@]}" health --section "health-$name" --url "$URL" --timeout "$timeout" \
            --pid "$SERVER_PID"; then
        return 0
    fi
    echo "---- last lines of $SERVER_LOG"
    tail -n 40 "$SERVER_LOG"
    return 1
}

ensure_checkpoint() {
    if [ -f "$MODEL/model.safetensors" ]; then
        echo "tiny checkpoint: $MODEL (already written)"
        return 0
    fi
    timeout 180 python3 -m moss_vl.testing "$MODEL"
}

# bundle LOGNAME: results.json, metrics.txt and one tarball of the logs and
# reports into $OUT (at most 8 files come back from a device call).
bundle() {
    mkdir -p "$OUTDIR"
    [ -f "$RESULTS" ] && cp "$RESULTS" "$OUTDIR/results.json"
    [ -f "$WORK/metrics.txt" ] && cp "$WORK/metrics.txt" "$OUTDIR/metrics.txt"
    (cd "$WORK" && tar -czf "$OUTDIR/logs.tar.gz" --exclude=tiny-moss-vl --exclude=out \
        --exclude='*.tmp' ./*.log ./*.json ./*.txt reports 2>/dev/null) || true
    ls -la "$OUTDIR"
}

# e2e_main PART_FUNCTION LOGNAME BUDGET_S: runs the part with its output in
# $OUT/LOGNAME, stops the server and bundles whatever happens.
e2e_main() {
    local part=$1 logname=$2 budget=$3
    mkdir -p "$WORK" "$OUTDIR" "$WORK/reports"
    E2E_START=$(date +%s)
    E2E_DEADLINE=$(( E2E_START + budget ))
    (
        trap 'stop_server; bundle' EXIT
        trap 'exit 143' TERM INT
        "$part"
    ) 2>&1 | tee "$OUTDIR/$logname"
    return "${PIPESTATUS[0]}"
}
