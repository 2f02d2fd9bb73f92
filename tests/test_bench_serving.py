"""`tests/gpu/e2e/bench_serving.py`, the full-scale run's client, against the wire fixture.

Contract: every workload's requests reach the server as OpenAI chat completions
(mixed-decode alternates text-only and single-image requests by seed, at every
concurrency); concurrency 1 sends at least C1_REQUESTS sequential requests; p50 is
the median; `--compare-to` counts, per workload, concurrency and variant, the greedy
texts equal to the baseline variant's for the same request seeds.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "gpu" / "e2e" / "bench_serving.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_serving", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_workloads_reach_the_server_and_are_summarised(bench, fixture_server, tmp_path):
    server = fixture_server(num_tokens=6)
    out = tmp_path / "runs.jsonl"
    assert bench.main(["--url", server.url, "--variant", "a", "--workloads",
                       "text,mixed-decode", "--concurrency", "1,2", "--rounds", "1",
                       "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_key = {(r["workload"], r["concurrency"]): r for r in rows}
    assert set(by_key) == {("text", 1), ("text", 2), ("mixed-decode", 1), ("mixed-decode", 2)}
    assert by_key[("text", 1)]["requests"] == bench.C1_REQUESTS
    assert all(r["ok"] == r["requests"] and not r["errors"] for r in rows)
    for workload in ("mixed-decode",):
        for conc in (1, 2):
            kinds = {key.split(":")[0] for key in by_key[(workload, conc)]["tokens"]}
            assert kinds == {"text", "single-image"}, (workload, conc, kinds)
    chats = server.chat_records()
    with_images = [r for r in chats if r.images]
    assert with_images and all(r.images[0][1:] == (1024, 1024) for r in with_images)
    assert all(r.body["stream"] and r.body["temperature"] == 0 for r in chats)


def test_p50_is_the_median(bench, monkeypatch):
    times = iter([0.1, 0.3])

    class Client:
        def stream(self, messages, max_tokens, ignore_eos=False, logprobs=False):
            return {"status": 200, "ttft_s": next(times), "e2e_s": 1.0, "decode_tok_s": None,
                    "prompt_tokens": 10, "completion_tokens": 1, "text": "x"}

    monkeypatch.setattr(bench, "C1_REQUESTS", 2)
    summary = bench.run(Client(), "text", 1, 1, 4, seed0=0)
    assert (summary["ttft_p50_ms"], summary["ttft_p95_ms"]) == (200.0, 300.0)


def test_compare_counts_equal_texts_per_variant(bench, tmp_path, capsys):
    out = tmp_path / "runs.jsonl"
    rows = [
        {"workload": "text", "concurrency": 8, "variant": "plugin_off",
         "tokens": {"text:1": "a b", "text:2": "c d", "text:3": "e"}},
        {"workload": "text", "concurrency": 8, "variant": "triton",
         "tokens": {"text:1": "a b", "text:2": "c x", "text:3": "e"}},
        {"workload": "video", "concurrency": 1, "variant": "triton", "tokens": {"video:1": "z"}},
    ]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.main(["--out", str(out), "--compare-to", "plugin_off"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [{"workload": "text", "concurrency": 8, "variant": "triton",
                      "baseline": "plugin_off", "compared": 3, "equal": 2,
                      "differ": ["text:2"]}]


def test_logprobs_give_each_token_its_top2_gap(bench, fixture_server, tmp_path):
    server = fixture_server(num_tokens=4)
    plain, with_lp = tmp_path / "plain.jsonl", tmp_path / "lp.jsonl"
    common = ["--url", server.url, "--variant", "a", "--workloads", "text",
              "--concurrency", "1", "--rounds", "1"]
    assert bench.main([*common, "--out", str(plain)]) == 0
    assert bench.main([*common, "--out", str(with_lp), "--logprobs"]) == 0
    (row_plain,) = [json.loads(line) for line in plain.read_text().splitlines()]
    (row,) = [json.loads(line) for line in with_lp.read_text().splitlines()]
    assert "steps" not in row_plain
    assert set(row["steps"]) == set(row["tokens"]) and len(row["steps"]) == bench.C1_REQUESTS
    for key, steps in row["steps"].items():
        # The fixture's token i has a top-2 gap of 0.25 * (i + 1).
        assert steps == [[f" tok{i}", 0.25 * (i + 1)] for i in range(4)], key
        assert "".join(token for token, _gap in steps) == row["tokens"][key]
    bodies = [r.body for r in server.chat_records()]
    asked = [b for b in bodies if b.get("logprobs")]
    # Warm-up requests of both runs are plain; the measured ones of the second ask.
    assert len(asked) == bench.C1_REQUESTS and all(b["top_logprobs"] == 2 for b in asked)


def test_compare_says_where_greedy_paths_part(bench, tmp_path, capsys):
    out = tmp_path / "runs.jsonl"
    base_steps = {"text:1": [["a", 3.0], ["b", 0.01], ["c", 2.0]], "text:2": [["d", 1.0]]}
    rows = [
        {"workload": "text", "concurrency": 1, "variant": "upstream",
         "tokens": {"text:1": "abc", "text:2": "d", "text:3": "e"}, "steps": base_steps},
        {"workload": "text", "concurrency": 1, "variant": "triton",
         "tokens": {"text:1": "axc", "text:2": "d", "text:3": "f"},
         "steps": {"text:1": [["a", 3.0], ["x", 0.02], ["c", 2.0]], "text:2": [["d", 1.0]]}},
    ]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.main(["--out", str(out), "--compare-to", "upstream"]) == 0
    (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert line["differ"] == ["text:1", "text:3"]
    assert line["divergences"] == [
        {"request": "text:1", "position": 1, "tokens": ["b", "x"], "top2_gap": [0.01, 0.02]},
        {"request": "text:3", "position": None, "why": "no logprobs on one side"},
    ]


def test_each_row_carries_the_servers_stage_times(bench, fixture_server, tmp_path):
    """The fixture's scheduler takes 0.5 ms to receive a request, queues nothing and
    prefills for the rest of its first-token delay: the row's means say so."""
    server = fixture_server(num_tokens=2, first_token_delay=0.08)
    out = tmp_path / "runs.jsonl"
    assert bench.main(["--url", server.url, "--variant", "a", "--workloads", "text,single-image",
                       "--concurrency", "1", "--rounds", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        stages = row["server_stages_ms"]
        assert set(stages) == {"request_process", "queue", "prefill_forward", "server_ttft"}
        assert stages["request_process"] == 0.5 and stages["queue"] == 0.0
        assert 79.0 <= stages["prefill_forward"] <= stages["server_ttft"] - 0.5 + 0.1
        # Means over this row's requests only: the warm-up and the other row are not in them.
        assert stages["server_ttft"] < row["ttft_p95_ms"] + 1


def test_stage_totals_sum_label_sets_and_ignore_buckets(bench):
    text = "\n".join([
        "# TYPE sglang:per_stage_req_latency_seconds histogram",
        'sglang:per_stage_req_latency_seconds_bucket{stage="prefill_forward",le="0.1"} 9',
        'sglang:per_stage_req_latency_seconds_sum{tp_rank="0",stage="prefill_forward"} 1.5',
        'sglang:per_stage_req_latency_seconds_count{tp_rank="0",stage="prefill_forward"} 3',
        'sglang:per_stage_req_latency_seconds_sum{tp_rank="1",stage="prefill_forward"} 0.5',
        'sglang:per_stage_req_latency_seconds_count{tp_rank="1",stage="prefill_forward"} 1',
        'sglang:queue_time_seconds_sum{model_name="moss-vl"} 0.2',
        'sglang:queue_time_seconds_count{model_name="moss-vl"} 4',
        'sglang:queue_time_seconds_created{model_name="moss-vl"} 1.7e9',
        'sglang:num_queue_reqs{model_name="moss-vl"} 2',
    ])
    before = bench.stage_totals(text)
    assert before == {"prefill_forward": [2.0, 4.0], "queue": [0.2, 4.0]}
    after = {"prefill_forward": [3.0, 6.0], "queue": [0.2, 4.0], "server_ttft": [0.3, 1.0]}
    # queue saw no new request: no mean for it, rather than a 0 that was not measured.
    assert bench.stage_means_ms(before, after) == {"prefill_forward": 500.0, "server_ttft": 300.0}


def test_video_transcript_shares_the_clip_and_not_the_text(bench):
    (one,) = bench.messages_for("video-transcript", 1)
    (two,) = bench.messages_for("video-transcript", 2)

    def split(message):
        parts = message["content"]
        images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
        texts = [p["text"] for p in parts if p["type"] == "text"]
        return images, texts

    images_1, texts_1 = split(one)
    images_2, texts_2 = split(two)
    assert len(images_1) == 64 and len(set(images_1)) == 64  # 64 distinct frames
    assert images_1 == images_2  # one clip for every request: the encoder cache serves it
    # Per frame: its timestamp, then its subtitle; then the question.
    assert len(texts_1) == 2 * 64 + 1 and texts_1[0].startswith("<|time_start|>0.0 seconds")
    subtitles_1, subtitles_2 = texts_1[1:-1:2], texts_2[1:-1:2]
    assert all(len(s.split()) == bench.TRANSCRIPT_WORDS_PER_FRAME for s in subtitles_1)
    assert all(a != b for a, b in zip(subtitles_1, subtitles_2))
    # Content order: timestamp, frame, subtitle.
    kinds = [p["type"] for p in one["content"][:3]]
    assert kinds == ["text", "image_url", "text"]
    assert "video-transcript" in bench.EXTRA_WORKLOADS


def test_no_two_requests_of_a_run_share_their_text(bench):
    """The seeds of every workload and concurrency level of one run (first_seed) and the
    warm-up's (999_999 - i): all distinct, text bodies and subtitles too, so no request finds another's
    prompt in the radix cache (only the template and, for video-transcript, the shared
    clip before the first subtitle)."""
    def seeds(workload):
        return [bench.first_seed(workload, c) + i for c in (1, 8, 16) for i in range(3 * c if c > 1 else 6)]

    warm_up = [999_999 - i for i in range(16)]
    text_seeds = seeds("text") + warm_up
    bodies = [bench.messages_for("text", s)[0]["content"].split("\n")[0] for s in text_seeds]
    assert len(set(bodies)) == len(text_seeds)
    firsts = [bench.messages_for("video-transcript", s)[0]["content"][2]["text"]
              for s in seeds("video-transcript")[:40]]
    assert len(set(firsts)) == 40
    # mixed-decode's text and image halves are not the text and single-image workloads' requests
    every = [seeds(w) for w in bench.WORKLOADS + bench.EXTRA_WORKLOADS]
    flat = [s for ws in every for s in ws] + warm_up
    assert len(set(flat)) == len(flat)
    assert bench.messages_for("text", 8001) == bench.messages_for("text", 8001)  # deterministic


def test_video_720p_costs_what_docs_video_md_says(bench, tmp_path):
    """The 720p workload is 64 timestamped 1280x720 frames; through the full-size
    checkpoint's processor each is 44x80 patches (720 rounds to 704), so the request
    carries 64 x 881 = 56,384 encoder tokens, the figure docs/video.md quotes."""
    import base64
    import io

    from PIL import Image
    from transformers import AutoProcessor

    from moss_vl.testing.__main__ import main as write_checkpoint

    (message,) = bench.messages_for("video-720p", 3)
    images = [p["image_url"]["url"] for p in message["content"] if p["type"] == "image_url"]
    stamps = [p["text"] for p in message["content"] if p["type"] == "text"][:-1]
    assert len(images) == len(stamps) == 64
    assert stamps[1] == "<|time_start|>0.5 seconds<|time_end|>"
    frames = [Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) for url in images[:2]]
    assert [f.size for f in frames] == [(1280, 720)] * 2
    path = tmp_path / "full-config"
    assert write_checkpoint([str(path), "--size", "full", "--config-only"]) == 0
    processor = AutoProcessor.from_pretrained(path, trust_remote_code=True)
    out = processor.image_processor(images=frames[:1], return_tensors="pt")
    grid = out.get("grid_thw", out.get("image_grid_thw"))
    assert grid.tolist() == [[1, 44, 80]], list(out)
    assert 64 * (44 * 80 // 4 + 1) == 56384
    assert "video-720p" not in bench.WORKLOADS and "video-720p" in bench.EXTRA_WORKLOADS


def test_warm_up_sends_its_requests_at_once_before_the_timed_ones(bench, fixture_server, tmp_path):
    server = fixture_server(num_tokens=2, first_token_delay=0.3)
    assert bench.main(["--url", server.url, "--variant", "a", "--workloads", "text",
                       "--concurrency", "1", "--rounds", "1", "--warmup-concurrency", "3",
                       "--out", str(tmp_path / "runs.jsonl")]) == 0
    chats = server.chat_records()
    assert len(chats) == 3 + bench.C1_REQUESTS
    warm = [r.body["messages"] for r in chats[:3]]
    assert len({json.dumps(m) for m in warm}) == 3  # three different prompts
    # At once: all three were in flight together (each takes 0.3 s to its first token).
    starts = sorted(r.received_at for r in chats[:3])
    assert starts[-1] - starts[0] < 0.3
