r"""What a final answer's value is: units, number words, variables, letters and digit spacing (issue 27, round 3).

Each row was written by hand for this test: grader, response, label, the careful grade. Rows marked "was 1.0"
scored 1.0 before the fix (a false positive); the others keep what was already right.
"""

import fractions

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.normalize import clean_answer
from slime_rollout.rewards.number_words import words_to_number
from slime_rollout.rewards.units import canonical


def _grade(grader, response, label):
    out = rule_based_reward(grader, response, label)
    return float(out["acc"]) if grader == "dapo" else float(out)


def B(s):  # noqa: N802 - a box, as a model writes it
    return f"The answer is $\\boxed{{{s}}}$."


# Item 2: a bare letter after a number is a variable, never a unit.
VARIABLE_LETTERS = [
    ("math", B("a+2c"), "a+2b", 0.0),  # was 1.0
    ("math", B("3p"), "3q", 0.0),  # was 1.0
    ("math", B(r"\frac{1}{2}ah"), r"\frac{1}{2}bh", 0.0),  # was 1.0
    ("math", B(r"2\sqrt{3}s"), r"2\sqrt{3}t", 0.0),  # was 1.0 (math-verify drops s and t as units)
    ("math", B("3s"), "3", 0.0),
    ("math", B("4r"), "4", 0.0),  # was 1.0
    ("math", B("12-3b"), "9", 0.0),  # was 1.0
    ("dapo", "Answer: 3b", "3", 0.0),  # was 1.0
    ("math", B("3p"), "3p", 1.0),
    ("math", B(r"2\sqrt{3}s"), r"2\sqrt{3}s", 1.0),
    ("math", B("x^2+2x+1"), "(x+1)^2", 1.0),
    # Units the grader knows, or that the author marked as text, still come off a number.
    ("math", B(r"5\ \mathrm{kg}"), "5", 1.0),
    ("math", B("5 kg"), "5", 1.0),
    ("math", B("5 m"), "5", 1.0),  # a one-letter symbol after a space
    ("math", B(r"5\text{m}"), "5", 1.0),
    ("math", B("45mph"), "45", 1.0),
    ("dapo", "Answer: 73 apples", "73", 1.0),
    ("dapo", "Answer: 5 meters", "5", 1.0),
]

# Item 4: when both sides carry a unit, it must be the same one (spelled any way).
UNITS = [
    ("math", B(r"5\text{ m}"), r"5\text{ cm}", 0.0),  # was 1.0
    ("math", B(r"3 \text{ hours}"), r"3 \text{ minutes}", 0.0),  # was 1.0
    ("math", B(r"12\text{ cm}^2"), r"12\text{ cm}", 0.0),  # was 1.0
    ("math", B("6 apples"), r"6\text{ oranges}", 0.0),
    ("dapo", "Answer: 5 kg", "5 g", 0.0),
    ("math", B(r"5\text{ centimeters}"), r"5\text{ cm}", 1.0),
    ("math", B(r"3\text{ hrs}"), r"3 \text{ hours}", 1.0),
    ("math", B("12 square feet"), r"12\text{ ft}^2", 1.0),
    ("math", B(r"12\text{ sq ft}"), "12 square feet", 1.0),
    ("math", B("60 miles per hour"), "60 mph", 1.0),
    ("math", B(r"5\text{ cm}"), "5", 1.0),  # the label has no unit: dropped
    ("math", B("5"), r"5\text{ cm}", 1.0),
]

