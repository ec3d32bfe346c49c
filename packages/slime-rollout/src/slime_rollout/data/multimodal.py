r"""Images of vision-language prompts (`--multimodal-keys`): from dataset rows to processor tensors and engines.

Flow of one prompt:

1. Data source (`rows_to_samples`): the column named by `--multimodal-keys '{"image": "<column>"}'` holds one
   image per `<image>` placeholder of the prompt (a list, or a single value for one image). Each image may be a
   file path (relative paths: the dataset file's directory, else the working directory), `file://` path, raw
   bytes, a base64 string or `data:` URI, or a Hugging Face `datasets` image struct `{"bytes": ..., "path": ...}`.
   `normalize_image` turns each into a path or a `data:image/...;base64,` URI, stored in
   `Sample.multimodal_inputs["images"]`; `build_messages` splits the prompt text at its placeholders into chat
   content parts (`{"type": "image"}` / `{"type": "text"}`), which the processor's chat template renders (for
   Qwen-VL: `<|vision_start|><|image_pad|><|vision_end|>`).
2. Generate (`prepare_vision_prompt`, once per prompt group): each image is decoded, resized to the size the
   model's processor would resize it to (so the engine, running the same processor on what it receives, sees
   exactly these pixels and expands exactly as many image tokens), and processed together with the prompt text:
   prompt ids with every image placeholder expanded to one token per merged patch (what the sample and the
   trainer hold), `pixel_values` and `image_grid_thw` for the trainer, and for the engine the resized images as
   PNG `data:` URIs (`image_data`) with the prompt ids whose image runs are collapsed back to one placeholder each.

What SGLang 0.5.16 does with `input_ids` + `image_data` (read in its source, `srt/managers/tokenizer_manager.py`
`_tokenize_one_request` and `srt/multimodal/processors/base_processor.py` / `qwen_vl.py`): it decodes the ids to
text, runs the Hugging Face processor on that text and the images (which replaces every `<|image_pad|>` of the
text by one image's tokens), then, with `SGLANG_MM_AVOID_RETOKENIZE` (on by default), keeps the sent ids and
expands the i-th `<|image_pad|>` to image i's token count. Ids that are already expanded would make the processor
see one placeholder per merged patch for a single image and fail the request; so the engine gets exactly one
`<|image_pad|>` per image and nowhere else, and reports the expanded length as `meta_info.prompt_tokens`.

Pillow decodes images; transformers' `AutoProcessor` of `--hf-checkpoint` (Qwen2-VL / Qwen2.5-VL / Qwen3-VL
families) does the rest. No image is fetched over the network: URLs are rejected with a clear error.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import io
import json
import os
import pathlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slime_core.error_text import shorten

if TYPE_CHECKING:
    import torch  # imported where tensors are made: the data source and reward workers do not need torch

__all__ = [
    "IMAGE_PLACEHOLDER",
    "VisionPrompt",
    "build_messages",
    "check_row_images",
    "collapse_image_runs",
    "decode_image",
    "get_processor",
    "image_column",
    "normalize_image",
    "normalize_images",
    "png_data_uri",
    "prepare_vision_prompt",
    "to_rgb",
    "resize_to_processor",
    "sample_images",
    "vision_token_ids",
]

#: The placeholder marking where an image goes in a prompt text (the original slime's).
IMAGE_PLACEHOLDER = "<image>"
# Processor outputs that are not vision tensors for the trainer (the ids travel as Sample.tokens).
_NOT_TRAIN_INPUTS = frozenset({"input_ids", "attention_mask", "mm_token_type_ids"})
_DATA_URI = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)
_IMAGE_STRUCT_KEYS = frozenset({"bytes", "path", "image", "type"})
# Keys of a chat content part that hold the image itself (Qwen-VL / OpenAI message forms).
_INLINE_IMAGE_KEYS = ("image", "image_url", "path", "url")


def image_column(multimodal_keys: dict[str, str] | None) -> str | None:
    """The dataset column of the images (`--multimodal-keys '{"image": "<column>"}'`), or None."""
    return (multimodal_keys or {}).get("image")


def _data_uri(raw: bytes, where: str) -> str:
    """`data:image/<format>;base64,...` of encoded image bytes (kept as they are, not re-encoded)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as img:
            fmt = (img.format or "png").lower()
    except Image.DecompressionBombError as e:
        raise ValueError(f"{where}: {_too_large(e)}") from None
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"{where}: not a readable image ({e})") from None
    return f"data:image/{fmt};base64,{base64.b64encode(raw).decode('ascii')}"


