r"""The grader's hot path made faster without changing a score (`benchmarks/bench_grader.py`, RESULTS.md).

`normalize.clean_answer` runs each regex pass only where a literal its pattern needs is present and remembers
short answers (bounded LRU); `retraction.expand_contractions` skips text without an apostrophe and
`parts.answer_parts` its LaTeX passes on text without a backslash. The cases below sit on the edge of each guard (a
pass that adds the backslash a later one looks for, case-folded words with non-ASCII letters, a unit's value
cleaned once); every expected value is what the code before the change gave (3fb8c42), checked by hand.
"""

import pytest

from slime_rollout.rewards.math_utils import grade_fast
from slime_rollout.rewards.normalize import (
    CLEAN_CACHE_MAX_CHARS,
    CLEAN_CACHE_SIZE,
    CleanAnswer,
    clean_answer,
    parse_number,
)
from slime_rollout.rewards.parts import answer_parts
from slime_rollout.rewards.retraction import expand_contractions
from slime_rollout.rewards.units import take_text_unit

GUARD_EDGES = [
    # `(?i:infinity)` also matches dotless i: non-ASCII text goes through the pattern, ASCII by its lower case
    ("ınfınıty", CleanAnswer(text="\\infty")),
    ("-INFINITY", CleanAnswer(text="-\\infty")),
    # the bare function gets its backslash first, then the backslash passes see it
    ("max(3, 5)", CleanAnswer(text="\\max(3,5)")),
    ("\\text{max}(3,5)", CleanAnswer(text="\\max(3,5)")),
    ("0.333...", CleanAnswer(text="0.333\\ldots")),
    ("3~cm", CleanAnswer(text="3", unit="cm")),  # a `~` space without any backslash
    ("30°C", CleanAnswer(text="30", unit="degc")),
    ("30^\\circ C", CleanAnswer(text="30", unit="degc")),
    ("x**2", CleanAnswer(text="x^2")),
    ("2**(n+1)", CleanAnswer(text="2^{n+1}")),
    ("1 000 000", CleanAnswer(text="1000000")),
    ("1\\,000", CleanAnswer(text="1000")),
    ("\\frac12", CleanAnswer(text="\\frac{1}{2}")),
    ("12.00", CleanAnswer(text="12")),
    ("5\\text{ cm}", CleanAnswer(text="5", unit="cm")),  # the value cleaned once, for the check and the text
    ("x\\text{ cm}", CleanAnswer(text="xcm")),  # not a constant: the unit stays
    ("50 PERCENT", CleanAnswer(text="50", percent=True)),
    ("50 pct", CleanAnswer(text="50", percent=True)),
    ("50\\%", CleanAnswer(text="50", percent=True)),
    ("12 (approx.)", CleanAnswer(text="12")),
    ("5 (or 6)", CleanAnswer(text="5(or6)")),
    ("−3", CleanAnswer(text="-3")),  # Unicode minus: non-ASCII text takes the Unicode passes
    ("２５", CleanAnswer(text="25")),
    ("5\u200b", CleanAnswer(text="5")),
    ("½", CleanAnswer(text="\\frac{1}{2}")),
    ("x²", CleanAnswer(text="x^{2}")),
    ("\\$45", CleanAnswer(text="45")),
    ("\\pi r", CleanAnswer(text="\\pi r")),
    ("2 3", CleanAnswer(text="2 3")),
    ("10,000", CleanAnswer(text="10000")),
    ("2.5k", CleanAnswer(text="2500")),
    ("\\left(1, 2\\right)", CleanAnswer(text="(1,2)")),
    ("(B) 12", CleanAnswer(text="12", letter="B")),
    ("7:30 \\text{ PM}", CleanAnswer(text="7:30", meridiem="pm")),
    ("\\text{two million}", CleanAnswer(text="2000000")),
    ("\\varnothing", CleanAnswer(text="\\emptyset")),
    ("a\x00b", CleanAnswer(text="a b")),  # a NUL in the input is a space, as the command-space marker is
]


@pytest.mark.parametrize(("answer", "expected"), GUARD_EDGES, ids=[repr(a) for a, _ in GUARD_EDGES])
def test_guarded_passes_clean_as_before(answer, expected):
    clean_answer.cache_clear()
    assert clean_answer(answer) == expected
    assert clean_answer(answer) == expected  # from the cache


def test_clean_answer_cache_is_bounded_and_keyed_by_text():
    clean_answer.cache_clear()
    assert clean_answer.cache_info().maxsize == CLEAN_CACHE_SIZE == 4096
    # One grade of "12" against "12.5": each side, then parse_number of each cleaned text (the same strings).
    assert grade_fast("12", "12.5")[0] is False
    info = clean_answer.cache_info()
    assert (info.hits, info.misses, info.currsize) == (2, 2, 2)  # "12" and "12.5", twice each
    long_answer = "1" * (CLEAN_CACHE_MAX_CHARS + 1)
    assert clean_answer(long_answer).text == long_answer and parse_number(long_answer) is None  # > 200 chars
    assert clean_answer.cache_info().currsize == 2  # a long answer is cleaned, never kept
    # Not a str: read as str() and not cached (an int 12 and a float 12.0 hash alike but read differently).
    assert clean_answer(12) == CleanAnswer(text="12") and clean_answer(12.5) == CleanAnswer(text="12.5")
    assert clean_answer.cache_info().currsize == 2


def test_clean_answer_cache_does_not_trust_a_str_subclass():
    class Shown(str):
        def __str__(self) -> str:
            return "7"

    clean_answer.cache_clear()
    assert clean_answer("5") == CleanAnswer(text="5")
    assert clean_answer(Shown("5")) == CleanAnswer(text="7")  # read through str(), as before the cache
    assert clean_answer.cache_info().currsize == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("it isn\u2019t right", "it is not right"),  # a curly apostrophe is one
        ("that's wrong", "that is wrong"),
        ("I CAN'T", "I cannot"),
        ("no apostrophe here", "no apostrophe here"),
        ("naïve \u2013 text", "naïve \u2013 text"),
    ],
)
def test_expand_contractions(text, expected):
    assert expand_contractions(text) == expected


def test_take_text_unit_needs_a_command():
    assert take_text_unit("5 cm") == ("5 cm", None)  # a bare unit is split_bare_unit's
    assert take_text_unit("5\\text{ cm}") == ("5", "cm")
    assert take_text_unit("5\\mathrm{kg}^2") == ("5", "kg^2")


@pytest.mark.parametrize(
    ("text", "unwrapped", "wrapped"),
    [
        ("x \\in \\{1, 2\\}", ["1", "2"], ["{1, 2}"]),
        ("1,000, 2", ["1000", "2"], ["1000", "2"]),  # no backslash: only the thousands pass runs
        ("\\left(1,\\,000, 3\\right)", ["1", "000", "3"], ["(1, 000, 3)"]),  # a thin space after the comma
        ("2 \\text{ and } 3", ["2", "3"], ["2", "3"]),
        ("(1, 2]", ["1", "2"], ["(1, 2]"]),
        ("$5$", ["5"], ["5"]),
    ],
)
def test_answer_parts_with_and_without_commands(text, unwrapped, wrapped):
    assert answer_parts(text) == unwrapped and answer_parts(text, unwrap=False) == wrapped
