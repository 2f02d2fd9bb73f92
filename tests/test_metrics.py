"""moss_vl:* metrics through prometheus_client's multiprocess mode, as SGLang exports them.

Contract: importing the plugin creates no metric and imports no
prometheus_client (it must not decide the value mode before SGLang sets
PROMETHEUS_MULTIPROC_DIR); metrics recorded in worker processes are collected
by ``MultiProcessCollector`` the way SGLang's HTTP server collects them,
summed across processes, with every mask path series present from the start.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("prometheus_client")

WORKER = textwrap.dedent(
    """
    from moss_vl import metrics
    metrics.observe_mask(0.002, num_bytes=1000, elements=1000, visible=400, rows_without_vision=3)
    metrics.count_mask_path("ascend_native", "staircase")
    metrics.count_encoder_cache(hits=1, misses=2, tokens_reused=257, tokens_computed=514)
    metrics.count_prefix_match_dropped()
    metrics.count_media(images=1, videos=2, video_frames=14)
    """
)


def run_worker(env_dir, code=WORKER):
    import os

    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(env_dir))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def collect(path) -> dict[str, float]:
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_import_creates_nothing():
    code = (
        "import sys, moss_vl.plugin, moss_vl.metrics, moss_vl.hooks;"
        "assert 'prometheus_client' not in sys.modules, 'imported too early'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_two_workers_are_collected_and_summed(tmp_path):
    run_worker(tmp_path)
    run_worker(tmp_path)
    samples = collect(tmp_path)
    assert samples["moss_vl:mask_bytes_total"] == 2000
    assert samples["moss_vl:mask_elements_total"] == 2000
    assert samples["moss_vl:mask_visible_elements_total"] == 800
    assert samples["moss_vl:rows_without_vision_total"] == 6
    assert samples["moss_vl:mask_build_seconds_count"] == 2
    assert samples['moss_vl:mask_build_seconds_bucket{le="0.0025"}'] == 2
    assert samples['moss_vl:mask_visible_ratio_bucket{le="0.4"}'] == 2
    assert samples['moss_vl:cross_attention_mask_path_total{path="ascend_native",plan="staircase"}'] == 2
    assert samples["moss_vl:encoder_cache_hits_total"] == 2
    assert samples["moss_vl:encoder_cache_misses_total"] == 4
    assert samples["moss_vl:encoder_tokens_reused_total"] == 514
    assert samples["moss_vl:encoder_tokens_computed_total"] == 1028
    assert samples["moss_vl:prefix_matches_dropped_total"] == 2
    assert samples['moss_vl:media_items_total{kind="image"}'] == 2
    assert samples['moss_vl:media_items_total{kind="video"}'] == 4
    assert samples["moss_vl:video_frames_total"] == 28


def test_dropped_path_series_exists_at_zero(tmp_path):
    run_worker(tmp_path, "from moss_vl import metrics; metrics.count_mask_path('flashinfer', 'staircase')")
    samples = collect(tmp_path)
    assert samples['moss_vl:cross_attention_mask_path_total{path="dropped",plan="mask"}'] == 0
    assert samples['moss_vl:cross_attention_mask_path_total{path="flashinfer",plan="staircase"}'] == 1


def test_unknown_path_is_refused():
    from moss_vl import metrics

    with pytest.raises(ValueError, match="unknown mask path 'cuda'"):
        metrics.count_mask_path("cuda", "mask")


def test_hook_state_is_min_across_processes_and_waits_for_the_metrics_directory(tmp_path):
    """moss_vl:hooks_applied: one process where a hook is not in effect shows 0.
    SGLang's launcher loads plugins before it creates PROMETHEUS_MULTIPROC_DIR:
    state set then must not import prometheus_client (it would fix the value
    mode for SGLang's own metrics) and is recorded with the process's first metric."""
    run_worker(tmp_path, textwrap.dedent(
        """
        import os, sys
        from moss_vl import metrics
        directory = os.environ.pop("PROMETHEUS_MULTIPROC_DIR")
        metrics.set_hooks_applied({"a": True, "b": False})
        metrics.set_plugin_info("0.1.0", "0.5.23", True)
        assert "prometheus_client" not in sys.modules, "imported before the directory existed"
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        metrics.count_prefix_match_dropped()
        """
    ))
    run_worker(tmp_path, textwrap.dedent(
        """
        from moss_vl import metrics
        metrics.set_hooks_applied({"a": True, "b": True})
        metrics.set_plugin_info("0.1.0", "0.5.23", True)
        """
    ))
    samples = collect(tmp_path)
    assert samples['moss_vl:hooks_applied{hook="a"}'] == 1
    assert samples['moss_vl:hooks_applied{hook="b"}'] == 0
    assert samples[
        'moss_vl:plugin_info{sglang_supported="true",sglang_version="0.5.23",version="0.1.0"}'
    ] == 1
