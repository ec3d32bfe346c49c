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


# The original's image/video helpers for multimodal rollouts (examples/geo3k_vlm*): media inputs are not implemented.
_MULTIMODAL = frozenset({"build_processor_kwargs", "encode_image_for_rollout_engine", "process_vision_info"})


def __getattr__(name: str) -> Any:
    """`from slime.utils.processing_utils import build_processor_kwargs` fails with what is missing and why."""
    if name in _MULTIMODAL:
        raise ImportError(
            f"slime.utils.processing_utils.{name} is not provided: multimodal (image/video) rollouts are not "
            "implemented in this version (MIGRATION.md, Plugins)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
