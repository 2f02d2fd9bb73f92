"""The /metrics of the fixture server: what SGLang and the moss_vl plugin export.

Series names and label names are the ones a real MOSS-VL pod exports
(docs/e2e-results/metrics.txt, recorded on the H200 run; SGLang 0.5.23's
metrics_collector for the histograms that recording cut short), and the values
follow the fixture's real traffic: every chat completion counts its request,
prompt and generated tokens, observes its measured time to first token, gaps
and end-to-end time, and, for requests with images, builds a (modelled)
cross-attention mask and looks its images up in an encoder cache keyed by
their bytes. tests/chart/test_prometheusrule.py and test_configmap_dashboard.py
hold the names against the installed SGLang and the plugin's registry.

The router stand-in (`router_exposition`) serves the two sglang-router 0.3.2
series the dashboard reads (`smg_worker_pool_size`, `smg_http_requests_total`).
"""

from __future__ import annotations

import hashlib
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MODEL_LABELS = {"engine_type": "unified", "model_name": "moss-vl"}
RANK_LABELS = {**MODEL_LABELS, "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
# SGLang 0.5.23's default buckets (sglang.srt.observability.metrics_collector).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
               0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800)
# The scheduler's per-request stage histograms: per_stage_req_latency_seconds (SGLang's
# exponential_buckets(0.001, 1.62, 30)) and queue_time_seconds.
STAGE_BUCKETS = tuple(0.001 * 1.62**i for i in range(30))
QUEUE_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40,
                 50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200,
                 1400, 1600, 1800, 2000, 2500, 3000)  # fmt: skip
# What the fixture's scheduler takes to receive a request (request_process stage).
REQUEST_PROCESS_S = 0.0005
# moss_vl.metrics buckets.
MASK_BUILD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                      0.25, 1.0)  # fmt: skip
MASK_PATHS = (
    ("flashinfer", "mask"),
    ("flashinfer", "staircase"),
    ("ascend_native", "staircase"),
    ("ascend_native", "dense"),
    ("dropped", "mask"),
)
# The KV pool the token_usage gauge is a share of (slots).
KV_SLOTS = 100_000


