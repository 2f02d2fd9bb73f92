#!/usr/bin/env bash
# Part 3 of the H200 end-to-end run: video through the real server, then parity of
# the served model with `moss-vl infer` (run-parity.sh's procedure) for the default
# triton plan, MOSS_VL_CROSS_ATTN_PLAN=mask and the plugin left out.
# Results: $OUT/video-parity.log, results.json, metrics.txt, logs.tar.gz.
#
# usage, from the repository root on the H200, after install.sh and run-e2e.sh on
# the same warm machine, carrying .whl/d (PyAV, tests/gpu/e2e/README.md):
#   bash tests/gpu/e2e/run-video-parity.sh
# E2E_BUDGET_S (570) bounds the run; VIDEO_S (170) the video part.
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
# shellcheck source=tests/gpu/e2e/lib.sh
source tests/gpu/e2e/lib.sh
VIDEO_MODEL=$MODEL
VIDEO_SERVE_ARGS=("${SERVE_ARGS[@]}")
# part_parity and its checkpoint and server flags (sourcing runs nothing).
# shellcheck source=tests/gpu/e2e/run-parity.sh
source tests/gpu/e2e/run-parity.sh
PARITY_MODEL=$MODEL
PARITY_SERVE_ARGS=("${SERVE_ARGS[@]}")

VIDEO_LIMITS='{"video": {"video_fps": 1, "max_frames": 32, "max_duration_seconds": 30, "max_video_bytes": 8388608}}'

part_video() {
    step "install batch d (PyAV)"
    install_batches || return 3
    [ -d "$SITE/av" ] || { echo "PyAV is not installed: carry .whl/d"; return 3; }
    env_setup
    stop_stale_server
    MODEL=$VIDEO_MODEL
    SERVE_ARGS=("${VIDEO_SERVE_ARGS[@]}")
    ensure_checkpoint || return 1

    step "server with the chart's video limits (default plan)"
    SGLANG_ARGS+=(--mm-process-config "$VIDEO_LIMITS")
    # Its own TMPDIR: the video client counts the temporary video files left there.
    local server_tmp=$WORK/server-tmp
    mkdir -p "$server_tmp"
    start_server video TMPDIR="$server_tmp" || return 1
    wait_healthy video "$(at_least_10 "$(min 240 $(( $(remaining) - 300 )))")" || return 1
    step "video requests"
    timeout "$(at_least_10 "$(min "${VIDEO_S:-170}" $(( $(remaining) - 280 )))")" \
        "${CHECKS[@]}" video --url "$URL" --max-duration-seconds 30 --max-video-bytes 8388608 \
        --server-temp-dir "$server_tmp"
    "${CHECKS[@]}" metrics --section metrics-video --url "$URL" --expect triton \
        --save "$WORK/metrics.txt"
    stop_server
    # run-parity.sh's part, inside this call's budget (its SERVE_ARGS: the peaked checkpoint).
    MODEL=$PARITY_MODEL
    SERVE_ARGS=("${PARITY_SERVE_ARGS[@]}")
    SGLANG_ARGS=("${SGLANG_ARGS[@]:0:${#SGLANG_ARGS[@]}-2}")  # the video limits off again
    part_parity
}

e2e_main part_video video-parity.log "${E2E_BUDGET_S:-570}"