# Item 3: number words are read by grammar; a list of numbers or a hedge is no number.
NUMBER_WORDS = [
    ("math", B(r"\text{five or six}"), "5", 0.0),  # was 1.0
    ("dapo", "Answer: five or six", "5", 0.0),  # was 1.0
    ("math", B(r"\text{two three}"), "5", 0.0),  # was 1.0
    ("math", B(r"\text{five five}"), "10", 0.0),  # was 1.0
    ("math", B(r"\text{one two three}"), "6", 0.0),  # was 1.0
    ("math", B(r"\text{thousand thousand}"), "2000", 0.0),  # was 1.0
    ("math", B(r"\text{twenty five}"), "25", 1.0),
    ("math", B(r"\text{five hundred thousand}"), "500000", 1.0),
    ("math", B(r"\text{two thousand and five}"), "2005", 1.0),
    ("math", B(r"\text{one and a half}"), r"\frac32", 1.0),
    ("math", B(r"\text{two million dollars}"), "2000000", 1.0),
]

# Item 9: what both sides name must agree; a bare scale word and spaced digits are no number.
LENIENT = [
    ("math", B("x=3"), "y=3", 0.0),  # was 1.0
    ("math", B("x = 3"), "y = 3", 0.0),
    ("math", B(r"(C)\ 12"), "(B) 12", 0.0),  # was 1.0
    ("math", B(r"\text{million}"), "1000000", 0.0),  # was 1.0
    ("math", B("2 3"), "23", 0.0),  # was 1.0
    ("math", B(r"\text{3 4}"), "34", 0.0),  # was 1.0
    ("math", B("1 2 3"), "123", 0.0),  # was 1.0
    ("math", B("2 3"), "6", 0.0),
    ("math", B("x=3"), "x=3", 1.0),
    ("math", B("x = 3"), "3", 1.0),
    ("math", B(r"(B)\ 12"), "(B) 12", 1.0),
    ("math", B(r"\text{a million}"), "1000000", 1.0),
    # Cheap credit: thousands grouped by a (thin) space, scientific notation, a trailing comma.
    ("math", B(r"1\,000"), "1000", 1.0),
    ("math", B("1 000 000"), "1000000", 1.0),
    ("math", B(r"6.02\times10^{23}"), "6.02e23", 1.0),
    ("math", B(r"6.02\times10^{23}"), "6.03e23", 0.0),
    ("math", B("5,"), "5", 1.0),
]


@pytest.mark.parametrize(("grader", "response", "label", "expected"), VARIABLE_LETTERS + UNITS + NUMBER_WORDS + LENIENT)
def test_value_is_graded_as_a_careful_reader_would(grader, response, label, expected):
    assert _grade(grader, response, label) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("two three", None),
        ("five five", None),
        ("thousand thousand", None),
        ("million", None),
        ("five or six", None),
        ("thousand million", None),  # scales must decrease
        ("five and six", None),  # "and" only where English puts it
        ("two million three hundred thousand", fractions.Fraction(2_300_000)),
        ("one hundred one", fractions.Fraction(101)),
        ("a half", fractions.Fraction(1, 2)),
        ("two thirds", fractions.Fraction(2, 3)),
    ],
)
def test_number_words_follow_english_grammar(text, value):
    assert words_to_number(text) == value


@pytest.mark.parametrize(
    ("words", "marked", "spaced", "unit"),
    [
        ("centimeters", False, True, "cm"),
        ("cm^2", False, True, "cm^2"),
        ("square feet", False, True, "ft^2"),
        ("mph", False, True, "mi/h"),
        ("miles per hour", False, True, "mi/h"),
        ("m/s", False, True, "m/s"),
        ("m", False, False, None),  # "5m": a variable
        ("r", False, True, None),  # not a unit symbol
        ("m", True, False, "m"),  # \text{m}
        ("or six", True, True, None),
        ("is wrong", True, True, None),
        ("ah", False, True, None),
    ],
)
def test_canonical_unit(words, marked, spaced, unit):
    assert canonical(words, marked=marked, spaced=spaced) == unit


def test_clean_answer_records_unit_and_variable():
    assert clean_answer(r"12\text{ cm}^2").unit == "cm^2"
    assert clean_answer("y = 3").variable == "y"
    assert clean_answer("4r").text == "4r" and clean_answer("4r").unit is None