def _path_candidates(value: str, base_dir: pathlib.Path | None) -> list[pathlib.Path]:
    path = pathlib.Path(value.removeprefix("file://")).expanduser()
    if path.is_absolute():
        return [path]
    return [*([base_dir / path] if base_dir else []), pathlib.Path.cwd() / path]


def normalize_image(value: Any, *, base_dir: pathlib.Path | None, where: str) -> str:
    """One dataset image value as a file path or a `data:` URI (what `Sample.multimodal_inputs` stores).

    Args:
        value: a path (`str` or `file://`), raw bytes, a base64 string (bare or `data:` URI), or a dict with
            `bytes`/`path` (Hugging Face `datasets` image) or `image` holding one of these.
        base_dir: directory relative paths are resolved against first (the dataset file's).
        where: location for error messages (file and row).

    Returns:
        An absolute path of an existing file, or a `data:image/...;base64,` URI of bytes Pillow can open.

    Raises:
        ValueError: a URL, a missing file, bytes that are no image, or a value of another type.
    """
    if isinstance(value, dict):
        unknown = set(value) - _IMAGE_STRUCT_KEYS
        if unknown:
            raise ValueError(f"{where}: image dict has unknown keys {sorted(unknown)} (known: bytes, path, image)")
        inner = value.get("bytes") or value.get("image") or value.get("path")
        if inner is None:
            raise ValueError(f"{where}: image dict without bytes, path or image")
        return normalize_image(inner, base_dir=base_dir, where=where)
    if isinstance(value, bytes | bytearray | memoryview):
        return _data_uri(bytes(value), where)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: an image must be a path, bytes or base64 string, got {type(value).__name__}")
    if value.startswith(("http://", "https://")):
        raise ValueError(f"{where}: image URLs are not fetched ({value[:60]!r}); download the images and give paths")
    if _DATA_URI.match(value):
        return _data_uri(_b64decode(value.split(",", 1)[1], where), where)
    candidates = _path_candidates(value, base_dir) if len(value) < 4096 and "\n" not in value else []
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate.resolve())
    try:
        raw = base64.b64decode(_without_whitespace(value), validate=True)
    except (binascii.Error, ValueError):
        tried = ", ".join(str(c) for c in candidates) or "none"
        raise ValueError(
            f"{where}: image {value[:60]!r} is neither an existing file (looked at {tried}) nor base64"
        ) from None
    return _data_uri(raw, where)


def _without_whitespace(text: str) -> str:
    """Base64 text without its line breaks and spaces (the `base64` CLI wraps at 76 columns, MIME at 76)."""
    return "".join(text.split())


