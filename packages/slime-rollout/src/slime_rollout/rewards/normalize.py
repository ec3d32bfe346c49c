r"""Cleaning a final answer the way a careful grader reads it (`clean_answer`), and exact numbers (`parse_number`).

A box often holds more than the mathematical answer: units (`5\ \mathrm{kg}`, `12 \text{ cm}^2`), words around
it (`\text{The total is } 42`, `\text{two million}`), a choice letter with its value (`(B)\ 12`), a time of day
(`7:30 \text{ AM}`), a repeating decimal (`0.\overline{3}`, `0.1666\ldots`). `clean_answer` reduces it to the
answer itself plus what matters besides (the letter, AM/PM, a percent sign); `parse_number` turns plain numbers,
fractions, mixed numbers, repeating decimals and number words into exact `Fraction`s. No model text is ever
evaluated.

Number and scale words are values, not units: `3 million` is 3000000 (`3 million dollars` too: only `dollars` is
a unit), `3 millions` too, `2.5 thousand` and `2.5k` are 2500 (`normalize_answer` gives `2500` for both), `a dozen`
is 12, `3 thousandths` is 0.003 (tenths to billionths). The sign stays with the value: `-3 million`, `−3 million`
(a Unicode minus) and `minus 3 million` are -3000000. A magnitude abbreviation that is not only a unit (`3M`, `3 mil`,
`3 mn`, `3 bn`: million, mil, molar, ...) is ambiguous: it is kept as written, so it equals neither 3 nor 3000000.
A percent sign (`50\%`, `50 percent`) is kept aside
in `CleanAnswer.percent` and the text is the number without it, so `normalize_answer("50%")` is `"50"`;
`math_utils.grade_fast` then takes `50%` as equal to both `50` (the original's graders drop the sign: a "what
percent" question labelled `50`) and `0.5` (its value, as math-verify reads it), while `50` and `0.5` stay
different.

A unit comes off only where the value stays a number (`slime_rollout.rewards.units`: known units and `\text{}`
units, never a bare variable letter: `4r` stays `4r`) and is kept in `CleanAnswer.unit`; the variable of `x = 3`
in `CleanAnswer.variable`. Number words follow English grammar (`slime_rollout.rewards.number_words`: `two three`
and a bare `million` are no number). Digits separated by a space stay apart (`2 3` is not 23) unless they group
thousands (`1 000`, `1\,000` are 1000). `6.02\times10^{23}` is an exact number.

The real line in words or symbols (`\text{all real numbers}`, "all reals", `\mathbb{R}`, `ℝ`) is written as the
interval `(-\infty,\infty)`; a Python power (`x**2`, from a label written in code) as `x^{2}`; full-width forms and
dashes standing for a minus as ASCII (`unicode_math.ascii_forms`).

All patterns are linear-time (no nested quantifiers), so a 1 MB answer is cleaned in milliseconds.
"""

from __future__ import annotations

import dataclasses
import decimal
import fractions
import functools
import re

from slime_rollout.rewards.markup import strip_markup
from slime_rollout.rewards.number_words import words_to_number
from slime_rollout.rewards.unicode_math import ascii_forms, latex_from_unicode
from slime_rollout.rewards.units import split_bare_unit, take_text_unit

__all__ = ["CleanAnswer", "choice_letter", "clean_answer", "normalize_answer", "parse_number", "words_to_number"]

