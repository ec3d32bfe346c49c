"""Qwen-VL image rules as SGLang 0.5.16 applies them, written from its source for tests that hold our code to it.

Loaded by file path (`importlib`), as the test trees are not packages.
"""

from __future__ import annotations

import math


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The Qwen-VL image size rule of SGLang's `srt/multimodal/processors/qwen_vl.py` `smart_resize` (the Hugging
    Face image processor's is the same): sides rounded to multiples of `factor` (patch x merge), then scaled down
    to at most `max_pixels` or up to at least `min_pixels` keeping the aspect ratio. Returns `(height, width)`."""
    h_bar, w_bar = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar, w_bar = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
