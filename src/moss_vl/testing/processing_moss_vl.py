"""MOSS-VL image processor and processor (the project's own, written from the published facts).

Copied next to `config.json` in generated checkpoints and loaded from there by
transformers' `AutoProcessor` / `AutoImageProcessor` with `trust_remote_code=True`,
as the published checkpoints ship their own `processing_moss_vl.py`. It imports only
torch, numpy, PIL and transformers, and overrides `__call__` / `preprocess` fully so
that it does not depend on the processor plumbing that changes between transformers
releases (5.12 with SGLang 0.5.17, 5.19 with SGLang 0.5.23).

What the processor produces is what SGLang's MOSS-VL multimodal processor
(`sglang.srt.multimodal.processors.moss_vl.MossVLImageProcessor`) reads:

- `input_ids` / `attention_mask`: the prompt with each `<|image|>` placeholder replaced
  by one `<|image_pad|>` token per frame (an image is one frame: temporal patch 1).
  MOSS-VL's vision tokens do not sit in the text; they are the encoder sequence that
  cross-attention layers read, so the text keeps one marker per frame and SGLang
  checks that frames and markers map one to one.
- `pixel_values` (num_patches, channels * temporal_patch * patch * patch) and
  `grid_thw` (num_media, 3), laid out the way Qwen2-VL's image processor lays them
  out: patches grouped merge x merge so the merger can concatenate neighbours.
- `cross_attention_mask` (batch, 1, text_len, num_frames), True = masked: text token
  t sees frame f iff at least f + 1 frame markers occur at or before t. SGLang turns
  it into `visible_frame_counts` per text token.
- `media_nums_per_sample`: how many media each prompt carries (a plain list).

Videos (`videos=`, one per `<|video|>` placeholder; SGLang hands over file paths or
`{"video_path": ...}` dicts) are laid out as MOSS-VL's published processor lays them
out: frames sampled at `video_fps` (at least `min_frames`, at most `max_frames`,
spread evenly over the video when the cap binds), each frame entering the prompt as
`<|time_start|>X.X seconds<|time_end|>` followed by its `<|image_pad|>` marker, the
whole video wrapped in `<|vision_start|>` ... `<|vision_end|>`. Every frame is its own
row of `grid_thw` ([1, h, w]) and its own medium in `media_nums_per_sample`, so a frame
becomes visible to the text from its marker on, exactly as an image does. Frames
share `video_max_pixels` (each gets at most that divided by the frame count, and at
most `max_pixels`). Containers are decoded with PyAV (FFmpeg); a video that is not
one of the accepted codecs, has no frames, cannot be parsed, or is over
`max_video_bytes` / `max_duration_seconds` is refused with a ValueError naming the
video and the reason (SGLang answers a ValueError from the processor with HTTP 400).
"""

from __future__ import annotations

import math
import os
import re
from typing import ClassVar

import numpy as np
import torch
from PIL import Image
from transformers import BaseImageProcessor, BatchFeature, ProcessorMixin

IMAGE_PLACEHOLDER = "<|image|>"
VIDEO_PLACEHOLDER = "<|video|>"
IMAGE_PAD = "<|image_pad|>"
_PLACEHOLDER = re.compile(f"{re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)}")