_TEXT_COMMANDS = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}"
)
# Functions math-verify parses as commands (`\lcm(4,6)` is 12). Wrapped (`\operatorname{lcm}`, `\mathrm{gcd}(`,
# `\text{max}(`) or bare right before `(`, they were unwrapped to letters, which it reads as a product
# (l·c·m(4, 6)): `\operatorname{lcm}(4,6)` scored 0 against 12. They are written as the command instead. `\text`
# and `\mathrm` only before an argument (`5\text{ min}` is a unit), bare names not `min`/`sec` (units too).
_BARE_NAMES = "gcd|lcm|max|det|floor|exp|ln|log|sinh|cosh|tanh|arcsin|arccos|arctan|arccot|sin|cos|tan|cot|csc"
_FUNCTION_NAMES = _BARE_NAMES + "|min|sec"
_WRAPPED_FUNCTION = re.compile(
    rf"\\operatorname\*?\s*\{{\s*({_FUNCTION_NAMES})\s*\}}"
    rf"|\\(?:mathrm|textrm|text|rm)\s*\{{\s*({_FUNCTION_NAMES})\s*\}}(?=\s*(?:\(|\\left))"
)
_BARE_FUNCTION = re.compile(rf"(?<![\\A-Za-z])({_BARE_NAMES})(?=\()")
_INFINITY = re.compile(r"(?<![\\A-Za-z])(?i:infinity)(?![A-Za-z])|∞")
# A LaTeX space (`\,`, `\ `, `\quad`, `~`); a row break `\\` is matched first and kept: its second backslash
# and the space after it (`1 \\ 2` in a pmatrix) are no `\ ` (taking them for one made the matrix `1\2`). Its
# spacing argument (`\\[4pt]`) is layout and goes.
_SPACES = re.compile(
    r"(\\\\)(?:\s*\[\s*[-+]?[\d.]{1,10}\s*(?:pt|em|ex|mm|cm|in|bp|pc|dd|sp|mu)\s*\])?|\\[ ,;:!]|\\q?quad\b|~"
)
_DELIMITERS = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_LETTER_ONLY = re.compile(r"^[(\[]?([A-J])[)\]]?\.?$")
# "Option B", "Choice (B)": a choice letter named as one (taken off only when a letter follows).
_CHOICE_WORD = re.compile(r"^(?i:option|choice)\s*:?\s*")
_LOWER_LETTER = re.compile(r"[(\[]?([a-j])[)\]]?\.?")
_LETTER_VALUE = re.compile(r"^(?:\(([A-J])\)|([A-J])(?:[):]|\.(?=\s)))\s*(\S.*)$")
_TIME = re.compile(r"^(\d{1,2}):(\d{2})\s*((?i:[ap])\.?\s?(?i:m)\.?)?$")
_LEAD_IN = re.compile(
    r"^(?i:(?:so\s*,?\s*)?(?:the\s+)?(?:final\s+|correct\s+)?(?:answer|result|solution|total|value)\s*(?:is|:|=)\s*)"
)
_SENTENCE = re.compile(r"^(?:[A-Za-z',]+\s+){1,12}(?:is|are|was|equals|=|:)\s+(?P<rest>\S.*)$")
_VARIABLE_PREFIX = re.compile(r"^([a-zA-Z])\s*=\s*(?=\S)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
# `\frac` with an unbraced one-token argument, as TeX reads it: `\frac12`, `\frac ab`, `\frac 1x`, `\frac\pi3`,
# `\frac{\pi}3` (`\frac abc` is `\frac{a}{b}c`; a letter right after `\frac` continues the command's name:
# `\fraction` is not a fraction). A token is one character or one command; a braced argument stays as written.
_FRAC_ARGUMENT = r"(\{[^{}]*\}|\\[A-Za-z]+|[0-9A-Za-z])"
_FRAC_SHORT = re.compile(rf"\\frac(?![A-Za-z])\s*{_FRAC_ARGUMENT}\s*{_FRAC_ARGUMENT}")
# A repeating decimal: its period under a bar (`\overline{3}`, `\bar{3}`, `\bar3`), dotted (`\dot{3}`) or in
# parentheses (`0.(3)`).
_REPEATING = re.compile(r"^(-?)(\d*)\.(\d*)(?:\\overline|\\bar|\\dot)\s*\{?(\d+)\}?$|^(-?)(\d*)\.(\d*)\((\d+)\)$")
_ELLIPSIS_DECIMAL = re.compile(r"^(-?)(\d*)\.(\d+?)(?:\\ldots|\\dots|\.\.\.|…)$")
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d{1,3})?$")
_LATEX_FRAC = re.compile(r"^([-+]?)\\frac\{([-+]?[\d.]+)\}\{([-+]?[\d.]+)\}$")
_SLASH_FRAC = re.compile(r"^([-+]?[\d.]+)/([-+]?[\d.]+)$")
_MIXED = re.compile(r"^([-+]?)(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}$")


