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
