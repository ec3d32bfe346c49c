r"""Issue 27, round 12: a box contradicted by the answer stated after it, and multiple-select letter answers.

Rows were written by hand for this test: grader, response, label, the careful grade. Rows marked "was 1.0" / "was
0.0" scored that before the fix; the others pin what must stay as it was (restatements, self-corrections that end
in a box, cases where a number is not the whole answer).
"""

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.answers import contradicts, final_boxed_answers
from slime_rollout.rewards.letter_sets import LetterSet, letter_set, multi_select_label
from slime_rollout.rewards.retraction import restated_values, retraction, retracts


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
    ("math", r"So \boxed{5}. Wait, the answer is 7, not 5.", "5", 0.0),  # was 1.0
    ("math", r"So \boxed{12}. So the answer is 12 inches, or 1 foot.", "12", 1.0),
    ("math", r"$x = \boxed{2}$, $y = \boxed{3}$. So the answer is 2 and 3.", "2, 3", 1.0),
    ("math", r"$x = \boxed{2}$, $y = \boxed{3}$. So the answer is $x = 2$", "2, 3", 1.0),  # one of its parts
    ("math", r"$x = \boxed{2}$, $y = \boxed{3}$. Final answer: 4", "2, 3", 0.0),  # was 1.0
]


@pytest.mark.parametrize(("grader", "response", "label", "expected"), CONTRADICTED)
def test_a_box_contradicted_by_the_stated_answer_after_it(grader, response, label, expected):
    assert _grade(grader, response, label) == expected


def test_restated_values_start_a_sentence():
    assert restated_values(". Wait, the answer is 7.") == ["7"]
    assert restated_values("\n\n**Final Answer:** \\(7\\)") == ["$7$"]
    assert restated_values(". Wait, the answer is 7, not 5.") == ["7"]
    assert restated_values(". For n = 4, the answer is 7.") == []
    assert restated_values(" (the answer is 7 if n = 4).") == []  # an aside


def test_one_retraction_pass_reads_the_restatement_after_the_other_rules():
    # retracts reads the restated answer over the window it already built (was a second pass, contradicted); a
    # retraction outranks it, and in final_boxed_answers a hedge does too, as when the two passes were separate.
    seen = []

    def restated(values):
        seen.append(values)
        return True

    assert retraction(". Wait, the answer is 7.", lambda value: True, restated) == "restated" and seen == [["7"]]
    assert retraction(". Oops, that is wrong. So the answer is 7.", lambda value: True, restated) == "retracted"
    assert retraction(". Done.", lambda value: True, restated) is None and len(seen) == 1  # no "answer": not read
    assert retracts(". Wait, the answer is 7.", lambda value: True) is False  # no restated predicate: not read
    assert final_boxed_answers(r"So \boxed{5} or 3. Wait, the answer is 7.").reason == "hedge"
    both = final_boxed_answers(r"x = \boxed{2}, y = \boxed{3}. Wait, the answer is 9.")
    assert (both.answers, both.reason, both.num_superseded) == ([], "retracted", 2)
    assert final_boxed_answers(r"x = \boxed{2}, y = \boxed{3}. So the answer is 2.").answers == ["2", "3"]


def test_contradicts_only_plainly_different_values():
    assert contradicts("7", "5")
    assert contradicts("$-7$", "5")
    assert contradicts("C", "B")
    assert not contradicts("7", r"\frac{14}{2}")
    assert not contradicts("0.5", r"50\%")  # a percent's value
    assert not contradicts(r"\sqrt{8}", r"2\sqrt{2}")  # not a plain number: not judged here
    assert not contradicts("a multiple of 3", "6")


