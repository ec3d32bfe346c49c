"""What a reward function may return, checked where it returns (`checked_reward`, `call_reward_plugin`).

A reward is a finite number or a dict of scores (`--reward-key` picks one). NaN, infinity, None or any other type
would otherwise surface later as a bare "reward nan is not finite" in training, or a broken advantage; here it is
an error naming the reward function and the sample. So is an exception the function raises, and a call that runs
past its deadline (`--rm-timeout-secs`; warned about every `--slow-call-warning-secs` while it runs).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from slime_core.sample import Sample
from slime_rollout.deadlines import DeadlineExceeded, call_plugin_with_deadline

__all__ = [
    "DEFAULT_RM_TIMEOUT_S",
    "DEFAULT_WARN_EVERY_S",
    "RewardFunctionError",
    "call_reward_plugin",
    "checked_reward",
]

DEFAULT_RM_TIMEOUT_S = 600.0  # `--rm-timeout-secs`' default
DEFAULT_WARN_EVERY_S = 60.0  # `--slow-call-warning-secs`' default


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


async def call_reward_plugin(
    fn: Callable[..., Any],
    *call_args: Any,
    source: str,
    sample: Sample,
    deadline_s: float = DEFAULT_RM_TIMEOUT_S,
    warn_every_s: float = DEFAULT_WARN_EVERY_S,
    **kwargs: Any,
):
    """Calls a (sync or async) reward function under a deadline; what goes wrong is one error naming it and the sample.

    A sync function runs in a worker thread, so one that never returns cannot block the event loop
    (`slime_rollout.deadlines`); a warning every `warn_every_s` seconds says it is still running.

    Args:
        fn: the reward function.
        *call_args: its arguments (`args, sample` or `args, samples`).
        source: names the function (`--custom-rm-path my.rm`).
        sample: the sample it scores (the first of a group), named in messages.
        deadline_s: seconds the call may take (`--rm-timeout-secs`).
        warn_every_s: seconds between "still running" warnings (`--slow-call-warning-secs`).
        **kwargs: its keyword arguments.

    Raises:
        RewardFunctionError: the function raised (chained), returned a non-reward, or ran past `deadline_s`.
    """
    what = f"reward function {source} on sample {sample.index}"
    try:
        value = await call_plugin_with_deadline(
            fn, *call_args, what=what, deadline_s=deadline_s, flag="--rm-timeout-secs", warn_every_s=warn_every_s,
            **kwargs,
        )  # fmt: skip
    except DeadlineExceeded as e:
        raise RewardFunctionError(str(e)) from e
    except Exception as e:
        raise RewardFunctionError(f"{source} raised {type(e).__name__} on sample {sample.index}: {e}") from e
    return checked_reward(value, source=source, sample=sample)
