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


# Issue 28, item 1: a retraction is about the box itself; later mentions of wrongness, asides and affirmations are
# not one. Label 5 throughout.
@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"\boxed{5}. So the correct answer is 5.", 1.0),  # an affirmation
        (r"Thus \boxed{5}. The correct answer is indeed $5$.", 1.0),
        (r"\boxed{5}. Option B is incorrect because it double counts.", 1.0),
        (r"\boxed{5}. The other root -3 is wrong since x>0.", 1.0),
        (r"\boxed{5}. My mistake earlier was the sign; now it is fixed.", 1.0),
        (r"\boxed{5}. (A common slip is to think 3; that is wrong.)", 1.0),  # an aside in parentheses
        (r"\boxed{5}. Wait, that's wrong.", 0.0),
        (r"\boxed{5}. Hmm, this is incorrect.", 0.0),
        (r"\boxed{5}. Scratch that.", 0.0),
        (r"\boxed{5}. My mistake, I misread the question.", 0.0),
        (r"\boxed{5} is wrong.", 0.0),
        (r"\boxed{5}. Actually, the correct answer is 6.", 0.0),  # a correction to another value
        (r"\boxed{5}. I made a mistake in step 2.", 0.0),
    ],
)
def test_retraction_must_be_about_the_box(response, expected):
    assert rule_based_reward("math", response, "5") == expected


# Items 2 and 3: hedges outside the old word list or in a middle sentence; negated boxes are not offered answers;
# every grader of a final answer applies the same rule.
@pytest.mark.parametrize(
    ("grader", "response", "expected"),
    [
        ("math", r"\boxed{3} vs \boxed{5}", 0.0),
        ("math", r"\boxed{3} otherwise \boxed{5}", 0.0),
        ("math", r"\boxed{3} is possible too; \boxed{5}", 0.0),
        ("math", r"It is \boxed{3}. I'm not certain. Another possibility is \boxed{5}.", 0.0),
        ("math", r"\boxed{3}. Since 3 is odd, the other possibility is \boxed{5}.", 0.0),
        ("math", r"\boxed{5} is correct, not \boxed{3}", 1.0),
        ("math", r"the answer is \boxed{5}. (Not \boxed{3}.)", 1.0),
        ("math", r"\boxed{3} is wrong; \boxed{5} is correct", 1.0),
        ("math", r"\boxed{5}, rather than \boxed{3}", 1.0),
        ("math", r"The answer is not \boxed{5}.", 0.0),  # its only box is negated: no answer
        ("boxed_math", r"\boxed{3} or \boxed{5}", 0.0),
        ("boxed_math", r"\boxed{5}", 1.0),
        ("boxed_math", "<think>\\boxed{5}", 0.0),  # reasoning that never closed has no answer
        ("dapo", r"Answer: \boxed{3} or \boxed{5}", 0.0),
        ("dapo", r"Answer: \boxed{5}", 1.0),
        ("boxed_dapo", r"So \boxed{3} or maybe \boxed{5}", 0.0),
        ("boxed_dapo", r"At first \boxed{3}, but fixing the sign gives \boxed{5}", 1.0),
        ("boxed_f1", r"\boxed{5} or \boxed{7}", 0.0),
        ("boxed_f1", r"\boxed{5}", 1.0),
    ],
)
def test_hedges_and_negations_on_every_final_answer_grader(grader, response, expected):
    out = rule_based_reward(grader, response, "5")
    assert (float(out["acc"]) if "dapo" in grader else float(out)) == expected


@pytest.mark.parametrize(
    ("between", "together"),
    [
        (" vs ", True),
        (" otherwise ", True),
        (". I'm not certain. Another possibility is ", True),
        (". Let me check: 2 or 3 terms give 5.\nSo ", False),  # a weak word deep inside a derivation
        (". Oops, it is possible too that ", False),  # a correction outranks a hedge word
    ],
)
def test_hedge_anywhere_between_boxes(between, together):
    assert offered_together(between) is together


# Item 4: labelled parts are compared in order, and the number of parts must be the label's.
@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        (r"(a) \boxed{2} (b) \boxed{1}", "1, 2", 0.0),
        (r"(a) \boxed{1} (b) \boxed{2}", "1, 2", 1.0),
        (r"$x = \boxed{2}$, $y = \boxed{1}$", "(1, 2)", 0.0),
        (r"$x = \boxed{1}$, $y = \boxed{2}$", "(1, 2)", 1.0),
        (r"\boxed{5}", "5, 5", 0.0),
        (r"\boxed{5}, \boxed{5}", "5, 5", 1.0),
        (r"\boxed{1}, \boxed{2}, \boxed{3}", "1, 2", 0.0),
        (r"\boxed{1, 2}", "1, 2", 1.0),
        # "or" inside one box lists values ("x = 3 or x = 5" is how a solution set is stated): right for the
        # two-part label, and still a hedge (two parts) for a one-value one.
        (r"\boxed{3 \text{ or } 5}", "3, 5", 1.0),
        (r"\boxed{3 \text{ or } 5}", "5", 0.0),
        (r"\boxed{1,000}", "1000", 1.0),  # a thousands separator is not a part
    ],
)
def test_multi_part_order_and_count(response, label, expected):
    assert rule_based_reward("math", response, label) == expected
    assert rule_based_reward("dapo", f"Answer: {response}", label)["acc"] is (expected == 1.0)


def test_unlabelled_parts_are_compared_as_a_set():
    # Roots have no order: math-verify compares the list as a set (dapo, never symbolic, needs the label's order).
    assert rule_based_reward("math", r"The roots are $\boxed{3}$ and $\boxed{2}$.", "2, 3") == 1.0


@pytest.mark.parametrize(
    ("response", "label"),
    [(r"\boxed{(-\infty, 3)}", "x<3"), (r"\boxed{1, 2}", r"\{1, 2\}"), (r"\boxed{(1, 2)}", "1, 2")],
)
def test_one_bracketed_answer_is_counted_either_way(response, label):
    assert rule_based_reward("math", response, label) == 1.0
