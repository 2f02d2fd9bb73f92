"""``moss_vl:*`` Prometheus metrics, exported on SGLang's own ``/metrics``.

SGLang serves metrics from several processes through
``PROMETHEUS_MULTIPROC_DIR``; prometheus_client decides at import time whether
values go to that directory. So nothing here imports prometheus_client or
creates a metric until the first observation, which happens in SGLang's
scheduler/worker processes after SGLang set the variable. Only counters and
histograms are used for what is counted: both aggregate across processes
without a gauge mode. The two state gauges (``moss_vl:hooks_applied``,
``moss_vl:plugin_info``) are set at start, in every process that loads the
plugin; one set before PROMETHEUS_MULTIPROC_DIR exists (SGLang's launcher
loads plugins before it creates the directory) waits until this process
creates its metrics, so it never decides prometheus_client's value mode.
This module never starts an HTTP server.

Recording must never break serving: a failure is logged once and ignored.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("moss_vl")

# Mask sizes span tiny image chats to video batches (10^2 .. 10^9 elements);
# build times from tens of microseconds to tens of milliseconds.
MASK_BUILD_SECONDS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)
VISIBLE_RATIO_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

# (path, plan) pairs that exist; all are created at 0 so alerts have a series.
MASK_PATHS = (
    ("flashinfer", "mask"),
    ("flashinfer", "staircase"),
    ("flashinfer", "triton"),
    ("ascend_native", "staircase"),
    ("ascend_native", "dense"),
    ("dropped", "mask"),
)

MEDIA_KINDS = ("image", "video")


class _Metrics:
    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.mask_build_seconds = Histogram(
            "moss_vl:mask_build_seconds",
            "Host time to build the packed cross-attention mask of a prefill batch.",
            buckets=MASK_BUILD_SECONDS_BUCKETS,
        )
        self.mask_bytes = Counter(
            "moss_vl:mask_bytes", "Bytes of packed cross-attention masks built."
        )
        self.mask_elements = Counter(
            "moss_vl:mask_elements", "Elements (text row x encoder token) of masks built."
        )
        self.mask_visible_elements = Counter(
            "moss_vl:mask_visible_elements", "Mask elements that are visible (1)."
        )
        self.mask_visible_ratio = Histogram(
            "moss_vl:mask_visible_ratio",
            "Visible share of each mask built (1.0 = every row sees every frame).",
            buckets=VISIBLE_RATIO_BUCKETS,
        )
        self.rows_without_vision = Counter(
            "moss_vl:rows_without_vision",
            "New text rows of vision requests that see no frame (cross-attention output 0).",
        )
        self.mask_path = Counter(
            "moss_vl:cross_attention_mask_path",
            "Cross-attention masks applied, by backend path and plan: once per planned "
            "batch on flashinfer, once per layer call on ascend_native. "
            'path="dropped": a mask was built but the backend did not apply it.',
            ["path", "plan"],
        )
        for path, plan in MASK_PATHS:
            self.mask_path.labels(path=path, plan=plan)
        self.encoder_cache_hits = Counter(
            "moss_vl:encoder_cache_hits",
            "Prefill requests whose encoder (vision) KV was already cached.",
        )
        self.encoder_cache_misses = Counter(
            "moss_vl:encoder_cache_misses",
            "Prefill requests whose encoder (vision) KV had to be computed.",
        )
        self.encoder_tokens_reused = Counter(
            "moss_vl:encoder_tokens_reused", "Encoder tokens served from the KV cache."
        )
        self.encoder_tokens_computed = Counter(
            "moss_vl:encoder_tokens_computed", "Encoder tokens computed by the vision tower."
        )
        self.media_items = Counter(
            "moss_vl:media_items",
            "Images and videos in requests the MOSS-VL processor accepted.",
            ["kind"],
        )
        for kind in MEDIA_KINDS:
            self.media_items.labels(kind=kind)
        self.video_frames = Counter(
            "moss_vl:video_frames",
            "Frames sampled from accepted videos (fps and max_frames applied); each is "
            "laid out as one image after its timestamp and costs one image's encoder tokens.",
        )
        self.prefix_matches_dropped = Counter(
            "moss_vl:prefix_matches_dropped",
            "Prefix-cache matches dropped because they ended inside the encoder span.",
        )
        # "min" across processes: one process where a hook did not take
        # effect shows 0.
        self.hooks_applied = Gauge(
            "moss_vl:hooks_applied",
            "1 when the plugin hook wraps its SGLang target in every process that loaded "
            "the plugin; 0 when it was chosen for this platform but is not in effect "
            "(unsupported SGLang, MOSS_VL_DISABLE_HOOKS, or apply_hooks failed).",
            ["hook"],
            multiprocess_mode="min",
        )
        self.plugin_info = Gauge(
            "moss_vl:plugin_info",
            'Always 1: the plugin and SGLang versions; sglang_supported="false" means SGLang '
            "runs unpatched (no moss_vl hooks).",
            ["version", "sglang_version", "sglang_supported"],
            multiprocess_mode="max",
        )


_metrics: _Metrics | None = None
_lock = threading.Lock()
_failed = False
# State recorded before this process may create its metrics (see the docstring).
_pending: list = []


def get() -> _Metrics | None:
    """The metrics, created on first use; None if they cannot be created."""
    global _metrics, _failed
    if _metrics is not None or _failed:
        return _metrics
    with _lock:
        if _metrics is None and not _failed:
            try:
                _metrics = _Metrics()
            except Exception:  # never let metrics break serving
                _failed = True
                logger.exception("moss_vl: metrics unavailable")
    if _metrics is not None and _pending:
        pending = list(_pending)
        _pending.clear()
        for fn in pending:
            _record(fn)
    return _metrics


def _record(fn) -> None:
    m = get()
    if m is None:
        return
    try:
        fn(m)
    except Exception:
        logger.debug("moss_vl: failed to record a metric", exc_info=True)


def observe_mask(
    seconds: float, num_bytes: int, elements: int, visible: int, rows_without_vision: int
) -> None:
    def fn(m: _Metrics) -> None:
        m.mask_build_seconds.observe(seconds)
        m.mask_bytes.inc(num_bytes)
        m.mask_elements.inc(elements)
        m.mask_visible_elements.inc(visible)
        if elements:
            m.mask_visible_ratio.observe(visible / elements)
        if rows_without_vision:
            m.rows_without_vision.inc(rows_without_vision)

    _record(fn)


def count_mask_bytes(num_bytes: int) -> None:
    """Bytes of a packed mask built after the builder ran (a deferred mask a consumer needed)."""
    _record(lambda m: m.mask_bytes.inc(num_bytes))


def count_mask_path(path: str, plan: str) -> None:
    if (path, plan) not in MASK_PATHS:
        raise ValueError(f"unknown mask path {path!r}/{plan!r}; known: {MASK_PATHS}")
    _record(lambda m: m.mask_path.labels(path=path, plan=plan).inc())


def count_encoder_cache(hits: int, misses: int, tokens_reused: int, tokens_computed: int) -> None:
    def fn(m: _Metrics) -> None:
        if hits:
            m.encoder_cache_hits.inc(hits)
        if misses:
            m.encoder_cache_misses.inc(misses)
        if tokens_reused:
            m.encoder_tokens_reused.inc(tokens_reused)
        if tokens_computed:
            m.encoder_tokens_computed.inc(tokens_computed)

    _record(fn)


def count_media(images: int, videos: int, video_frames: int) -> None:
    def fn(m: _Metrics) -> None:
        if images:
            m.media_items.labels(kind="image").inc(images)
        if videos:
            m.media_items.labels(kind="video").inc(videos)
        if video_frames:
            m.video_frames.inc(video_frames)

    _record(fn)


def count_prefix_match_dropped() -> None:
    _record(lambda m: m.prefix_matches_dropped.inc())


def _record_state(fn) -> None:
    """Record now where SGLang's metrics directory exists, else at this
    process's first metric (or never, in a process that records none)."""
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ or _metrics is not None:
        _record(fn)
    else:
        _pending.append(fn)


def set_hooks_applied(applied: dict[str, bool]) -> None:
    """``moss_vl:hooks_applied{hook}``: 1 in effect, 0 not."""

    def fn(m: _Metrics) -> None:
        for hook, ok in applied.items():
            m.hooks_applied.labels(hook=hook).set(1 if ok else 0)

    _record_state(fn)


def set_plugin_info(version: str, sglang_version: str | None, sglang_supported: bool) -> None:
    def fn(m: _Metrics) -> None:
        m.plugin_info.labels(
            version=version,
            sglang_version=sglang_version or "not installed",
            sglang_supported="true" if sglang_supported else "false",
        ).set(1)

    _record_state(fn)
