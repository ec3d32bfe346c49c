"""What a reward function may return, checked where it returns (`checked_reward`, `call_reward_plugin`).

A reward is a finite number or a dict of scores (`--reward-key` picks one). NaN, infinity, a number too large for
a float (`10**400`), None or any other type would otherwise surface later as a bare "reward nan is not finite" or
`OverflowError` in training, or a broken advantage; here it is an error naming the reward function and the sample.
The numbers of a dict are checked however deeply they are nested (`{"score": {"x": nan}}`, a list of scores), since
`--reward-key` may pick any of them. So is an exception the function raises (`SystemExit` included: see
`slime_rollout.runtime.deadlines.PluginExit`), and a call that runs past its deadline (`--rm-timeout-secs`; warned about
every `--slow-call-warning-secs` while it runs), its value's conversion included: a returned object whose
`__float__` (or `items()`, `__repr__`, ...) raises or never returns is converted within that deadline, off the event
loop, and then replaced by plain builtins (`plain_reward`), so nothing later runs the plugin's code again.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from slime_core.error_text import preview
from slime_core.sample import Sample
from slime_rollout.runtime.deadlines import DeadlineExceeded, PluginExit, call_plugin_with_deadline

__all__ = [
    "DEFAULT_RM_TIMEOUT_S",
    "DEFAULT_WARN_EVERY_S",
    "NotAReward",
    "RewardFunctionError",
    "call_reward_plugin",
    "checked_preset_reward",
    "checked_reward",
    "describe_raised",
    "plain_reward",
    "plain_rewards",
]

DEFAULT_RM_TIMEOUT_S = 600.0  # `--rm-timeout-secs`' default
DEFAULT_WARN_EVERY_S = 60.0  # `--slow-call-warning-secs`' default


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something that is not a reward; the message names both."""


_MAX_DEPTH = 8  # nesting levels of a reward dict that are checked; deeper is refused (or a dict that holds itself)


class NotAReward(ValueError):
    """What a reward function returned is not a reward; the message says what, and where in a dict."""


def plain_reward(value: Any) -> Any:
    """A copy of a reward made only of exact builtins (bool, int, float, str, None, dict, list, tuple), checked.

    A reward function's value may be any object: its `__float__`, `__index__`, `__bool__`, `__repr__`,
    `items()` or `__iter__` is user code, which may raise or never return. So every such call happens here, once,
    and callers run this under the reward deadline in a worker thread (`call_reward_plugin`); what comes out can
    be read on the event loop, pickled and sent to the trainer without running user code again.

    Args:
        value: what the reward function returned: a real number (a numpy scalar or a 0-d array or tensor too) or
            a mapping of scores (numbers, strings, None, lists, tuples and mappings of them, nested at most
            `_MAX_DEPTH` levels).

    Returns:
        Numbers as `float` (an exact `int` stays an `int`), mappings as `dict`, lists and tuples as themselves.

    Raises:
        NotAReward: a non-finite number, one too large for a float, another type, or a conversion that raised
            (the message names where, e.g. `'score'['x']`, and the exception).
    """
    try:
        value = _scalar(value)
        if type(value) is bool:
            return value
        if isinstance(value, numbers.Real):
            return _plain_number(value, "reward", "")
        if isinstance(value, Mapping):
            return {_plain_key(key): _plain_score(item, repr(key), 1) for key, item in value.items()}
        raise NotAReward(f"{type(value).__name__} {preview(value)}, not a number or a dict of scores")
    except NotAReward:
        raise
    except Exception as e:  # the value's own methods raised
        raise NotAReward(f"a {type(value).__name__} whose conversion raised {type(e).__name__}: {e}") from e


def _scalar(value: Any) -> Any:
    """A numpy scalar, 0-d array or 0-d tensor (`np.bool_(True)`, `torch.tensor(0.5)`) as its Python value.

    The original puts rewards into `torch.tensor(...)`, which takes these, so `return np.isclose(pred, gold)` or
    `return model(x).squeeze()` from a reward function worked there; anything else is returned unchanged.
    """
    if type(value) in (bool, int, float, str) or isinstance(value, Mapping):
        return value
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return value.item()
    return value


def _is_plain_number(value: Any) -> bool:
    """An exact `bool`, a finite `float` or an `int` within float range: a reward that runs no plugin code."""
    kind = type(value)
    return kind is bool or (kind is float and math.isfinite(value)) or (kind is int and abs(value) < 2**1000)


def _plain_number(value: numbers.Real, what: str, at: str) -> int | float:
    """`value` as a finite float (an exact int stays one), or NotAReward saying why not."""
    try:
        number = float.__float__(float(value))  # a float subclass becomes a plain float
    except OverflowError:
        try:
            digits = f"{str(value)[:20]}..., {len(str(value))} digits"
        except ValueError:  # more digits than int -> str allows (4300)
            digits = "over 4300 digits"
        raise NotAReward(f"a {what} too large for a float ({digits}){at}") from None
    if not math.isfinite(number):
        raise NotAReward(f"a non-finite {what} ({number!r}){at}")
    return value if type(value) is int else number


def _plain_key(key: Any) -> Any:
    if type(key) in (str, int, float, bool) or key is None:
        return key
    if isinstance(key, str):
        return str.__str__(key)  # a str subclass becomes a plain str
    raise NotAReward(f"a dict key of type {type(key).__name__}, not a string or a number")