@dataclasses.dataclass(frozen=True, slots=True)
class CleanAnswer:
    """A final answer reduced to what is graded.

    Attributes:
        text: the answer without units, words around it or a choice letter; spaces removed; may be "".
        letter: a multiple-choice letter given with (or as) the answer, upper case, or None.
        meridiem: "am" / "pm" of a time of day, or None.
        percent: True when the answer was given in percent (`50%`, `50 percent`); `text` is then the number
            without the sign (`"50"`).
        unit: the unit taken off a number, spelled one way (`units.canonical`: `"cm"`, `"cm^2"`, `"apple"`), or
            None.
        variable: the variable named before `=` (`x = 3` → `"x"`), or None.
    """

    text: str
    letter: str | None = None
    meridiem: str | None = None
    percent: bool = False
    unit: str | None = None
    variable: str | None = None


# Abbreviations of a magnitude that are also units or symbols ("3M": million or molar; "3 mil": million or a
# thousandth of an inch): never stripped as units, never read as a value, so "3M" equals neither 3 nor 3000000.
_AMBIGUOUS_MAGNITUDE = re.compile(r"M|MM|(?i:mil|mln|mn|bn|mio)\.?")
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\uff0d": "-"})  # the Unicode minus sign and its full-width form
_PERCENT = re.compile(r"\\?%|(?i:\bper\s?cent(?:age)?\b|\bpct\b\.?)")
_SPACE_GROUPS = re.compile(r"(?<![\d.])\d{1,3}(?: \d{3})+(?![\d.])")  # thousands grouped by spaces
_COMMAND_SPACE = re.compile(r"(\\[a-zA-Z]+) +(?=[a-zA-Z])")
_NOT_BETWEEN_DIGITS = re.compile(r"(?<!\d) | (?!\d)")
# `6.02\times10^{23}`; also `6.02 x 10^{23}` and `6.02*10^23` (a letter x between a number and a power of ten is
# the times sign: `x10^{23}` names no variable).
_SCIENTIFIC = re.compile(r"^([-+]?(?:\d+(?:\.\d*)?|\.\d+))(?:\\times|\\cdot|[x*])10\^\{?([-+]?\d{1,3})\}?$")
_THOUSANDS_SUFFIX = re.compile(r"^([-+]?(?:\d+(?:\.\d*)?|\.\d+))[kK]$")  # "2.5k": a number of thousands


# A degree sign followed by a temperature scale (`30^\circ C`, `30°F`, `30 ^{\circ}\text{C}` after `\text{}` is
# unwrapped): read as the unit `degC` / `degF` (`units`), so the letter is not left glued to the number.
_DEGREES_SCALE = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|\\circ|°)\s*([CcFf])(?![A-Za-z])")


# The real line in words, as a set or as an inequality that bounds nothing (`\text{all real numbers}`, "all reals",
# `\mathbb{R}`, `ℝ`, `-\infty < x < \infty`, which math-verify took for no interval): written as the interval
# `(-\infty,\infty)`, which math-verify compares with any other spelling of it. Only the whole answer:
# "all real numbers except 2", "all positive reals" and `\mathbb{R}^2` stay as written.
_ALL_REALS = re.compile(
    r"(?i:(?:the\s+set\s+of\s+)?(?:all|any|every)\s+reals?(?:\s+(?:numbers?|values?))?(?:\s+[a-z])?)"
    r"|\\mathbb\s*\{?\s*R\s*\}?|ℝ"
    r"|-\\infty\s*<\s*[a-zA-Z]\s*<\s*\\infty"
)
_REAL_LINE = r"(-\infty,\infty)"