def smart_resize(height, width, factor, min_pixels, max_pixels):
    """(height, width) rounded to multiples of `factor` with the pixel count clamped.

    Qwen2-VL's rule: keep the aspect ratio, round each side to the nearest multiple of
    `factor` (patch * merge), then scale down to fit `max_pixels` or up to reach
    `min_pixels`.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image of {width}x{height} pixels has no area")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"image of {width}x{height} pixels: aspect ratio above 200 cannot be patched"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _to_chw(image, index):
    """An RGB image as a (3, H, W) CPU tensor: uint8 for 8-bit input (PIL images, uint8
    arrays and tensors), else float32 of 0..255 values."""
    if isinstance(image, Image.Image):
        if image.mode != "RGB":
            image = image.convert("RGB")
        return torch.from_numpy(np.array(image)).permute(2, 0, 1)
    if isinstance(image, np.ndarray):
        image = torch.from_numpy(image if image.flags.writeable else image.copy())
    if isinstance(image, torch.Tensor):
        # SGLang may hand over an nvJPEG-decoded (C, H, W) uint8 tensor on the GPU.
        tensor = image.detach().to("cpu")
        if tensor.ndim != 3:
            raise ValueError(f"image {index}: expected 3 dimensions, got shape {tuple(tensor.shape)}")
        if tensor.shape[0] not in (1, 3, 4) and tensor.shape[-1] in (1, 3, 4):
            tensor = tensor.permute(2, 0, 1)
        if tensor.shape[0] == 1:
            tensor = tensor.expand(3, -1, -1)
        elif tensor.shape[0] == 4:
            tensor = tensor[:3]
        elif tensor.shape[0] != 3:
            raise ValueError(f"image {index}: cannot find 1, 3 or 4 channels in shape {tuple(tensor.shape)}")
        if tensor.dtype == torch.uint8:
            return tensor
        tensor = tensor.to(torch.float32)
        if not image.dtype.is_floating_point:
            return tensor
        # Floating tensors are taken as 0..1 when they look like it.
        return tensor * 255.0 if float(tensor.max()) <= 1.0 else tensor
    raise TypeError(
        f"image {index}: expected a PIL image, numpy array or torch tensor, got {type(image).__name__}"
    )


def _flatten_images(images):
    if images is None:
        return []
    if isinstance(images, (list, tuple)):
        flat = []
        for item in images:
            flat.extend(_flatten_images(item))
        return flat
    return [images]


# ---- video ---------------------------------------------------------------------

# The defaults of MOSS-VL's published video settings (1 frame per second, up to
# 256 frames, 192 Mi pixels over all frames of one video).
VIDEO_DEFAULTS = {
    "video_fps": 1.0,
    "min_frames": 1,
    "max_frames": 256,
    "video_max_pixels": 201326592,
    # Refusals, not sampling: 0 switches a limit off.
    "max_duration_seconds": 0.0,
    "max_video_bytes": 0,
}
# Codecs a MOSS-VL deployment is expected to see from clients; anything else
# (raw, lossless, image codecs in a video container) is refused by name.
VIDEO_CODECS = ("h264", "hevc", "vp8", "vp9", "av1", "mpeg4")
TIME_START, TIME_END = "<|time_start|>", "<|time_end|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"


def video_settings(**overrides):
    """VIDEO_DEFAULTS updated by the given keys; unknown keys and bad values raise."""
    unknown = sorted(set(overrides) - set(VIDEO_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown video setting(s) {unknown}: expected {sorted(VIDEO_DEFAULTS)}")
    settings = dict(VIDEO_DEFAULTS)
    for key, value in overrides.items():
        if value is not None:
            settings[key] = type(VIDEO_DEFAULTS[key])(value)
    if not settings["video_fps"] > 0:
        raise ValueError(f"video_fps={settings['video_fps']} must be > 0")
    if not 1 <= settings["min_frames"] <= settings["max_frames"]:
        raise ValueError(
            f"need 1 <= min_frames ({settings['min_frames']}) <= max_frames ({settings['max_frames']})"
        )
    return settings


def sample_times(duration, settings):
    """Seconds at which to take frames: one every 1/fps, bounded by min/max_frames.

    When the cap binds the frames are spread evenly over the whole video, so a long
    video is covered end to end rather than cut after max_frames / fps seconds.
    """
    fps = settings["video_fps"]
    count = int(math.floor(duration * fps + 1e-6)) or 1
    count = max(settings["min_frames"], min(settings["max_frames"], count))
    if count == 1:
        return [0.0]
    natural = int(math.floor(duration * fps + 1e-6))
    # One frame per 1/fps, unless max_frames (or min_frames) overrides the count:
    # then the count is spread over the whole duration.
    step = 1.0 / fps if count == natural else duration / count
    return [i * step for i in range(count)]


def _video_name(video, index):
    # Only the position: SGLang hands over its own temporary file, whose name
    # means nothing to the client.
    return f"video {index} of the request"


def _pyav():
    # Imported in a try block: transformers refuses to load remote code whose
    # imports are missing unless they sit in one, and images need no PyAV.
    try:
        import av
    except ImportError as err:
        raise ImportError("decoding a video needs PyAV (pip install av)") from err
    return av


def decode_video(video, index, settings):
    """Sampled frames of one video: (list of (3, H, W) uint8 tensors, their times in s)."""
    av = _pyav()

    name = _video_name(video, index)
    if isinstance(video, dict):
        if "video_path" not in video:
            raise ValueError(f"{name}: a video dict needs 'video_path'")
        video = video["video_path"]
    if isinstance(video, bytes):
        import io

        size, source = len(video), io.BytesIO(video)
    elif isinstance(video, str):
        if not os.path.isfile(video):
            raise ValueError(f"{name}: no such file")
        size, source = os.path.getsize(video), video
    else:
        raise TypeError(f"{name}: expected a path, a dict with 'video_path' or bytes, "
                        f"got {type(video).__name__}")
    if settings["max_video_bytes"] and size > settings["max_video_bytes"]:
        raise ValueError(f"{name}: {size} bytes is over the limit of "
                         f"{settings['max_video_bytes']} bytes (max_video_bytes)")
    if size == 0:
        raise ValueError(f"{name}: the file is empty")
    try:
        container = av.open(source, mode="r")
    except (av.FFmpegError, OSError, ValueError) as err:
        raise ValueError(f"{name}: not a readable video container ({_reason(err)})") from None
    with container:
        if not container.streams.video:
            raise ValueError(f"{name}: the container holds no video frames (no video stream)")
        stream = container.streams.video[0]
        codec = stream.codec_context.name
        if codec not in VIDEO_CODECS:
            raise ValueError(f"{name}: codec {codec!r} is not supported "
                             f"(supported: {', '.join(VIDEO_CODECS)})")
        duration = _duration(container, stream)
        limit = settings["max_duration_seconds"]
        if limit and duration is not None and duration > limit:
            raise ValueError(f"{name}: {duration:.1f} s is over the limit of {limit:g} s "
                             "(max_duration_seconds)")
        stream.thread_type = "AUTO"
        frames, times = _sample(container, stream, duration, settings, name)
    if limit and times and times[-1] > limit:
        raise ValueError(f"{name}: frames run past {limit:g} s (max_duration_seconds)")
    return frames, times


def _reason(err):
    # FFmpeg's own words without the file name (a temporary path of SGLang's).
    return getattr(err, "strerror", None) or type(err).__name__


def _duration(container, stream):
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # av.time_base: microseconds
    return None


def _sample(container, stream, duration, settings, name):
    av = _pyav()

    start = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
    decoded = []  # (seconds, frame) for every frame when the duration is unknown
    targets = sample_times(duration, settings) if duration else None
    frames, times = [], []
    try:
        for frame in container.decode(stream):
            if frame.pts is None or frame.time_base is None:
                continue
            t = max(0.0, float(frame.pts * frame.time_base) - start)
            if targets is None:
                decoded.append((t, frame.to_ndarray(format="rgb24")))
                continue
            # The first frame at or after each target time (frames come in order).
            while len(times) < len(targets) and t + 1e-6 >= targets[len(times)]:
                if times and times[-1] == t:
                    break
                frames.append(frame.to_ndarray(format="rgb24"))
                times.append(t)
            if len(times) == len(targets):
                break
    except (av.FFmpegError, ValueError) as err:
        raise ValueError(f"{name}: the video data is corrupt ({_reason(err)})") from None
    if targets is None:
        if decoded:
            last = decoded[-1][0]
            wanted = sample_times(last if last > 0 else 0.0, settings)
            for target in wanted:
                t, array = next(((t, a) for t, a in decoded if t + 1e-6 >= target), decoded[-1])
                if not times or times[-1] != t:
                    frames.append(array)
                    times.append(t)
    if not frames:
        raise ValueError(f"{name}: the video has no decodable frames")
    return [torch.from_numpy(f).permute(2, 0, 1) for f in frames], times


def frame_text(seconds):
    """How MOSS-VL writes one frame's timestamp: one decimal, then ' seconds'."""
    return f"{TIME_START}{seconds:.1f} seconds{TIME_END}"


