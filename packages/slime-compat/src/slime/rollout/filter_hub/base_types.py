"""`slime.rollout.filter_hub.base_types`: what a dynamic-sampling filter returns (original module path).

Also the helpers the original's `generate_rollout_async` uses around a filter (`should_drop_dynamic_filter_output`,
`MetricGatherer`), for custom rollout functions written from a copy of it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from slime_core.protocols import DynamicFilterOutput
from slime_rollout.generation.filters import normalize_filter_output, should_drop_dynamic_filter_output

__all__ = ["DynamicFilterOutput", "MetricGatherer", "call_dynamic_filter", "should_drop_dynamic_filter_output"]


def call_dynamic_filter(fn: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> DynamicFilterOutput:
    """Calls a filter (None keeps everything) and wraps a bare bool return in `DynamicFilterOutput`."""
    if fn is None:
        return DynamicFilterOutput(keep=True)
    return normalize_filter_output(fn(*args, **kwargs))


class MetricGatherer:
    """Counts dropped groups per filter reason; `collect()` gives `{"rollout/dynamic_filter/drop_<reason>": n}`."""

    def __init__(self) -> None:
        self._drops: collections.Counter[str] = collections.Counter()

    def on_dynamic_filter_drop(self, reason: str | None) -> None:
        """Counts one dropped group under `reason` (a drop without a reason is not counted, as in the original)."""
        if reason:
            self._drops[reason] += 1

    def collect(self) -> dict[str, int]:
        """The counts so far, as the original's metric names."""
        return {f"rollout/dynamic_filter/drop_{reason}": n for reason, n in self._drops.items()}