def _b64decode(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(_without_whitespace(text), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: the data: URI does not hold valid base64 ({text[:40]!r}...)") from None


def normalize_images(value: Any, *, base_dir: pathlib.Path | None, where: str) -> list[str]:
    """A dataset cell of images (a list, a JSON list string, or a single image) as normalized images.

    See `normalize_image`. Raises ValueError naming `where` for a malformed JSON list or a bad image.
    """
    if value is None:
        return []
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        try:
            value = json.loads(value)  # a JSON list stored as a string column
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{where}: the image cell {shorten(value, 60)!r} looks like a JSON list but is not ({e})"
            ) from None
    items = list(value) if isinstance(value, list | tuple) else [value]
    return [normalize_image(v, base_dir=base_dir, where=f"{where} image {i + 1}") for i, v in enumerate(items)]


def decode_image(image: str) -> Any:
    """Opens a normalized image (path or `data:` URI) as an RGB `PIL.Image` (fully loaded).

    Raises:
        ValueError: the bytes cannot be decoded (message names the image).
    """
    from PIL import Image, UnidentifiedImageError

    name = shorten(image, 43) if image.startswith("data:") else image  # a data: URI is the whole image
    try:
        source: Any = io.BytesIO(base64.b64decode(image.split(",", 1)[1])) if image.startswith("data:") else image
        with Image.open(source) as img:
            img.load()
            return to_rgb(img)
    except Image.DecompressionBombError as e:
        raise ValueError(f"image {name}: {_too_large(e)}") from None
    except (UnidentifiedImageError, OSError, binascii.Error, ValueError) as e:
        raise ValueError(f"image {name}: cannot be decoded ({e})") from None


# Pillow's modes of 16-bit grayscale (a 16-bit PNG or TIFF opens as "I;16"), whose values run 0..65535.
_GRAY16_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def to_rgb(image: Any) -> Any:
    """A `PIL.Image` in RGB; 16-bit grayscale scaled to 8 bits first (`round(v * 255 / 65535)`), as viewers show it.

    Pillow's (and so transformers' `convert_to_rgb`, the original's `qwen_vl_utils.to_rgb`) conversion of a 16-bit
    image clips every value above 255: a typical 16-bit scan came out all white. Other modes convert as Pillow does.
    """
    if image.mode == "RGB":
        return image
    if image.mode in _GRAY16_MODES:
        import numpy as np
        from PIL import Image

        values = np.asarray(image, dtype=np.uint32)
        return Image.fromarray(((values * 255 + 32767) // 65535).astype(np.uint8)).convert("RGB")
    return image.convert("RGB")


def _too_large(error: Exception) -> str:
    """Why Pillow refused to open an image (`DecompressionBombError`: pixels over twice `MAX_IMAGE_PIXELS`)."""
    from PIL import Image

    # Pillow refuses before decoding, so the image is never resized to the processor's max_pixels; a smaller copy
    # of it is what the model would see anyway.
    return (
        f"too large to decode ({error}; Pillow refuses more than 2 x PIL.Image.MAX_IMAGE_PIXELS = "
        f"{2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels): downscale it below the processor's max_pixels"
    )


def check_row_images(row: dict[str, Any], *, input_key: str, image_key: str, base_dir: pathlib.Path, where: str) -> int:
    """Checks one dataset row's images: each one found and decodable, one per `<image>` placeholder.

    What preflight runs on every row before anything starts (the data source repeats the cheap part).

    Returns:
        The number of images of the row.

    Raises:
        ValueError: a missing, unreadable or surplus image, or a missing one for a placeholder (names `where`).
    """
    images = normalize_images(row.get(image_key), base_dir=base_dir, where=where)
    build_messages(row.get(input_key, ""), images, where=where)
    for i, image in enumerate(images):
        try:
            decode_image(image)
        except ValueError as e:
            raise ValueError(f"{where} image {i + 1}: {e}") from None
    return len(images)


def build_messages(prompt: Any, images: Sequence[str], *, where: str) -> list[dict[str, Any]]:
    """Chat messages whose text is split at each `<image>` placeholder into image and text content parts.

    Args:
        prompt: the prompt text (one user message) or a list of chat messages. String contents are split; in
            contents given as part lists, each bare `{"type": "image"}` part is a placeholder too and gets the
            next image, other parts are kept.
        images: normalized images, one per placeholder in order.
        where: location for error messages.

    Returns:
        Messages with `content` lists like `[{"type": "image", "image": img}, {"type": "text", "text": "..."}]`.

    Raises:
        ValueError: the number of placeholders differs from the number of images, or a content part carries its
            own image (or a video): images come only from the `--multimodal-keys` column.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    queue = list(images)
    placeholders = 0
    for m, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            # The chat template renders every image part as one image slot: a part whose image was not read (an
            # inline one) would put image tokens in the prompt without pixels, silently.
            kept: list[Any] = []
            for p, part in enumerate(content):
                kind = _media_part(part)
                if kind is None:
                    kept.append(part)
                    continue
                if kind != "image" or any(part.get(k) is not None for k in _INLINE_IMAGE_KEYS):
                    raise ValueError(
                        f"{where}: message {m + 1} content part {p + 1} carries its own {kind} "
                        f"({shorten(str(part), 80)}); images are read only from the --multimodal-keys column: "
                        f"write {IMAGE_PLACEHOLDER} (or a bare {{'type': 'image'}} part) and put the image there"
                    )
                placeholders += 1
                if queue:
                    kept.append({"type": "image", "image": queue.pop(0)})
            message["content"] = kept
            continue
        if not isinstance(content, str):
            continue
        parts: list[dict[str, Any]] = []
        for i, piece in enumerate(content.split(IMAGE_PLACEHOLDER)):
            if i > 0:
                placeholders += 1
                if queue:
                    parts.append({"type": "image", "image": queue.pop(0)})
            if piece:
                parts.append({"type": "text", "text": piece})
        message["content"] = parts
    if placeholders != len(images):
        raise ValueError(
            f"{where}: the prompt has {placeholders} {IMAGE_PLACEHOLDER} placeholder(s) for {len(images)} image(s) "
            "in the --multimodal-keys column (one placeholder per image)"
        )
    return messages


def _media_part(part: Any) -> str | None:
    """`"image"`, `"video"` or `"audio"` for a chat content part the template renders as media, else None."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "image_url" or "image_url" in part:
        return "image"
    for media in ("image", "video", "audio"):
        if kind == media:
            return media
    return next((media for media in ("image", "video", "audio") if media in part), None)


# The files an image (or video) processor is read from (transformers' PROCESSOR_NAME, IMAGE_PROCESSOR_NAME /
# FEATURE_EXTRACTOR_NAME, VIDEO_PROCESSOR_NAME): a local checkpoint without any of them has no image processor.
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")


def may_have_processor(path: str) -> bool:
    """False when `path` is a local checkpoint folder without any processor file (`_PROCESSOR_FILES`), else True.

    A hub id or a missing folder gives True: only transformers can tell then.
    """
    return not os.path.isdir(path) or any(os.path.isfile(os.path.join(path, f)) for f in _PROCESSOR_FILES)


@functools.cache
def get_processor(path: str) -> Any:
    """The Hugging Face processor of a vision-language checkpoint (cached per path).

    Raises:
        ValueError: the checkpoint has no image processor (not a vision-language model).
    """
    if not may_have_processor(path):
        # Known without transformers: AutoProcessor took ~18 s to come back with a bare tokenizer (measured on the
        # Qwen3 tokenizer fixture, CPU), paid by every process that asks (the compat GenerateState, per process).
        raise ValueError(_no_image_processor(path))
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"--multimodal-keys: cannot load the processor of --hf-checkpoint {path} ({e})") from None
    if getattr(processor, "image_processor", None) is None:
        raise ValueError(_no_image_processor(path))
    return processor


def _no_image_processor(path: str) -> str:
    return (
        f"--multimodal-keys: --hf-checkpoint {path} has no image processor (preprocessor_config.json); "
        "it is not a vision-language checkpoint"
    )


def sample_images(sample: Any) -> list[str]:
    """The normalized images of a sample (`multimodal_inputs["images"]`), empty for text-only samples.

    The data source stores paths and `data:` URIs; a plugin may also put what the original's plugins hold
    there: `PIL.Image`s (encoded as lossless PNG `data:` URIs here), raw bytes or Hugging Face image dicts.

    Raises:
        ValueError: an image of another type, or bytes that are no image (the message names the sample).
    """
    out = []
    for i, image in enumerate((sample.multimodal_inputs or {}).get("images") or []):
        if isinstance(image, str):
            out.append(image)
        elif callable(getattr(image, "save", None)) and hasattr(image, "mode"):  # a PIL.Image
            out.append(png_data_uri(to_rgb(image)))
        else:
            out.append(normalize_image(image, base_dir=None, where=f"sample {sample.index} image {i + 1}"))
    return out


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class VisionPrompt:
    """A prompt with images after the processor.

    Attributes:
        input_ids: prompt ids, each image placeholder expanded to `grid_t * grid_h * grid_w / merge²` tokens.
        train_inputs: the processor's vision tensors (`pixel_values` `[P, C*T*p*p]` float32, `image_grid_thw`
            `[num_images, 3]` int64, ...), shared by the samples of the prompt's group.
        engine_images: the images as the processor saw them (resized), PNG `data:` URIs for `/generate`'s
            `image_data`.
        engine_input_ids: `input_ids` with each image's run of image tokens collapsed to one (the chat template's
            `<|vision_start|><|image_pad|><|vision_end|>`): the `/generate` `input_ids` of the prompt, which the
            engine expands back to `input_ids` (see the module docstring).
    """

    input_ids: tuple[int, ...]
    train_inputs: dict[str, torch.Tensor]
    engine_images: tuple[str, ...]
    engine_input_ids: tuple[int, ...]


@functools.cache
def vision_token_ids(checkpoint: str) -> tuple[int, int]:
    """`(image_token_id, vision_start_token_id)` of a vision-language checkpoint's config (what SGLang reads too)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(checkpoint)
    return int(config.image_token_id), int(config.vision_start_token_id)


def collapse_image_runs(ids: Sequence[int], image_token_id: int, vision_start_id: int) -> list[int]:
    """Prompt ids with every run of image tokens right after `<|vision_start|>` collapsed to one image token.

    The inverse of the processor's expansion: `[s, p, p, p, e]` -> `[s, p, e]` for vision start `s`, image token
    `p`, vision end `e`. Image tokens elsewhere are kept as they are.

    Args:
        ids: token ids, image placeholders expanded.
        image_token_id: the image placeholder (`<|image_pad|>`, 151655 in the Qwen vocabularies).
        vision_start_id: the token before each image (`<|vision_start|>`, 151652).
    """
    out: list[int] = []
    i = 0
    while i < len(ids):
        out.append(ids[i])
        if ids[i] == image_token_id and i > 0 and ids[i - 1] == vision_start_id:
            while i + 1 < len(ids) and ids[i + 1] == image_token_id:  # the rest of this image's run
                i += 1
        i += 1
    return out


def png_data_uri(image: Any) -> str:
    """A `PIL.Image` as a lossless PNG `data:image/png;base64,...` URI (what `/generate`'s `image_data` takes)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _run_processor(processor: Any, text: str, images: list[Any]) -> Any:
    return processor(text=[text], images=images, return_tensors="pt")


def _processed_sizes(processor: Any, grid_thw: torch.Tensor) -> list[tuple[int, int]]:
    """(width, height) in pixels the processor resized each image to: grid rows × columns × patch size."""
    patch = int(processor.image_processor.patch_size)
    return [(int(w) * patch, int(h) * patch) for _, h, w in grid_thw.tolist()]


def resize_to_processor(processor: Any, images: Sequence[Any]) -> list[Any]:
    """Each `PIL.Image` resized (bicubic) to the size the processor's image processor resizes it to.

    The processor then leaves the returned images as they are, so an engine that runs the same processor on them
    sees the same pixels. Sizes come from the image processor's own `image_grid_thw` (its patch size, merge size
    and min/max pixels); an image already at its size is returned as it is.

    Args:
        processor: a Qwen-VL-style processor (`image_processor` with `patch_size`, output `image_grid_thw`).
        images: RGB `PIL.Image`s.

    Returns:
        The images, in order, at (grid_w * patch, grid_h * patch) pixels.
    """
    if not images:
        return []
    from PIL import Image

    grid = processor.image_processor(images=list(images), return_tensors="pt")["image_grid_thw"]
    sizes = _processed_sizes(processor, grid)
    return [
        img if img.size == size else img.resize(size, Image.Resampling.BICUBIC)
        for img, size in zip(images, sizes, strict=True)
    ]


@functools.lru_cache(maxsize=256)
def _prepare_cached(checkpoint: str, text: str, images: tuple[str, ...]) -> VisionPrompt:
    # The n samples of a group share one prompt: process it once (256 entries cover the groups in flight).
    processor = get_processor(checkpoint)
    placeholder = getattr(processor, "image_token", "<|image_pad|>")
    if text.count(placeholder) != len(images):
        # The processor (and SGLang's, on the engine) turns every placeholder into one whole image.
        raise ValueError(f"the prompt has {text.count(placeholder)} {placeholder} for {len(images)} image(s)")
    pil = [decode_image(img) for img in images]
    out = _run_processor(processor, text, pil)
    sizes = _processed_sizes(processor, out["image_grid_thw"])
    if any(img.size != size for img, size in zip(pil, sizes, strict=True)):
        # Resize to the processor's target ourselves and process again (a no-op resize now), so that the pixels
        # the trainer sees are exactly the ones sent to the engine, whose processor then leaves them as they are.
        from PIL import Image

        pil = [img.resize(size, Image.Resampling.BICUBIC) for img, size in zip(pil, sizes, strict=True)]
        out = _run_processor(processor, text, pil)
    import torch

    train_inputs = {k: v for k, v in out.items() if k not in _NOT_TRAIN_INPUTS and isinstance(v, torch.Tensor)}
    input_ids = tuple(int(t) for t in out["input_ids"][0].tolist())
    image_token_id, vision_start_id = vision_token_ids(checkpoint)
    engine_input_ids = tuple(collapse_image_runs(input_ids, image_token_id, vision_start_id))
    if engine_input_ids.count(image_token_id) != len(pil):
        # SGLang expands the i-th image token of the request into image i: an image placeholder not right after
        # <|vision_start|> (a template that does not write `<|vision_start|><|image_pad|>`) cannot be sent.
        raise ValueError(
            f"the prompt has {engine_input_ids.count(image_token_id)} image tokens for {len(pil)} image(s) once each "
            "image's run after <|vision_start|> is collapsed: every image placeholder must follow <|vision_start|>"
        )
    return VisionPrompt(
        input_ids=input_ids,
        train_inputs=train_inputs,
        engine_images=tuple(png_data_uri(img) for img in pil),
        engine_input_ids=engine_input_ids,
    )


def prepare_vision_prompt(checkpoint: str, text: str, images: Sequence[str]) -> VisionPrompt:
    """Runs the processor of `checkpoint` on a rendered prompt and its images (cached per prompt).

    Args:
        checkpoint: `--hf-checkpoint` (its processor and preprocessor config).
        text: the prompt after the chat template, one image placeholder per image.
        images: normalized images (paths or `data:` URIs), in placeholder order.

    Returns:
        The expanded prompt ids, the trainer's vision tensors, and the engine's images and prompt ids.

    Raises:
        ValueError: an image cannot be decoded, the prompt's `<|image_pad|>` placeholders are not one per image,
            or one of them does not follow `<|vision_start|>`.
    """
    if not isinstance(text, str):
        raise ValueError("a prompt with images must be a rendered string (--apply-chat-template)")
    return _prepare_cached(os.fspath(checkpoint), text, tuple(images))
