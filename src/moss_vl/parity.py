"""Served model vs `moss-vl infer`: teacher-forced logprobs and greedy tokens (H200 lane).

    python -m moss_vl.parity --url http://127.0.0.1:30000 --model-path CKPT \\
        --label staircase --out parity-staircase.json

For each of the built-in prompts (text only, single image, multi-image, multi-turn
with images; videos, single and several, next to images and across turns, when PyAV
is installed to write them) the script:

1. teacher forcing: sends prompt + a fixed continuation to SGLang's `/generate` with
   `return_logprob` and `logprob_start_len=0` and scores the same text with the
   transformers model of `moss_vl.infer` (the checkpoint's own modeling file); it
   compares the per-position logprobs of every token after the first (prompt and
   continuation) and reports max |difference| per prompt;
2. greedy: asks both for `--greedy-steps` tokens at temperature 0 (EOS ignored) and
   compares them token by token. A divergence is reported with its position, both
   tokens and the top-2 logprob gap of both sides there: a gap below `--tie-gap` is a
   near-tie (bf16 rounding decides it, no bug); above it, the divergence is a finding.

Random weights give nearly uniform next-token distributions (near-ties everywhere):
serve a checkpoint written with `python -m moss_vl.testing PATH --lm-head-scale 50`
for the greedy check. That factor multiplies every logit, and with it the rounding
differences between the two engines: `--logprob-tol` and `--tie-gap` are given for the
unscaled model and multiplied by the factor the checkpoint records
(`moss_vl_testing.json`; 1 for any other checkpoint). Exit 0 when every prompt is
within the tolerance and every greedy divergence is a near-tie; 1 otherwise; 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import urllib.error
import urllib.request

CONTINUATION = " The picture shows a red square on a white background, next to a blue circle."


# ---- prompts ---------------------------------------------------------------------------


def _png(width: int, height: int, seed: int) -> str:
    """A deterministic PNG data URL: coloured shapes on a gradient (no randomness libs)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height))
    pixels = image.load()
    for y in range(height):
        for x in range(width):
            pixels[x, y] = ((x * 255 // max(1, width - 1) + seed * 40) % 256,
                            (y * 255 // max(1, height - 1) + seed * 70) % 256,
                            (seed * 90) % 256)
    draw = ImageDraw.Draw(image)
    draw.rectangle([width // 5, height // 5, width // 2, height // 2], fill=(220, 30, 30))
    draw.ellipse([width // 2, height // 2, width - 4, height - 4], fill=(30, 60, 220))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _img(width, height, seed):
    return {"type": "image_url", "image_url": {"url": _png(width, height, seed)}}


def _text(text):
    return {"type": "text", "text": text}


def _mp4(seed: int, frames: int, width: int, height: int) -> str:
    """A deterministic H.264/MP4 data URL (2 fps, so the processor keeps every frame)."""
    import tempfile
    from pathlib import Path

    from moss_vl.testing.videos import write_video

    with tempfile.TemporaryDirectory(prefix="moss-vl-parity-") as tmp:
        path = write_video(Path(tmp) / "clip.mp4", codec="h264", width=width, height=height,
                           fps=2, frames=frames, grain=6, seed=seed)
        return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()


def _video(seed, frames=6, width=96, height=64):
    return {"type": "video_url", "video_url": {"url": _mp4(seed, frames, width, height)}}


def pyav_available() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def prompts() -> list[tuple[str, list]]:
    """(name, messages): 19, and 6 videos more with PyAV (25: the full-scale issue asks
    for at least 24), covering every layout the mask has to get right."""
    user = "user"
    cases = [
        ("text-short", [{"role": user, "content": "Hello, who are you?"}]),
        ("text-system", [{"role": "system", "content": "You answer briefly."},
                         {"role": user, "content": "Name three colours."}]),
        ("text-multi-turn", [{"role": user, "content": "Count to three."},
                             {"role": "assistant", "content": "One, two, three."},
                             {"role": user, "content": "Now backwards."}]),
    ]
    for i, (w, h) in enumerate([(128, 128), (256, 192), (160, 320), (512, 384)]):
        cases.append((f"image-{w}x{h}", [{"role": user, "content": [
            _img(w, h, i), _text("Describe this image.")]}]))
    cases.append(("image-after-text", [{"role": user, "content": [
        _text("Look at the following picture carefully:"), _img(192, 192, 5),
        _text("What shapes are in it?")]}]))
    for n in (2, 3, 4):
        content = []
        for k in range(n):
            content += [_text(f"Image {k + 1}:"), _img(128 + 32 * k, 160, 10 + k)]
        content.append(_text("Which image is the brightest?"))
        cases.append((f"multi-image-{n}", [{"role": user, "content": content}]))
    cases.append(("multi-turn-images", [
        {"role": user, "content": [_img(192, 128, 20), _text("What is this?")]},
        {"role": "assistant", "content": "A red square and a blue circle."},
        {"role": user, "content": [_img(128, 192, 21), _text("And this one? Compare.")]}]))
    cases.append(("multi-turn-images-3", [
        {"role": user, "content": [_img(128, 128, 22), _text("First."), _img(160, 128, 23)]},
        {"role": "assistant", "content": "Noted."},
        {"role": user, "content": [_text("Second:"), _img(128, 160, 24)]},
        {"role": "assistant", "content": "Noted again."},
        {"role": user, "content": [_img(192, 192, 25), _text("Summarise all four.")]}]))
    cases.append(("text-then-image-turn", [
        {"role": user, "content": "I will show you a picture next."},
        {"role": "assistant", "content": "Go ahead."},
        {"role": user, "content": [_img(256, 256, 26), _text("Here it is.")]}]))
    cases.append(("system-and-images", [
        {"role": "system", "content": "Describe images in one sentence."},
        {"role": user, "content": [_img(224, 160, 27), _img(160, 224, 28)]}]))
    cases.append(("text-long", [{"role": user, "content": " ".join(
        f"Sentence {i} talks about the weather on day {i}." for i in range(40))}]))
    cases.append(("image-wide-then-question-turn", [
        {"role": user, "content": [_img(640, 128, 29)]},
        {"role": "assistant", "content": "A wide strip."},
        {"role": user, "content": "What colour is on the left?"}]))
    # A sampled video as clients without video_url send it: each frame an image behind
    # its timestamp text, MOSS-VL's own layout; 16 steps of the staircase.
    frames = []
    for k in range(16):
        frames += [_text(f"<|time_start|>{k * 0.5:.1f} seconds<|time_end|>"),
                   _img(96, 64, 30 + k)]
    cases.append(("frames-as-images-16", [{"role": user, "content": [
        *frames, _text("What changes from frame to frame?")]}]))
    cases.append(("image-then-long-text", [{"role": user, "content": [
        _img(192, 160, 50), _text(" ".join(
            f"Point {i}: say whether the picture shows item {i}." for i in range(30)))]}]))
    if pyav_available():
        cases += video_prompts()
    return cases


def video_prompts() -> list[tuple[str, list]]:
    """Videos as clients send them (`video_url` data URLs): every frame is one step of the
    staircase, so text between and after frames checks the mask frame by frame."""
    user = "user"
    return [
        ("video-one", [{"role": user, "content": [_video(40), _text("What happens here?")]}]),
        ("video-question-first", [{"role": user, "content": [
            _text("Watch the clip and count the moves:"), _video(41, frames=8, width=64,
                                                                  height=96),
            _text("How many?")]}]),
        ("video-two-in-one-message", [{"role": user, "content": [
            _text("First clip:"), _video(42, frames=4), _text("Second clip:"),
            _video(43, frames=5, width=64, height=64), _text("Which one is brighter?")]}]),
        ("video-then-image-turn", [
            {"role": user, "content": [_video(44), _text("Describe the clip.")]},
            {"role": "assistant", "content": "A red block moves across a grey background."},
            {"role": user, "content": [_img(160, 128, 45), _text("Is this frame from it?")]}]),
        # Many rows after the last frame: the rows that see every frame dominate.
        ("video-then-long-question", [{"role": user, "content": [
            _video(46, frames=8), _text(" ".join(
                f"Question {i}: what happens at step {i} of the clip?" for i in range(30)))]}]),
        ("video-images-text-turns", [
            {"role": user, "content": [_video(47, frames=4), _text("Remember this clip.")]},
            {"role": "assistant", "content": "Remembered."},
            {"role": user, "content": [_img(128, 96, 48), _img(96, 128, 49),
                                       _text("Which of these frames is from the clip?")]},
            {"role": "assistant", "content": "The first one."},
            {"role": user, "content": "Why?"}]),
    ]


# ---- the two sides ---------------------------------------------------------------------


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"POST {url}: HTTP {err.code}: {err.read()[:500]!r}") from None


def _parts_of(messages, kind: str) -> list[str]:
    return [p[kind]["url"] for m in messages if isinstance(m["content"], list)
            for p in m["content"] if p.get("type") == kind]


def _images_of(messages) -> list[str]:
    return _parts_of(messages, "image_url")


def _videos_of(messages) -> list[str]:
    return _parts_of(messages, "video_url")


_PLACEHOLDERS = {"image_url": {"type": "image"}, "video_url": {"type": "video"}}


def _template_messages(messages):
    return [m if isinstance(m["content"], str) else
            {**m, "content": [_PLACEHOLDERS.get(p.get("type"), p) for p in m["content"]]}
            for m in messages]


def _media(body: dict, media: dict) -> dict:
    """/generate's image_data / video_data, each in prompt order, only when present."""
    body.update({key: urls for key, urls in media.items() if urls})
    return body


def served_logprobs(url, text, media, timeout) -> tuple[list[int], list[float | None]]:
    body = _media({"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                   "return_logprob": True, "logprob_start_len": 0}, media)
    meta = _post(f"{url}/generate", body, timeout)["meta_info"]
    entries = meta["input_token_logprobs"]
    return [int(e[1]) for e in entries], [None if e[0] is None else float(e[0]) for e in entries]


def served_greedy(url, text, media, steps, timeout) -> tuple[list[int], list]:
    body = _media({"text": text, "return_logprob": True, "top_logprobs_num": 2,
                   "sampling_params": {"max_new_tokens": steps, "temperature": 0,
                                       "ignore_eos": True}}, media)
    meta = _post(f"{url}/generate", body, timeout)["meta_info"]
    ids = [int(e[1]) for e in meta["output_token_logprobs"]]
    return ids, meta.get("output_top_logprobs") or []


def compare_teacher_forced(hf_ids, hf_lp, sg_ids, sg_lp) -> dict:
    """Align on the common suffix of token ids (the server may prepend encoder slots)."""
    n = min(len(hf_ids), len(sg_ids))
    if hf_ids[-n:] != sg_ids[-n:]:
        first = next(i for i in range(1, n + 1) if hf_ids[-i] != sg_ids[-i])
        return {"ok": False, "error": f"token ids differ {first} positions from the end"}
    diffs = [(len(hf_ids) - n + i, abs(a - b))
             for i, (a, b) in enumerate(zip(hf_lp[-n:], sg_lp[-n:]))
             if a is not None and b is not None]
    worst = max(diffs, key=lambda d: d[1]) if diffs else (None, 0.0)
    return {"positions": len(diffs), "max_abs_diff": worst[1], "worst_position": worst[0],
            "mean_abs_diff": sum(d for _, d in diffs) / max(1, len(diffs))}


def compare_greedy(hf_ids, hf_gaps, sg_ids, sg_top, tie_gap) -> dict:
    for k, (a, b) in enumerate(zip(hf_ids, sg_ids)):
        if a == b:
            continue
        sg_gap = None
        if k < len(sg_top) and sg_top[k] and len(sg_top[k]) >= 2:
            sg_gap = float(sg_top[k][0][0]) - float(sg_top[k][1][0])
        hf_gap = hf_gaps[k]
        near_tie = hf_gap is not None and hf_gap < tie_gap
        return {"equal": False, "diverged_at": k, "hf_token": a, "served_token": b,
                "hf_top2_gap": hf_gap, "served_top2_gap": sg_gap, "near_tie": near_tie}
    if len(hf_ids) != len(sg_ids):
        return {"equal": False, "diverged_at": min(len(hf_ids), len(sg_ids)),
                "near_tie": False, "error": f"lengths {len(hf_ids)} vs {len(sg_ids)}"}
    return {"equal": True, "steps": len(hf_ids)}


def greedy(engine, messages, prompt_text, media, args, tie_gap: float) -> dict:
    import torch

    inputs = engine.prepare(messages)
    prompt_len = inputs["input_ids"].shape[1]
    with torch.no_grad():
        ids = engine.model.generate(**inputs, max_new_tokens=args.greedy_steps, eos_token_id=[])
    hf_ids = ids[0, prompt_len:].tolist()
    gaps = engine.score(messages, continuation=hf_ids)["top2_gap"][prompt_len:]
    served_ids, served_top = served_greedy(args.url, prompt_text, media, args.greedy_steps,
                                           args.timeout)
    return compare_greedy(hf_ids, gaps, served_ids, served_top, tie_gap)


def run(args) -> int:
    from moss_vl.infer import InferError, load_engine

    try:
        engine = load_engine(args.model_path, device=args.device, attn_impl=args.attn_impl,
                             dtype=args.dtype, warn=lambda m: print(f"warning: {m}",
                                                                    file=sys.stderr))
    except InferError as err:
        print(f"moss-vl parity: {err}", file=sys.stderr)
        return 2
    from moss_vl.testing.checkpoint import lm_head_scale_of

    scale = lm_head_scale_of(args.model_path)
    logprob_tol, tie_gap = args.logprob_tol * scale, args.tie_gap * scale
    cases = prompts()
    if not pyav_available():
        print("moss-vl parity: PyAV is not installed: the video prompts are left out "
              "(pip install av)", file=sys.stderr)
    if args.only:
        cases = [c for c in cases if any(o in c[0] for o in args.only)]
    report = {"label": args.label, "url": args.url, "model_path": args.model_path,
              "device": engine.device, "attn_implementation": engine.attn_implementation,
              "dtype": str(engine.dtype), "lm_head_scale": scale,
              "logprob_tol": logprob_tol, "tie_gap": tie_gap,
              "logprob_tol_unscaled": args.logprob_tol, "tie_gap_unscaled": args.tie_gap,
              "prompts": []}
    failures = 0
    for name, messages in cases:
        media = {"image_data": _images_of(messages), "video_data": _videos_of(messages)}
        prompt_text = engine.processor.apply_chat_template(
            _template_messages(messages), add_generation_prompt=True, tokenize=False)
        entry = {"name": name, "images": len(media["image_data"]),
                 "videos": len(media["video_data"])}
        try:
            scored = engine.score(messages, continuation=CONTINUATION)
            sg_ids, sg_lp = served_logprobs(args.url, prompt_text + CONTINUATION, media,
                                            args.timeout)
            tf = compare_teacher_forced(scored["input_ids"], scored["token_logprobs"],
                                        sg_ids, sg_lp)
            tf["ok"] = tf.get("ok", True) and tf.get("max_abs_diff", 0.0) <= logprob_tol
            if "max_abs_diff" in tf:
                tf["max_abs_diff_unscaled"] = tf["max_abs_diff"] / scale
            entry["teacher_forced"] = tf

            if args.greedy_steps > 0:
                entry["greedy"] = greedy(engine, messages, prompt_text, media, args, tie_gap)
            else:
                entry["greedy"] = {"equal": True, "steps": 0}
        except (RuntimeError, OSError, InferError, KeyError) as err:
            entry["error"] = str(err)
        ok = ("error" not in entry and entry["teacher_forced"]["ok"]
              and (entry["greedy"]["equal"] or entry["greedy"]["near_tie"]))
        entry["ok"] = ok
        failures += not ok
        report["prompts"].append(entry)
        tf, gr = entry.get("teacher_forced", {}), entry.get("greedy", {})
        greedy_text = ("equal" if gr.get("equal") else
                       f"diverged at {gr.get('diverged_at')} (top-2 gap "
                       f"{gr.get('hf_top2_gap')}, near-tie={gr.get('near_tie')})") if gr else "-"
        print(f"{'ok  ' if ok else 'FAIL'} {name:24s} max|dlogprob|="
              f"{tf.get('max_abs_diff', float('nan')):.4f} over {tf.get('positions', 0)} "
              f"positions; greedy {greedy_text}{'; ' + entry['error'] if 'error' in entry else ''}",
              flush=True)
    report["failures"] = failures
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    print(f"moss-vl parity [{args.label}]: {len(cases) - failures}/{len(cases)} prompts agree "
          f"(LM head x{scale:g}: |dlogprob| <= {logprob_tol:g}, near-tie gap < {tie_gap:g})")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moss_vl.parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the SGLang server (http://host:port)")
    parser.add_argument("--model-path", required=True, help="the checkpoint the server serves")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "npu", "cpu"))
    parser.add_argument("--attn-impl", default="auto",
                        choices=("auto", "eager", "sdpa", "flash_attention_2"))
    parser.add_argument("--dtype", default="bfloat16",
                        choices=("auto", "bfloat16", "float16", "float32"),
                        help="the served dtype (default bfloat16)")
    parser.add_argument("--label", default="", help="names the server setup in the report")
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--greedy-steps", type=int, default=32, help="0: teacher forcing only")
    parser.add_argument("--logprob-tol", type=float, default=0.05,
                        help="max |logprob difference| accepted (bf16 rounding), for the "
                             "unscaled model: times the checkpoint's LM-head factor")
    parser.add_argument("--tie-gap", type=float, default=0.05,
                        help="a greedy divergence where the top-2 gap is below this is a "
                             "near-tie; times the checkpoint's LM-head factor")
    parser.add_argument("--only", nargs="*", help="run prompts whose name contains one of these")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
