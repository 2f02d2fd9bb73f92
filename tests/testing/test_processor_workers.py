"""MOSS-VL requests on SGLang's multimodal processor workers, off the tokenizer's event loop.

Contract (hook moss_vl_processor.process_off_the_event_loop, both SGLang lines): upstream
runs MOSS-VL's image processor synchronously inside the request's coroutine, on the
tokenizer process's one event loop, so concurrent requests go through the processor
one at a time and SGLang's `--mm-processor-worker-num` does nothing for MOSS-VL. With
the plugin and more than one worker, each request runs on a worker thread with that
thread's processor clone (never the shared instance), several run through the
processor at once, and each reaches the scheduler hand-off with exactly the input ids
of a request processed alone. One worker keeps upstream's path.

Driven through SGLang's own HTTP route, TokenizerManager and MossVLImageProcessor
(tests/testing/sglang_video_probe.py); four identical requests at once on one event
loop, the processor call stretched by 0.3 s so that overlap does not depend on timing.
"""

from __future__ import annotations

import pytest
from sglang_video_probe import run_in_child

AT_ONCE = 4
pytestmark = pytest.mark.slow

CASE = {"turns": [{"role": "user", "parts": [
    {"type": "image", "file": "red.png", "mime": "image/png", "as": "data"},
    {"type": "text", "text": "What colour is it?"}]}]}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from PIL import Image

    from moss_vl.testing import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-moss-vl-workers"))
    directory = tmp_path_factory.mktemp("media")
    Image.new("RGB", (96, 64), (200, 30, 30)).save(directory / "red.png")
    return checkpoint, directory


def run_probe(workdir, name: str, plugins: str, workers: int) -> dict:
    checkpoint, directory = workdir
    run_dir = directory / name
    run_dir.mkdir()
    (run_dir / "red.png").write_bytes((directory / "red.png").read_bytes())
    spec = {"video_limits": {}, "good": {"image": CASE}, "bad": {},
            "mm_processor_worker_num": workers, "processor_delay_s": 0.3,
            "concurrent": {"case": "image", "count": AT_ONCE}}
    try:
        return run_in_child(checkpoint, run_dir, spec,
                            {"TMPDIR": str(run_dir), "SGLANG_PLUGINS": plugins})
    except RuntimeError as err:
        pytest.fail(str(err))


def check_all_handed_off(out: dict) -> list[dict]:
    concurrent = out["concurrent"]
    assert concurrent["handed_off"] == [True] * AT_ONCE, concurrent["statuses"]
    alone = out["good"]["image"]["input_ids"]
    assert concurrent["input_ids"] == [alone] * AT_ONCE
    calls = concurrent["processor_calls"]
    assert len(calls) == AT_ONCE
    return calls


def test_with_workers_requests_overlap_on_worker_clones(workdir):
    out = run_probe(workdir, "plugin-2-workers", "moss_vl", 2)
    alone = out["good"]["image"]["processor_calls"]
    assert [c["thread"].startswith("sglang-mm-processor") for c in alone] == [True]
    calls = check_all_handed_off(out)
    assert all(c["thread"].startswith("sglang-mm-processor") and not c["shared"] for c in calls)
    assert max(c["at_once"] for c in calls) == 2  # the two workers, both busy


def test_upstream_processes_concurrent_requests_one_at_a_time(workdir):
    """The bug: SGLang's worker count has no effect on MOSS-VL without the plugin."""
    out = run_probe(workdir, "upstream-2-workers", "none", 2)
    calls = check_all_handed_off(out)
    assert max(c["at_once"] for c in calls) == 1
    assert all(c["shared"] for c in calls)


def test_one_worker_keeps_upstreams_path(workdir):
    out = run_probe(workdir, "plugin-1-worker", "moss_vl", 1)
    calls = check_all_handed_off(out)
    assert max(c["at_once"] for c in calls) == 1
    assert all(c["shared"] and not c["thread"].startswith("sglang-mm-processor")
               for c in calls)
