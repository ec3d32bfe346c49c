r"""The built-in graders in the one signature their `slime.rewards` records name (`slime_rollout.entries`).

`grade(response, label, metadata, boxed) -> float | dict` (and the pooled form, which adds `num_workers` and
`sample_index`): `slime_rollout.rewards.rule_based_reward` and `async_rm` call whatever the record of
`--rm-type NAME` names, so a new built-in grader is its module, its record and its entry point. These wrap the
grading modules, whose own signatures predate the records.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from slime_rollout.rewards.dapo import dapo_reward
from slime_rollout.rewards.f1 import f1_reward
from slime_rollout.rewards.gpqa import gpqa_reward
from slime_rollout.rewards.ifbench import ifbench_reward
from slime_rollout.rewards.math import deepscaler_reward, deepscaler_reward_async, math_reward, math_reward_async

__all__ = [
    "grade_dapo",
    "grade_deepscaler",
    "grade_deepscaler_pooled",
    "grade_f1",
    "grade_gpqa",
    "grade_ifbench",
    "grade_math",
    "grade_math_pooled",
    "grade_random",
]

Metadata = Mapping[str, Any] | None


def grade_math(response: str, label: Any, metadata: Metadata, boxed: bool) -> float:
    """`rewards.math.math_reward`: 1.0 / 0.0, the final boxed answer against the label (inline)."""
    return math_reward(response, label)


async def grade_math_pooled(
    response: str, label: Any, metadata: Metadata, boxed: bool, *, num_workers: int, sample_index: int | None
) -> float:
    """`grade_math` with the symbolic check in a pool of `num_workers` processes (0: inline)."""
    return await math_reward_async(response, label, num_workers=num_workers, sample_index=sample_index)


def grade_deepscaler(response: str, label: Any, metadata: Metadata, boxed: bool) -> float:
    """`rewards.math.deepscaler_reward`: as `grade_math` on the text after the last `</think>`."""
    return deepscaler_reward(response, label)


async def grade_deepscaler_pooled(
    response: str, label: Any, metadata: Metadata, boxed: bool, *, num_workers: int, sample_index: int | None
) -> float:
    """`grade_deepscaler` with the symbolic check in a pool of `num_workers` processes (0: inline)."""
    return await deepscaler_reward_async(response, label, num_workers=num_workers, sample_index=sample_index)


def grade_dapo(response: str, label: Any, metadata: Metadata, boxed: bool) -> dict[str, Any]:
    r"""`rewards.dapo.dapo_reward`: `{"score": ±1.0, "acc", "pred"}`; `boxed` reads the final `\boxed{}`."""
    return dapo_reward(response, label, strict_box=boxed)


def grade_f1(response: str, label: Any, metadata: Metadata, boxed: bool) -> float:
    """`rewards.f1.f1_reward`: SQuAD token F1 in [0, 1] of the answer against the label."""
    return f1_reward(response, label)


def grade_gpqa(response: str, label: Any, metadata: Metadata, boxed: bool) -> float:
    """`rewards.gpqa.gpqa_reward`: 1.0 / 0.0 for the option picked (`metadata` may give choices and letters)."""
    return gpqa_reward(response, label, metadata)


def grade_ifbench(response: str, label: Any, metadata: Metadata, boxed: bool) -> float:
    """`rewards.ifbench.ifbench_reward`: 1.0 / 0.0, every instruction `metadata` names followed (no label read)."""
    return ifbench_reward(response, metadata)


def grade_random(response: str, label: Any, metadata: Metadata, boxed: bool) -> float:
    """0.0 or 1.0 with equal probability (the original's `random` type; a smoke test of the loop)."""
    return float(random.randint(0, 1))
