"""`slime.utils.processing_utils`: tokenizer and processor loading (original module path).

Prompts are text only in this version, so `load_processor` returns None, as the original does for a
text-only checkpoint (whose "processor" is just its tokenizer).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_processor", "load_tokenizer"]


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def load_processor(name_or_path: str, **kwargs: Any) -> None:
    """None: no multimodal processor (text-only prompts; `--multimodal-keys` is not implemented)."""
    del name_or_path, kwargs
    return None