# A Python-style power in a label (`x**2`, `2**(n+1)`): `**` has no other meaning in an answer, and the original's
# sympy grader reads it as `^`; math-verify does not parse it (`x^2` scored 0 against `x**2`). Markdown bold
# (`**5**`) has no operand on one side and stays.
_PYTHON_POWER = re.compile(r"(?<=[\w)}\]])\s*\*\*\s*(-?\d+(?:\.\d+)?|[A-Za-z]|\([^()]*\))")


def _latex_power(match: re.Match[str]) -> str:
    # As a LaTeX writer spells it, so the cheap string checks (dapo) match too: `x**2` → `x^2`, `2**(n+1)` →
    # `2^{n+1}`, `x**10` → `x^{10}` (`x^10` would be x^1 · 0).
    exponent = match.group(1)
    if exponent.startswith("("):
        exponent = exponent[1:-1]
    return "^" + exponent if len(exponent) == 1 else "^{" + exponent + "}"


def _strip_delimiters(s: str) -> str:
    # Bounds move inward and the text is cut once: a slice per pair copied the rest each time, quadratic in a box of
    # nested `$` (1 MB: 14 s on the event loop, before any grading deadline applies).
    start, end = 0, len(s)
    changed = True
    while changed:
        changed = False
        while start < end and s[start].isspace():
            start += 1
        while end > start and s[end - 1].isspace():
            end -= 1
        for left, right in _DELIMITERS:
            if end - start >= len(left) + len(right) and s.startswith(left, start) and s.endswith(right, 0, end):
                start, end, changed = start + len(left), end - len(right), True
                break
    return s[start:end].replace("\\displaystyle", "")


def _latex_cleanup(s: str) -> str:
    # Each pass runs only where its pattern can match, judged by a literal every match contains (grading calls this
    # 2-3 times per answer, mostly on short plain numbers); a pass that adds a backslash (`max(` → `\max(`) comes
    # before the checks that look for one.
    if "\\" in s:  # `\operatorname{lcm}(4,6)` → `\lcm(4,6)`
        s = _WRAPPED_FUNCTION.sub(lambda m: "\\" + (m.group(1) or m.group(2)), s)
    if "(" in s:
        s = _BARE_FUNCTION.sub(r"\\\1", s)
    if "\\" in s:
        for _ in range(2):  # \text{\textbf{x}}
            s = _TEXT_COMMANDS.sub(r" \1 ", s)
    if "\\" in s or "~" in s:
        s = _SPACES.sub(lambda m: m.group(1) or " ", s)
    if not s.isascii() or "infinity" in s.lower():  # (?i) also matches non-ASCII letters (`ınfınıty`)
        s = _INFINITY.sub(r"\\infty", s)  # "infinity", "∞": the value `\infty` (the word was left as letters)
    if "..." in s or "…" in s:
        s = _TRAILING_ELLIPSIS.sub(r"\1\\ldots", s)  # "0.333..." keeps its ellipsis past rstrip(".")
    if "\\" in s:
        s = (
            s.replace("\\left", "")
            .replace("\\right", "")
            .replace("\\dfrac", "\\frac")
            .replace("\\tfrac", "\\frac")
            .replace("\\sfrac", "\\frac")
        )
        s = s.replace("\\varnothing", "\\emptyset")  # two spellings of one set (math-verify parses only the second)
        s = _array_as_matrix(s)  # "(\begin{array}{cc} 1 & 2 \\ 3 & 4 \end{array})" is the pmatrix
    if "\\circ" in s or "°" in s:
        s = _DEGREES_SCALE.sub(lambda m: f" deg{m.group(1).upper()} ", s)  # "30^\circ C": a unit, not a 30C
    if "\\" in s or "°" in s or "$" in s:
        for token in ("^{\\circ}", "^\\circ", "\\circ", "°", "\\textdollar", "\\$", "$"):
            s = s.replace(token, "")
    s = s.strip().rstrip(".,;").strip()  # "5,", "5." and "5;" are 5
    return s[1:].lstrip() if s.startswith("+") and not s.startswith("++") else s  # a unary plus: "+\infty" is \infty


