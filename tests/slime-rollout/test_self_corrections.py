r"""Self-corrections and restated answers are graded by their final answer; hedges stay wrong (issue 27).

A hedge is several final answers offered at once ("\boxed{3} or \boxed{5}"); a corrected derivation gives an
answer, more work, then the answer it settles on ("At first I got \boxed{3}, but ... \boxed{5}"): the last box,
as the original's last-box rule and a careful grader read it. Each row: grader, response, label, expected reward,
written by hand for this test.
"""

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.answers import final_boxed_answers, offered_together

FIX = r"At first I got \boxed{3}, but after fixing the sign error the result is \boxed{5}."

PAIRS = [
    # Self-corrections: the later answer supersedes the earlier one.
    ("math", FIX, "5", 1.0),
    ("math", FIX, "3", 0.0),
    ("math", r"I get $\boxed{3}$. Hmm, let me redo step 2: $x = 5$, so the answer is $\boxed{5}$.", "5", 1.0),
    ("math", r"$\boxed{12}$. Wait, I double counted the corners; removing them gives $\boxed{10}$.", "10", 1.0),
    ("math", r"\boxed{3}. Actually, \boxed{5}.", "5", 1.0),
    ("math", r"\boxed{3}, but \boxed{5}", "5", 1.0),
    ("math", r"Initially \boxed{7}. Correcting the carry: \boxed{8}", "8", 1.0),
    ("math", r"first \boxed{3} then \boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}", 1.0),
    ("math", r"\boxed{3}. Let me recheck: for 2 or more terms the sum is 5. So \boxed{5}.", "5", 1.0),
    ("math", r"\boxed{3}. Oops, I made a mistake; it could be \boxed{5}.", "5", 1.0),
    ("math", "<think>maybe \\boxed{4}</think> First \\boxed{3}; after checking again, \\boxed{5}", "5", 1.0),
    # "Final answer" given twice: the second one stands.
    ("math", r"Final answer: \boxed{3}. Let me recheck the arithmetic: 2+3=5. Final answer: \boxed{5}", "5", 1.0),
    ("math", "Final answer: \\boxed{3}\nFinal answer: \\boxed{5}", "5", 1.0),
    ("math", "Final answer: \\boxed{3}\nFinal answer: \\boxed{5}", "3", 0.0),
    ("deepscaler", "<think>work</think>The final answer is \\boxed{3}. Rechecking, it is \\boxed{5}.", "5", 1.0),
    ("dapo", "Answer: 3\nHmm, 2 + 3 = 5, not 3.\nAnswer: 5", "5", 1.0),
    ("gpqa", "The answer is (A). Wait, rechecking the units, the answer is (C).", "C", 1.0),
    # Restated answers: the same value twice is one answer.
    ("math", r"So $\boxed{5}$. Double-checking: 2 + 3 = 5, hence $\boxed{5}$.", "5", 1.0),
    ("math", r"$\boxed{\frac{1}{2}}$, i.e. $\boxed{0.5}$", "0.5", 1.0),
    ("math", r"\boxed{5} \boxed{5}", "5", 1.0),
    # True hedges: several final answers offered at once.
    ("math", r"\boxed{3} or \boxed{5}", "5", 0.0),
    ("math", r"\boxed{3} or \boxed{5}", "3", 0.0),
    ("math", r"The answer is either \boxed{3} or \boxed{5}.", "5", 0.0),
    ("math", r"\boxed{3}, \boxed{5}", "5", 0.0),
    ("math", r"\boxed{3} \boxed{5}", "3", 0.0),
    ("math", r"\boxed{3}; \boxed{5}", "5", 0.0),
    ("math", r"It could be $\boxed{12}$, but it might also be $\boxed{13}$.", "13", 0.0),
    ("math", r"\boxed{3}, or maybe \boxed{5}", "5", 0.0),
    ("math", r"\boxed{3}. Perhaps \boxed{5}.", "5", 0.0),
    ("math", r"\boxed{3}. I'm not sure, so it may be \boxed{5}.", "5", 0.0),
    ("math", r"\boxed{3}. Alternatively, \boxed{5}.", "5", 0.0),
    ("math", r"We found \boxed{1} earlier. The answer is \boxed{3} or \boxed{5}.", "5", 0.0),
    ("deepscaler", "<think>x</think>$\\boxed{3}$ or $\\boxed{4}$", "3", 0.0),
    # A list of boxes is a multi-part answer: right only as the label's parts.
    ("math", r"\boxed{3}, \boxed{5}", "3, 5", 1.0),
    ("math", r"The roots are $\boxed{2}$ and $\boxed{3}$.", "2, 3", 1.0),
    ("math", r"$x = \boxed{2}$ and $y = \boxed{3}$", "2, 3", 1.0),
    ("math", r"(a) \boxed{4} (b) \boxed{9}", "4, 9", 1.0),
    ("math", r"Part (a): \boxed{4}. Part (b): \boxed{9}.", "4, 9", 1.0),
    ("math", r"\boxed{2} and \boxed{3}", "3", 0.0),
]


@pytest.mark.parametrize(("grader", "response", "label", "expected"), PAIRS)
def test_final_answer_is_graded(grader, response, label, expected):
    out = rule_based_reward(grader, response, label)
    score = float(out["acc"]) if grader == "dapo" else float(out)
    assert score == expected


def test_superseded_boxes_are_counted():
    final = final_boxed_answers(FIX)
    assert final.answers == ["5"] and final.num_superseded == 1
    hedge = final_boxed_answers(r"First \boxed{1}. Then: \boxed{3} or \boxed{5}")
    assert hedge.answers == ["3", "5"] and hedge.num_superseded == 1


@pytest.mark.parametrize(
    ("between", "together"),
    [
        (" or ", True),
        ("$ and $", True),
        (r", \quad ", True),
        (" (b) ", True),
        (", i.e. ", True),
        (", but after fixing the sign error the result is ", False),
        (". Final answer: ", False),
        (". Wait, that's wrong. ", False),
        (". Let me check: 2 or 3 terms give 5.\nSo ", False),
    ],
)
def test_offered_together(between, together):
    assert offered_together(between) is together
