#!/usr/bin/env bash
# The H200 replay (tests/gpu/e2e/README.md, "Replay"): the CUDA server
# container of the chart's default values, run as the pod runs it
# (tests/replay/replay.py: uid 1000, read-only root, /models read-only on a
# claim, /tmp, /dev/shm and /home/moss/.cache as tmpfs emptyDirs, the image's
# ENV and ENTRYPOINT `moss-vl serve`), serving the tiny checkpoint with the
# real SGLang 0.5.17; then the chart's own `helm test` pod and its in-cluster
# load test (master Job + one worker) replayed against it, Service names
# resolved to 127.0.0.1. Results: $OUT/replay.log, results.json, logs.tar.gz.
#
# usage, from the repository root on the H200, after install.sh (call 1):
#   bash tests/gpu/e2e/run-replay.sh          (carry: .whl/b, .whl/c)
# Needs on the CPU side: hack/gpu/prepare-batches, tests/gpu/e2e/prepare-batch-c,
# then tests/gpu/e2e/prepare-replay (the H200 has no helm: the rendered chart
# travels as .whl/c/replay-objects.json).
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
# shellcheck source=tests/gpu/e2e/lib.sh
source tests/gpu/e2e/lib.sh

OBJECTS=.whl/c/replay-objects.json
STATE=$WORK/replay
CLAIM=$STATE/claim
STANDIN=$STATE/standin-venv
# What stands in for the image: the H200's Python 3.12 + torch 2.11 with the
# carried packages (bound at /opt/site, first on PYTHONPATH as env_setup
# does), in a venv bound at the image's /opt/venv. The kernel-version check is
# off as in every H200 run (sgl_kernel 0.4.5 against torch 2.11).
REPLAY=(python3 tests/replay/replay.py --rendered "$OBJECTS" --venv "$STANDIN"
        --bind "$SITE:/opt/site" --env PYTHONPATH=/opt/site
        --env SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1)