_WHITESPACE = re.compile(r"\s+")
_ASCII_LETTER = re.compile(r"[a-zA-Z]")
_WHOLE_DECIMAL = re.compile(r"-?\d+\.0+")  # "12.0", "12.00": the integer 12
_TRAILING_ELLIPSIS = re.compile(r"(\d)\s*(?:\.\.\.|…)$")
_ARRAY_BEGIN = re.compile(r"\\begin\{array\}\s*\{[^{}]{0,40}\}")
_ARRAY_END = "\\end{array}"
_MATRIX_OF_BRACKETS = {("(", ")"): "pmatrix", ("[", "]"): "bmatrix", ("|", "|"): "vmatrix"}


def _array_as_matrix(s: str) -> str:
    r"""`s` with each bracketed `array` as the matrix it typesets: `(\begin{array}{cc}..\end{array})` is a pmatrix.

    math-verify reads `pmatrix`, `bmatrix` and `vmatrix` but not an `array` between brackets, so a matrix written
    the older way scored 0 against the same matrix. One forward scan (each `\end{array}` is searched for once).
    """
    if "\\begin{array}" not in s:
        return s
    pieces, position, end = [], 0, -1
    for begin in _ARRAY_BEGIN.finditer(s):
        if begin.start() < position:
            continue
        if end < begin.end():  # the next `\end{array}`, searched for once for all the begins before it
            end = s.find(_ARRAY_END, begin.end())
        if end < 0:
            break
        opening = begin.start() - 1  # the bracket before it and the one after its end, spaces skipped (no copies)
        while opening >= position and s[opening].isspace():
            opening -= 1
        closing = end + len(_ARRAY_END)
        while closing < len(s) and s[closing].isspace():
            closing += 1
        kind = _MATRIX_OF_BRACKETS.get((s[opening : opening + 1], s[closing : closing + 1]))
        if kind is None or opening < position:
            continue
        pieces.append(s[position:opening])
        pieces.append(f"\\begin{{{kind}}}{s[begin.end() : end]}\\end{{{kind}}}")
        position = closing + 1
    pieces.append(s[position:])
    return "".join(pieces)


# A remark in parentheses after the answer, set off by a space (`5 \text{ (verified)}`, `5 (approx.)`, `12 \text{ (in
# centimeters)}`): words only, one of them a word of 4+ letters (`2(ab)` and `2 (xy)` are products), a lower-case
# letter (`(II)` and `(B)` name options) and none that changes the answer (a condition, an alternative, a negation:
# `5 (if n is odd)`, `5 (or 6)`, `5 (not simplified)` stay as written).
_REMARK = re.compile(r"(?<=\S)\s+\((?P<words>\s*[A-Za-z][A-Za-z.\s]{0,60})\)$")
_REMARK_KEEPS = frozenset(
    "or and if unless when whenever where not no never except only otherwise but maybe perhaps possibly mod modulo "
    "wrong incorrect false invalid undefined".split()
)


def _drop_remark(s: str) -> str:
    """`s` without a parenthesized remark at its end (`_REMARK`), or `s` as is."""
    remark = _REMARK.search(s) if ")" in s else None
    if remark is None or not re.search(r"[a-z]", remark["words"]):
        return s
    words = re.findall(r"[A-Za-z]+", remark["words"].lower())
    if any(len(word) < 2 for word in words) or max(map(len, words)) < 4 or _REMARK_KEEPS.intersection(words):
        return s
    return s[: remark.start()].rstrip()


