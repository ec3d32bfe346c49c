r"""Grader cases left open by the fourth hostile pass on issue 27 and found by the fifth; each row written by hand.

Rows marked "was" scored the other way before the fix; the others pin neighbours that must stay as they are.
"""

import fractions

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.normalize import clean_answer
from slime_rollout.rewards.number_words import words_to_number

F = fractions.Fraction

# Item 2: a fraction of a multiple is a number ("half a million" is 500000).
FRACTIONS_OF_MULTIPLES = [
    ("half a million", F(500_000)),  # was None
    ("a half million", F(500_000)),  # was None
    ("half million", F(500_000)),  # was None
    ("a quarter million", F(250_000)),  # was None
    ("quarter of a million", F(250_000)),  # was None
    ("three quarters of a million", F(750_000)),  # was None
    ("a third of a million", F(1_000_000, 3)),  # was None
    ("half a billion", F(500_000_000)),  # was None
    ("half a dozen", F(6)),  # was None
    ("half a hundred", F(50)),  # was None
    ("a dozen and a half", F(18)),  # was None
    ("a million and a half", F(1_500_000)),  # was None
    ("one and a half million", F(1_500_000)),  # was None
    ("two and a half thousand", F(2_500)),  # was None
    ("minus half a million", F(-500_000)),  # was None
    ("1.5 million", F(1_500_000)),
    ("a half", F(1, 2)),
    ("three quarters", F(3, 4)),
    ("one and a half", F(3, 2)),
    # Not one numeral: still None.
    ("half", None),
    ("third a million", None),  # only "half"/"quarter" go without a count
    ("half a million a million", None),
    ("half a million and five", None),
    ("one thousand and a half million", None),
    ("million and a half", None),
]


@pytest.mark.parametrize(("text", "value"), FRACTIONS_OF_MULTIPLES)
def test_fraction_of_a_multiple_is_a_number(text, value):
    assert words_to_number(text) == value


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        (r"\boxed{half a million}", "500000", 1.0),  # was 0.0
        (r"\boxed{500000}", "half a million", 1.0),  # was 0.0
        (r"\boxed{\text{a quarter million}}", "250000", 1.0),  # was 0.0
        (r"\boxed{half a dozen}", "6", 1.0),  # was 0.0
        (r"\boxed{\text{three quarters of a million dollars}}", "750000", 1.0),  # was 0.0
        (r"\boxed{half a million, 3}", "500000, 3", 1.0),  # was 0.0
        (r"\boxed{half a million}", "5", 0.0),
        (r"\boxed{half a million}", "1000000", 0.0),
        (r"\boxed{3 hundredths of a meter}", "0.03", 1.0),
    ],
)
def test_fraction_of_a_multiple_is_graded_by_value(response, label, expected):
    assert rule_based_reward("math", response, label) == expected


def test_unit_after_a_fraction_of_a_multiple():
    clean = clean_answer("half of a million dollars")
    assert (clean.text, clean.unit) == ("500000", "dollar")


# Item 1 in gpqa without an explicit statement: options offered together are a hedge, by the math graders' rule
# (the original's fallback takes the last letter, so "A or B" is B there).
GPQA_NO_STATEMENT = [
    ("A or B", "B", 0.0),  # was 1.0
    ("It's A or B.", "B", 0.0),  # was 1.0
    ("I'd go with A or maybe B", "B", 0.0),  # was 1.0
    ("A (or possibly B)", "B", 0.0),  # was 1.0
    ("A, B", "B", 0.0),  # was 1.0
    ("A/B", "B", 0.0),  # was 1.0
    ("Probably A, maybe B.", "B", 0.0),  # was 1.0
    ("A. B is also plausible.", "B", 0.0),  # was 1.0
    ("The answer is A, or maybe B.", "A", 0.0),  # was 1.0: a statement followed by another option in hedge words
    ("Answer: B or possibly D", "B", 0.0),  # was 1.0
    # "I" and "A" as words are not options (the default letters are A-J).
    ("I'd say B. I checked twice.", "B", 1.0),  # was 0.0
    ("B. A quick check confirms it.", "B", 1.0),  # was 0.0
    # Kept right: one pick after the alternatives, a restatement, a pick with its reason.
    ("Between A and B, I pick A.", "A", 1.0),
    ("B or C, probably B", "B", 1.0),
    ("Not B, so A", "A", 1.0),
    ("Option A is about X, option B is about Y. So B.", "B", 1.0),
    ("Answer: B. A quick check confirms it.", "B", 1.0),
    ("Answer: B, since A requires more energy.", "B", 1.0),
    ("It is I.", "I", 1.0),
    ("A because the field is uniform", "A", 1.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), GPQA_NO_STATEMENT)
