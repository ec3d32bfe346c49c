"""`slime.rollout.rm_hub.math_dapo_utils`: the DAPO grader (original module path)."""

from __future__ import annotations

from typing import Any

from slime_rollout.rewards.dapo import dapo_reward

__all__ = ["BoxError", "compute_score", "last_boxed_only_string", "remove_boxed"]

_BOX = "\\boxed{"


class BoxError(ValueError, AssertionError):
    r"""`remove_boxed` got no `\boxed{...}`; an AssertionError too, as the original raised and callers catch."""


def last_boxed_only_string(string: str) -> str | None:
    r"""The last `\boxed{...}` of `string`, command and braces included, or None.

    Unlike `math_utils.last_boxed_only_string` (the original's two modules differ), only `\boxed{` counts: `\fbox{7}`,
    `\boxed 5` and `\boxed {5}` are no box.
    """
    start = string.rfind(_BOX)
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(string)):
        if string[i] == "{":
            depth += 1
        elif string[i] == "}":
            depth -= 1
            if depth == 0:
                return string[start : i + 1]
    return None


def remove_boxed(s: str) -> str:
    r"""`"\boxed{x}"` -> `"x"`.

    Raises:
        BoxError: `s` does not start with `\boxed{` and end with `}` (the original asserted it).
    """
    if not s.startswith(_BOX) or not s.endswith("}"):
        raise BoxError(f"box error: {s}")
    return s[len(_BOX) : -1]


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
