"""`slime.rollout.base_types`: what rollout functions return (original module path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slime_rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput, wrap_rollout_output

__all__ = ["RolloutFnEvalOutput", "RolloutFnTrainOutput", "call_rollout_fn"]


def call_rollout_fn(fn: Callable[..., Any], *args: Any, evaluation: bool, **kwargs: Any) -> Any:
    """Calls a rollout function with `evaluation=` and wraps a legacy bare return value (groups list or dict)."""
    return wrap_rollout_output(fn(*args, **kwargs, evaluation=evaluation), evaluation=evaluation)