def _plain_score(value: Any, path: str, depth: int) -> Any:
    """A plain copy of a score inside a reward dict (`path`: where it is, `'score'['x']`)."""
    value = _scalar(value)
    if getattr(value, "ndim", 0) >= 1 and callable(getattr(value, "tolist", None)):
        value = value.tolist()  # an array or tensor of scores beside the reward (`{"score": 1.0, "probs": ...}`)
    if type(value) in (bool, str) or value is None:
        return value
    if isinstance(value, numbers.Real):
        return _plain_number(value, "score", f" at {path}")
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, Mapping | list | tuple):
        if depth >= _MAX_DEPTH:
            raise NotAReward(f"a score {path} nested deeper than {_MAX_DEPTH} levels")
        if isinstance(value, Mapping):
            return {_plain_key(k): _plain_score(v, f"{path}[{k!r}]", depth + 1) for k, v in value.items()}
        items = [_plain_score(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) else items
    raise NotAReward(f"a score of type {type(value).__name__} at {path}, not a number, string, list or dict")


def describe_raised(error: BaseException) -> tuple[str, str]:
    """`(type name, message)` of what a plugin raised: for a `PluginExit`, of the `SystemExit` & co. it carries."""
    original = error.__cause__ if isinstance(error, PluginExit) and error.__cause__ is not None else error
    return type(original).__name__, str(original)


def checked_reward(value: Any, *, source: str, sample: Sample) -> Any:
    """`plain_reward(value)`, with what is wrong named by the function and the sample.

    Call it only on values that run no user code (parsed JSON, as a remote reward model's); a plugin's value goes
    through `call_reward_plugin`, which converts it under the deadline.

    Args:
        value: what the reward function returned.
        source: names the function (`--custom-rm-path my.rm`, `--rm-type remote_rm (http://...)`).
        sample: the sample it scored.

    Raises:
        RewardFunctionError: naming `source`, the sample index and what was wrong.
    """
    try:
        return plain_reward(value)
    except NotAReward as e:
        raise RewardFunctionError(f"{source} returned {e} for sample {sample.index}") from e


def plain_rewards(rewards: Any, *, source: str, samples: list[Sample]) -> list[Any]:
    """A group reward function's value as one plain reward per sample (`plain_reward`; run it off the event loop).

    Args:
        rewards: what `fn(args, samples)` returned: a list or tuple of rewards, or a 1-d array or tensor, one per
            sample.
        source: names the function (`--custom-rm-path my.rm (--group-rm)`).
        samples: the samples it scored, in order.

    Raises:
        RewardFunctionError: not a list of `len(samples)` rewards, or a reward that is not one (naming its sample).
    """
    try:
        if getattr(rewards, "ndim", None) == 1 and callable(getattr(rewards, "tolist", None)):
            rewards = rewards.tolist()  # a 1-d array or tensor of rewards, which the original takes as a list
        items = list(rewards) if isinstance(rewards, list | tuple) else None
        shown = preview(rewards, 200) if items is None or len(items) != len(samples) else ""
    except Exception as e:  # the value's own __iter__ / __repr__ raised
        indices = [s.index for s in samples]
        problem = f"a {type(rewards).__name__} whose conversion raised {type(e).__name__}: {e}"
        raise RewardFunctionError(f"{source} returned {problem} for samples {indices}") from e
    if items is None or len(items) != len(samples):
        raise RewardFunctionError(f"{source} must return a list of {len(samples)} rewards, got {shown}")
    return [checked_reward(r, source=source, sample=s) for r, s in zip(items, samples, strict=True)]


async def checked_preset_reward(
    value: Any,
    *,
    source: str,
    sample: Sample,
    deadline_s: float = DEFAULT_RM_TIMEOUT_S,
    warn_every_s: float = DEFAULT_WARN_EVERY_S,
) -> Any:
    """A reward a plugin set on the sample itself (a generate function, a sample hook, an env), as `plain_reward`.

    Such a value is read like a returned one: in a worker thread within `--rm-timeout-secs`, since its conversion
    is the plugin's code. A finite `float`, an `int` within float range and a `bool` are returned at once.

    Args:
        value: the sample's `reward`.
        source: what set it, named in messages.
        sample: the sample.
        deadline_s: seconds the conversion may take (`--rm-timeout-secs`).
        warn_every_s: seconds between "still running" warnings (`--slow-call-warning-secs`).

    Raises:
        RewardFunctionError: not a reward, a conversion that raised, or one past `deadline_s` (naming both).
    """
    if _is_plain_number(value):
        return value
    what = f"reading the reward that {source} set on sample {sample.index}"
    try:
        return await call_plugin_with_deadline(
            plain_reward, value, what=what, deadline_s=deadline_s, flag="--rm-timeout-secs", warn_every_s=warn_every_s
        )
    except DeadlineExceeded as e:
        raise RewardFunctionError(str(e)) from e
    except NotAReward as e:
        raise RewardFunctionError(f"{source} set {e} as the reward of sample {sample.index}") from e
    except Exception as e:
        name, message = describe_raised(e)
        problem = f"a reward on sample {sample.index} that raised {name}: {message}"
        raise RewardFunctionError(f"{source} set {problem}") from e


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
    (`slime_rollout.runtime.deadlines`); a warning every `warn_every_s` seconds says it is still running. Its value
    is converted to plain data (`plain_reward`) in a worker thread within the same deadline, so a `__float__` that
    never returns fails the call like a function that never returns.

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
        return await call_plugin_with_deadline(
            fn, *call_args, what=what, deadline_s=deadline_s, flag="--rm-timeout-secs", warn_every_s=warn_every_s,
            convert=plain_reward, plain=_is_plain_number, **kwargs,
        )  # fmt: skip
    except DeadlineExceeded as e:
        raise RewardFunctionError(str(e)) from e
    except NotAReward as e:
        raise RewardFunctionError(f"{source} returned {e} for sample {sample.index}") from e
    except Exception as e:
        name, message = describe_raised(e)
        raise RewardFunctionError(f"{source} raised {name} on sample {sample.index}: {message}") from e