standin_venv() {
    rm -rf "$STANDIN"
    python3 -m venv --system-site-packages --without-pip "$STANDIN" || return 1
    # The H200's python3 is itself a venv (torch, numpy): --system-site-packages
    # reaches only its base interpreter, so its site-packages join by a .pth.
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
        >"$(echo "$STANDIN"/lib/python3*/site-packages)/h200-image.pth"
    # The images' console scripts, pointing at the image's interpreter path.
    # FlashInfer's JIT runs ninja, which the image's venv carries (its lock).
    ln -s "$(command -v ninja)" "$STANDIN/bin/ninja" || return 1
    local name module
    for name in moss-vl:moss_vl.cli locust:locust.main; do
        module=${name#*:}
        printf '#!/opt/venv/bin/python3\nimport sys\nfrom %s import main\nsys.exit(main())\n' \
            "$module" >"$STANDIN/bin/${name%%:*}"
        chmod 0755 "$STANDIN/bin/${name%%:*}"
    done
}

replay_part() {
    step "install batches b and c into $SITE"
    install_batches || return 3
    env_setup
    stop_stale_server
    rm -f "$RESULTS"
    if [ ! -f "$OBJECTS" ]; then
        echo "run-replay: $OBJECTS missing: run tests/gpu/e2e/prepare-replay on the CPU side"
        return 2
    fi

    step "can this machine replay?"
    python3 tests/replay/replay.py --check || return 4

    step "tiny MOSS-VL checkpoint on the weights claim, as the download init container leaves it"
    ensure_checkpoint || return 1
    rm -rf "$STATE"
    mkdir -p "$CLAIM"
    cp -r "$MODEL" "$CLAIM/MOSS-VL-Instruct-0708"
    chown -R 1000:1000 "$CLAIM"
    standin_venv || return 1

    step "server container: moss-vl serve --preflight under the pod contract"
    timeout 300 "${REPLAY[@]}" --state "$STATE/preflight" --workload Deployment/moss-vl-cuda \
        --container server --pvc "moss-vl-models=$CLAIM" -- --preflight \
        >"$WORK/replay-preflight.log" 2>&1
    local rc=$?
    cat "$WORK/replay-preflight.log"
    "${CHECKS[@]}" note --section replay --name "preflight under the pod contract" \
        --ok "$([ $rc -eq 0 ] && echo pass || echo fail)" --detail "exit $rc"

    step "the GPU as the NVIDIA device plugin hands it to a container"
    # The device plugin gives the container's user the device nodes and the
    # container toolkit the driver libraries; here: nodes opened to every uid,
    # the host's driver library path added to the image's.
    ls -l /dev/nvidia* 2>&1 | head -5
    chmod 0666 /dev/nvidia* 2>/dev/null
    local driver_libs
    driver_libs=$(dirname "$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')" 2>/dev/null)
    echo "driver libraries: ${driver_libs:-not found by ldconfig}; host LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    REPLAY+=(--env "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64${driver_libs:+:$driver_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    # The replayed root is an overlay of the host's root filesystem, which does
    # not show the mounts below it: the driver (and CUDA toolkit, nvcc for
    # FlashInfer's JIT) where they are mounts are bound in, as the toolkit does.
    local dir
    for dir in /usr/local/nvidia /usr/local/cuda "$driver_libs"; do
        [ -n "$dir" ] && [ -d "$dir" ] && mountpoint -q "$dir" && REPLAY+=(--bind "$dir:$dir") \
            && echo "bound into the container: $dir"
    done
    findmnt -rn -o TARGET | grep -E '^/usr|^/opt' | head -5

    step "server container: the image's ENTRYPOINT under the pod contract"
    SERVER_LOG=$WORK/server-replay.log
    set -m
    "${REPLAY[@]}" --state "$STATE/server" --workload Deployment/moss-vl-cuda \
        --container server --pvc "moss-vl-models=$CLAIM" >"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    set +m
    echo "$SERVER_PID" >"$WORK/server.pid"
    wait_healthy replay "$(at_least_10 "$(min 330 $(( $(remaining) - 150 )))")" || return 1
    "${CHECKS[@]}" plugin-log --section replay-plugin --log "$SERVER_LOG" \
        --sglang-version "$SGLANG_EXPECTED"
    if grep -E "Read-only file system|Permission denied" "$SERVER_LOG"; then
        "${CHECKS[@]}" note --section replay --name "no EROFS/EACCES in the server log" --ok fail
    else
        "${CHECKS[@]}" note --section replay --name "no EROFS/EACCES in the server log" --ok pass
    fi

    local pod
    for pod in moss-vl-test-chat moss-vl-test-chat-cuda; do
        step "the chart's helm test pod $pod against it"
        timeout "$(at_least_10 "$(min 200 $(( $(remaining) - 100 )))")" "${REPLAY[@]}" \
            --state "$STATE/$pod" --hosts --workload "Pod/$pod" --container chat-png \
            >"$WORK/replay-$pod.log" 2>&1
        rc=$?
        tail -n 20 "$WORK/replay-$pod.log"
        "${CHECKS[@]}" note --section replay --name "helm test pod $pod" \
            --ok "$([ $rc -eq 0 ] && echo pass || echo fail)" --detail "exit $rc"
    done

    step "chat completions against the replayed server (default plan: triton)"
    timeout "$(at_least_10 "$(min 150 $(( $(remaining) - 120 )))")" "${CHECKS[@]}" chat \
        --url "$URL" --max-tokens 16
    "${CHECKS[@]}" metrics --url "$URL" --expect triton --expect-cache-hits \
        --save "$WORK/metrics.txt"

    step "the chart's load test: master Job + one worker"
    "${REPLAY[@]}" --state "$STATE/master" --hosts --workload Job/moss-vl-loadtest-r1-master \
        --container locust >"$WORK/replay-locust-master.log" 2>&1 &
    local master=$!
    "${REPLAY[@]}" --state "$STATE/worker" --hosts --workload Job/moss-vl-loadtest-r1-worker \
        --container locust >"$WORK/replay-locust-worker.log" 2>&1 &
    local worker=$!
    timeout "$(at_least_10 "$(min 200 $(( $(remaining) - 30 )))")" tail --pid="$master" -f /dev/null
    wait "$master"
    rc=$?
    kill "$worker" 2>/dev/null
    wait "$worker" 2>/dev/null
    tail -n 40 "$WORK/replay-locust-master.log"
    "${CHECKS[@]}" note --section replay --name "in-cluster load test (master + worker)" \
        --ok "$([ $rc -eq 0 ] && echo pass || echo fail)" --detail "master exit $rc"

    step "/metrics after the load test"
    "${CHECKS[@]}" metrics --section metrics-after-load --url "$URL" --expect triton \
        --save "$WORK/metrics.txt"
    "${CHECKS[@]}" summary
}

e2e_main replay_part replay.log "${E2E_BUDGET_S:-570}"