def _take_percent(s: str) -> tuple[str, bool]:
    """`s` without its percent signs and words, and whether it had any."""
    if "%" not in s and s.isascii() and "per" not in (lower := s.lower()) and "pct" not in lower:
        return s, False  # (?i) also matches non-ASCII letters: only ASCII text is judged by its lower case
    without = _PERCENT.sub(" ", s)
    return (_WHITESPACE.sub(" ", without).strip(), True) if without != s else (s, False)


def _is_number(text: str) -> bool:
    """Whether `text` (before the last cleaning steps) is a plain number or a numeral in words."""
    if words_to_number(text) is not None:
        return True
    try:
        return _parse_clean_number(_THOUSANDS.sub("", text).replace(" ", "")) is not None
    except (ValueError, ZeroDivisionError, OverflowError):
        return False


def _is_constant(text: str) -> bool:
    r"""Whether `text` is a number or a constant expression (`2\sqrt{3}`, `\frac{\pi}{2}`): no variable letters."""
    return bool(re.search(r"\d", text)) and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", text))


def _strip_words_around(s: str) -> tuple[str, str | None, str | None]:
    """Drops a lead-in ("the answer is"), a sentence around one value, a variable prefix and a trailing unit.

    Returns:
        `(text, variable, unit)`: the variable named before `=` (`x = 5` → "x"), the canonical unit taken off.
    """
    s = _LEAD_IN.sub("", s).strip()
    variable = None
    prefix = _VARIABLE_PREFIX.match(s)  # before the sentence rule, which would drop "y =" as words
    if prefix:
        variable, s = prefix.group(1), s[prefix.end() :]
    sentence = _SENTENCE.match(s)
    if sentence and re.search(r"\d", sentence.group("rest")):
        s = sentence.group("rest").strip().rstrip(".")
        prefix = _VARIABLE_PREFIX.match(s)  # "the side length is s = 5"
        if prefix and variable is None:
            variable, s = prefix.group(1), s[prefix.end() :]
    rest, unit = split_bare_unit(s)
    if unit is None or _AMBIGUOUS_MAGNITUDE.fullmatch(unit) or not _is_number(rest):
        return s, variable, None  # "3M" is not 3: kept as written (module docstring)
    return rest, variable, unit


def choice_letter(clean: CleanAnswer) -> str | None:
    """The choice letter a cleaned answer gives, upper case: its letter, or a lone lower-case one (`b`, `(b)`).

    Only used against a label that is a bare choice letter (or by one): there `b` names option B, as a careful
    grader reads it, while elsewhere a lower-case letter is a variable.
    """
    if clean.letter:
        return clean.letter
    lower = _LOWER_LETTER.fullmatch(clean.text)
    return lower.group(1).upper() if lower else None


# One grade cleans the same short strings several times (an answer, its cleaned text in `parse_number`, the label
# of every sample of a group; `answers._readings` three times): 5,096 calls on 2,639 distinct strings in
# `benchmarks/bench_grader.py`. Bounded in entries and in key size (a 1 MB answer is cleaned, never kept).
CLEAN_CACHE_SIZE = 4096
CLEAN_CACHE_MAX_CHARS = 512


def clean_answer(answer: str) -> CleanAnswer:
    """Reduces a final answer (box content or label) to what is graded (see the module docstring).

    Pure; text of up to `CLEAN_CACHE_MAX_CHARS` characters is remembered (LRU, `CLEAN_CACHE_SIZE` answers;
    `clean_answer.cache_info()` / `clean_answer.cache_clear()` as `functools.lru_cache` names them).

    Args:
        answer: the raw answer text (anything else is read as `str(answer)`, never cached).

    Returns:
        The cleaned answer with its choice letter and AM/PM, if any.
    """
    if type(answer) is str and len(answer) <= CLEAN_CACHE_MAX_CHARS:  # a str subclass's str() may differ
        return _clean_cached(answer)
    return _clean(answer)


