"""`slime.rollout.rm_hub.math_dapo_utils`: the DAPO grader (original module path)."""

from __future__ import annotations

from typing import Any

from slime.rollout.rm_hub.math_utils import last_boxed_only_string, remove_boxed
from slime_rollout.rewards.dapo import dapo_reward

__all__ = ["compute_score", "last_boxed_only_string", "remove_boxed"]


def compute_score(
    solution_str: str,
    ground_truth: str,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict[str, Any]:
    r"""DAPO score of a solution: `{"score": 1.0 | -1.0, "acc": bool, "pred": str | None}`.

    Args:
        solution_str: model output (its last 300 characters are graded).
        ground_truth: the answer.
        strict_box_verify: read the answer from the last `\boxed{}` instead of an `Answer:` line.
        pause_tokens_index: accepted for signature compatibility; pause tokens are not used.

    Returns:
        `{"score", "acc", "pred"}`; `pred` is "[INVALID]" when no `Answer:` line gives an answer and None when
        `strict_box_verify` finds no box, the original's markers of "no answer", which its examples read (strands'
        reward_func grades again with `strict_box_verify=True` on "[INVALID]").
    """
    del pause_tokens_index
    result = dapo_reward(solution_str, ground_truth, strict_box=strict_box_verify)
    if result["pred"] == "":
        result["pred"] = None if strict_box_verify else "[INVALID]"
    return result
