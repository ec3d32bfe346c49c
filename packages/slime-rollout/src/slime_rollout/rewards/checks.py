"""What a reward function may return, checked where it returns (`checked_reward`, `call_reward_plugin`).

A reward is a finite number or a dict of scores (`--reward-key` picks one). NaN, infinity, a number too large for
a float (`10**400`), None or any other type would otherwise surface later as a bare "reward nan is not finite" or
`OverflowError` in training, or a broken advantage; here it is an error naming the reward function and the sample.
The numbers of a dict are checked however deeply they are nested (`{"score": {"x": nan}}`, a list of scores), since
`--reward-key` may pick any of them. So is an exception the function raises (`SystemExit` included: see
`slime_rollout.runtime.deadlines.PluginExit`), and a call that runs past its deadline (`--rm-timeout-secs`; warned about
every `--slow-call-warning-secs` while it runs).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from slime_core.sample import Sample
from slime_rollout.runtime.deadlines import DeadlineExceeded, PluginExit, call_plugin_with_deadline

__all__ = [
    "DEFAULT_RM_TIMEOUT_S",
    "DEFAULT_WARN_EVERY_S",
    "RewardFunctionError",
    "call_reward_plugin",
    "checked_reward",
    "describe_raised",
]

DEFAULT_RM_TIMEOUT_S = 600.0  # `--rm-timeout-secs`' default
DEFAULT_WARN_EVERY_S = 60.0  # `--slow-call-warning-secs`' default


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something that is not a reward; the message names both."""


_MAX_DEPTH = 8  # nesting levels of a reward dict that are checked; deeper is refused (or a dict that holds itself)


def _bad_number(value: numbers.Real, what: str) -> str | None:
    """Why a number cannot be a reward (non-finite, or too large for the float it becomes), or None."""
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        digits = str(value)
        return f"a {what} too large for a float ({digits[:20]}..., {len(digits)} digits)"
    return None if finite else f"a non-finite {what} ({value!r:.40})"


def _bad_score(value: Any, path: str, depth: int) -> str | None:
    """The first non-finite or overflowing number inside a reward dict's value (`path`: `'score'['x']`)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        problem = _bad_number(value, "score")
        return None if problem is None else f"{problem} at {path}"
    if depth >= _MAX_DEPTH and isinstance(value, Mapping | list | tuple):
        return f"a score {path} nested deeper than {_MAX_DEPTH} levels"
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, item in items:
        problem = _bad_score(item, f"{path}[{key!r}]", depth + 1)
        if problem is not None:
            return problem
    return None


def _bad_value(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        problem = _bad_number(value, "reward")
        return problem
    if isinstance(value, Mapping):
        for key, item in value.items():
            problem = _bad_score(item, repr(key), 1)
            if problem is not None:
                return problem
        return None
    return f"{type(value).__name__} {value!r:.80}, not a number or a dict of scores"


def describe_raised(error: BaseException) -> tuple[str, str]:
    """`(type name, message)` of what a plugin raised: for a `PluginExit`, of the `SystemExit` & co. it carries."""
    original = error.__cause__ if isinstance(error, PluginExit) and error.__cause__ is not None else error
    return type(original).__name__, str(original)


def checked_reward(value: Any, *, source: str, sample: Sample) -> Any:
    """`value` if it is a reward (a finite number or a dict with no non-finite number at any depth).

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
    (`slime_rollout.runtime.deadlines`); a warning every `warn_every_s` seconds says it is still running.

    Args:
        fn: the reward function.
        *call_args: its arguments (`args, sample` or `args, samples`).
        source: names the function (`--custom-rm-path my.rm`).
        sample: the sample it scores (the first of a group), named in messages.
        deadline_s: seconds the call may take (`--rm-timeout-secs`).
        warn_every_s: seconds between "still running" warnings (`--slow-call-warning-secs`).
        **kwargs: its keyword arguments.

    Raises:
        RewardFunctionError: the function raised (chained; `SystemExit` and other non-`Exception` errors too, but
            not `KeyboardInterrupt`), returned a non-reward, or ran past `deadline_s`.
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
        name, message = describe_raised(e)
        raise RewardFunctionError(f"{source} raised {name} on sample {sample.index}: {message}") from e
    return checked_reward(value, source=source, sample=sample)
