"""What a reward function may return, checked where it returns (`checked_reward`, `call_reward_plugin`).

A reward is a finite number or a dict of scores (`--reward-key` picks one). NaN, infinity, None or any other type
would otherwise surface later as a bare "reward nan is not finite" in training, or a broken advantage; here it is
an error naming the reward function and the sample. So is an exception the function raises.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from slime_core.sample import Sample
from slime_rollout.plugins import call_maybe_async

__all__ = ["RewardFunctionError", "call_reward_plugin", "checked_reward"]


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something that is not a reward; the message names both."""


def _bad_value(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return None if math.isfinite(float(value)) else f"a non-finite reward ({value!r})"
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, numbers.Real) and not isinstance(item, bool) and not math.isfinite(float(item)):
                return f"a non-finite score {key!r}={item!r}"
        return None
    return f"{type(value).__name__} {value!r:.80}, not a number or a dict of scores"


def checked_reward(value: Any, *, source: str, sample: Sample) -> Any:
    """`value` if it is a reward (a finite number or a dict without non-finite numbers).

    Args:
        value: what the reward function returned.
        source: names the function (`--custom-rm-path my.rm`, `--rm-type remote_rm (http://...)`).
        sample: the sample it scored.

    Raises:
        RewardFunctionError: naming `source`, the sample index and what was wrong.
    """
    problem = _bad_value(value)
    if problem is not None:
        raise RewardFunctionError(f"{source} returned {problem} for sample {sample.index}")
    return value


async def call_reward_plugin(fn: Callable[..., Any], *call_args: Any, source: str, sample: Sample, **kwargs: Any):
    """Calls a (sync or async) reward function; its exceptions become one error naming it and the sample.

    Raises:
        RewardFunctionError: the function raised (chained) or returned a non-reward.
    """
    try:
        value = await call_maybe_async(fn, *call_args, **kwargs)
    except Exception as e:
        raise RewardFunctionError(f"{source} raised {type(e).__name__} on sample {sample.index}: {e}") from e
    return checked_reward(value, source=source, sample=sample)
