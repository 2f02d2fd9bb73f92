"""`moss-vl infer`: MOSS-VL on plain transformers, without SGLang.

The second serving path (offline jobs, evaluation, machines with no accelerator) and
the reference the served model is checked against. The checkpoint is loaded exactly
as a user would load it: `AutoModelForCausalLM.from_pretrained(path,
trust_remote_code=True)` and `AutoProcessor.from_pretrained(...)`; the modeling code
is the checkpoint's own `modeling_moss_vl.py`.

Requests are OpenAI chat-completion bodies (`messages` with text, `image_url` and
`video_url` parts; `max_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop`),
one per JSONL line or wrapped as OpenAI batch lines (`{"custom_id", "body": {...}}`).
Answers are chat-completion objects, one JSONL line per request, tagged with the
request's line `index`: a rerun skips the indices already answered (resumable).
"""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DTYPES = ("auto", "bfloat16", "float16", "float32")
DEFAULT_MAX_TOKENS = 256
# Image and video URLs fetched over HTTP(S) are bounded so one request cannot hang a job.
FETCH_TIMEOUT_S = 60
FETCH_MAX_BYTES = 64 << 20


class InferError(Exception):
    """A request or setup the engine refuses, with a message naming the input."""


# ---- loading ------------------------------------------------------------------------


def _check_model_path(model_path: str) -> None:
    path = Path(model_path).expanduser()
    looks_local = path.is_absolute() or model_path.startswith((".", "~")) or path.exists()
    if not looks_local:
        return  # a hub id: transformers resolves it (or says why not)
    if not path.exists():
        raise InferError(f"--model-path {model_path}: no such directory")
    if not path.is_dir():
        raise InferError(f"--model-path {model_path}: not a directory")
    if not (path / "config.json").is_file():
        raise InferError(f"--model-path {model_path}: no config.json (not a checkpoint directory)")


def _torch_dtype(dtype: str, device: str):
    import torch

    if dtype not in DTYPES:
        raise InferError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if dtype == "auto":
        # bf16 is what the model is served in; on the CPU fp32 is faster and exact.
        return torch.float32 if device == "cpu" else torch.bfloat16
    return getattr(torch, dtype)


