"""Loading user plugins given as import paths (`--custom-rm-path my_mod.reward`).

Paths of the original slime (`slime.rollout.sglang_rollout.generate_rollout`, ...) are accepted and
mapped to their equivalents here, so existing launch scripts keep working.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["ORIGINAL_PATH_ALIASES", "accepts_kwarg", "call_maybe_async", "load_function"]

ORIGINAL_PATH_ALIASES: dict[str, str] = {
    "slime.rollout.sglang_rollout.generate_rollout": "slime_rollout.rollout.generate_rollout",
    "slime.rollout.sglang_rollout.generate": "slime_rollout.generate.generate",
    "slime.rollout.sglang_rollout.eval_rollout": "slime_rollout.eval.eval_rollout",
    "slime.rollout.data_source.RolloutDataSourceWithBuffer": "slime_rollout.data_source.RolloutDataSourceWithBuffer",
    "slime.rollout.data_source.RolloutDataSource": "slime_rollout.data_source.RolloutDataSource",
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std": (
        "slime_rollout.filters.check_reward_nonzero_std"
    ),
    "slime.rollout.rm_hub.async_rm": "slime_rollout.rewards.async_rm",
    "slime.rollout.rm_hub.batched_async_rm": "slime_rollout.rewards.batched_async_rm",
}


@functools.cache
def load_function(path: str) -> Callable[..., Any]:
    """Imports `package.module.attr` and returns the attribute.

    Args:
        path: dotted import path; original slime paths are translated (`ORIGINAL_PATH_ALIASES`).

    Raises:
        ValueError: if the path has no module part, the module cannot be imported, or lacks the attribute.
    """
    path = ORIGINAL_PATH_ALIASES.get(path, path)
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"plugin path {path!r} must look like 'package.module.function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import module {module_name!r} of plugin {path!r}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (plugin {path!r})") from None


async def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls `fn` and awaits the result if it is awaitable (plugins may be sync or async)."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def accepts_kwarg(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` takes a keyword argument `name` (or **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
