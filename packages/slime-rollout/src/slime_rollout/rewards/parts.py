r"""The parts of a multi-part answer: how many, which brackets wrap them, which variable each names.

Used by `math_utils` (`final_pairs`, `grade_fast`): `answer_parts` splits `1, 2`, `x = 2 or x = 3`, `\pm 2` and
`(1, 2]` into their parts (`Split` holds both readings of one answer, split once per grade); `different_brackets`
tells a set `\{1, 2\}` from a pair `(1, 2)`; `named_pairs` matches `y = 6, x = 5` with the label `x = 5, y = 6` by
name. Cheap string work, linear in the text.
"""

from __future__ import annotations

import dataclasses
import re

from slime_rollout.rewards.markup import strip_markup
from slime_rollout.rewards.number_words import words_to_number

__all__ = ["Split", "answer_parts", "different_brackets", "named_pairs", "positional_pairs"]

# "or" inside one answer lists its values ("x = 2 \text{ or } x = 3"); for a one-value label that is two parts,
# so a hedge inside a box (`\boxed{3 \text{ or } 5}` for `5`) is still wrong.
_PART_SEPARATOR = re.compile(r",|;|\b(?:and|or)\b")
_TEXT_AND = re.compile(r"\\(?:text|mathrm|textrm)\s*\{\s*(and|or)\s*\}")
_PLUS_MINUS = re.compile(r"\\(pm|mp)(?![a-zA-Z])|±")
_LATEX_SPACE = re.compile(r"\\[,;:! ]")
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
# A variable said to be in a bracketed set or interval (`x \in \{1, 2\}`, `t \in [0, 1)`): the brackets are the answer.
_MEMBERSHIP = re.compile(r"^[A-Za-z](?:_\{?\w{1,3}\}?)?\s*\\in(?![A-Za-z])\s*(?=[(\[{])")
_OPEN, _CLOSE = "([{", ")]}"


def _depths(text: str) -> list[int]:
    """Bracket depth before each character of `text` (any of `([{` opens, any of `)]}` closes)."""
    depths, depth = [], 0
    for char in text:
        depths.append(depth)
        depth += (char in _OPEN) - (char in _CLOSE)
    return depths


def _bracketed(text: str) -> tuple[str, list[int]]:
    r"""`text` as `answer_parts` reads it (no `\left`/`\right`, `\{` as `{`, no `$`), with its bracket depths."""
    # "1\,000": a thin space, not a part separator; "10,\!000" (`markup`): a thousands separator
    s = strip_markup(text)
    command = "\\" in s  # every pass but the thousands one needs a backslash (most answers are plain numbers)
    if command:
        s = _LATEX_SPACE.sub(" ", _TEXT_AND.sub(r" \1 ", s))
    if "," in s:
        s = _THOUSANDS_COMMA.sub("", s)
    if command:
        s = s.replace("\\left", "").replace("\\right", "").replace("\\{", "{").replace("\\}", "}")
    s = s.strip().strip("$").strip()
    if command:
        s = _MEMBERSHIP.sub("", s)  # "x \in {1, 2}" lists the set's elements, as "{1, 2}" does
    return s, _depths(s)


def _outer_brackets(text: str) -> str | None:
    """The bracket pair around the whole of a list answer (`"(]"` for `(1, 2]`), or None (not one, or one part)."""
    s, depths = _bracketed(text)
    if not (len(s) >= 2 and s[0] in _OPEN and s[-1] in _CLOSE and all(d > 0 for d in depths[1:])):
        return None
    if not any(depths[m.start()] == 1 for m in _PART_SEPARATOR.finditer(s)):
        return None  # `(5)` is 5 in parentheses, `\{5\}` a one-element set: graded by value
    return s[0] + s[-1]


def different_brackets(pred: str, gold: str) -> bool:
    r"""Whether two list answers are wrapped in different brackets: a set, a pair (or open interval), a closed one.

    The original grader requires the same brackets for tuples (`grade_answer_sympy`); math-verify takes the set
    `\{1, 2\}` for the pair `(1, 2)`. An unwrapped list (`1, 2`) is graded by value against any of them.
    """
    pred_pair, gold_pair = _outer_brackets(pred), _outer_brackets(gold)
    return pred_pair is not None and gold_pair is not None and pred_pair != gold_pair


def answer_parts(text: str, *, unwrap: bool = True) -> list[str]:
    r"""The parts of a (possibly multi-part) answer: split at top-level `,` `;` `and` `or`; `a \pm b` is two.

    With `unwrap`, one pair of brackets around the whole answer is taken off first (`(1, 2)`, `\{1, 2\}`,
    `[1, 2)` have two parts, as `1, 2` does); a thousands separator is not a split (`1,000` is one part).

    Args:
        text: an answer (a box's content or a label's answer).
        unwrap: take off brackets around the whole answer.

    Returns:
        The stripped parts, in order; one part for a plain answer.
    """
    s, depths = _bracketed(text)
    return _split(s, depths, unwrap=unwrap)


def _split(s: str, depths: list[int], *, unwrap: bool) -> list[str]:
    """`answer_parts` of a text already read by `_bracketed` (`s`, its bracket depths)."""
    if unwrap and len(s) >= 2 and s[0] in _OPEN and s[-1] in _CLOSE and all(d > 0 for d in depths[1:]):
        s, depths = s[1:-1], [d - 1 for d in depths[1:-1]]
    pieces, joiners, start = [], [], 0
    for m in _PART_SEPARATOR.finditer(s):
        if depths[m.start()] == 0:
            pieces.append(s[start : m.start()].strip())
            joiners.append(m.group())
            start = m.end()
    pieces.append(s[start:].strip())
    parts = pieces[:1]
    for joiner, piece in zip(joiners, pieces[1:], strict=True):
        # An "and" inside one numeral in words ("two thousand and five", "one and a half") joins, not splits.
        joined = f"{parts[-1]} and {piece}"
        if joiner == "and" and parts[-1] and words_to_number(joined) is not None:
            parts[-1] = joined
        else:
            parts.append(piece)
    return [value for p in parts if p for value in _plus_minus(p)] or [s]


