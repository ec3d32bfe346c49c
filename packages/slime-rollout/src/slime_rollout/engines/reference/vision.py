"""Images for the reference engine: SGLang's `/generate` `image_data` on a Qwen-VL checkpoint.

A request names its images in `image_data` (a `data:` URI, bare base64 or a file path each, one per image
placeholder of the prompt, in order) with either `text` or `input_ids`, holding exactly one image token
(`<|image_pad|>`) per image, not expanded: the i-th one becomes image i's merged patches. That is what SGLang 0.5.16
accepts: it decodes `input_ids` to text, runs the processor on it (which expands every `<|image_pad|>` of the text
into one image) and then expands the i-th image token of the sent ids (`srt/multimodal/processors/base_processor.py`
`load_mm_data`, `process_and_combine_mm_data`, `_expand_input_ids`). Ids that are already expanded, or an image
token beyond the images, fail there; here they are a 400 with a message saying so.

`mrope_positions` gives the 3-D rotary positions (temporal, height, width) of a prompt with images, from the
model's own `get_rope_index`, so prefill can run left-padded rows through the language model with explicit
positions and decoding can continue each row at `max(position) + 1`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["VisionInputs", "VisionPreprocessor", "decode_engine_image", "mrope_positions"]


def decode_engine_image(item: Any) -> Any:
    """An `image_data` entry as an RGB `PIL.Image`: `data:` URI, bare base64 or a file path.

    Raises:
        ValueError: the entry is not a string, or its bytes are not an image (the message says which entry).
    """
    from PIL import Image, UnidentifiedImageError

    if not isinstance(item, str) or not item:
        raise ValueError(f"image_data entries must be base64 strings, data: URIs or paths, got {type(item).__name__}")
    if item.startswith(("http://", "https://")):
        raise ValueError("the reference engine does not fetch image URLs; send the image bytes as base64")
    try:
        if item.startswith("data:"):
            source: Any = io.BytesIO(base64.b64decode(item.split(",", 1)[1]))
        elif len(item) < 4096 and "\n" not in item and _is_file(item):
            source = item
        else:
            source = io.BytesIO(base64.b64decode(item, validate=True))
        with Image.open(source) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, binascii.Error, ValueError) as e:
        raise ValueError(f"image_data entry {item[:32]!r}...: not a readable image ({e})") from None


def _is_file(path: str) -> bool:
    import os

    return os.path.isfile(path)


@dataclasses.dataclass(kw_only=True, slots=True)
class VisionInputs:
    """A prompt's vision tensors as the model's forward takes them.

    Attributes:
        pixel_values: `[P, C*T*p*p]` float, patches of all the prompt's images.
        image_grid_thw: `[num_images, 3]` int64 patch grid of each image.
    """

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor


class VisionPreprocessor:
    """Turns `/generate` requests with `image_data` into expanded prompt ids and vision tensors.

    Args:
        processor: the checkpoint's `AutoProcessor` (image processor + tokenizer).
        config: the model config (`image_token_id`, `vision_config.spatial_merge_size`).
    """

    def __init__(self, processor: Any, config: Any) -> None:
        self.processor = processor
        self.image_token_id = int(config.image_token_id)
        self.merge = int(config.vision_config.spatial_merge_size)

    def prepare(
        self, input_ids: Sequence[int] | None, text: str | None, images: Sequence[Any]
    ) -> tuple[list[int], VisionInputs]:
        """Expanded prompt ids and vision tensors of one request.

        Args:
            input_ids: the prompt ids with one image token per image, or None when `text` is given.
            text: the prompt text with one placeholder per image, used when `input_ids` is None.
            images: decoded images, one per placeholder in order.

        Returns:
            (prompt ids with each image token expanded to its image's merged patch count, vision tensors).

        Raises:
            ValueError: the number of image tokens differs from the number of images (expanded ids included).
        """
        if input_ids is None:
            placeholder = self.processor.tokenizer.convert_ids_to_tokens(self.image_token_id)
            if (text or "").count(placeholder) != len(images):
                raise ValueError(
                    f"the text has {(text or '').count(placeholder)} {placeholder} for {len(images)} image(s) in "
                    "image_data (one per image, not expanded)"
                )
            out = self.processor(text=[text], images=list(images), return_tensors="pt")
            ids = [int(t) for t in out["input_ids"][0].tolist()]
        else:
            out = self.processor.image_processor(images=list(images), return_tensors="pt")
            ids = self._expand(list(input_ids), out["image_grid_thw"])
        return ids, VisionInputs(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"])

    def _expand(self, ids: list[int], grid_thw: torch.Tensor) -> list[int]:
        # SGLang's `_expand_input_ids`: the i-th image token of the request becomes image i's tokens.
        counts = [int(t * h * w) // self.merge**2 for t, h, w in grid_thw.tolist()]
        found = ids.count(self.image_token_id)
        if found != len(counts):
            raise ValueError(
                f"input_ids hold {found} image token(s) for {len(counts)} image(s) in image_data: send one "
                "<|image_pad|> per image, not expanded (SGLang expands each one into its image) and none elsewhere"
            )
        images = iter(counts)
        out: list[int] = []
        for token in ids:
            out.extend([token] * next(images) if token == self.image_token_id else [token])
        return out


def mrope_positions(inner_model: Any, input_ids: Sequence[int], image_grid_thw: torch.Tensor | None) -> torch.Tensor:
    """`[3, P]` int64 rotary positions of one prompt, from the model's `get_rope_index` (Qwen2/2.5/3-VL).

    Text tokens advance all three rows by one; an image's tokens get (0, row, column) offsets from the
    position where the image starts, and the text after it continues from that position plus the image's
    larger side (in merged patches). A prompt without images gets `arange(P)` on all rows.

    Args:
        inner_model: the `*VLModel` (the `model` attribute of `*ForConditionalGeneration`).
        input_ids: `[P]` prompt ids with expanded image tokens.
        image_grid_thw: `[num_images, 3]` grids of the prompt's images, or None.
    """
    ids = torch.tensor(list(input_ids), dtype=torch.long)[None]
    if image_grid_thw is None:
        return torch.arange(ids.shape[1]).expand(3, -1).clone()
    config = inner_model.config
    token_type = (ids == config.image_token_id).long() + 2 * (ids == config.video_token_id).long()
    pos, _ = inner_model.get_rope_index(ids, mm_token_type_ids=token_type, image_grid_thw=image_grid_thw)
    return pos[:, 0, :]
