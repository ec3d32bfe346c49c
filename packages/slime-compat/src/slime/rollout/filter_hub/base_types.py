"""`slime.rollout.filter_hub.base_types`: what a dynamic-sampling filter returns (original module path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slime_core.protocols import DynamicFilterOutput
from slime_rollout.generation.filters import normalize_filter_output

__all__ = ["DynamicFilterOutput", "call_dynamic_filter"]


def call_dynamic_filter(fn: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> DynamicFilterOutput:
    """Calls a filter (None keeps everything) and wraps a bare bool return in `DynamicFilterOutput`."""
    if fn is None:
        return DynamicFilterOutput(keep=True)
    return normalize_filter_output(fn(*args, **kwargs))
