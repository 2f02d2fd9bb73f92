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

Videos are not supported by this processor: the tiny checkpoints it serves test the
image path, and a multi-image prompt has the same encoder layout as a video (one
frame marker and one separator per frame).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch
from PIL import Image
from transformers import BaseImageProcessor, BatchFeature, ProcessorMixin

IMAGE_PLACEHOLDER = "<|image|>"
VIDEO_PLACEHOLDER = "<|video|>"
IMAGE_PAD = "<|image_pad|>"


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


def _to_chw_float(image, index):
    """An RGB image as a float32 (3, H, W) tensor of 0..255 values on the CPU."""
    if isinstance(image, Image.Image):
        array = np.asarray(image.convert("RGB"), dtype=np.float32)
        return torch.from_numpy(array.copy()).permute(2, 0, 1)
    if isinstance(image, np.ndarray):
        image = torch.from_numpy(image)
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


class MossVLImageProcessor(BaseImageProcessor):
    """Resize to patch * merge multiples, normalise, cut into merge-grouped patches."""

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
        mean = torch.tensor(self.image_mean, dtype=torch.float32).view(3, 1, 1)
        std = torch.tensor(self.image_std, dtype=torch.float32).view(3, 1, 1)

        patches, grids = [], []
        for index, image in enumerate(_flatten_images(images)):
            pixels = _to_chw_float(image, index)
            height, width = int(pixels.shape[1]), int(pixels.shape[2])
            new_h, new_w = smart_resize(height, width, factor, min_pixels, max_pixels)
            if (new_h, new_w) != (height, width):
                pixels = torch.nn.functional.interpolate(
                    pixels[None], size=(new_h, new_w), mode="bicubic",
                    align_corners=False, antialias=True,
                )[0]
                # Resizing works on 8-bit images everywhere else; keep the same grid of values.
                pixels = pixels.round().clamp(0, 255)
            pixels = (pixels * self.rescale_factor - mean) / std
            flat, grid = self._patchify(pixels)
            patches.append(flat)
            grids.append(grid)

        if not patches:
            raise ValueError("MossVLImageProcessor got no images")
        data = {
            "pixel_values": torch.cat(patches, dim=0),
            "image_grid_thw": torch.tensor(grids, dtype=torch.long),
        }
        return BatchFeature(data=data, tensor_type=return_tensors)

    def _patchify(self, pixels):
        """(3, H, W) -> (t*h*w, 3*tp*p*p) rows, merge x merge neighbours adjacent."""
        p, tp, m = self.patch_size, self.temporal_patch_size, self.merge_size
        channels, height, width = pixels.shape
        # A still image is one frame, repeated to fill a temporal patch.
        frames = pixels[None].expand(tp, -1, -1, -1)
        grid_t, grid_h, grid_w = 1, height // p, width // p
        frames = frames.reshape(grid_t, tp, channels, grid_h // m, m, p, grid_w // m, m, p)
        # (t, h/m, w/m, m, m, C, tp, p, p): the row order the vision tower's merger expects.
        frames = frames.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        flat = frames.reshape(grid_t * grid_h * grid_w, channels * tp * p * p)
        return flat.contiguous(), [grid_t, grid_h, grid_w]

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
        if videos is not None:
            raise ValueError("MossVLProcessor (tiny test checkpoint) supports images only, got videos")
        if text is None:
            raise ValueError("MossVLProcessor needs `text`: the prompt with <|image|> placeholders")
        texts = [text] if isinstance(text, str) else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("MossVLProcessor `text` must be a string or a list of strings")

        return_tensors = kwargs.pop("return_tensors", None)
        images_kwargs = dict(kwargs.pop("images_kwargs", None) or {})
        for key in ("device", "min_pixels", "max_pixels", "size"):
            if key in kwargs:
                images_kwargs[key] = kwargs.pop(key)
        text_kwargs = dict(kwargs.pop("text_kwargs", None) or {})
        for key in self._TEXT_KWARGS:
            if key in kwargs:
                text_kwargs[key] = kwargs.pop(key)
        kwargs.pop("return_mm_token_type_ids", None)
        kwargs.pop("return_token_type_ids", None)
        if kwargs:
            raise TypeError(f"MossVLProcessor got unexpected keyword(s): {sorted(kwargs)}")

        image_list = _flatten_images(images)
        placeholders = [t.count(IMAGE_PLACEHOLDER) for t in texts]
        if sum(placeholders) != len(image_list):
            raise ValueError(
                f"the prompt has {sum(placeholders)} {IMAGE_PLACEHOLDER} placeholder(s) "
                f"but {len(image_list)} image(s) were given"
            )
        for t in texts:
            if VIDEO_PLACEHOLDER in t:
                raise ValueError(
                    f"the prompt contains {VIDEO_PLACEHOLDER}: this processor supports images only"
                )

        output = {}
        frames = []
        if image_list:
            vision = self.image_processor(image_list, **images_kwargs)
            output["pixel_values"] = vision["pixel_values"]
            grid_thw = torch.as_tensor(vision["image_grid_thw"], dtype=torch.long)
            output["grid_thw"] = grid_thw
            frames = [int(t) for t in grid_thw[:, 0]]

        # One frame marker per frame, in placeholder order.
        expanded, cursor = [], 0
        for t in texts:
            pieces = t.split(IMAGE_PLACEHOLDER)
            out = pieces[0]
            for piece in pieces[1:]:
                out += IMAGE_PAD * frames[cursor] + piece
                cursor += 1
            expanded.append(out)

        text_kwargs.setdefault("return_attention_mask", True)
        encoded = self.tokenizer(expanded, **text_kwargs)
        output["input_ids"] = encoded["input_ids"]
        output["attention_mask"] = encoded["attention_mask"]

        media_nums_per_sample = placeholders
        if image_list:
            output["cross_attention_mask"] = self._cross_attention_mask(
                encoded["input_ids"], encoded["attention_mask"], frames, media_nums_per_sample
            )
        batch = BatchFeature(data=output, tensor_type=return_tensors)
        # A plain list, as SGLang reads it (BatchFeature would turn it into a tensor).
        batch["media_nums_per_sample"] = media_nums_per_sample
        return batch

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
