"""Numbers written in words, read by English grammar (`words_to_number`).

`"two million"` → 2000000, `"five hundred thousand"` → 500000, `"two thousand and five"` → 2005, `"1.5 million"`
→ 1500000, `"two dozen"` → 24, `"3 thousandths"` → 3/1000, `"one and a half"` → 3/2, and a fraction of a
multiple: `"half a million"` → 500000, `"a quarter million"`, `"three quarters of a million"`, `"half a dozen"` → 6,
`"one and a half million"`, `"a million and a half"`, `"a dozen and a half"` → 18. A sequence that is not one
English numeral is no number at all: `"two three"`, `"five five"`, `"thousand thousand"`, `"five or six"` and a bare
scale word (`"million"`) are None, where an earlier reader added the words up (5, 10, 2000, 5, 1000000).

The grammar (one pass over the words, no backtracking):

    numeral  := [sign] (fraction multiple | group (scale group)* [scale] ["and" below100 | "and a half"] [part])
    fraction := [count] part ["of"] ["a" | "one"]    (the count may be left out only before "half"/"quarter")
    group    := "a" | digits | below100 ["hundred" ["and" below100]]
    below100 := tens [unit] | teen | unit

Scale words (thousand, million, ...) must come in strictly decreasing order; "and" only after "hundred" or a scale
("one hundred and one"), or before "a half", which after a multiple is half of that multiple ("a million and a
half", "two and a half million", "a dozen and a half"); a fractional word (tenths ... billionths, halves, thirds,
quarters) ends the numeral and divides it ("two thirds", "a half"). Plurals of scales count as the singular
("3 millions").
"""

from __future__ import annotations

import fractions
import re

__all__ = ["MULTIPLE_WORDS", "NUMBER_WORDS", "words_to_number"]

_UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine".split())}
_TEENS = {
    w: 10 + i
    for i, w in enumerate("ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())
}
_TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
# Fractional words: "3 thousandths" is 3/1000, "two thirds" 2/3.
_PARTS = {
    "tenth": 10, "hundredth": 100, "thousandth": 10**3, "millionth": 10**6, "billionth": 10**9,
    "half": 2, "halve": 2, "third": 3, "quarter": 4, "fourth": 4,
}  # fmt: skip
# What a fraction can be of: "half a million", "a quarter of a dozen", "half a hundred".
_MULTIPLES = {**_SCALES, "hundred": 100, "dozen": 12}
_AND_A_PART = {("and", "a", "half"): fractions.Fraction(1, 2), ("and", "a", "quarter"): fractions.Fraction(1, 4)}
_SIGN_WORDS = {"minus": -1, "negative": -1}
_MAX_WORDS = 12
_DIGITS = re.compile(r"\d+(?:\.\d+)?")
_LATEX_FRACTION = re.compile(r"\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_SLASH_FRACTION = re.compile(r"\d+/[1-9]\d*")  # "1/2 million": a count of a scale word, as "0.5 million" is
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")

# Words that are (part of) a value, plurals included: never units.
NUMBER_WORDS = frozenset(
    [*_UNITS, *_TEENS, *_TENS, "hundred", "dozen", *_SIGN_WORDS, "a", "and"]
    + [w + s for w in [*_SCALES, *_PARTS, "hundred", "dozen"] for s in ("", "s")]
    + ["halves", "fourths"]
)

# What "of" may join in a numeral ("three quarters of a million"), plurals included.
MULTIPLE_WORDS = frozenset(w + s for w in _MULTIPLES for s in ("", "s"))


def _singular(word: str) -> str:
    if word == "halves":
        return "half"
    return word[:-1] if word.endswith("s") and word[:-1] in {*_SCALES, *_PARTS, "hundred", "dozen"} else word


class _Words:
    """A cursor over the words of a numeral."""

    def __init__(self, words: list[str]):
        self.words, self.i = words, 0

    def peek(self, ahead: int = 0) -> str | None:
        j = self.i + ahead
        return self.words[j] if j < len(self.words) else None

    def take(self) -> str:
        self.i += 1
        return self.words[self.i - 1]

    def done(self) -> bool:
        return self.i == len(self.words)


def _below100(w: _Words) -> int | None:
    word = w.peek()
    if word in _TENS:
        value = _TENS[w.take()]
        if w.peek() in _UNITS and w.peek() != "zero":
            value += _UNITS[w.take()]
        return value
    if word in _TEENS:
        return _TEENS[w.take()]
    if word in _UNITS:
        return _UNITS[w.take()]
    return None


def _group(w: _Words, first: bool) -> tuple[fractions.Fraction, bool] | None:
    """One count below a scale word: (value, whether it was written in words)."""
    word = w.peek()
    if word is None:
        return None
    if first and word == "a" and w.peek(1) is not None:
        w.take()
        if _singular(w.peek() or "") not in {*_SCALES, *_PARTS, "hundred", "dozen"}:
            return None
        # "a" is a count of one: "a hundred" (and five) goes on to the hundreds below, as "one hundred" does.
        value, in_words = fractions.Fraction(1), True
    elif _DIGITS.fullmatch(word):
        value, in_words = fractions.Fraction(w.take()), False
    elif first and _SLASH_FRACTION.fullmatch(word) and _singular(w.peek(1) or "") in _SCALES:
        value, in_words = fractions.Fraction(w.take()), False
    else:
        small = _below100(w)
        if small is None:
            return None
        value, in_words = fractions.Fraction(small), True
    if _singular(w.peek() or "") == "hundred" and value < 100:
        w.take()
        value, in_words = value * 100, True
        if w.peek() == "and":
            w.take()
            rest = _below100(w)
            if rest is None:
                return None
            value += rest
        else:
            value += _below100(w) or 0  # "three hundred twelve"
    return value, in_words


def words_to_number(text: str) -> fractions.Fraction | None:
    """The value of a numeral written (partly) in words, read by English grammar (module docstring).

    Args:
        text: e.g. `"forty-two"`, `"-3 million"`, `"minus three million"`, `"2.5 thousand"`, `"a dozen"`.

    Returns:
        The exact value, or None when the text is not one English numeral (digits alone, `"42"`, are not number
        words; nor is a scale word without a count, `"million"`, or a list of numbers, `"two three"`).
    """
    text = _THOUSANDS.sub("", text.strip().lower().translate({0x2212: "-", 0xFF0D: "-"}))
    text = _LATEX_FRACTION.sub(r"\1/\2", text)  # "\frac{1}{2} million" is "1/2 million"
    sign = -1 if text.startswith("-") else 1
    words = [word for word in re.split(r"[\s\-,]+", text.lstrip("+-")) if word]
    if words and words[0] in _SIGN_WORDS:
        sign = _SIGN_WORDS[words.pop(0)]
    if not words or len(words) > _MAX_WORDS:
        return None
    fraction_of = _fraction_of_multiple(_Words(words))
    if fraction_of is not None:
        return sign * fraction_of
    w = _Words(words)
    total, in_words, previous_scale = fractions.Fraction(0), False, None
    while True:
        group = _group(w, first=w.i == 0)
        if group is None:
            return None
        value, group_in_words = group
        in_words = in_words or group_in_words
        word = _singular(w.peek() or "")
        if word not in _SCALES:
            return _tail(w, total, value, in_words, sign)
        scale = _SCALES[word]
        if previous_scale is not None and scale >= previous_scale:
            return None  # "thousand million", "five thousand thousand"
        w.take()
        rest_words = tuple(w.words[w.i :])
        if previous_scale is None and rest_words in _AND_A_PART:  # "a million and a half": half of that scale
            return sign * (value + _AND_A_PART[rest_words]) * scale
        total, previous_scale, in_words = total + value * scale, scale, True
        if w.done():
            return sign * total
        if w.peek() == "and" and w.peek(1) != "a":  # "two thousand and five"
            w.take()
            rest = _below100(w)
            return sign * (total + rest) if rest is not None and w.done() else None


def _tail(
    w: _Words, total: fractions.Fraction, value: fractions.Fraction, in_words: bool, sign: int
) -> fractions.Fraction | None:
    """The end of a numeral after its last count `value`: nothing, "dozen", a fractional word or "and a half"."""
    word = _singular(w.peek() or "")
    if word == "dozen":
        w.take()
        value, in_words = (value + _take_and_a_part(w)) * 12, True  # "a dozen and a half" is 18
    elif word in _PARTS:
        w.take()
        value, in_words = value / _PARTS[word], True
    elif tuple(w.words[w.i : w.i + 3]) in _AND_A_PART:
        value, in_words = value + _take_and_a_part(w), True
        multiple = _singular(w.peek() or "")
        if total == 0 and multiple in _MULTIPLES:  # "two and a half million"
            w.take()
            value *= _MULTIPLES[multiple]
    if not w.done():
        return None
    return sign * (total + value) if in_words else None


def _take_and_a_part(w: _Words) -> fractions.Fraction:
    """Takes "and a half" / "and a quarter" at the cursor and returns its value; 0 (nothing taken) otherwise."""
    part = _AND_A_PART.get(tuple(w.words[w.i : w.i + 3]), fractions.Fraction(0))
    w.i += 3 if part else 0
    return part


def _fraction_of_multiple(w: _Words) -> fractions.Fraction | None:
    """A fraction of one multiple as the whole text ("half a million", "three quarters of a million"), or None.

    None leaves the text to the main grammar ("a half", "two thirds", "one and a half million").
    """
    counted = True
    if w.peek() == "a":
        w.take()
        count = fractions.Fraction(1)
    elif w.peek() is not None and _DIGITS.fullmatch(w.peek() or ""):
        count = fractions.Fraction(w.take())
    else:
        small = _below100(w)
        counted = small is not None
        count = fractions.Fraction(small if counted else 1)
    part = _singular(w.peek() or "")
    if part not in _PARTS or not (counted or part in ("half", "quarter")):
        return None
    w.take()
    if w.peek() == "of":
        w.take()
    if w.peek() in ("a", "one"):
        w.take()
    multiple = _singular(w.peek() or "")
    if multiple not in _MULTIPLES or w.i + 1 != len(w.words):
        return None
    return count / _PARTS[part] * _MULTIPLES[multiple]
