r"""Reward functions (`--rm-type`, `--custom-rm-path`, `--group-rm`).

Resolution order per sample (as in the original `rm_hub`): the sample's own `custom_rm_path`, then
`--custom-rm-path`, then `sample.metadata["rm_type"]`, then `--rm-type`. A `boxed_` prefix on a type
makes the grader read the response's final `\boxed{}` answer (`_unbox`; a hedge of several boxes is no answer).

| rm_type      | returns                                  |
|--------------|------------------------------------------|
| math         | 1.0 / 0.0 (final boxed answer vs label)  |
| deepscaler   | 1.0 / 0.0 (same, after `</think>`)       |
| dapo         | {"score": ±1.0, "acc", "pred"}           |
| f1           | SQuAD token F1 of the final answer       |
| gpqa         | 1.0 / 0.0 (the option picked)            |
| remote_rm    | the JSON reply of `--rm-url`             |
| random       | 0 or 1                                   |
| other        | a `slime.rewards` entry point's function |

Any other name is a reward function an installed package registers (`slime_core.extensions.REWARDS`), called as
a `--custom-rm-path` function is.

The graders judge what a careful grader would (`rewards.math`, `rewards.math_utils`, `rewards.answers`,
`rewards.normalize`): reasoning (`<think>`) never counts, hedged or retracted answers are wrong (a corrected one
counts by its final box), units, words, choice letters and repeating decimals are read, exact numbers are
compared exactly. Every grading ends within its budget on any thread (`rewards.deadline`). `async_rm` grades
`math` / `deepscaler` (and their `boxed_` forms) with the symbolic check in a pool of `--rm-num-workers`
processes (`slime_rollout.rewards.pool`); `rule_based_reward` always grades inline. A custom or remote reward
that raises or returns NaN / a non-reward is one error naming it and the sample (`rewards.checks`); so is one
that runs past `--rm-timeout-secs` (warned about every `--slow-call-warning-secs` while it runs).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from typing import TYPE_CHECKING, Any

from slime_core.extensions import REWARDS
from slime_core.sample import Sample
from slime_rollout.plugins import load_function
from slime_rollout.rewards.checks import (
    RewardFunctionError,
    call_reward_plugin,
    checked_reward,
    describe_raised,
    plain_rewards,
)
from slime_rollout.rewards.dapo import dapo_reward
from slime_rollout.rewards.f1 import f1_reward
from slime_rollout.rewards.gpqa import gpqa_reward
from slime_rollout.rewards.math import deepscaler_reward, deepscaler_reward_async, math_reward, math_reward_async
from slime_rollout.rewards.math_utils import single_final_answer
from slime_rollout.rewards.remote import remote_reward
from slime_rollout.runtime.deadlines import DeadlineExceeded, call_plugin_with_deadline

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["RM_TYPES", "async_rm", "batched_async_rm", "rule_based_reward"]

RM_TYPES = ("math", "deepscaler", "dapo", "f1", "gpqa", "remote_rm", "random")


def _unbox(rm_type: str, response: str) -> tuple[str, str, bool]:
    r"""Applies a `boxed_` prefix: `(type without it, response to grade, whether it had the prefix)`.

    math, deepscaler and dapo grade the final box themselves, by the one final-answer rule
    (`math_utils.final_pairs`; dapo reads its box instead of an `Answer:` line), so they get the whole response;
    the others get the content of its one final box (`math_utils.single_final_answer`), or "" when there is none
    or the final statement offers several different ones (a hedge).
    """
    if not rm_type.startswith("boxed_"):
        return rm_type, response, False
    rm_type = rm_type.removeprefix("boxed_")
    if rm_type in ("math", "deepscaler", "dapo"):
        return rm_type, response, True
    return rm_type, single_final_answer(response) or "", True


def rule_based_reward(rm_type: str, response: str, label: Any, metadata: dict[str, Any] | None = None) -> Any:
    """Scores one response with a built-in rule (everything except `remote_rm`).

    Args:
        rm_type: one of `RM_TYPES` (minus remote_rm), optionally prefixed with `boxed_`.
        response: model output text.
        label: ground truth.
        metadata: the sample's metadata (gpqa reads choices/letters from it).

    Raises:
        KeyError: unknown `rm_type`, listing the known ones.
    """
    rm_type, response, boxed = _unbox(rm_type, response)
    if rm_type == "math":
        return math_reward(response, label)
    if rm_type == "deepscaler":
        return deepscaler_reward(response, label)
    if rm_type == "dapo":
        return dapo_reward(response, label, strict_box=boxed)
    if rm_type == "f1":
        return f1_reward(response, label)
    if rm_type == "gpqa":
        return gpqa_reward(response, label, metadata)
    if rm_type == "random":
        return float(random.randint(0, 1))
    raise KeyError(f"unknown --rm-type {rm_type!r}; known: {', '.join(RM_TYPES)} (each also as boxed_<type>)")


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
        ValueError: no reward type configured.
        KeyError: unknown reward type.
        RewardFunctionError: a custom or remote reward function raised, returned NaN/infinity, None or a
            non-reward type, or ran past `--rm-timeout-secs` (the message names the function and the sample).
    """
    custom_path = sample.custom_rm_path or args.custom_rm_path
    if custom_path:
        flag = "sample.custom_rm_path" if sample.custom_rm_path else "--custom-rm-path"
        fn = load_function(custom_path, flag=flag)
        return await call_reward_plugin(
            fn, args, sample, source=f"{flag} {custom_path}", sample=sample, **_bounds(args), **kwargs
        )
    rm_type = (sample.metadata or {}).get("rm_type") or args.rm_type
    if not rm_type:
        if args.use_opd:
            return 0.0  # pure on-policy distillation: the teacher's term is the whole learning signal
        raise ValueError("no reward function: set --rm-type, --custom-rm-path or metadata['rm_type']")
    if rm_type in ("remote_rm", "boxed_remote_rm"):
        response = sample.response if rm_type == "remote_rm" else (single_final_answer(sample.response) or "")
        payload = {"prompt": sample.prompt, "response": response, "label": sample.label}
        source = f"--rm-type {rm_type} ({args.rm_url})"
        reward = await call_reward_plugin(remote_reward, args.rm_url, payload, source=source, sample=sample,
                                          **_bounds(args))  # fmt: skip
        return checked_reward(reward, source=source, sample=sample)
    if rm_type.removeprefix("boxed_") not in RM_TYPES:  # a reward function of an installed package
        return await _registered_reward(args, sample, rm_type, **kwargs)
    base_type, response, _ = _unbox(rm_type, sample.response)
    graders = {"math": math_reward_async, "deepscaler": deepscaler_reward_async}
    if base_type in graders:  # symbolic check in the pool (inline with --rm-num-workers 0)
        num_workers = args.rm_num_workers
        return await graders[base_type](response, sample.label, num_workers=num_workers, sample_index=sample.index)
    # Everything else is cheap string work (dapo compares normalized strings): inline.
    return rule_based_reward(rm_type, sample.response, sample.label, sample.metadata)