@dataclass
class Engine:
    """A loaded model and processor, answering chat requests one at a time."""

    model: object
    processor: object
    device: str
    attn_implementation: str
    dtype: object
    model_name: str

    # -- inputs ---------------------------------------------------------------------

    def prepare(self, messages: list) -> dict:
        """Processor outputs (on the model's device) for a list of chat messages."""
        if not isinstance(messages, list) or not messages:
            raise InferError("`messages` must be a non-empty list of chat messages")
        # Data and http videos go through temporary files (the processor takes paths);
        # they are removed once the processor has read them, whatever happens.
        downloaded: list[str] = []
        try:
            return self._prepare(messages, downloaded)
        finally:
            for path in downloaded:
                Path(path).unlink(missing_ok=True)

    def _prepare(self, messages: list, downloaded: list[str]) -> dict:
        rendered, images, videos = [], [], []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise InferError(f"messages[{i}] must be an object with a `role`")
            content = message.get("content")
            if content is None or isinstance(content, str):
                rendered.append({"role": message["role"], "content": content or ""})
                continue
            if not isinstance(content, list):
                raise InferError(f"messages[{i}].content must be a string or a list of parts")
            parts = []
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                elif kind in ("image_url", "image"):
                    images.append(load_image(_url_of(part, "image_url", where), where))
                    parts.append({"type": "image"})
                elif kind in ("video_url", "video"):
                    url = _url_of(part, "video_url", where)
                    videos.append(fetch_video(url, where))
                    if url.startswith(REMOTE_VIDEO_SCHEMES):
                        downloaded.append(videos[-1])
                    parts.append({"type": "video"})
                else:
                    raise InferError(f"{where}: unsupported part type {kind!r} "
                                     "(expected text, image_url or video_url)")
            rendered.append({"role": message["role"], "content": parts})
        text = self.processor.apply_chat_template(rendered, add_generation_prompt=True,
                                                  tokenize=False)
        kwargs = {"text": text, "return_tensors": "pt"}
        if images:
            kwargs["images"] = images
        if videos:
            kwargs["videos"] = videos
        try:
            inputs = self.processor(**kwargs)
        except (ValueError, TypeError) as err:
            raise InferError(f"the processor refused the request: {err}") from None
        return self._to_device(inputs)

    def _to_device(self, inputs) -> dict:
        import torch

        out = {}
        for key, value in dict(inputs).items():
            if isinstance(value, torch.Tensor):
                value = value.to(self.device)
                if key == "pixel_values":
                    value = value.to(self.dtype)
            out[key] = value
        return out

    # -- generation -------------------------------------------------------------------

    def generate(self, request: dict, on_token: Callable[[str], None] | None = None,
                 default_seed: int = 0) -> dict:
        """An OpenAI `chat.completion` object answering `request`.

        `on_token(text_delta)` is called as text is produced (for streaming).
        """
        import torch

        options = sampling_options(request, default_seed)
        inputs = self.prepare(request.get("messages"))
        prompt_len = int(inputs["input_ids"].shape[-1])
        generator = torch.Generator().manual_seed(options["seed"])
        streamer = _TextStreamer(self.processor.tokenizer, on_token, options["stop"])
        ids = self.model.generate(
            **inputs,
            max_new_tokens=options["max_tokens"],
            do_sample=options["do_sample"],
            temperature=options["temperature"],
            top_p=options["top_p"],
            top_k=options["top_k"],
            generator=generator,
            streamer=streamer,
        )
        new = ids[0, prompt_len:].tolist()
        matched = None
        if new and new[-1] in _eos_ids(self.model):
            matched = new[-1]
        elif streamer.stopped:
            matched = streamer.matched
        finish = "stop" if matched is not None else "length"
        return completion(
            request.get("model") or self.model_name, streamer.text, finish, prompt_len,
            len(new), request_id=request.get("id"), matched_stop=matched,
        )

    def score(self, messages: list, continuation: str | list[int] = "") -> dict:
        """Teacher-forced per-position logprobs of the prompt plus a fixed continuation.

        `continuation` is text (tokenised without special tokens) or token ids.

        Returns the token ids and, for every position after the first, the logprob of
        that token given everything before it (what SGLang's `/generate` returns as
        `input_token_logprobs` with `logprob_start_len=0`), plus the top-2 gap.
        """
        import torch

        inputs = self.prepare(messages)
        if continuation:
            if isinstance(continuation, str):
                extra = self.processor.tokenizer(continuation, add_special_tokens=False,
                                                 return_tensors="pt")["input_ids"]
            else:
                extra = torch.tensor([list(continuation)], dtype=torch.long)
            extra = extra.to(self.device)
            inputs["input_ids"] = torch.cat([inputs["input_ids"], extra], dim=1)
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
            mask = inputs.get("cross_attention_mask")
            if mask is not None:
                # Continuation rows see every frame, like the prompt's last row.
                tail = mask[:, :, -1:].expand(-1, -1, extra.shape[1], -1)
                inputs["cross_attention_mask"] = torch.cat([mask, tail], dim=2)
        with torch.no_grad():
            logits = self.model(**inputs).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        ids = inputs["input_ids"][0]
        chosen = logprobs[:-1].gather(1, ids[1:, None])[:, 0]
        top2 = logprobs[:-1].topk(2, dim=-1).values
        return {
            "input_ids": ids.tolist(),
            "token_logprobs": [None, *chosen.tolist()],
            "top2_gap": [None, *(top2[:, 0] - top2[:, 1]).tolist()],
        }