# Multiple-select labels (two or more option letters): the answer is the set of options it names, in any spelling
# and order; letters offered with "or" are a hedge. A single letter keeps its own rule.
LETTER_SETS = [
    (r"\boxed{\text{A and C}}", "A, C", 1.0),  # was 0.0
    (r"\boxed{(A), (C)}", "A, C", 1.0),  # was 0.0
    (r"\boxed{AC}", "A, C", 1.0),  # was 0.0
    (r"\boxed{A, C}", "AC", 1.0),  # was 0.0
    (r"\boxed{\textbf{(C)} and \textbf{(A)}}", "AC", 1.0),  # was 0.0
    (r"\boxed{\text{Both A and C}}", "AC", 1.0),  # was 0.0
    (r"\boxed{\{A, C\}}", "A, C", 1.0),  # was 0.0
    (r"\boxed{A} and \boxed{C}", "AC", 1.0),  # was 0.0
    (r"\boxed{C, A}", "A, C", 1.0),
    (r"\boxed{A and C}", "A, C", 1.0),
    (r"\boxed{A or C}", "A, C", 0.0),  # was 1.0: a hedge
    (r"\boxed{\text{either A or C}}", "AC", 0.0),
    (r"\boxed{A}", "A, C", 0.0),
    (r"\boxed{ABC}", "A, C", 0.0),
    (r"\boxed{A, C, C}", "A, C", 0.0),
    (r"\boxed{A, C}", "A", 0.0),  # a one-letter label: not a set of options
    (r"\boxed{(B) 12}", "B", 1.0),  # a single letter with its value, as before
]


@pytest.mark.parametrize(("response", "label", "expected"), LETTER_SETS)
@pytest.mark.parametrize("grader", ["math", "boxed_dapo"])
def test_multiple_select_letters_are_sets_of_options(grader, response, label, expected):
    assert _grade(grader, response, label) == expected


@pytest.mark.parametrize(
    ("answer", "letters", "hedged"),
    [
        (r"\text{A and C}", {"A", "C"}, False),
        ("(a), (c)", {"A", "C"}, False),  # lower case in brackets
        (r"Options A \& C are correct", {"A", "C"}, False),
        ("A or C", {"A", "C"}, True),
        ("a, c", None, None),  # bare lower case: variables
        ("AA", None, None),  # a letter twice
        ("AK", None, None),  # K is no option
        ("A, 3", None, None),
        ("I think A", None, None),
    ],
)
def test_letter_set_reading(answer, letters, hedged):
    options = letter_set(answer)
    if letters is None:
        assert options is None
    else:
        assert options == LetterSet(frozenset(letters), hedged)


def test_a_multiple_select_label_has_two_letters_and_run_together_in_order():
    assert multi_select_label("AC") == LetterSet(frozenset("AC"), False)
    assert multi_select_label("C, A") == LetterSet(frozenset("AC"), False)
    assert multi_select_label("CA") is None  # more likely a segment than options out of order
    assert multi_select_label("A") is None
    assert multi_select_label("A or C") is None


async def test_an_undecided_grading_is_counted_and_logged(caplog):
    # Issue 27: a grading without a verdict (too costly, over budget, a crashed worker) was one warning per sample
    # and counted nowhere; the count is now in the warning and, per rollout, in rollout/num_reward_undecided.
    from slime_rollout.rewards.math import math_reward_async, num_undecided

    before = num_undecided()
    costly = r"The answer is \boxed{10^{5000}}."  # too costly to evaluate: skipped, no verdict
    assert await math_reward_async(costly, "1" + "0" * 5000, num_workers=0, sample_index=7) == 0.0
    assert await math_reward_async(costly, "1" + "0" * 5000, num_workers=0, sample_index=8) == 0.0
    assert await math_reward_async(r"\boxed{5}", "5", num_workers=0, sample_index=9) == 1.0  # decided: not counted
    assert num_undecided() - before == 2
    warnings = [r.getMessage() for r in caplog.records if "counted as wrong" in r.getMessage()]
    assert len(warnings) == 2 and "sample 8" in warnings[1]
    assert f"{before + 2} such grading(s) in this process" in warnings[1]
