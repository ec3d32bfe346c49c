r"""Issue 27, round 12: a box contradicted by the answer stated after it, and multiple-select letter answers.

Rows were written by hand for this test: grader, response, label, the careful grade. Rows marked "was 1.0" / "was
0.0" scored that before the fix; the others pin what must stay as it was (restatements, self-corrections that end
in a box, cases where a number is not the whole answer).
"""

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.answers import contradicts


def _grade(grader: str, response: str, label: str) -> float:
    out = rule_based_reward(grader, response, label, {})
    return float(out["acc"]) if isinstance(out, dict) else float(out)


# The answer stated again after the last box, at the start of a sentence, as plainly another value: the box is
# taken back (no final answer), whichever value the label has. The original reads the last box only (1.0).
CONTRADICTED = [
    ("math", r"So \boxed{5}. Wait, the answer is 7.", "5", 0.0),  # was 1.0
    ("math", r"So \boxed{5}. Wait, the answer is 7.", "7", 0.0),  # the box it settles on is still 5
    ("math", r"So \boxed{5}. Hmm, actually the answer is 7.", "5", 0.0),  # was 1.0
    ("math", r"So \boxed{5}. The final answer is $7$.", "5", 0.0),  # was 1.0
    ("math", "So \\boxed{5}.\n\nFinal answer: 7", "5", 0.0),  # was 1.0
    ("math", "So \\boxed{5}.\n\n**Final Answer:** \\(-7\\)", "5", 0.0),  # was 1.0
    ("math", r"So \boxed{5}. So my answer is seven apples.", "5", 0.0),  # was 1.0
    ("deepscaler", r"<think>work</think>So \boxed{5}. Wait, the answer is 7.", "5", 0.0),  # was 1.0
    ("boxed_dapo", r"So \boxed{5}. Wait, the answer is 7.", "5", 0.0),  # was 1.0
    ("dapo", "Answer: 5\nWait, the answer is 7.", "5", 0.0),  # was 1.0
    ("math", r"So \boxed{B}. Wait, the answer is C.", "B", 0.0),  # was 1.0
    # Kept: the same value restated (another spelling, a unit, a percent's value), a correction ending in a box.
    ("math", r"So \boxed{5}. The answer is 5.", "5", 1.0),
    ("math", r"So \boxed{\frac{14}{2}}. So the answer is 7 apples, as expected.", "7", 1.0),
    ("math", r"So \boxed{50\%}. The answer is 0.5.", "50%", 1.0),
    ("math", r"So \boxed{5}. Wait, the answer is 7. Hence \boxed{7}.", "7", 1.0),
    ("dapo", "Answer: 5\nSo the answer is 5.", "5", 1.0),
    # Kept: nothing plainly contradicts (another form, a case inside a sentence, a value that goes on).
    (r"math", r"So \boxed{2\sqrt{2}}. So the answer is $\sqrt{8}$.", r"2\sqrt{2}", 1.0),
    ("math", r"So \boxed{5}. For n = 4, the answer is 7.", "5", 1.0),
    ("math", r"So \boxed{5}. The answer is 5 because 2 + 3 = 5.", "5", 1.0),
    ("math", r"So \boxed{5}. The answer to part (b) is 7.", "5", 1.0),
]


@pytest.mark.parametrize(("grader", "response", "label", "expected"), CONTRADICTED)
def test_a_box_contradicted_by_the_stated_answer_after_it(grader, response, label, expected):
    assert _grade(grader, response, label) == expected


def test_contradicts_only_plainly_different_values():
    assert contradicts("7", "5")
    assert contradicts("$-7$", "5")
    assert contradicts("C", "B")
    assert not contradicts("7", r"\frac{14}{2}")
    assert not contradicts("0.5", r"50\%")  # a percent's value
    assert not contradicts(r"\sqrt{8}", r"2\sqrt{2}")  # not a plain number: not judged here
    assert not contradicts("a multiple of 3", "6")
