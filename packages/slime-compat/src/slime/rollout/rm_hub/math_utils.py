r"""`slime.rollout.rm_hub.math_utils`: `\boxed{}` extraction and math grading (original module path)."""

from __future__ import annotations

from slime_rollout.rewards.math_utils import extract_boxed, extract_label_answer, grade_answer

__all__ = [
    "extract_answer",
    "extract_boxed_answer",
    "grade_answer_mathd",
    "grade_answer_sympy",
    "grade_answer_verl",
    "last_boxed_only_string",
    "remove_boxed",
]


def extract_answer(passage: str) -> str | None:
    r"""Content of the last `\boxed{...}` of `passage`, or None."""
    return extract_boxed(passage)


def last_boxed_only_string(string: str) -> str | None:
    r"""The last `\boxed{...}` of `string` including the command and braces, or None."""
    inner = extract_boxed(string)
    return None if inner is None else f"\\boxed{{{inner}}}"


def remove_boxed(s: str) -> str:
    r"""`\boxed{x}` -> `x` (a string without a box is returned unchanged)."""
    inner = extract_boxed(s)
    return s if inner is None else inner


# The original's other names for the same functions. Its two graders (normalized string compare, then sympy) are both
# the one careful grader here (`slime_rollout.rewards.math_utils.grade_answer`): it accepts what either accepted except
# rounded decimals for exact values (see that module).
extract_boxed_answer = extract_boxed
grade_answer_mathd = grade_answer
grade_answer_sympy = grade_answer


def grade_answer_verl(solution_str: str, ground_truth: object) -> bool:
    r"""Whether the last `\boxed{}` of `solution_str` equals the ground truth (normalized, numeric or symbolic).

    An empty ground truth or a solution without a box is wrong. A boxed ground truth is unboxed first.
    """
    if ground_truth in (None, ""):
        return False
    given = extract_boxed(solution_str)
    if given is None:
        return False
    return grade_answer(given, extract_label_answer(ground_truth))