def _clean(answer: str) -> CleanAnswer:
    """`clean_answer` without the cache."""
    s = str(answer)
    if not s.isascii():  # what these three rewrite is not ASCII (`isascii` costs nothing, a pass is a copy)
        s = latex_from_unicode(ascii_forms(s).translate(_MINUS_SIGNS))
    s = strip_markup(_strip_delimiters(s))
    if "**" in s:
        s = _PYTHON_POWER.sub(_latex_power, s)
    rest, unit = take_text_unit(s)
    cleaned = None
    if unit is not None:
        cleaned = _latex_cleanup(rest)
        if _is_constant(cleaned):
            s = rest  # "5\text{ cm}": the unit is set aside, the value stays (and is cleaned once)
        else:
            unit, cleaned = None, None
    s, percent = _take_percent(_drop_remark(_latex_cleanup(s) if cleaned is None else cleaned))
    if _ALL_REALS.fullmatch(s):
        s = _REAL_LINE
    letter = None
    named = _CHOICE_WORD.match(s)
    if named and (_LETTER_ONLY.match(s[named.end() :]) or _LETTER_VALUE.match(s[named.end() :])):
        s = s[named.end() :]
    only = _LETTER_ONLY.match(s)
    if only:
        return CleanAnswer(text="", letter=only.group(1))
    with_value = _LETTER_VALUE.match(s)
    if with_value:
        letter = with_value.group(1) or with_value.group(2)
        s = with_value.group(3).strip()
    s, variable, bare_unit = _strip_words_around(s)
    unit = unit or bare_unit
    time = _TIME.match(s)
    if time:
        meridiem = time.group(3)
        meridiem = meridiem.lower().replace(".", "").replace(" ", "") if meridiem else None
        return CleanAnswer(text=f"{int(time.group(1))}:{time.group(2)}", letter=letter, meridiem=meridiem)
    value = words_to_number(s) if _ASCII_LETTER.search(s) else None
    if value is not None:
        s = _fraction_text(value)
    s = _WHITESPACE.sub(" ", s)
    if "," in s:
        s = _THOUSANDS.sub("", s)
    if " " in s:  # every space is " " now; the three passes below all need one
        s = _SPACE_GROUPS.sub(lambda m: m.group().replace(" ", ""), s)  # "1 000 000" (a thin space \, too)
        s = _COMMAND_SPACE.sub(r"\1\0", s)  # "\pi r" is not the command "\pir"
        s = _NOT_BETWEEN_DIGITS.sub("", s)  # "2 3" keeps its space: two numbers, not 23
    s = s.replace("\0", " ")
    thousands = _THOUSANDS_SUFFIX.fullmatch(s)
    if thousands:  # "2.5k" is 2500 here too, so normalize_answer and parse_number agree
        s = format(decimal.Decimal(thousands.group(1)).scaleb(3), "f")
    if "\\frac" in s:
        s = _FRAC_SHORT.sub(_braced_frac, s)
    if "." in s and _WHOLE_DECIMAL.fullmatch(s):
        s = s.split(".")[0]
    return CleanAnswer(text=s, letter=letter, percent=percent, unit=unit, variable=variable)


_clean_cached = functools.lru_cache(maxsize=CLEAN_CACHE_SIZE)(_clean)
clean_answer.cache_info = _clean_cached.cache_info  # type: ignore[attr-defined]
clean_answer.cache_clear = _clean_cached.cache_clear  # type: ignore[attr-defined]


def _braced_frac(match: re.Match[str]) -> str:
    r"""`\frac` with both arguments braced (`\frac\pi3` → `\frac{\pi}{3}`); a braced one is kept as is."""
    numerator, denominator = (arg if arg.startswith("{") else "{" + arg + "}" for arg in match.groups())
    return f"\\frac{numerator}{denominator}"


