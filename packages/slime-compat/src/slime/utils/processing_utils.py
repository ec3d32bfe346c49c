"""`slime.utils.processing_utils`: tokenizer/processor loading and the image helpers of the original's VLM plugins.

Adapters over `slime_rollout.data.multimodal` with the original's signatures (THUDM/slime
`slime/utils/processing_utils.py`). Images are supported (Qwen-VL processors); an image may be a `PIL.Image` (as
the original's plugins pass) or any form `Sample.multimodal_inputs` or a dataset holds (path, `data:` URI, base64,
bytes). Videos and audio are not implemented and fail with one line. No image is fetched over the network.
"""

from __future__ import annotations

import logging
from typing import Any

from slime_rollout.data import multimodal

__all__ = [
    "build_processor_kwargs",
    "encode_image_for_rollout_engine",
    "load_processor",
    "load_tokenizer",
    "process_vision_info",
]

logger = logging.getLogger(__name__)

_NO_VIDEO = "videos are not implemented in this version (images only: slime_rollout.data.multimodal)"
# Media keys of the original's processor kwargs that this version cannot process.
_UNSUPPORTED_MEDIA = ("videos", "audio", "audios")


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def load_processor(name_or_path: str, **kwargs: Any) -> Any | None:
    """The checkpoint's vision-language processor, or None (text-only checkpoint, or none loadable), as the original.

    Without `kwargs` this is the framework's cached `slime_rollout.data.multimodal.get_processor`. A local folder
    without processor files is None at once (`multimodal.may_have_processor`; AutoProcessor took ~18 s to say so).
    """
    if not multimodal.may_have_processor(name_or_path):
        logger.info("load_processor(%s): no multimodal processor (no processor config file)", name_or_path)
        return None
    try:
        if not kwargs:
            return multimodal.get_processor(name_or_path)
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError) as e:
        logger.info("load_processor(%s): no multimodal processor (%s)", name_or_path, e)
        return None
    return processor if getattr(processor, "image_processor", None) is not None else None


def _pil(image: Any, where: str) -> Any:
    """A `PIL.Image` as it is, or any `normalize_image` form decoded to an RGB `PIL.Image`."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    return multimodal.decode_image(multimodal.normalize_image(image, base_dir=None, where=where))


def build_processor_kwargs(multimodal_inputs: dict | None = None) -> dict:
    """Keyword arguments for `processor(text=..., **build_processor_kwargs(multimodal_inputs))`, as the original.

    The media of `multimodal_inputs` are kept (images given as paths or `data:` URIs, e.g. from
    `Sample.multimodal_inputs`, are decoded to `PIL.Image`s); text outputs come back as lists (`text_kwargs`
    `return_tensors=None`, no `mm_token_type_ids`), vision outputs (`pixel_values`, `image_grid_thw`) as torch
    tensors (`images_kwargs`/`videos_kwargs`/`audio_kwargs` `return_tensors="pt"`).

    Args:
        multimodal_inputs: `{"images": [...], ...}` plus optional per-modality kwargs dicts, or None.

    Returns:
        A new dict; the argument is not modified.

    Raises:
        ValueError: videos or audio are given, or an image cannot be decoded.
    """
    result = dict(multimodal_inputs) if multimodal_inputs else {}
    if given := [k for k in _UNSUPPORTED_MEDIA if result.get(k)]:
        raise ValueError(f"build_processor_kwargs: {', '.join(given)} given; {_NO_VIDEO}")
    if result.get("images"):
        result["images"] = [
            _pil(img, f"build_processor_kwargs image {i + 1}") for i, img in enumerate(result["images"])
        ]
    result["text_kwargs"] = {**result.get("text_kwargs", {}), "return_tensors": None, "return_mm_token_type_ids": False}
    for key in ("audio_kwargs", "images_kwargs", "videos_kwargs"):
        result[key] = {**result.get(key, {}), "return_tensors": "pt"}
    return result


def encode_image_for_rollout_engine(image: Any) -> str:
    """An image as an RGB PNG `data:image/png;base64,...` URI (for `image_data` and `Sample.multimodal_inputs`).

    Args:
        image: a `PIL.Image` (any mode; converted to RGB, 16-bit grayscale scaled to 8 bits), or a path / `data:`
            URI / base64 string / bytes.

    Raises:
        ValueError: the image cannot be read (a URL, a missing file, bytes that are no image).
    """
    pil = _pil(image, "encode_image_for_rollout_engine")
    return multimodal.png_data_uri(multimodal.to_rgb(pil))


def _image_parts(messages: Any) -> list[Any]:
    """The image values of chat content parts (`{"type": "image", "image": x}` or `{"image_url": x | {"url": x}}`)."""
    found = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "video" or "video" in part:
                raise ValueError(f"process_vision_info: a video content part; {_NO_VIDEO}")
            value = part.get("image", part.get("image_url"))
            if value is None and part.get("type") in ("image", "image_url"):
                raise ValueError(f"process_vision_info: image part without an image: {part}")
            if value is not None:
                found.append(value.get("url") if isinstance(value, dict) else value)
    return found


def process_vision_info(prompt: Any, processor: Any) -> dict[str, Any]:
    """The images of a chat prompt, resized as `processor` resizes them: `{"images": [...] | None, "videos": None}`.

    As the original (qwen_vl_utils' `process_vision_info` with the processor's patch size): each image content part
    becomes an RGB `PIL.Image` at a multiple of patch size × merge size, here the exact size the processor's own
    image processor picks (`slime_rollout.data.multimodal.resize_to_processor`), so processing it again leaves it as is.

    Args:
        prompt: chat messages whose `content` may be a list of parts; a string prompt has no images.
        processor: the checkpoint's processor (`load_processor`).

    Raises:
        ValueError: a video part, an image part without an image, or an image that cannot be read (URLs are not
            fetched).
    """
    values = [] if isinstance(prompt, str) else _image_parts(prompt)
    images = [multimodal.to_rgb(_pil(v, f"process_vision_info image {i + 1}")) for i, v in enumerate(values)]
    return {"images": multimodal.resize_to_processor(processor, images) or None, "videos": None}
