r"""`slime.rollout.rm_hub.math_utils`: `\boxed{}` extraction and math grading (original module path).

The extraction functions behave exactly as the original's string functions, quirks included, because plugins that
import them branch on their results: `\fbox{7}` has no answer (`remove_boxed` only strips `\boxed{`), `\boxed 5` and
`\boxed {5}` have none, and a text holding any `\boxed` reads its last `\boxed` even when an `\fbox` follows it.
The run's own graders (`--rm-type math`, `dapo`, ...) read answers with `slime_rollout.rewards.answers` instead.
"""

from __future__ import annotations

from slime_rollout.rewards.math_utils import extract_label_answer, grade_answer

__all__ = [
    "extract_answer",
    "extract_boxed_answer",
    "grade_answer_mathd",
    "grade_answer_sympy",
    "grade_answer_verl",
    "last_boxed_only_string",
    "remove_boxed",
]

_BOX = "\\boxed{"


def last_boxed_only_string(string: str) -> str | None:
    r"""The text from the last `\boxed` (else the last `\fbox`) to the brace that closes the first `{` after it.

    Args:
        string: any text.

    Returns:
        That slice, command included (`"\boxed {5}"`, `"\fbox{2}"`), or None when there is no such command or no
        brace closes after it.
    """
    start = string.rfind("\\boxed")
    if start < 0:
        start = string.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(string)):
        char = string[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return string[start : i + 1]
    return None


def remove_boxed(s: str | None) -> str | None:
    r"""`"\boxed{x}"` -> `"x"`; None for anything that does not start with `\boxed{` and end with `}` (or is None)."""
    if not isinstance(s, str) or not s.startswith(_BOX) or not s.endswith("}"):
        return None
    return s[len(_BOX) : -1]


def extract_boxed_answer(solution: str) -> str | None:
    r"""Content of the last `\boxed{...}` of `solution` (`remove_boxed(last_boxed_only_string(solution))`), or None."""
    return remove_boxed(last_boxed_only_string(solution))


def extract_answer(passage: str) -> str | None:
    r"""Content of the last `\boxed{...}` of `passage`; None when it holds no `\boxed` (an `\fbox` alone is none)."""
    if "\\boxed" not in passage:
        return None
    return extract_boxed_answer(passage)


# The original's two graders (normalized string compare, then sympy) are both the one careful grader here
# (`slime_rollout.rewards.math_utils.grade_answer`): it accepts what either accepted except rounded decimals for
# exact values (see that module).
grade_answer_mathd = grade_answer
grade_answer_sympy = grade_answer


def grade_answer_verl(solution_str: str, ground_truth: object) -> bool:
    r"""Whether the answer `extract_answer` reads from `solution_str` equals the ground truth.

    Equality is normalized, numeric or symbolic. An empty ground truth or a solution without an answer is wrong. A
    boxed ground truth is unboxed first.
    """
    if ground_truth in (None, ""):
        return False
    given = extract_answer(solution_str)
    if given is None:
        return False
    return grade_answer(given, extract_label_answer(ground_truth))
