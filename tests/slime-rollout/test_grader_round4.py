r"""Grader cases found by the fourth hostile pass on issue 27 (items 1 and 2); each row was written by hand.

Rows marked "was" scored the other way before the fix. The others pin the corrections and lists that must stay
right next to them.
"""

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.math_utils import answer_parts
from slime_rollout.rewards.number_words import words_to_number

# Item 1: doubt about the later box ("is also plausible", "is another", "a second guess") is a hedge.
HEDGES = [
    (r"I'd say \boxed{3}, but \boxed{5} is also plausible.", "5", 0.0),  # was 1.0
    (r"I think it's \boxed{3}. Though \boxed{5} is also plausible.", "5", 0.0),  # was 1.0
    (r"\boxed{3} is one candidate. \boxed{5} is another.", "5", 0.0),  # was 1.0
    (r"My best guess is \boxed{3}. A second guess is \boxed{5}.", "5", 0.0),  # was 1.0
    (r"\boxed{3} seems right. Then again, \boxed{5} also seems right.", "5", 0.0),  # was 1.0
    (r"\boxed{3}. I'm not confident. \boxed{5}", "5", 0.0),  # was 1.0
    # Kept right: corrections that use the same words, and one box with doubt after it.
    (r"My first guess was \boxed{3}, but computing carefully gives \boxed{5}.", "5", 1.0),
    (r"\boxed{3}. Hmm, likely I dropped a sign. Redoing it: \boxed{5}.", "5", 1.0),
    (r"\boxed{3}. The candidate 3 fails the check x^2=25. So \boxed{5}.", "5", 1.0),
    (r"\boxed{3} was a draft. The final answer is \boxed{5}, which is also right by symmetry.", "5", 1.0),
    (r"First I tried \boxed{3}. Then again I re-did step 2 and got \boxed{5}.", "5", 1.0),
    (r"The answer is \boxed{5}. It's likely the intended answer.", "5", 1.0),
    (r"\boxed{3}. Fixing the sign gives \boxed{5}, which is likely correct.", "5", 1.0),  # confidence, not a hedge
]

# Item 2: "and" inside a numeral in words, "a hundred", and a list joined by "and" or ";".
VALUES = [
    (r"\boxed{one hundred and twenty}", "120", 1.0),  # was 0.0 (split into two parts at "and")
    (r"\boxed{two thousand and five}", "2005", 1.0),  # was 0.0
    (r"\boxed{one and a half}", "1.5", 1.0),  # was 0.0
    (r"\boxed{1.5}", "one and a half", 1.0),  # was 0.0 (the label split too)
    (r"\boxed{a hundred}", "100", 1.0),  # was 0.0
    (r"\boxed{a hundred and five}", "105", 1.0),  # was 0.0
    (r"\boxed{2 and 3}", "2, 3", 1.0),  # was 0.0
    (r"\boxed{2; 3}", "2, 3", 1.0),  # was 0.0
    (r"\boxed{2 and 3}", "2, 4", 0.0),
    (r"\boxed{2 and 3}", "5", 0.0),
    (r"\boxed{two and three}", "5", 0.0),  # a list of two numbers, not one numeral
    (r"\boxed{(2, 1)}", "(1, 2)", 0.0),  # an ordered pair keeps its order
    (r"\boxed{(1, 2)}", "(1, 2)", 1.0),
    (r"\boxed{two, three}", "2, 3", 1.0),  # was 0.0: a list's numerals in words
    (r"\boxed{two and three}", "2, 3", 1.0),  # was 0.0
    (r"\boxed{one and a half, 2}", "3/2, 2", 1.0),  # was 0.0
    (r"\boxed{two, four}", "2, 3", 0.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), HEDGES + VALUES)
def test_math_grade(response, label, expected):
    assert rule_based_reward("math", response, label) == expected


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("one hundred and twenty", ["one hundred and twenty"]),
        ("one and a half, two thousand and five", ["one and a half", "two thousand and five"]),
        ("two and three", ["two", "three"]),
        ("2 and 3", ["2", "3"]),
        ("x and y", ["x", "y"]),
    ],
)
def test_answer_parts_keep_a_numeral_in_words_whole(text, parts):
    assert answer_parts(text) == parts


@pytest.mark.parametrize(
    ("text", "value"), [("a hundred", 100), ("a hundred and five", 105), ("a hundred twelve", 112)]
)
def test_a_counts_one_hundred(text, value):
    assert words_to_number(text) == value


# Item 12 (hangs): the graders run inline on the event loop, so each must be linear in the response. gpqa's
# statement patterns tried `\s*` at every position: 200,000 spaces took 308 s (2,000: 0.12 s; 8,000: 2 s).
@pytest.mark.parametrize("grader", ["gpqa", "math", "dapo", "f1"])
@pytest.mark.parametrize("filler", [" ", " \n", "\t", ": "])
def test_graders_are_linear_in_whitespace_runs(grader, filler):
    import time

    response = "Answer: " + filler * 100_000 + "B"
    start = time.perf_counter()
    rule_based_reward(grader, response, "B", {})
    assert time.perf_counter() - start < 2.0  # quadratic: minutes


@pytest.mark.parametrize(
    ("response", "expected"),
    [("The answer is\n\n   (B)", 1.0), ("Answer:    B", 1.0), ("Answer: A   or    B", 0.0), ("Answer:\tA", 0.0)],
)
def test_gpqa_reads_through_whitespace_runs(response, expected):
    assert rule_based_reward("gpqa", response, "B", {}) == expected


# Item 1 in gpqa: a later pick doubted in its own sentence, after a different earlier pick, is a hedge (as in math).
@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Answer: A. Answer: B is also plausible", 0.0),  # was 1.0
        ("Answer: A. Answer: B is another candidate.", 0.0),  # was 1.0
        ("Answer: A. After checking, Answer: B", 1.0),  # a correction settles on the last pick
        ("Answer: B. B is also plausible since x", 1.0),  # no other pick before it
        ("Answer: B, I think.", 1.0),
    ],
)
def test_gpqa_doubted_second_pick_is_a_hedge(response, expected):
    assert rule_based_reward("gpqa", response, "B", {}) == expected