class FixtureMetrics:
    """sglang:* and moss_vl:* series in a registry of their own, fed by the handler."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._seen_images: set[bytes] = set()
        self._running = 0
        self._running_tokens = 0
        r = self.registry
        model, streaming = list(MODEL_LABELS), [*MODEL_LABELS, "is_streaming"]
        ranks = list(RANK_LABELS)
        self.num_running = Gauge("sglang:num_running_reqs", "", ranks, registry=r)
        self.num_queue = Gauge("sglang:num_queue_reqs", "", ranks, registry=r)
        self.token_usage = Gauge("sglang:token_usage", "", ranks, registry=r)
        self.cache_hit_rate = Gauge("sglang:cache_hit_rate", "", ranks, registry=r)
        # prometheus_client appends _total to counters itself.
        self.prompt_tokens = Counter("sglang:prompt_tokens", "", streaming, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "", streaming, registry=r)
        self.num_requests = Counter("sglang:num_requests", "", streaming, registry=r)
        self.num_aborted = Counter("sglang:num_aborted_requests", "", model, registry=r)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "", streaming, buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "", model, buckets=ITL_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "", streaming, buckets=E2E_BUCKETS, registry=r
        )
        self.queue_time = Histogram(
            "sglang:queue_time_seconds", "", ranks, buckets=QUEUE_BUCKETS, registry=r
        )
        self.stage_latency = Histogram(
            "sglang:per_stage_req_latency_seconds", "", [*ranks, "stage"],
            buckets=STAGE_BUCKETS, registry=r,
        )
        self.mask_build = Histogram(
            "moss_vl:mask_build_seconds", "", buckets=MASK_BUILD_BUCKETS, registry=r
        )
        self.mask_bytes = Counter("moss_vl:mask_bytes", "", registry=r)
        self.mask_elements = Counter("moss_vl:mask_elements", "", registry=r)
        self.mask_visible = Counter("moss_vl:mask_visible_elements", "", registry=r)
        self.rows_without_vision = Counter("moss_vl:rows_without_vision", "", registry=r)
        self.mask_path = Counter(
            "moss_vl:cross_attention_mask_path", "", ["path", "plan"], registry=r
        )
        for path, plan in MASK_PATHS:
            self.mask_path.labels(path=path, plan=plan)
        self.encoder_hits = Counter("moss_vl:encoder_cache_hits", "", registry=r)
        self.encoder_misses = Counter("moss_vl:encoder_cache_misses", "", registry=r)
        self.encoder_reused = Counter("moss_vl:encoder_tokens_reused", "", registry=r)
        self.encoder_computed = Counter("moss_vl:encoder_tokens_computed", "", registry=r)
        self.prefix_dropped = Counter("moss_vl:prefix_matches_dropped", "", registry=r)
        self.media_items = Counter("moss_vl:media_items", "", ["kind"], registry=r)
        for kind in ("image", "video"):
            self.media_items.labels(kind=kind)
        self.video_frames = Counter("moss_vl:video_frames", "", registry=r)
        # Series that exist from the start, as SGLang creates them at launch.
        for gauge in (self.num_running, self.num_queue, self.token_usage, self.cache_hit_rate):
            gauge.labels(**RANK_LABELS).set(0)
        self.num_aborted.labels(**MODEL_LABELS)

    # ---- fed by the handler -----------------------------------------------------

    def request_started(self, prompt_tokens: int, max_tokens: int) -> None:
        with self._lock:
            self._running += 1
            self._running_tokens += prompt_tokens + max_tokens
            self._set_load()

    def request_finished(self, prompt_tokens: int, max_tokens: int) -> None:
        with self._lock:
            self._running -= 1
            self._running_tokens -= prompt_tokens + max_tokens
            self._set_load()

    def _set_load(self) -> None:
        self.num_running.labels(**RANK_LABELS).set(self._running)
        self.token_usage.labels(**RANK_LABELS).set(min(1.0, self._running_tokens / KV_SLOTS))

    def aborted(self) -> None:
        self.num_aborted.labels(**MODEL_LABELS).inc()

    def media(self, images: int, videos: int, frames: int) -> None:
        """What the processor accepted: images, videos and the videos' sampled frames."""
        self.media_items.labels(kind="image").inc(images)
        self.media_items.labels(kind="video").inc(videos)
        self.video_frames.inc(frames)

    def prefill(self, images: list[bytes], image_tokens: list[int], text_tokens: int) -> None:
        """One prefill: encoder-cache lookups and, with images, one staircase mask."""
        if not images:
            return
        hits = 0
        with self._lock:
            for data, tokens in zip(images, image_tokens):
                key = hashlib.blake2b(data, digest_size=16).digest()
                if key in self._seen_images:
                    hits += 1
                    self.encoder_hits.inc()
                    self.encoder_reused.inc(tokens)
                else:
                    self._seen_images.add(key)
                    self.encoder_misses.inc()
                    self.encoder_computed.inc(tokens)
            lookups = len(images)
            self.cache_hit_rate.labels(**RANK_LABELS).set(hits / lookups)
        encoder_len = sum(image_tokens)
        elements = text_tokens * encoder_len
        # Staircase: the text after the last image sees every frame; model that
        # half of the rows see half the encoder span on average.
        visible = elements * 3 // 4
        self.mask_elements.inc(elements)
        self.mask_bytes.inc(elements)  # uint8, one byte per element
        self.mask_visible.inc(visible)
        self.rows_without_vision.inc(min(text_tokens, 8))
        self.mask_path.labels(path="flashinfer", plan="staircase").inc()
        self.mask_build.observe(0.0004 + elements * 2e-9)

    def finished(
        self,
        stream: bool,
        prompt_tokens: int,
        completion_tokens: int,
        ttft: float,
        gaps: list[float],
        e2e: float,
    ) -> None:
        labels = {**MODEL_LABELS, "is_streaming": "true" if stream else "false"}
        self.num_requests.labels(**labels).inc()
        self.prompt_tokens.labels(**labels).inc(prompt_tokens)
        self.generation_tokens.labels(**labels).inc(completion_tokens)
        self.ttft.labels(**labels).observe(ttft)
        self.e2e.labels(**labels).observe(e2e)
        # The scheduler's view of the same request: received at once, never queued,
        # its prefill the first-token delay (no tokenizer work is modelled).
        self.stage_latency.labels(**RANK_LABELS, stage="request_process").observe(
            REQUEST_PROCESS_S
        )
        self.queue_time.labels(**RANK_LABELS).observe(0.0)
        self.stage_latency.labels(**RANK_LABELS, stage="prefill_forward").observe(
            max(0.0, ttft - REQUEST_PROCESS_S)
        )
        for gap in gaps:
            self.itl.labels(**MODEL_LABELS).observe(gap)

    # ---- exposition -------------------------------------------------------------

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    @staticmethod
    def router_exposition(requests: int) -> bytes:
        """The router's view of the same traffic: one worker, every chat request."""
        return (
            "# HELP smg_worker_pool_size Workers in the router's pool.\n"
            "# TYPE smg_worker_pool_size gauge\n"
            "smg_worker_pool_size 1\n"
            "# HELP smg_http_requests_total HTTP requests received.\n"
            "# TYPE smg_http_requests_total counter\n"
            f'smg_http_requests_total{{method="POST",path="/v1/chat/completions"}} {requests}\n'
        ).encode()
