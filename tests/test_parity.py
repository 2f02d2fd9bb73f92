"""`python -m moss_vl.parity`: the H200 comparison of the served model and `moss-vl infer`.

The SGLang server cannot start here, so the script is checked against a stand-in for
SGLang's `/generate` (its JSON shape: `meta_info.input_token_logprobs`,
`output_token_logprobs`, `output_top_logprobs` as [logprob, token_id, text]) backed by
the same tiny model. Contract: the script builds at least 16 prompts covering text
only, single image, multi-image and multi-turn with images; it aligns the served
logprobs on the common suffix (a server may report encoder slots first) and passes
when both sides agree; a server that drops the frame-level mask (the Ascend review's
train/inference mismatch) is caught and reported with the position and the top-2 gap;
greedy near-ties are told apart from real divergences.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from PIL import Image

from moss_vl import parity


class GenerateStandIn(BaseHTTPRequestHandler):
    engine = None
    apply_mask = True
    encoder_slots = 0  # leading entries a server may report before the text

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        engine = type(self).engine
        images = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).convert("RGB")
                  for u in body.get("image_data", [])]
        # Videos as SGLang's processor hands them on: the container's bytes.
        videos = [base64.b64decode(u.split(",", 1)[1]) for u in body.get("video_data", [])]
        kwargs = {"text": body["text"], "return_tensors": "pt"}
        if images:
            kwargs["images"] = images
        if videos:
            kwargs["videos"] = videos
        inputs = engine._to_device(engine.processor(**kwargs))
        params = body["sampling_params"]
        ids = inputs["input_ids"][0].tolist()
        with torch.no_grad():
            logits = engine.model(**inputs, apply_cross_attention_mask=self.apply_mask).logits[0]
        lp = torch.log_softmax(logits.float(), -1)
        meta = {}
        if body.get("logprob_start_len") == 0:
            entries = [[None, ids[0], None]] + [[float(lp[i - 1, t]), t, None]
                                                 for i, t in enumerate(ids) if i > 0]
            meta["input_token_logprobs"] = [[None, 0, None]] * self.encoder_slots + entries
        if params["max_new_tokens"] > 1:
            out, lps = engine.model.generate(**inputs, max_new_tokens=params["max_new_tokens"],
                                             eos_token_id=[], output_logprobs=True,
                                             apply_cross_attention_mask=self.apply_mask)
            new = out[0, len(ids):].tolist()
            meta["output_token_logprobs"] = [[p, t, None] for p, t in zip(lps, new)]
            cont = torch.tensor([ids + new])
            mask = inputs.get("cross_attention_mask")
            full = dict(inputs, input_ids=cont, attention_mask=torch.ones_like(cont))
            if mask is not None:
                full["cross_attention_mask"] = torch.cat(
                    [mask, mask[:, :, -1:].expand(-1, -1, len(new), -1)], dim=2)
            with torch.no_grad():
                all_lp = torch.log_softmax(engine.model(**full).logits[0].float(), -1)
            top = all_lp[len(ids) - 1:-1].topk(2, dim=-1)
            meta["output_top_logprobs"] = [
                [[float(v), int(i), None] for v, i in zip(vals, idx)]
                for vals, idx in zip(top.values, top.indices)]
        raw = json.dumps({"text": "", "meta_info": meta}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def stand_in(tiny_engine):
    handler = type("Handler", (GenerateStandIn,), {"engine": tiny_engine})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


ONLY = ["text-short", "multi-turn-images", "frames-as-images-16", "image-then-long-text"]


def run(url, checkpoint, tmp_path, *extra):
    out = tmp_path / "report.json"
    code = parity.main(["--url", url, "--model-path", str(checkpoint), "--device", "cpu",
                        "--dtype", "float32", "--label", "test",
                        "--out", str(out), "--only", *ONLY, *extra])
    return code, json.loads(out.read_text())


def test_builtin_prompts_cover_the_layouts():
    cases = parity.prompts()
    names = [n for n, _ in cases]
    assert parity.pyav_available()  # PyAV is a project dependency: the videos are in
    assert len(cases) >= 24 and len(set(names)) == len(names)
    videos = [len(parity._videos_of(m)) for _, m in cases]
    assert sum(v > 0 for v in videos) >= 6
    images = [len(parity._images_of(m)) for _, m in cases]
    turns = [sum(m["role"] == "user" for m in msgs) for _, msgs in cases]
    assert images.count(0) >= 3 and images.count(1) >= 4 and max(images) >= 4
    assert any(i >= 2 and t >= 2 for i, t in zip(images, turns))  # multi-turn multi-image


def test_agreeing_server_passes(stand_in, tiny_checkpoint, tmp_path):
    handler, url = stand_in
    handler.encoder_slots = 7
    code, report = run(url, tiny_checkpoint, tmp_path, "--greedy-steps", "3")
    assert code == 0, report
    for entry in report["prompts"]:
        assert entry["ok"] and entry["greedy"]["equal"]
        assert entry["teacher_forced"]["max_abs_diff"] < 1e-3
        assert entry["teacher_forced"]["positions"] > 10


def test_a_server_without_the_mask_is_caught(stand_in, tiny_checkpoint, tmp_path):
    handler, url = stand_in
    handler.apply_mask = False
    code, report = run(url, tiny_checkpoint, tmp_path, "--logprob-tol", "1e-4",
                       "--greedy-steps", "0")
    assert code == 1
    by_name = {e["name"]: e for e in report["prompts"]}
    assert by_name["text-short"]["ok"]  # no image, no mask to drop
    bad = by_name["multi-turn-images"]["teacher_forced"]
    assert not bad["ok"] and bad["max_abs_diff"] > 1e-3 and bad["worst_position"] is not None
    # 16 frames, each behind its timestamp: the staircase, dropped, is seen too
    assert not by_name["frames-as-images-16"]["ok"]


def test_tolerances_scale_with_the_recorded_lm_head_factor(stand_in, tiny_checkpoint, tmp_path):
    """The same mask-less server as above, against the same weights recorded with an LM
    head x10000: every difference is read in unscaled units, so 1e-4 becomes 1.0."""
    import shutil

    from moss_vl.testing.checkpoint import write_generator_record

    handler, url = stand_in
    handler.apply_mask = False
    scaled = tmp_path / "scaled"
    shutil.copytree(tiny_checkpoint, scaled)
    write_generator_record(scaled, seed=0, lm_head_scale=1e4)
    code, report = run(url, scaled, tmp_path, "--logprob-tol", "1e-4", "--greedy-steps", "0")
    assert (report["lm_head_scale"], report["logprob_tol"]) == (1e4, pytest.approx(1.0))
    bad = {e["name"]: e for e in report["prompts"]}["multi-turn-images"]["teacher_forced"]
    assert 1e-3 < bad["max_abs_diff"] < 1.0
    assert bad["max_abs_diff_unscaled"] == pytest.approx(bad["max_abs_diff"] / 1e4)
    assert code == 0, report


def test_video_prompts_agree_and_need_the_mask(stand_in, tiny_checkpoint, tmp_path):
    """Videos go to /generate as `video_data` (data URLs, prompt order) next to
    `image_data`; a server that ignores the frame-level mask is caught on them."""
    pytest.importorskip("av")
    cases = dict(parity.video_prompts())
    assert {len(parity._videos_of(m)) for m in cases.values()} == {1, 2}
    assert any(parity._images_of(m) and parity._videos_of(m) for m in cases.values())
    handler, url = stand_in
    code, report = run(url, tiny_checkpoint, tmp_path, "--greedy-steps", "2", "--only", "video-")
    assert code == 0, report
    assert [e["name"] for e in report["prompts"]] == list(cases)
    assert all(e["videos"] >= 1 and e["teacher_forced"]["max_abs_diff"] < 1e-3
               for e in report["prompts"])
    handler.apply_mask = False
    code, report = run(url, tiny_checkpoint, tmp_path, "--logprob-tol", "1e-4",
                       "--greedy-steps", "0", "--only", "video-")
    assert code == 1
    assert not {e["name"]: e for e in report["prompts"]}["video-question-first"]["ok"]


def test_greedy_divergence_is_explained():
    tie = parity.compare_greedy([5, 6, 7], [0.5, 0.01, 0.3], [5, 9, 7],
                                [[[-1, 5, None], [-2, 4, None]], [[-1, 9, None], [-1.01, 6, None]]],
                                tie_gap=0.05)
    assert tie == {"equal": False, "diverged_at": 1, "hf_token": 6, "served_token": 9,
                   "hf_top2_gap": 0.01, "served_top2_gap": pytest.approx(0.01), "near_tie": True}
    real = parity.compare_greedy([5, 6], [0.5, 2.0], [5, 9], [], tie_gap=0.05)
    assert real["near_tie"] is False and real["diverged_at"] == 1
