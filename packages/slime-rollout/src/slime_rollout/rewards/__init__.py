r"""Reward functions (`--rm-type`, `--custom-rm-path`, `--group-rm`).

Resolution order per sample (as in the original `rm_hub`): the sample's own `custom_rm_path`, then
`--custom-rm-path`, then `sample.metadata["rm_type"]`, then `--rm-type`. A type is a name in the reward registry
(`slime_core.extensions.REWARDS`, entry-point group `slime.rewards`), and its record says how to score it: a
`factory` is called as a `--custom-rm-path` function is, a `grader` is a built-in rule (the built-ins, what
each returns and their records: `rewards.builtin`, `slime_rollout.entries`), neither is a reward model behind
`--rm-url` (`remote_rm`). A `boxed_` prefix on a grader's type makes it grade the response's final `\boxed{}`
answer (`_unbox`; a hedge of several boxes is no answer).

The graders judge what a careful grader would (`rewards.math`, `rewards.math_utils`, `rewards.answers`,
`rewards.normalize`): reasoning (`<think>`) never counts, hedged or retracted answers are wrong (a corrected one
counts by its final box), units, words, choice letters and repeating decimals are read, exact numbers are
compared exactly. Every grading ends within its budget on any thread (`rewards.deadline`). `async_rm` grades
a type whose record names a `pooled_grader` (`math`, `deepscaler`) with the symbolic check in a pool of
`--rm-num-workers` processes (`slime_rollout.rewards.pool`); `rule_based_reward` always grades inline. A custom
or remote reward that raises or returns NaN / a non-reward is one error naming it and the sample
(`rewards.checks`); so is one that runs past `--rm-timeout-secs` (warned about every `--slow-call-warning-secs`
while it runs).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from typing import TYPE_CHECKING, Any

from slime_core.error_text import int_digits, preview
from slime_core.extensions import REWARDS, RewardSpec
from slime_core.registry import UnknownNameError
from slime_core.sample import Sample
from slime_rollout.plugins import load_function
from slime_rollout.rewards.checks import (
    RewardFunctionError,
    call_reward_plugin,
    checked_reward,
    describe_raised,
    plain_rewards,
)
from slime_rollout.rewards.math_utils import single_final_answer
from slime_rollout.rewards.remote import remote_reward
from slime_rollout.runtime.deadlines import DeadlineExceeded, call_plugin_with_deadline

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["RM_TYPES", "async_rm", "batched_async_rm", "row_rm_type", "rule_based_reward"]


def __getattr__(name: str) -> Any:
    # `RM_TYPES` is asked of the registry on each use: a package installed or registered later is in it.
    if name == "RM_TYPES":
        return _graded_here()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def row_rm_type(metadata: Any, default: str | None) -> str:
    """The reward type of a sample or row: its `metadata["rm_type"]`, else `default` (`--rm-type`), stripped.

    As the original reads it (`(metadata.get("rm_type") or args.rm_type or "").strip()`): `" math"` from a data
    tool is `math` (it was refused as an unknown reward); "" when there is none.
    """
    given = metadata.get("rm_type") if isinstance(metadata, dict) else None
    return str(given or default or "").strip()


def _graded_here() -> tuple[str, ...]:
    """`RM_TYPES`: the registered types this package scores itself (records without a `factory`), sorted."""
    return tuple(name for name in REWARDS.names() if REWARDS.get(name).factory is None)


def _unbox(spec: RewardSpec, rm_type: str, response: str) -> tuple[str, bool]:
    """Applies a `boxed_` prefix: `(response to grade, whether the type had the prefix)`.

    A grader that reads the final box itself (`spec.reads_box`: math, deepscaler and dapo, by the one
    final-answer rule `math_utils.final_pairs`; dapo reads its box instead of an `Answer:` line) gets the whole
    response; the others get the content of its one final box (`math_utils.single_final_answer`), or "" when
    there is none or the final statement offers several different ones (a hedge).
    """
    if not rm_type.startswith("boxed_"):
        return response, False
    if spec.reads_box:
        return response, True
    return single_final_answer(response) or "", True


def rule_based_reward(rm_type: str, response: str, label: Any, metadata: dict[str, Any] | None = None) -> Any:
    """Scores one response inline with the built-in rule its record names (`RewardSpec.grader`).

    Args:
        rm_type: a registered type whose record has a `grader` (math, deepscaler, dapo, f1, gpqa, random, or a
            package's), optionally prefixed with `boxed_`.
        response: model output text.
        label: ground truth.
        metadata: the sample's metadata (gpqa reads choices/letters from it).

    Raises:
        KeyError: unknown `rm_type`, or one that is not a rule (remote_rm, a package's function), listing the
            rules.
        TypeError: `response` is not text (None from a broken generate function failed deep inside one grader as
            "argument of type 'NoneType' is not iterable" and scored 0 in the others).
        ValueError: `label` is an int past Python's int-to-text limit (`_check_label`), or the grader refused it.
    """
    _check_text(response, f"--rm-type {rm_type}")
    _check_label(label, f"--rm-type {rm_type}")
    name = rm_type.removeprefix("boxed_")
    try:
        spec: RewardSpec | None = REWARDS.get(name)
    except UnknownNameError:
        spec = None
    if spec is None or spec.grader is None:
        rules = [n for n in REWARDS.names() if REWARDS.get(n).grader is not None]
        raise KeyError(f"unknown --rm-type {name!r}; known: {', '.join(rules)} (each also as boxed_<type>)")
    response, boxed = _unbox(spec, rm_type, response)
    return spec.load_grader()(response, label, metadata, boxed)


def _check_label(label: Any, what: str) -> None:
    """Raises ValueError naming `what` when `label` is an int too long for Python to turn into text.

    Graders read a label as text, and `str()` of an int of more than `sys.get_int_max_str_digits()` digits (4,300)
    raises; a plugin's label (a custom data source or generate function: JSONL refuses such numbers when it reads
    them) failed inside the grader, and then again while the error naming the sample was formatted.
    """
    limit = sys.get_int_max_str_digits()
    # Fewer than 3 bits per digit limit cannot reach it (a digit holds log2(10) = 3.32 bits): most labels stop here.
    if not isinstance(label, int) or not limit or label.bit_length() <= 3 * limit:
        return
    if (digits := int_digits(label)) > limit:
        raise ValueError(
            f"{what}: the label is an int of {digits:,} digits, past Python's int-to-text limit ({limit:,} digits, "
            "sys.get_int_max_str_digits()) that graders read labels through; give it as a string"
        )


def _check_text(response: Any, what: str) -> None:
    """Raises TypeError naming `what` when a response to grade is not a str."""
    if not isinstance(response, str):
        raise TypeError(
            f"{what}: the response to grade must be text, got {type(response).__name__} {preview(response, 60)}"
        )


def _bounds(args: SlimeArgs) -> dict[str, float]:
    """`call_reward_plugin`'s deadline and warning interval from the run's flags."""
    return {"deadline_s": args.rm_timeout_secs, "warn_every_s": args.slow_call_warning_secs}


async def async_rm(args: SlimeArgs, sample: Sample, **kwargs: Any) -> Any:
    """Scores one finished sample (original signature `async_rm(args, sample)`).

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`), passed to a custom reward function; reads
            `custom_rm_path`, `rm_type`, `rm_url`, `rm_timeout_secs` and `slow_call_warning_secs` (custom and
            remote rewards), `rm_num_workers` (math and deepscaler grade their symbolic
            check in that many worker processes; 0 grades inline), `use_opd` (without a reward type the reward
            is 0: pure on-policy distillation).
        sample: the sample (its `custom_rm_path` and `metadata["rm_type"]` override the flags).
        **kwargs: passed to a custom reward function.

    Returns:
        A float or a dict of scores (select with `--reward-key`).

    Raises:
        ValueError: no reward type configured, or a built-in grader refused the sample's data (a missing label,
            a label naming no option, an int label past Python's int-to-text limit; the message names the sample
            and its label).
        KeyError: unknown reward type.
        RewardFunctionError: a custom or remote reward function raised, returned NaN/infinity, None or a
            non-reward type, or ran past `--rm-timeout-secs` (the message names the function and the sample); or
            a built-in or registered grader raised anything but ValueError (naming the grader and the sample).
    """
    custom_path = sample.custom_rm_path or args.custom_rm_path
    if custom_path:
        flag = "sample.custom_rm_path" if sample.custom_rm_path else "--custom-rm-path"
        fn = load_function(custom_path, flag=flag)
        return await call_reward_plugin(
            fn, args, sample, source=f"{flag} {custom_path}", sample=sample, **_bounds(args), **kwargs
        )
    rm_type = row_rm_type(sample.metadata, args.rm_type)
    if not rm_type:
        if args.use_opd:
            return 0.0  # pure on-policy distillation: the teacher's term is the whole learning signal
        raise ValueError("no reward function: set --rm-type, --custom-rm-path or metadata['rm_type']")
    spec = REWARDS.get(rm_type.removeprefix("boxed_"))
    if spec.factory is not None:  # a package's reward function
        return await _registered_reward(args, sample, rm_type, spec, **kwargs)
    if spec.grader is None:
        return await _remote_rm(args, sample, rm_type, spec)
    _check_text(sample.response, f"--rm-type {rm_type} on sample {sample.index}")
    _check_label(sample.label, f"--rm-type {rm_type} on sample {sample.index}")
    try:
        if spec.pooled_grader is not None:  # symbolic check in the pool (inline with --rm-num-workers 0)
            response, boxed = _unbox(spec, rm_type, sample.response)
            grade = spec.load_grader(pooled=True)
            return await grade(response, sample.label, sample.metadata, boxed, num_workers=args.rm_num_workers,
                               sample_index=sample.index)  # fmt: skip
        # Everything else is cheap string work (dapo compares normalized strings): inline.
        return rule_based_reward(rm_type, sample.response, sample.label, sample.metadata)
    except ValueError as e:  # bad data in the sample (no label, a label naming no option): say which sample
        raise ValueError(
            f"--rm-type {rm_type} on sample {sample.index} (label {preview(sample.label, 60)}): {e}"
        ) from e
    except Exception as e:  # a grader's own failure (a package's, or a bug here): which grader, on which sample
        name, message = describe_raised(e)
        raise RewardFunctionError(
            f"--rm-type {rm_type} grader {_grader_name(spec)} raised {name} on sample {sample.index} (label "
            f"{preview(sample.label, 60)}, response {preview(sample.response, 60)}): {message}"
        ) from e


def _grader_name(spec: RewardSpec) -> str:
    """The grader of a record as a user finds it: its import path, or the function's module and name."""
    grader = spec.pooled_grader or spec.grader
    if isinstance(grader, str):
        return grader
    return f"{getattr(grader, '__module__', '?')}:{getattr(grader, '__qualname__', type(grader).__name__)}"


async def _remote_rm(args: SlimeArgs, sample: Sample, rm_type: str, spec: RewardSpec) -> Any:
    """Posts the sample to `--rm-url` (a record with neither factory nor grader) and returns its checked reply.

    Raises:
        ValueError: the record does not say it needs `--rm-url` either (it names nothing to score with), or the
            label is an int past Python's int-to-text limit (`_check_label`).
        RewardFunctionError: the service failed, returned a non-reward or ran past `--rm-timeout-secs`.
    """
    if not spec.needs_url:
        raise ValueError(f"--rm-type {rm_type}: its record names no factory and no grader, and needs no --rm-url")
    _check_label(sample.label, f"--rm-type {rm_type} on sample {sample.index}")  # JSON is written through str() too
    response, _ = _unbox(spec, rm_type, sample.response)
    payload = {"prompt": sample.prompt, "response": response, "label": sample.label}
    source = f"--rm-type {rm_type} ({args.rm_url})"
    reward = await call_reward_plugin(remote_reward, args.rm_url, payload, source=source, sample=sample,
                                      **_bounds(args))  # fmt: skip
    return checked_reward(reward, source=source, sample=sample)


async def _registered_reward(args: SlimeArgs, sample: Sample, rm_type: str, spec: RewardSpec, **kwargs: Any) -> Any:
    """Calls the `slime.rewards` entry `rm_type` as a custom reward (`fn(args, sample)`, bounded by its deadline).

    Raises:
        ValueError: a `boxed_` prefix on it.
        RewardFunctionError: it raised, returned a non-reward, or ran past `--rm-timeout-secs`.
    """
    if rm_type.startswith("boxed_"):  # the function sees the whole sample: it extracts what it grades itself
        raise ValueError(f"--rm-type {rm_type}: the boxed_ prefix applies to the built-in graders only")
    source = f"--rm-type {rm_type} ({spec.factory})"
    return await call_reward_plugin(spec.load(), args, sample, source=source, sample=sample, **_bounds(args), **kwargs)


async def batched_async_rm(args: SlimeArgs, samples: list[Sample], **kwargs: Any) -> list[Any]:
    """Scores a list of samples (original signature `batched_async_rm(args, samples)`).

    With `--custom-rm-path` the custom function is called once in batch mode (`fn(args, samples) -> list`), as the
    original does, with or without `--group-rm`: the rollout calls this for a whole group with `--group-rm`, and
    for the list a fan-out generate function returned (the original documents the function as
    `(args, sample | list[Sample]) -> float | list[float]`). Otherwise every sample goes through `async_rm`
    concurrently.

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`); reads `custom_rm_path`, `group_rm`,
            `rm_timeout_secs`, `slow_call_warning_secs`.
        samples: the samples to score.
        **kwargs: passed to the reward function.

    Returns:
        One reward per sample, in order.

    Raises:
        RewardFunctionError: a reward function raised, returned a non-reward or a list of the wrong length, or ran
            (its value's conversion included) past `--rm-timeout-secs`; the message names it and the sample.
    """
    custom_path = args.custom_rm_path
    if not custom_path:
        return list(await asyncio.gather(*(async_rm(args, s, **kwargs) for s in samples)))
    source = f"--custom-rm-path {custom_path} ({'--group-rm' if args.group_rm else 'batch mode'})"
    indices = [s.index for s in samples]
    what = f"reward function {source} on samples {indices}"
    # Without --group-rm the batch call comes from a fan-out generate function: a per-sample function fails on it.
    hint = "" if args.group_rm else f"; {_BATCH_HINT}"
    try:
        return await call_plugin_with_deadline(
            load_function(custom_path, flag="--custom-rm-path"), args, samples, what=what,
            flag="--rm-timeout-secs", convert=functools.partial(plain_rewards, source=source, samples=samples),
            **_bounds(args), **kwargs,
        )  # fmt: skip
    except DeadlineExceeded as e:
        raise RewardFunctionError(str(e)) from e
    except RewardFunctionError as e:
        if not hint:
            raise  # from plain_rewards: names the function and the sample
        raise RewardFunctionError(f"{e}{hint}") from e
    except Exception as e:
        name, message = describe_raised(e)
        raise RewardFunctionError(f"{source} raised {name} on samples {indices}: {message}{hint}") from e


_BATCH_HINT = (
    "a generate function that returns a list of samples has them scored in one call fn(args, samples) -> list, as in "
    "the original (its reward is (args, sample | list[Sample]) -> float | list[float])"
)