async def _registered_reward(args: SlimeArgs, sample: Sample, rm_type: str, **kwargs: Any) -> Any:
    """Calls the `slime.rewards` entry `rm_type` as a custom reward (`fn(args, sample)`, bounded by its deadline).

    Raises:
        ValueError: a `boxed_` prefix on it.
        KeyError: no reward function of that name (the message lists the registered ones and the group).
        RewardFunctionError: it raised, returned a non-reward, or ran past `--rm-timeout-secs`.
    """
    if rm_type.startswith("boxed_"):  # the function sees the whole sample: it extracts what it grades itself
        raise ValueError(f"--rm-type {rm_type}: the boxed_ prefix applies to the built-in graders only")
    spec = REWARDS.get(rm_type)
    source = f"--rm-type {rm_type} ({spec.factory})"
    return await call_reward_plugin(spec.load(), args, sample, source=source, sample=sample, **_bounds(args), **kwargs)


async def batched_async_rm(args: SlimeArgs, samples: list[Sample], **kwargs: Any) -> list[Any]:
    """Scores a list of samples (original signature `batched_async_rm(args, samples)`).

    With `--custom-rm-path` and `--group-rm` the custom function is called once in batch mode
    (`fn(args, samples) -> list`); otherwise every sample goes through `async_rm` concurrently.

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
    if custom_path and args.group_rm:
        source = f"--custom-rm-path {custom_path} (--group-rm)"
        indices = [s.index for s in samples]
        what = f"reward function {source} on samples {indices}"
        try:
            return await call_plugin_with_deadline(
                load_function(custom_path, flag="--custom-rm-path"), args, samples, what=what,
                flag="--rm-timeout-secs", convert=functools.partial(plain_rewards, source=source, samples=samples),
                **_bounds(args), **kwargs,
            )  # fmt: skip
        except DeadlineExceeded as e:
            raise RewardFunctionError(str(e)) from e
        except RewardFunctionError:
            raise  # from plain_rewards: names the function and the sample
        except Exception as e:
            name, message = describe_raised(e)
            raise RewardFunctionError(f"{source} raised {name} on samples {indices}: {message}") from e
    return list(await asyncio.gather(*(async_rm(args, s, **kwargs) for s in samples)))
