#!/usr/bin/env python3
"""Workloads shaped like real MOSS-VL prompts, against a running server: TTFT and decode rates.

Used by run-full-scale.sh on the H200 (the 11B architecture with random weights);
standard library plus Pillow (both on the GPU image). Every request is an OpenAI
chat completion, streamed, so TTFT is what a client sees.

  single-image   one 1024x1024 image and a question
  multi-turn     a 4-turn chat, an image (768x768) added in every user turn
  video          64 frames of 448x448, each behind its timestamp text, as MOSS-VL
                 lays a sampled video out, then the question
  text           ~3,400 tokens of text, no image
  mixed-decode   half text-only, half single-image requests at once (alternating
                 by request seed), 128 tokens each with ignore_eos: the decode batch
                 mixes both kinds
  video-720p     (by name only) as video, 64 frames of 1280x720: 56,384 encoder
                 tokens, so the server needs --context-length 65536
  video-transcript (by name only) one 64-frame 448x448 clip for every request,
                 each frame followed by its subtitle text (16 words, the request's
                 own): the encoder cache serves the ViT, the text rows see a
                 growing prefix of the frames (cross-attention's largest share)

For each workload and concurrency: TTFT p50/p95 (at concurrency 1 at least
C1_REQUESTS sequential requests), prefill tokens/s (prompt tokens over TTFT), decode
tokens/s per request (tokens after the first over the time after the first),
aggregate output tokens/s, SGLang's own mean time per request in each stage it
measures (`server_stages_ms`, from /metrics before and after: request_process,
queue, prefill_forward, server_ttft), and the greedy texts of each request (`--compare-to`
compares them between variants; with `--logprobs` also the first divergent position
and the top-2 logprob gap there on both sides). Images differ per request (a seed per request)
so that every request encodes its own images, as distinct users' do.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import math
import re
import statistics
import sys
import threading
import time
import urllib.parse

WORKLOADS = ("single-image", "multi-turn", "video", "text", "mixed-decode")
# Asked for by name only: 64 frames of 720p are 56,384 encoder tokens, past the
# default runs' --context-length 32768 (run-full-scale.sh: FULL_CONTEXT_LENGTH);
# video-transcript (~22k prompt tokens) is the staircase's case, for its own runs.
EXTRA_WORKLOADS = ("video-720p", "video-transcript")
# video-transcript: the frames every request shares (one clip, many users), so that
# SGLang's encoder cache serves the ViT and prefill is the decoder's.
TRANSCRIPT_WORDS_PER_FRAME = 16
C1_REQUESTS = 6  # at least this many sequential requests at concurrency 1


def first_seed(workload: str, concurrency: int) -> int:
    """The first request seed of a workload at a concurrency level: a million apart per
    workload, a thousand per level, so that no two requests of a run are the same prompt
    (mixed-decode's text and image halves included) and the radix cache serves none of
    them from another's."""
    return 1_000_000 * (1 + (WORKLOADS + EXTRA_WORKLOADS).index(workload)) + 1000 * concurrency


def image_uri(width: int, height: int, seed: int) -> str:
    import random

    from PIL import Image

    rng = random.Random(seed)
    # Blocks of colour, not noise: JPEG sizes stay realistic (noise would be 10x larger).
    img = Image.new("RGB", (width, height))
    step = 32
    for y in range(0, height, step):
        for x in range(0, width, step):
            img.paste((rng.randrange(256), rng.randrange(256), rng.randrange(256)),
                      (x, y, min(x + step, width), min(y + step, height)))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def image(width, height, seed):
    return {"type": "image_url", "image_url": {"url": image_uri(width, height, seed)}}


def text(t):
    return {"type": "text", "text": t}


def words(n: int, *key) -> str:
    """``n`` words drawn from the whole of ``key`` (a request's seed, a frame): two
    requests of a run never share them, so the radix cache finds no common prefix
    past the prompt's template. (Until 2026-12-02 the words came from the seed
    modulo 1000 and every workload's seeds were 1000 * concurrency + i: the levels
    collided, half the text requests at 16 were cache hits of those at 8, and
    mixed-decode repeated the text and single-image workloads' prompts.)"""
    import random

    rng = random.Random(":".join(map(str, key)))
    return " ".join(f"word{rng.randrange(1000)}" for _ in range(n))


def messages_for(workload: str, seed: int) -> list[dict]:
    question = f"Request {seed}: describe what you see in detail, then summarise it."
    if workload == "single-image":
        return [{"role": "user", "content": [image(1024, 1024, seed), text(question)]}]
    if workload == "multi-turn":
        msgs = []
        for turn in range(4):
            msgs.append({"role": "user",
                         "content": [image(768, 768, seed * 10 + turn), text(f"Turn {turn}: {question}")]})
            if turn < 3:
                msgs.append({"role": "assistant", "content": f"Answer {turn}: " + "w " * 40})
        return msgs
    if workload in ("video", "video-720p"):
        # 64 sampled frames as MOSS-VL lays a video out: each frame's timestamp, then it.
        width, height = (448, 448) if workload == "video" else (1280, 720)
        parts = []
        for frame in range(64):
            parts.append(text(f"<|time_start|>{frame * 0.5:.1f} seconds<|time_end|>"))
            parts.append(image(width, height, seed * 100 + frame))
        parts.append(text(question))
        return [{"role": "user", "content": parts}]
    if workload == "video-transcript":
        # A clip with its subtitles: each frame behind its timestamp, then what is
        # said there; the clip is every request's, the transcript and question their
        # own. The text rows after frame f see f + 1 frames: the staircase with the
        # most cross-attention work per prefill among these workloads.
        parts = []
        for frame in range(64):
            parts.append(text(f"<|time_start|>{frame * 0.5:.1f} seconds<|time_end|>"))
            parts.append(image(448, 448, 7_000_000 + frame))
            parts.append(text(words(TRANSCRIPT_WORDS_PER_FRAME, seed, frame)))
        parts.append(text(question))
        return [{"role": "user", "content": parts}]
    if workload == "text":
        return [{"role": "user", "content": words(420, seed) + "\n" + question}]
    raise ValueError(workload)


class Client:
    def __init__(self, url: str, model: str, timeout: float):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.model, self.timeout = model, timeout

    def metrics(self) -> str:
        """The server's /metrics text ("" when it has none to give)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            body = resp.read().decode(errors="replace")
            return body if resp.status == 200 else ""
        except OSError:
            return ""
        finally:
            conn.close()

    def stream(self, messages, max_tokens: int, ignore_eos: bool = False,
               logprobs: bool = False) -> dict:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        if ignore_eos:
            body["ignore_eos"] = True
        if logprobs:
            body["logprobs"], body["top_logprobs"] = True, 2
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            detail = resp.read()[:300]
            conn.close()
            return {"status": resp.status, "error": detail.decode(errors="replace")}
        first = last = None
        pieces, usage, steps = [], None, []
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                for entry in (choice.get("logprobs") or {}).get("content") or ():
                    steps.append(token_step(entry))
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    pieces.append(piece)
        conn.close()
        end = time.perf_counter()
        usage = usage or {}
        out = usage.get("completion_tokens") or 0
        return {
            "status": 200,
            "ttft_s": (first - start) if first else None,
            "e2e_s": end - start,
            "decode_tok_s": ((out - 1) / (last - first)) if first and last and last > first and out > 1 else None,
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": out,
            "text": "".join(pieces),
            "steps": steps,
        }


# SGLang's own per-request timing, summed over label sets: the scheduler's stage
# histogram (request_process: received to queued; prefill_forward: the prefill
# batch, ViT included), its queue time, and the tokenizer manager's time to first
# token. Where a client's TTFT goes: server TTFT minus the three is the tokenizer
# side (media decode, processor, hashing, hand-off) and transport.
STAGE_SERIES = {
    "sglang:per_stage_req_latency_seconds": None,  # keyed by its stage label
    "sglang:queue_time_seconds": "queue",
    "sglang:time_to_first_token_seconds": "server_ttft",
}
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)_(?P<part>sum|count)"
                     r"(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def stage_totals(text: str) -> dict[str, list[float]]:
    """{stage: [sum of seconds, count]} from a /metrics exposition."""
    totals: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m["name"] not in STAGE_SERIES:
            continue
        key = STAGE_SERIES[m["name"]]
        if key is None:
            stage = re.search(r'stage="([^"]*)"', m["labels"] or "")
            if not stage:
                continue
            key = stage[1]
        totals.setdefault(key, [0.0, 0.0])[0 if m["part"] == "sum" else 1] += float(m["value"])
    return totals


def stage_means_ms(before: dict, after: dict) -> dict[str, float]:
    """Mean milliseconds per observation of each stage between two snapshots."""
    means = {}
    for key, (total, count) in sorted(after.items()):
        total0, count0 = before.get(key, (0.0, 0.0))
        if count > count0:
            means[key] = round(1000 * (total - total0) / (count - count0), 1)
    return means


def token_step(entry: dict) -> list:
    """[token, top-1 minus top-2 logprob] of one generated token (OpenAI's
    `logprobs.content` entry); the gap is None without two alternatives."""
    top = sorted((t["logprob"] for t in entry.get("top_logprobs") or ()), reverse=True)
    gap = round(top[0] - top[1], 4) if len(top) >= 2 else None
    return [entry["token"], gap]


def run(client: Client, workload: str, concurrency: int, rounds: int, max_tokens: int,
        seed0: int, logprobs: bool = False) -> dict:
    results: list[dict] = []
    lock = threading.Lock()

    def one(seed: int, kind: str):
        msgs = messages_for(kind, seed)
        r = client.stream(msgs, max_tokens, ignore_eos=(workload == "mixed-decode"),
                          logprobs=logprobs)
        r["seed"], r["kind"] = seed, kind
        with lock:
            results.append(r)

    wall_start = time.perf_counter()
    if concurrency == 1:
        # Sequential requests are cheap and a p50 of two says little.
        rounds = max(rounds, C1_REQUESTS)
    for rnd in range(rounds):
        threads = []
        for i in range(concurrency):
            seed = seed0 + rnd * concurrency + i
            kind = workload
            if workload == "mixed-decode":
                kind = "text" if seed % 2 == 0 else "single-image"
            threads.append(threading.Thread(target=one, args=(seed, kind)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - wall_start
    ok = [r for r in results if r["status"] == 200 and r["ttft_s"] is not None]
    ttfts = sorted(r["ttft_s"] for r in ok)

    def pct(values, q):
        # p50 the median; other quantiles by nearest rank (p95 of 16 is the 16th value).
        if not values:
            return None
        if q == 0.5:
            return statistics.median(values)
        return values[max(0, math.ceil(q * len(values)) - 1)]

    decode = [r["decode_tok_s"] for r in ok if r["decode_tok_s"]]
    summary = {
        "workload": workload, "concurrency": concurrency, "requests": len(results),
        "ok": len(ok), "errors": [r.get("error") for r in results if r["status"] != 200][:3],
        "ttft_p50_ms": round(1000 * pct(ttfts, 0.5), 1) if ttfts else None,
        "ttft_p95_ms": round(1000 * pct(ttfts, 0.95), 1) if ttfts else None,
        "prompt_tokens_p50": statistics.median([r["prompt_tokens"] or 0 for r in ok]) if ok else None,
        "prefill_tok_s_p50": (statistics.median([(r["prompt_tokens"] or 0) / r["ttft_s"] for r in ok])
                              if ok else None),
        "decode_tok_s_p50": round(statistics.median(decode), 1) if decode else None,
        "output_tok_s": round(sum(r["completion_tokens"] for r in ok) / wall, 1),
        "tokens": {f"{r['kind']}:{r['seed']}": r["text"] for r in ok},
    }
    if logprobs:
        summary["steps"] = {f"{r['kind']}:{r['seed']}": r["steps"] for r in ok}
    return summary


def compare(path: str, baseline: str) -> list[dict]:
    """Per workload, concurrency and variant: how many greedy texts equal the baseline's
    (same request seeds). Meaningful on a checkpoint with a scaled LM head only: random
    weights give near-uniform distributions, where bf16 rounding decides the token."""
    rows: dict[tuple, dict] = {}
    with open(path) as fh:
        for line in fh:
            row = json.loads(line)
            rows[(row["workload"], row["concurrency"], row["variant"])] = row
    report = []
    for (workload, conc, variant), row in sorted(rows.items()):
        base = rows.get((workload, conc, baseline))
        if variant == baseline or base is None:
            continue
        common = sorted(set(base["tokens"]) & set(row["tokens"]))
        equal = [k for k in common if base["tokens"][k] == row["tokens"][k]]
        differ = sorted(set(common) - set(equal))
        line = {"workload": workload, "concurrency": conc, "variant": variant,
                "baseline": baseline, "compared": len(common), "equal": len(equal),
                "differ": differ}
        if "steps" in base and "steps" in row:
            line["divergences"] = [divergence(k, base["steps"].get(k), row["steps"].get(k))
                                   for k in differ]
        report.append(line)
    return report


def divergence(request: str, base: list | None, other: list | None) -> dict:
    """Where two greedy paths part, and how close the top two candidates were there in
    each: a gap at bf16 rounding is a near-tie; a wide one is a numerical difference."""
    if not base or not other:
        return {"request": request, "position": None, "why": "no logprobs on one side"}
    pos = next((i for i, (a, b) in enumerate(zip(base, other)) if a[0] != b[0]),
               min(len(base), len(other)))
    if pos >= min(len(base), len(other)):
        return {"request": request, "position": pos, "why": "one path is longer"}
    return {"request": request, "position": pos, "tokens": [base[pos][0], other[pos][0]],
            "top2_gap": [base[pos][1], other[pos][1]]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--model", default="moss-vl")
    parser.add_argument("--variant", default="")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--warmup-concurrency", type=int, default=1,
                        help="warm-up requests sent at once per workload before the timed ones")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--deadline", type=float, default=0,
                        help="unix time after which no new measurement starts")
    parser.add_argument("--out", required=True, help="JSON lines file to append to")
    parser.add_argument("--logprobs", action="store_true",
                        help="ask for the top-2 logprobs of every generated token, so that "
                             "--compare-to says where two greedy paths part and how close "
                             "their top two candidates were there (costs decode time)")
    parser.add_argument("--compare-to", metavar="VARIANT",
                        help="measure nothing: compare the greedy texts in --out with this "
                             "variant's, print one JSON line per workload and variant")
    args = parser.parse_args(argv)
    if args.compare_to:
        for line in compare(args.out, args.compare_to):
            print(json.dumps(line), flush=True)
        return 0
    if not args.variant:
        parser.error("--variant is required to measure")
    client = Client(args.url, args.model, args.timeout)
    # Warm-up: kernels and graphs a workload needs first are compiled outside the window,
    # and with --warmup-concurrency N (2x the server's --tokenizer-worker-num) every HTTP
    # worker most likely takes a first request, which pays that worker's start-up.
    for workload in args.workloads.split(","):
        kind = "single-image" if workload == "mixed-decode" else workload
        warm = [threading.Thread(target=client.stream, args=(messages_for(kind, 999_999 - i), 4))
                for i in range(max(1, args.warmup_concurrency))]
        for t in warm:
            t.start()
        for t in warm:
            t.join()
    with open(args.out, "a") as out:
        for workload in args.workloads.split(","):
            for conc in (int(c) for c in args.concurrency.split(",")):
                if args.deadline and time.time() > args.deadline:
                    print(f"deadline: skipping {workload} at concurrency {conc}", flush=True)
                    continue
                max_tokens = args.decode_tokens if workload == "mixed-decode" else args.max_tokens
                before = stage_totals(client.metrics())
                summary = run(client, workload, conc, args.rounds, max_tokens, seed0=first_seed(workload, conc),
                              logprobs=args.logprobs)
                summary["server_stages_ms"] = stage_means_ms(before, stage_totals(client.metrics()))
                summary["variant"] = args.variant
                out.write(json.dumps(summary) + "\n")
                out.flush()
                brief = {k: v for k, v in summary.items() if k not in ("tokens", "steps")}
                print(json.dumps(brief), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