def normalize_answer(answer: str) -> str:
    """The cleaned text of `clean_answer` (string form for equality; AM/PM appended when present).

    Scale words are part of the value (`"3 million"` → `"3000000"`); a percent sign is dropped (`"50%"` →
    `"50"`, as the original normalizes it); `grade_fast` also takes `50%` as `0.5`.
    """
    clean = clean_answer(answer)
    text = clean.text if clean.text or clean.letter is None else clean.letter
    return text + (clean.meridiem or "")


def _fraction_text(value: fractions.Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _repeating(sign: str, whole: str, fixed: str, period: str) -> fractions.Fraction:
    # x = whole + (fixed + period / (10^len(period) - 1)) / 10^len(fixed)
    value = fractions.Fraction(int(whole or 0)) + (
        fractions.Fraction(int(fixed or 0)) + fractions.Fraction(int(period), 10 ** len(period) - 1)
    ) / 10 ** len(fixed)
    return -value if sign == "-" else value


def _ellipsis_period(digits: str) -> tuple[str, str] | None:
    """`"1666"` → ("1", "6"): the shortest period that repeats at the end (3 times for one digit, else twice)."""
    for size in range(1, 7):
        times = 3 if size == 1 else 2
        if len(digits) < size * times:
            break
        period = digits[-size:]
        if digits.endswith(period * times):
            fixed = digits[: len(digits) - size * times]
            while fixed.endswith(period):
                fixed = fixed[: -len(period)]
            return fixed, period
    return None


def parse_number(answer: str) -> fractions.Fraction | None:
    r"""Exact value of a plain number (after `clean_answer`), or None.

    Plain numbers are integers, decimals (scientific exponents up to 3 digits), `a/b`, `\frac{a}{b}`, mixed
    numbers `2\frac{1}{2}` (= 5/2, as a reader takes them), repeating decimals, number words and a number of
    thousands (`2.5k` = 2500, read by `clean_answer`; only where the whole answer is that number, so `3k` in algebra,
    `x + 3k`, stays `3k`).
    A percent sign is not part of the value (`50%` → 50; see `CleanAnswer.percent`).

    Returns:
        The value, or None if the text is not such a number.
    """
    s = clean_answer(answer).text
    if not s or len(s) > 200:
        return None
    try:
        return _parse_clean_number(s)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def _parse_clean_number(s: str) -> fractions.Fraction | None:
    if _NUMBER.fullmatch(s):
        return fractions.Fraction(s)
    match = _SCIENTIFIC.fullmatch(s)
    if match:  # "6.02\times10^{23}"
        return fractions.Fraction(match.group(1)) * fractions.Fraction(10) ** int(match.group(2))
    match = _LATEX_FRAC.fullmatch(s)
    if match:
        sign, num, den = match.groups()
        value = fractions.Fraction(num) / fractions.Fraction(den)
        return -value if sign == "-" else value
    match = _SLASH_FRAC.fullmatch(s)
    if match:
        return fractions.Fraction(match.group(1)) / fractions.Fraction(match.group(2))
    match = _MIXED.fullmatch(s)
    if match:
        sign, whole, num, den = match.groups()
        value = int(whole) + fractions.Fraction(int(num), int(den))
        return -value if sign == "-" else value
    match = _REPEATING.fullmatch(s)
    if match:
        groups = match.groups()
        return _repeating(*(groups[:4] if groups[3] is not None else groups[4:]))
    match = _ELLIPSIS_DECIMAL.fullmatch(s)
    if match:
        split = _ellipsis_period(match.group(3))
        if split is not None:
            return _repeating(match.group(1), match.group(2), *split)
        return fractions.Fraction(f"{match.group(1)}{match.group(2) or 0}.{match.group(3)}")
    return None