class MossVLImageProcessor(BaseImageProcessor):
    """Resize to patch * merge multiples, normalise, cut into merge-grouped patches.

    Computes what MOSS-VL's published (torchvision-backed) processor computes, to 1e-6,
    at the same cost (benchmarks/bench_processor.py): video numbers measured with a
    test checkpoint depend on it."""

    model_input_names: ClassVar[list] = ["pixel_values", "image_grid_thw"]

    def __init__(
        self,
        patch_size=16,
        temporal_patch_size=1,
        merge_size=2,
        min_pixels=65536,
        max_pixels=16777216,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
        rescale_factor=1 / 255,
        **kwargs,
    ):
        # Qwen2-VL configs spell the pixel bounds as size = {shortest_edge, longest_edge}.
        size = kwargs.pop("size", None) or {}
        # Video sampling settings live next to the pixel bounds in
        # preprocessor_config.json, as in MOSS-VL's published checkpoints.
        self.video_settings = video_settings(
            **{key: kwargs.pop(key) for key in list(kwargs) if key in VIDEO_DEFAULTS})
        min_pixels = size.get("shortest_edge", min_pixels)
        max_pixels = size.get("longest_edge", max_pixels)
        super().__init__(**kwargs)
        self.patch_size = int(patch_size)
        self.temporal_patch_size = int(temporal_patch_size)
        self.merge_size = int(merge_size)
        self.min_pixels = int(min_pixels)
        self.max_pixels = int(max_pixels)
        self.image_mean = list(image_mean)
        self.image_std = list(image_std)
        self.rescale_factor = float(rescale_factor)
        self.size = {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels={self.min_pixels} exceeds max_pixels={self.max_pixels}")

    def __call__(self, images, **kwargs):
        return self.preprocess(images, **kwargs)

    def preprocess(
        self,
        images,
        min_pixels=None,
        max_pixels=None,
        size=None,
        return_tensors=None,
        device=None,
        **kwargs,
    ):
        # `device` is where SGLang would like a torch-based processor to run; this one
        # runs on the CPU and SGLang moves features to where it needs them.
        del device
        unknown = sorted(k for k, v in kwargs.items() if v is not None)
        if unknown:
            raise TypeError(f"MossVLImageProcessor.preprocess got unexpected keyword(s): {unknown}")
        size = size or {}
        min_pixels = int(size.get("shortest_edge", min_pixels or self.min_pixels))
        max_pixels = int(size.get("longest_edge", max_pixels or self.max_pixels))
        factor = self.patch_size * self.merge_size
        # Rescale folded into mean and std: one subtraction and one division, in place.
        mean = torch.tensor(self.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(self.image_std, dtype=torch.float32).view(1, 3, 1, 1)
        mean, std = mean / self.rescale_factor, std / self.rescale_factor

        # As the published (torchvision-backed) processor does on the CPU: image by image
        # (a batch of frames would need one large fresh buffer per step, slower here),
        # 8-bit images resized in uint8 by torch's own bicubic kernel (the values
        # torchvision's resize gives), rescale and normalisation fused, in place.
        patches, grids = [], []
        for index, image in enumerate(_flatten_images(images)):
            pixels = _to_chw(image, index)[None]
            height, width = int(pixels.shape[2]), int(pixels.shape[3])
            new_h, new_w = smart_resize(height, width, factor, min_pixels, max_pixels)
            if (new_h, new_w) != (height, width):
                resized = torch.nn.functional.interpolate(
                    pixels, size=(new_h, new_w), mode="bicubic", align_corners=False,
                    antialias=True)
                if pixels.dtype != torch.uint8:
                    # Resizing works on 8-bit images everywhere else; keep the same grid of values.
                    resized = resized.round().clamp(0, 255)
                pixels = resized
            # Always a new tensor (a float input may be the caller's memory): in place is safe.
            pixels = pixels.to(torch.float32, copy=True)
            flat, grid = self._patchify(pixels.sub_(mean).div_(std))
            patches.append(flat)
            grids.append(grid)

        if not patches:
            raise ValueError("MossVLImageProcessor got no images")
        data = {
            "pixel_values": patches[0] if len(patches) == 1 else torch.cat(patches, dim=0),
            "image_grid_thw": torch.tensor(grids, dtype=torch.long),
        }
        return BatchFeature(data=data, tensor_type=return_tensors)

    def _patchify(self, pixels):
        """(N, 3, H, W) -> (N*h*w, 3*tp*p*p) rows, image by image, merge x merge neighbours
        adjacent; and one image's grid [1, h, w]."""
        p, tp, m = self.patch_size, self.temporal_patch_size, self.merge_size
        count, channels, height, width = pixels.shape
        # A still image is one frame, repeated to fill a temporal patch.
        frames = pixels[:, None].expand(-1, tp, -1, -1, -1)
        grid_h, grid_w = height // p, width // p
        frames = frames.reshape(count, tp, channels, grid_h // m, m, p, grid_w // m, m, p)
        # (N, h/m, w/m, m, m, C, tp, p, p): the row order the vision tower's merger expects.
        frames = frames.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        flat = frames.reshape(count * grid_h * grid_w, channels * tp * p * p)
        return flat.contiguous(), [1, grid_h, grid_w]

    def get_number_of_image_patches(self, height, width, images_kwargs=None):
        """Patches (before merging) the processor cuts an image of this size into."""
        kwargs = images_kwargs or {}
        factor = self.patch_size * self.merge_size
        new_h, new_w = smart_resize(
            height, width, factor,
            kwargs.get("min_pixels", self.min_pixels), kwargs.get("max_pixels", self.max_pixels),
        )
        return (new_h // self.patch_size) * (new_w // self.patch_size)


class MossVLProcessor(ProcessorMixin):
    """Tokenizer + image processor: `<|image|>` placeholders in, MOSS-VL model inputs out."""

    # transformers 5 finds the sub-processors from __init__'s parameter names (and
    # warns about the older `*_class` declarations); `attributes` is for older readers.
    attributes: ClassVar[list] = ["image_processor", "tokenizer"]

    _TEXT_KWARGS = ("padding", "truncation", "max_length", "add_special_tokens",
                    "padding_side", "pad_to_multiple_of", "return_attention_mask")

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template)
        self.image_token = IMAGE_PAD
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if self.image_token_id is None or self.image_token_id == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no {IMAGE_PAD} token")

    def __call__(self, text=None, images=None, videos=None, **kwargs):
        if text is None:
            raise ValueError("MossVLProcessor needs `text`: the prompt with <|image|> / "
                             "<|video|> placeholders")
        texts = [text] if isinstance(text, str) else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("MossVLProcessor `text` must be a string or a list of strings")

        return_tensors = kwargs.pop("return_tensors", None)
        images_kwargs = dict(kwargs.pop("images_kwargs", None) or {})
        videos_kwargs = dict(kwargs.pop("videos_kwargs", None) or {})
        for key in ("device", "min_pixels", "max_pixels", "size"):
            if key in kwargs:
                images_kwargs[key] = kwargs.pop(key)
        for key in VIDEO_DEFAULTS:
            if key in kwargs:
                videos_kwargs[key] = kwargs.pop(key)
        text_kwargs = dict(kwargs.pop("text_kwargs", None) or {})
        for key in self._TEXT_KWARGS:
            if key in kwargs:
                text_kwargs[key] = kwargs.pop(key)
        kwargs.pop("return_mm_token_type_ids", None)
        kwargs.pop("return_token_type_ids", None)
        if kwargs:
            raise TypeError(f"MossVLProcessor got unexpected keyword(s): {sorted(kwargs)}")

        image_list = _flatten_images(images)
        video_list = [] if videos is None else (
            list(videos) if isinstance(videos, (list, tuple)) else [videos])
        image_slots = sum(t.count(IMAGE_PLACEHOLDER) for t in texts)
        video_slots = sum(t.count(VIDEO_PLACEHOLDER) for t in texts)
        if image_slots != len(image_list):
            raise ValueError(
                f"the prompt has {image_slots} {IMAGE_PLACEHOLDER} placeholder(s) "
                f"but {len(image_list)} image(s) were given"
            )
        if video_slots != len(video_list):
            raise ValueError(
                f"the prompt has {video_slots} {VIDEO_PLACEHOLDER} placeholder(s) "
                f"but {len(video_list)} video(s) were given"
            )

        # Media in prompt order: an image is one frame, a video one frame per sample.
        device = images_kwargs.pop("device", None)
        videos_kwargs.pop("device", None)
        settings = video_settings(**{**self.image_processor.video_settings, **videos_kwargs})
        pixel_values, grids, layouts, media_nums_per_sample = [], [], [], []
        images_left, videos_left = iter(image_list), iter(enumerate(video_list))
        for t in texts:
            count = 0
            for placeholder in _PLACEHOLDER.findall(t):
                if placeholder == IMAGE_PLACEHOLDER:
                    vision = self.image_processor([next(images_left)], device=device,
                                                  **images_kwargs)
                    layouts.append(IMAGE_PAD)
                    count += 1
                else:
                    index, video = next(videos_left)
                    vision, times = self._video(video, index, settings, images_kwargs)
                    layouts.append(VISION_START + "".join(
                        frame_text(s) + IMAGE_PAD for s in times) + VISION_END)
                    count += len(times)
                pixel_values.append(vision["pixel_values"])
                grids.append(torch.as_tensor(vision["image_grid_thw"], dtype=torch.long))
            media_nums_per_sample.append(count)

        output = {}
        frames = []
        if grids:
            output["pixel_values"] = torch.cat(pixel_values, dim=0)
            grid_thw = torch.cat(grids, dim=0)
            output["grid_thw"] = grid_thw
            frames = [int(t) for t in grid_thw[:, 0]]

        layouts = iter(layouts)
        expanded = [_PLACEHOLDER.sub(lambda _match: next(layouts), t) for t in texts]

        text_kwargs.setdefault("return_attention_mask", True)
        encoded = self.tokenizer(expanded, **text_kwargs)
        output["input_ids"] = encoded["input_ids"]
        output["attention_mask"] = encoded["attention_mask"]

        if grids:
            output["cross_attention_mask"] = self._cross_attention_mask(
                encoded["input_ids"], encoded["attention_mask"], frames, media_nums_per_sample
            )
        batch = BatchFeature(data=output, tensor_type=return_tensors)
        # A plain list, as SGLang reads it (BatchFeature would turn it into a tensor).
        batch["media_nums_per_sample"] = media_nums_per_sample
        return batch

    def _video(self, video, index, settings, images_kwargs):
        """One video's pixel rows and per-frame grids, and its frame times in seconds."""
        frames, times = decode_video(video, index, settings)
        ip = self.image_processor
        min_pixels = int(images_kwargs.get("min_pixels") or ip.min_pixels)
        max_pixels = int(images_kwargs.get("max_pixels") or ip.max_pixels)
        per_frame = max(min_pixels, min(max_pixels, settings["video_max_pixels"] // len(frames)))
        vision = ip(frames, min_pixels=min_pixels, max_pixels=per_frame)
        return vision, times

    def _cross_attention_mask(self, input_ids, attention_mask, frames, media_nums_per_sample):
        """(batch, 1, text_len, max_frames) bool, True where text may NOT see the frame."""
        frames_per_sample, cursor = [], 0
        for count in media_nums_per_sample:
            frames_per_sample.append(sum(frames[cursor:cursor + count]))
            cursor += count
        rows = [list(map(int, r)) for r in input_ids]
        masks = [list(map(int, r)) for r in attention_mask]
        width = max(len(r) for r in rows)
        # Unpadded batches are ragged; the tail past a row's end is not text.
        ids = torch.full((len(rows), width), -1, dtype=torch.long)
        valid = torch.zeros((len(rows), width), dtype=torch.bool)
        for b, (row, mask) in enumerate(zip(rows, masks)):
            ids[b, :len(row)] = torch.tensor(row, dtype=torch.long)
            valid[b, :len(mask)] = torch.tensor(mask, dtype=torch.bool)
        markers = (ids == self.image_token_id) & valid
        seen = markers.cumsum(dim=1)
        frame_index = torch.arange(max(frames_per_sample) if frames_per_sample else 0)
        visible = seen[:, :, None] > frame_index[None, None, :]
        visible &= valid[:, :, None]
        visible &= frame_index[None, None, :] < torch.tensor(frames_per_sample)[:, None, None]
        return (~visible)[:, None]

    def batch_decode(self, *args, **kwargs):
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)

    @property
    def model_input_names(self):
        return ["input_ids", "attention_mask", "pixel_values", "grid_thw", "cross_attention_mask"]