def test_gpqa_options_offered_together_are_a_hedge(response, label, expected):
    assert rule_based_reward("gpqa", response, label, {}) == expected


def test_gpqa_fallback_reads_only_the_final_statement():
    import time

    response = "A " * 500_000  # 1 MB of letters: the backwards walk stops after the final statement
    start = time.perf_counter()
    assert rule_based_reward("gpqa", response, "A", {}) == 1.0
    assert time.perf_counter() - start < 2.0  # every letter's negation check: ~14 s


# Item 1, fifth pass: an unboxed alternative right after the last box, and two more doubt phrases between boxes.
MATH_HEDGES = [
    (r"\boxed{5} or 3", "5", 0.0),  # was 1.0
    (r"\boxed{5} (or 3)", "5", 0.0),  # was 1.0
    (r"\boxed{5}, possibly 3", "5", 0.0),  # was 1.0
    (r"\boxed{5}. It might be 3 though.", "5", 0.0),  # was 1.0
    (r"\boxed{5}. Though it could also be 3.", "5", 0.0),  # was 1.0
    (r"\boxed{5} or -5", "5", 0.0),  # was 1.0
    (r"The answer is \boxed{3} but I could also see \boxed{5}.", "5", 0.0),  # was 1.0
    (r"\boxed{3}, though I'm leaning towards \boxed{5}", "5", 0.0),  # was 1.0
    # Kept right: the same value again, a derivation or a count after the box.
    (r"\boxed{5}, attained when n = 2 or 3.", "5", 1.0),
    (r"\boxed{5}, or equivalently 10/2", "5", 1.0),
    (r"\boxed{5} or 5.0", "5", 1.0),
    (r"\boxed{\frac{1}{2}} or 0.5", "1/2", 1.0),
    (r"\boxed{5}. Perhaps 2 more checks would help.", "5", 1.0),
    (r"\boxed{5}. Maybe 5 is right.", "5", 1.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), MATH_HEDGES)
def test_unboxed_alternative_after_the_last_box_is_a_hedge(response, label, expected):
    assert rule_based_reward("math", response, label) == expected
    assert rule_based_reward("boxed_dapo", response, label)["acc"] == bool(expected)


# Item 1 in gpqa with a statement: a correction that names only the letter, and options offered with the pick.
GPQA_STATEMENTS = [
    ("Answer: A. Correction: B.", "B", 1.0),  # was 0.0 (a retraction with no pick)
    ("Answer: A. No wait, B.", "B", 1.0),  # was 0.0
    ("Answer: B\nConfidence: low; A is also possible", "B", 0.0),  # was 1.0
    (r"\boxed{A} \boxed{B}", "B", 0.0),  # was 1.0
    ("Either A or B is correct.", "B", 0.0),  # was 1.0
    # Kept right: a second statement supersedes, a letter judged wrong or named as a distractor is no pick.
    ("Answer: A\nAnswer: B", "B", 1.0),
    ("Answer: A. Wait, B is wrong.", "A", 1.0),
    ("Answer: B (though A is close)", "B", 1.0),
    ("Answer: B. D is another common mistake.", "B", 1.0),
    ("I initially thought A, but the answer is B.", "B", 1.0),
    ("Comparing A and C, B is correct.", "B", 1.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), GPQA_STATEMENTS)
def test_gpqa_statement_corrections_and_hedges(response, label, expected):
    assert rule_based_reward("gpqa", response, label, {}) == expected


MORE_MATH_HEDGES = [
    (r"\boxed{3} (I'm not 100% sure) \boxed{5}", "5", 0.0),  # was 1.0
    ("\\boxed{5}\n\nAlternatively: 3", "5", 0.0),  # right since the previous commit
    (r"\boxed{5}; another possible answer is 3", "5", 0.0),  # was 1.0
    (r"\boxed{5} (3 is also possible)", "5", 0.0),  # was 1.0
    (r"\boxed{5}. 3 would also work.", "5", 0.0),  # was 1.0
    # Kept right: a check after the answer is no alternative.
    (r"\boxed{5}. Check: x = 3 is valid, so y = 5.", "5", 1.0),
    ("\\boxed{5}\n\nThe value 3 would not work.", "5", 1.0),
    (r"\boxed{5}. Alternatively, the same 5 follows from symmetry.", "5", 1.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), MORE_MATH_HEDGES)
def test_more_alternatives_after_the_last_box(response, label, expected):
    assert rule_based_reward("math", response, label) == expected