@dataclasses.dataclass(frozen=True, slots=True)
class Split:
    r"""One answer split into its parts both ways `answer_parts` reads it, once (a grade asks several times).

    Example: `Split.of(r"\{1, 2\}")` has `wrapped == ["{1, 2}"]` and `unwrapped == ["1", "2"]`.

    Attributes:
        text: the answer as given.
        wrapped: `answer_parts(text, unwrap=False)`: brackets around the whole answer kept (`(1, 2)` is one part).
        unwrapped: `answer_parts(text)`: those brackets taken off first (`(1, 2)` is two parts).
    """

    text: str
    wrapped: list[str]
    unwrapped: list[str]

    @classmethod
    def of(cls, text: str) -> Split:
        """Splits `text` (its LaTeX read once by `_bracketed`, then split with and without unwrapping)."""
        s, depths = _bracketed(text)
        return cls(text=text, wrapped=_split(s, depths, unwrap=False), unwrapped=_split(s, depths, unwrap=True))

    def same_count(self, other: Split) -> bool:
        r"""Whether both answers have as many parts, counted as written or with enclosing brackets off.

        So `\{1, 2\}` has the parts of `1, 2`, and `(-\infty, 3)` the one part of `x<3`.
        """
        return len(self.wrapped) == len(other.wrapped) or len(self.unwrapped) == len(other.unwrapped)

    def joined(self) -> str:
        """The top-level parts joined by ", ", numerals in words as digits ("two and 3" → "2, 3").

        A one-part answer is returned unchanged: the single-answer checks read number words themselves.
        """
        if len(self.wrapped) <= 1:
            return self.text
        return ", ".join(_digits(part) for part in self.wrapped)


def _plus_minus(part: str) -> list[str]:
    r"""The two values of a part with one `\pm` (`\pm 2` → `+2`, `-2`; `\mp` the other way round), else `[part]`.

    `a \pm b` names two answers, as math-verify reads it; counted as one part, `\pm 2` failed the part count
    against the label `2, -2`. Two or more signs are ambiguous (correlated or not) and stay one part.
    """
    signs = _PLUS_MINUS.findall(part)
    if len(signs) != 1:
        return [part]
    first, second = ("-", "+") if signs[0] == "mp" else ("+", "-")
    return [_PLUS_MINUS.sub(first, part), _PLUS_MINUS.sub(second, part)]


# One part of a list that names what it gives: `x = 5`, `a_1 = 2`, `y_{max} = 3` (the name, the value).
_NAMED_PART = re.compile(r"^\s*([A-Za-z](?:_\{?\w+\}?)?)\s*=\s*(\S.*)$")


def named_pairs(parts: list[str], gold_parts: list[str]) -> list[tuple[str, str]] | None:
    """Each named part with the label's part of the same name (`y = 6, x = 5` against `x=5, y=6`), or None.

    Named parts are matched by name, not by position, and each value is compared on its own: `y = 5, x = 6` is not
    `x = 5, y = 6` (compared as one list, the values {5, 6} matched). None unless both sides have two or more parts,
    all named, each name once, the same names.
    """
    if len(parts) < 2 or len(parts) != len(gold_parts):
        return None
    names = [_NAMED_PART.match(part) for part in parts]
    gold_names = [_NAMED_PART.match(part) for part in gold_parts]
    if not all(names) or not all(gold_names):
        return None
    by_name = {_name(m): part for m, part in zip(names, parts, strict=True)}
    gold_by_name = {_name(m): part for m, part in zip(gold_names, gold_parts, strict=True)}
    if len(by_name) != len(parts) or len(gold_by_name) != len(gold_parts) or by_name.keys() != gold_by_name.keys():
        return None
    return [(by_name[name], gold_part) for name, gold_part in gold_by_name.items()]


def positional_pairs(parts: list[str], gold_parts: list[str]) -> list[tuple[str, str]] | None:
    """Unnamed parts against a label whose parts each name a different variable: paired in the label's order.

    `2, 1` (or `(2, 1)`) for the label `x = 1, y = 2` gives x = 2, y = 1: compared as one list (the set {1, 2}), it
    scored 1, while `x = 2, y = 1` against the label `(1, 2)` scored 0. A label that names one variable several
    times (`x = 1, x = 2`: its solutions) is a set and is not paired. None unless both sides have two or more parts,
    as many each, no part of `parts` named, every label part named, each name once.
    """
    if len(parts) < 2 or len(parts) != len(gold_parts) or any(_NAMED_PART.match(part) for part in parts):
        return None
    gold_names = [_NAMED_PART.match(part) for part in gold_parts]
    if not all(gold_names) or len({_name(m) for m in gold_names if m}) != len(gold_parts):
        return None
    return list(zip(parts, gold_parts, strict=True))


def _name(match: re.Match[str]) -> str:
    return match.group(1).replace("{", "").replace("}", "").lower()  # case folded, as the graded text is


def _digits(part: str) -> str:
    """A numeral in words as its exact value ("two" → "2", "one and a half" → "3/2"); anything else unchanged."""
    value = words_to_number(part)
    if value is None:
        return part
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