def load_engine(model_path: str, device: str = "auto", attn_impl: str = "auto",
                dtype: str = "auto", served_model_name: str | None = None,
                warn: Callable[[str], None] | None = None) -> Engine:
    """Resolve device and attention implementation, then load model and processor."""
    from moss_vl.device import DeviceError, resolve_attn_impl, resolve_infer_device

    if not model_path:
        raise InferError("--model-path is required (a checkpoint directory or hub id)")
    _check_model_path(model_path)
    try:
        resolved = resolve_infer_device(device)
        impl, note = resolve_attn_impl(attn_impl, resolved)
    except DeviceError as err:
        raise InferError(str(err)) from None
    if note and warn:
        warn(note)
    torch_dtype = _torch_dtype(dtype, resolved)
    if resolved == "npu":
        import torch_npu  # noqa: F401  (registers the npu device with torch)

    from transformers import AutoModelForCausalLM, AutoProcessor

    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_path, trust_remote_code=True, dtype=torch_dtype, attn_implementation=impl,
        )
        processor = AutoProcessor.from_pretrained(model_path, trust_remote_code=True)
    except (OSError, ValueError, ImportError) as err:
        raise InferError(f"cannot load {model_path}: {err}") from None
    model.to(resolved).eval()
    name = served_model_name or str(model_path)
    return Engine(model, processor, resolved, impl, torch_dtype, name)


# ---- requests -------------------------------------------------------------------------


def sampling_options(request: dict, default_seed: int = 0) -> dict:
    """Sampling settings of an OpenAI request; no temperature (or 0) means greedy."""
    def number(name, default, cast=float, low=None):
        value = request.get(name)
        if value is None:
            return default
        try:
            value = cast(value)
        except (TypeError, ValueError):
            raise InferError(f"`{name}`={request.get(name)!r} is not a number") from None
        if low is not None and value < low:
            raise InferError(f"`{name}`={value} must be >= {low}")
        return value

    max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else _positive_int(max_tokens,
                                                                             "max_tokens")
    temperature = number("temperature", 0.0, float, 0.0)
    top_p = number("top_p", 1.0, float, 0.0)
    if not 0.0 < top_p <= 1.0:
        raise InferError(f"`top_p`={top_p} must be in (0, 1]")
    stop = request.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not all(isinstance(s, str) and s for s in stop):
        raise InferError("`stop` must be a string or a list of non-empty strings")
    return {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "do_sample": temperature > 0,
        "top_p": top_p,
        "top_k": number("top_k", 0, int, -1),
        "seed": number("seed", default_seed, int),
        "stop": list(stop),
    }


def _positive_int(value, name) -> int:
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise InferError(f"`{name}`={value!r} is not an integer") from None
    if value < 1:
        raise InferError(f"`{name}`={value} must be >= 1")
    return value


def _url_of(part: dict, key: str, where: str) -> str:
    value = part.get(key, part.get(key.split("_")[0]))
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise InferError(f"{where}: missing {key}.url")
    return value


def _read_url(url: str, where: str) -> bytes:
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if ";base64" not in header:
            return urllib.parse.unquote_to_bytes(payload)
        try:
            return base64.b64decode(payload, validate=False)
        except ValueError as err:
            raise InferError(f"{where}: bad base64 data URL: {err}") from None
    if url.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
                data = response.read(FETCH_MAX_BYTES + 1)
        except OSError as err:
            raise InferError(f"{where}: cannot fetch {url}: {err}") from None
        if len(data) > FETCH_MAX_BYTES:
            raise InferError(f"{where}: {url} is larger than {FETCH_MAX_BYTES} bytes")
        return data
    path = urllib.parse.unquote(urllib.parse.urlparse(url).path) if url.startswith("file:") \
        else url
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as err:
        raise InferError(f"{where}: cannot read {path}: {err.strerror}") from None


def load_image(url: str, where: str = "image"):
    """A PIL RGB image from a data URL, file URL, local path or http(s) URL."""
    from PIL import Image, UnidentifiedImageError

    data = _read_url(url, where)
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError) as err:
        raise InferError(f"{where}: not a decodable image ({err})") from None
    return image.convert("RGB")


