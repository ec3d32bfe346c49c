"""Built-in dynamic-sampling filters (`--dynamic-sampling-filter-path`).

The original paths `slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std[_with_fallback]`
are accepted as aliases of the functions here (`slime_rollout.plugins.ORIGINAL_PATH_ALIASES`).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from slime_core.error_text import preview
from slime_core.protocols import DynamicFilterOutput
from slime_core.sample import Sample
from slime_rollout.runtime.deadlines import call_plugin_with_deadline, plugin_bounds

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = [
    "ZERO_STD_THRESHOLD",
    "call_dynamic_filter",
    "check_reward_nonzero_std",
    "check_reward_nonzero_std_with_fallback",
    "flatten_group",
    "normalize_filter_output",
    "should_drop_dynamic_filter_output",
]


ZERO_STD_THRESHOLD = 1e-6  # the original's; `> 0` kept groups whose rewards differed only by rounding (0.1 + 0.2, 0.3)


def check_reward_nonzero_std(args: SlimeArgs, samples: list[Any], **kwargs: Any) -> DynamicFilterOutput:
    """Keeps a group only if its rewards differ (DAPO dynamic sampling: equal rewards give zero GRPO advantage).

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`); reads `reward_key` for dict rewards.
        samples: one finished group; an entry may be a list of samples (a multi-turn fan-out), whose samples
            all count.
        **kwargs: ignored (forward compatibility with newer call sites).

    Returns:
        keep=True if the sample std of the rewards (Bessel's, n - 1) is > `ZERO_STD_THRESHOLD` (1e-6), as the
        original's `torch.tensor(rewards, dtype=float64).std() > 1e-6`: rewards equal but for float rounding are
        no spread; else keep=False with reason `zero_std_{reward:.1f}`, logged as
        `rollout/dynamic_filter/drop_zero_std_{reward:.1f}`.

    Reference: Yu et al., "DAPO" (2025), §3.2 dynamic sampling.
    """
    rewards = [s.get_reward_value(args.reward_key) for s in flatten_group(samples)]
    if len(rewards) > 1 and statistics.stdev(rewards) > ZERO_STD_THRESHOLD:
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason=f"zero_std_{round(rewards[0], 1)}" if rewards else "empty")


def check_reward_nonzero_std_with_fallback(
    args: SlimeArgs, samples: list[Sample], **kwargs: Any
) -> DynamicFilterOutput:
    """`check_reward_nonzero_std`, but a zero-std group is kept when no other group could take its place.

    Prefers groups whose rewards differ without starting another over-sampling round for the last places.
    """
    output = check_reward_nonzero_std(args, samples, **kwargs)
    output.keep_when_insufficient = True
    return output


def flatten_group(group: Sequence[Any]) -> list[Sample]:
    """The samples of one group whose entries may be samples or lists of samples (fan-out generate)."""
    out: list[Sample] = []
    for item in group:
        out.extend(item if isinstance(item, list | tuple) else [item])
    return out


def normalize_filter_output(
    output: DynamicFilterOutput | bool, what: str = "dynamic sampling filter"
) -> DynamicFilterOutput:
    """Accepts the two return types a filter may have (`DynamicFilterOutput` or a bare bool).

    A numpy bool (or a 0-d bool array or tensor: `np.std(rewards) > 0`) is a bool, as the original's
    `DynamicFilterOutput(keep=output)` takes it; it was refused here.

    Args:
        output: what the filter returned.
        what: names the filter in the error (its flag, path and samples).

    Raises:
        TypeError: anything else (None from a filter missing its `return`, which the original reads as a drop).
    """
    if isinstance(output, DynamicFilterOutput):
        return output
    if getattr(output, "ndim", None) == 0 and callable(getattr(output, "item", None)):
        output = output.item()
    if isinstance(output, bool):
        return DynamicFilterOutput(keep=output, reason=None if output else "filtered")
    raise TypeError(f"{what} must return DynamicFilterOutput or bool, got {type(output).__name__} {preview(output)}")


def _plain_filter_output(output: Any, what: str = "dynamic sampling filter") -> DynamicFilterOutput:
    """`normalize_filter_output` with its fields read into plain `bool`/`str` (their `__bool__` is the plugin's)."""
    verdict = normalize_filter_output(output, what)
    reason = verdict.reason
    return DynamicFilterOutput(
        keep=bool(verdict.keep),
        reason=None if reason is None else str(reason),
        keep_when_insufficient=bool(verdict.keep_when_insufficient),
    )


def _is_plain_verdict(output: Any) -> bool:
    """A bool, or our own `DynamicFilterOutput` holding plain fields: reading it runs no plugin code."""
    if type(output) is bool:
        return True
    return (
        type(output) is DynamicFilterOutput
        and type(output.keep) is bool
        and (output.reason is None or type(output.reason) is str)
        and type(output.keep_when_insufficient) is bool
    )


async def call_dynamic_filter(args: SlimeArgs, fn: Callable[..., Any], group: Sequence[Any]) -> DynamicFilterOutput:
    """Runs `--dynamic-sampling-filter-path` on one finished group, bounded and off the event loop.

    The filter is the user's code and sync: called on the event loop, one that never returns froze the rollout
    with no word. It runs in a worker thread under `--plugin-timeout-secs` (warned about every
    `--slow-call-warning-secs`), its verdict read there too (`slime_rollout.runtime.deadlines`).

    Args:
        args: the plugin view; reads `dynamic_sampling_filter_path`, `plugin_timeout_secs`, `slow_call_warning_secs`.
        fn: the loaded filter, `fn(args, samples) -> DynamicFilterOutput | bool`.
        group: one finished group (fan-out entries are flattened: `flatten_group`).

    Returns:
        The verdict, with plain fields.

    Raises:
        DeadlineExceeded: the filter ran past `--plugin-timeout-secs` (the message names it and the samples).
        TypeError: it returned neither a `DynamicFilterOutput` nor a bool.
        ValueError: it added, removed or replaced entries of the sample list it was given.
        Exception: what the filter raised.
    """
    samples = flatten_group(group)
    given = list(samples)
    what = f"--dynamic-sampling-filter-path {args.dynamic_sampling_filter_path} on samples {[s.index for s in samples]}"
    convert = functools.partial(_plain_filter_output, what=what)  # a wrong return names the filter in its message
    verdict = await call_plugin_with_deadline(
        fn, args, samples, what=what, convert=convert, plain=_is_plain_verdict, **plugin_bounds(args)
    )
    # The original hands the filter the group it then trains, so removing samples there shrank the trained group (and
    # broke the batch invariant and the per-prompt reward grouping downstream); here it gets a flat copy, where the
    # same edit would silently do nothing. Refused instead: a filter keeps or drops a whole group.
    if len(samples) != len(given) or any(a is not b for a, b in zip(samples, given, strict=True)):
        raise ValueError(
            f"{what}: the filter changed the list of samples it was given ({len(given)} -> {len(samples)} entries); "
            "a dynamic-sampling filter keeps or drops the whole group: return DynamicFilterOutput(keep=False) instead"
        )
    return verdict


def should_drop_dynamic_filter_output(
    output: DynamicFilterOutput, *, remaining_batch_size: int, target_data_size: int
) -> bool:
    """Whether a filter's verdict drops its group (the original's rule, `slime.rollout.filter_hub.base_types`).

    Args:
        output: the verdict.
        remaining_batch_size: groups that could still fill the batch (kept, in flight, this one).
        target_data_size: `--rollout-batch-size`.

    Returns:
        False when kept, or when `keep_when_insufficient` and no other group could take its place
        (`remaining_batch_size <= target_data_size`); else True.
    """
    if output.keep:
        return False
    return not (output.keep_when_insufficient and remaining_batch_size <= target_data_size)