REMOTE_VIDEO_SCHEMES = ("data:", "http://", "https://")


def fetch_video(url: str, where: str = "video"):
    """A local video path for the processor (data and http URLs are written to a temp file)."""
    if not url.startswith(REMOTE_VIDEO_SCHEMES):
        path = urllib.parse.unquote(urllib.parse.urlparse(url).path) if url.startswith("file:") \
            else url
        if not Path(path).expanduser().is_file():
            raise InferError(f"{where}: no such video file {path}")
        return str(Path(path).expanduser())
    import tempfile

    data = _read_url(url, where)
    handle = tempfile.NamedTemporaryFile(prefix="moss-vl-video-", suffix=".mp4", delete=False)
    with handle:
        handle.write(data)
    return handle.name


def _eos_ids(model) -> set[int]:
    config = getattr(model, "generation_config", None) or model.config
    eos = getattr(config, "eos_token_id", None)
    return set([eos] if isinstance(eos, int) else (eos or []))


class _TextStreamer:
    """Incremental detokenisation with stop strings, fed by the model's `generate`."""

    def __init__(self, tokenizer, on_token, stop):
        self.tokenizer = tokenizer
        self.on_token = on_token
        self.stop = stop
        self.ids: list[int] = []
        self.text = ""
        self.stopped = False
        self.matched = None
        self._skip = set(tokenizer.all_special_ids)

    def put(self, token) -> None:
        if self.stopped:
            return
        token = int(token.reshape(-1)[0])
        if token in self._skip:
            return
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        # Hold back an incomplete UTF-8 sequence until its last byte arrives.
        if text.endswith("\ufffd"):
            return
        for stop in self.stop:
            cut = text.find(stop)
            if cut >= 0:
                text, self.stopped, self.matched = text[:cut], True, stop
        self._emit(text)

    def _emit(self, text: str) -> None:
        delta = text[len(self.text):]
        self.text = text
        if delta and self.on_token is not None:
            self.on_token(delta)

    def end(self) -> None:
        if not self.stopped:
            self._emit(self.tokenizer.decode(self.ids, skip_special_tokens=True))


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """SGLang's UsageInfo, field for field."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def completion(model: str, text: str, finish_reason: str, prompt_tokens: int,
               completion_tokens: int, request_id: str | None = None,
               matched_stop=None) -> dict:
    """A `chat.completion` object in SGLang's shape (same keys, same order)."""
    return {
        "id": request_id or uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "reasoning_content": None},
            "logprobs": None,
            "finish_reason": finish_reason,
            "matched_stop": matched_stop,
        }],
        "usage": usage(prompt_tokens, completion_tokens),
        "metadata": None,
    }


# ---- JSONL jobs ----------------------------------------------------------------------


def read_requests(path: str) -> Iterator[tuple[int, dict | None, str | None]]:
    """(index, request body, error) per non-empty line of a JSONL file."""
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115  (closed below)
    except OSError as err:
        raise InferError(f"--input {path}: {err.strerror}") from None
    with handle:
        index = -1
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            index += 1
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                yield index, None, f"line {number}: not JSON ({err.msg})"
                continue
            if not isinstance(item, dict):
                yield index, None, f"line {number}: expected a JSON object"
                continue
            body = item.get("body") if isinstance(item.get("body"), dict) else item
            if "custom_id" in item:
                body = {**body, "custom_id": item["custom_id"]}
            yield index, body, None


def answered_indices(output: Path) -> set[int]:
    """Indices already in `output`; a torn last line (a crash mid-write) is dropped."""
    if not output.exists():
        return set()
    done, keep = set(), []
    lines = output.read_text(encoding="utf-8").splitlines(keepends=True)
    for line in lines:
        try:
            item = json.loads(line)
            done.add(int(item["index"]))
            keep.append(line if line.endswith("\n") else line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    if keep != lines:
        output.write_text("".join(keep), encoding="utf-8")
    return done


def run_jsonl(engine: Engine, input_path: str, output_path: str, progress: bool = True,
              default_seed: int = 0) -> tuple[int, int, int]:
    """Answer every request of `input_path` into `output_path`: (answered, skipped, failed)."""
    from tqdm import tqdm

    requests = list(read_requests(input_path))
    output = Path(output_path)
    output.parent.mkdir(parents=True, exist_ok=True)
    done = answered_indices(output)
    answered = failed = 0
    bar = tqdm(total=len(requests), initial=len(done & {i for i, _, _ in requests}),
               desc="moss-vl infer", unit="req", file=sys.stderr, disable=not progress)
    with open(output, "a", encoding="utf-8") as sink, bar:
        for index, body, error in requests:
            if index in done:
                continue
            record: dict = {"index": index}
            if body is not None and "custom_id" in body:
                record["custom_id"] = body["custom_id"]
            if error is None:
                try:
                    request = {k: v for k, v in body.items() if k != "custom_id"}
                    request.setdefault("id", f"infer-{index}")
                    record["response"] = engine.generate(request, default_seed=default_seed)
                except InferError as err:
                    error = str(err)
            if error is not None:
                record["error"] = {"message": error}
                failed += 1
            else:
                answered += 1
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
            bar.update(1)
    return answered, len(done), failed


# ---- command line ---------------------------------------------------------------------


def add_arguments(parser) -> None:
    """`moss-vl infer` flags (also used by `serve --engine transformers`'s loader)."""
    parser.add_argument("--model-path", help="checkpoint directory or hub id; MOSS_VL_MODEL_PATH")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "npu", "cpu"))
    parser.add_argument("--attn-impl", default="auto",
                        choices=("auto", "eager", "sdpa", "flash_attention_2"),
                        help="auto: eager on NPU, flash_attention_2 on CUDA when installed "
                             "(else sdpa), sdpa on CPU")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="auto: bfloat16 on accelerators, float32 on CPU")


def main(args) -> int:
    """Run `moss-vl infer` from parsed arguments; exit codes as moss_vl.cli."""
    from moss_vl import environ

    if (args.input is None) == (args.prompt is None):
        print("moss-vl infer: give either --prompt (one request) or --input FILE.jsonl",
              file=sys.stderr)
        return 2
    if args.input is not None and not args.output:
        print("moss-vl infer: --input needs --output FILE.jsonl", file=sys.stderr)
        return 2
    model_path = args.model_path or environ.MOSS_VL_MODEL_PATH.get()

    def warn(message):
        print(f"moss-vl infer: warning: {message}", file=sys.stderr)

    try:
        engine = load_engine(model_path, args.device, args.attn_impl, args.dtype, warn=warn)
        print(f"moss-vl infer: {model_path} on {engine.device} "
              f"(attn_implementation={engine.attn_implementation}, "
              f"dtype={str(engine.dtype).removeprefix('torch.')})", file=sys.stderr)
        if args.input is not None:
            answered, skipped, failed = run_jsonl(engine, args.input, args.output,
                                                  progress=not args.no_progress,
                                                  default_seed=args.seed)
            print(f"moss-vl infer: {answered} answered, {skipped} already in {args.output}, "
                  f"{failed} failed", file=sys.stderr)
            return 1 if failed else 0
        content = [{"type": "image_url", "image_url": {"url": p}} for p in args.image or []]
        content += [{"type": "video_url", "video_url": {"url": p}} for p in args.video or []]
        content.append({"type": "text", "text": args.prompt})
        request = {"messages": [{"role": "user", "content": content}],
                   "max_tokens": args.max_tokens, "temperature": args.temperature,
                   "top_p": args.top_p, "seed": args.seed}
        answer = engine.generate(request, default_seed=args.seed)
    except InferError as err:
        print(f"moss-vl infer: {err}", file=sys.stderr)
        return 2
    if args.output_format == "json":
        print(json.dumps(answer, ensure_ascii=False))
    else:
        print(answer["choices"][0]["message"]["content"])
    return 0
