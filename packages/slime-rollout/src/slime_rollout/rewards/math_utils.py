r"""Whether two final answers are the same mathematical answer, judged as a careful grader would.

`grade_answer(pred, gold)` = `grade_fast` (cleaning and exact arithmetic, no sympy) then `symbolic_equal`
(math-verify's LaTeX parser and comparison, with exactness restored and a bounded budget):

* cleaning (`slime_rollout.rewards.normalize`): units, words around the answer, a choice letter given with its
  value, number and scale words (`3 million`, `2.5k`), repeating decimals, times of day (`5:30 PM` = `17:30`;
  AM/PM given on one side only of an hour 1-12 is dropped), function names written as text
  (`\operatorname{lcm}(4,6)` is `\lcm(4,6)`), "infinity", Unicode math (`√2`, `x²`, `½`: `rewards.unicode_math`),
  typesetting (`10,\!000`, `\textcolor{red}{5}`, `{\bf 5}`: `rewards.markup`);
* multiple-select answers are the sets of option letters they name where the label is such a set (`A, C` = `AC` =
  `\text{A and C}` = `(C), (A)`; "A or C" is a hedge): `rewards.letter_sets`;
* answers naming roman-numeral statements (`\text{I only}`, `I, III`, `\text{II and III}`) are the sets of
  numerals they name ("I or II" is a hedge): `rewards.roman_options`;
* what both sides name must agree: the choice letter (`(C) 12` ≠ `(B) 12`), the variable (`x = 3` ≠ `y = 3`), the
  unit (`5\text{ m}` ≠ `5\text{ cm}`, `12 cm^2` ≠ `12 cm`; a unit on one side only is dropped: `5 cm` = `5`), and
  the variables of an expression (`3s` ≠ `3t` and ≠ `3`, which math-verify takes as equal by dropping `s` and `t`
  as units). Text is compared case-folded as the original does, so `\Delta` = `\delta` and `X = 5` = `x = 5`
  (kept on purpose: labels differ in case more often than answers hinge on it); `2 3` is two numbers, equal only
  to `2 3`;
* a percent answer equals its number and its value (`50%` = `50` and `50%` = `0.5`, while `50` ≠ `0.5`): the
  original drops the sign, math-verify reads the value, and the label tells which the question meant;
* several final boxes (`answers.final_boxed_answers`) are one answer when they restate one value, else the parts of
  a multi-part answer (`final_pairs`): their number must be the label's number of parts (`parts.answer_parts`: `5`
  is not `5, 5`; `\pm 2` is the two parts `2, -2`; "x = 2 or x = 3" inside one box lists two), parts named on both
  sides ("x = ..., y = ...") are compared with the label's part of the same name, labelled parts ("(a) ... (b)
  ...") with the label's parts in order, unlabelled ones together as one list (math-verify compares it as a set;
  wrapped in other brackets than the label's, `\{1, 2\}` for `(1, 2)`, it is wrong); any other several answers
  are a hedge, which is wrong. Every
  grader that reads a final boxed answer (math, deepscaler, dapo, the `boxed_` types) goes through `final_pairs`
  or `single_final_answer`;
* numbers are compared exactly as rationals: `1/3^{40}` ≠ `1/3^{41}`, `0.5` = `\frac12`, `0.\overline{3}` =
  `\frac13`, but a rounded decimal is not the exact value, either way round (`0.333` ≠ `\frac13`, `1.414` ≠
  `\sqrt2`, `2\pi` ≠ `6.28`);
* symbolic forms go to math-verify (`\sqrt8` = `2\sqrt2`, sets, intervals, equations; an inequality is its solution
  set: `1 \le x < 3` = `[1, 3)` whichever side is the label, and inequalities joined by "or" are one set, their
  union: `x<1 \text{ or } x>2` = `(-\infty,1)\cup(2,\infty)`, `rewards.inequalities`); where it says "equal"
  for two exact constants, the equality is re-checked to 40 significant digits (math-verify compares
  `(a - b).evalf(chop=True)` and so takes `e^{-50}` for `e^{-51}`);
* bounded time on any thread: answers longer than `GRADE_MAX_CHARS` are not compared, those longer than
  `SYMBOLIC_MAX_CHARS` not symbolically, and expressions whose evaluation
  would be huge (power towers, exponents of 5+ digits, factorials, binomials and the like of 4+ digit values, however
  written: `(10^{100})!`) are not evaluated at
  all (a single big-integer power cannot be interrupted), and the rest runs under `run_with_deadline`.

A symbolic check that is skipped or runs out of time returns None ("undecided"); callers count it as wrong
and log it. Model text is never passed to `eval`/`sympify`.
"""

from __future__ import annotations

import fractions
import functools
import logging
import math
import re

from slime_core.error_text import preview
from slime_rollout.rewards.answers import FinalAnswers, extract_boxed, final_boxed_answers, strip_reasoning
from slime_rollout.rewards.costly import GRADE_MAX_CHARS, SYMBOLIC_MAX_CHARS, costly_reason, tree_too_big
from slime_rollout.rewards.deadline import GradingTimeout, run_with_deadline
from slime_rollout.rewards.inequalities import union_pair
from slime_rollout.rewards.letter_sets import letter_set, multi_select_label
from slime_rollout.rewards.normalize import choice_letter, clean_answer, normalize_answer, parse_number
from slime_rollout.rewards.parts import Split, answer_parts, different_brackets, named_pairs, positional_pairs
from slime_rollout.rewards.roman_options import roman_options
from slime_rollout.rewards.times import same_time

logger = logging.getLogger(__name__)

__all__ = [
    "GRADE_MAX_CHARS",
    "PREVIEW_CHARS",
    "SYMBOLIC_MAX_CHARS",
    "answer_parts",
    "costly_reason",
    "extract_boxed",
    "extract_label_answer",
    "final_boxed_answers",
    "final_pairs",
    "grade_answer",
    "grade_fast",
    "normalize_answer",
    "parse_number",
    "prepare_worker",
    "require_label",
    "single_final_answer",
    "strip_reasoning",
    "symbolic_equal",
    "symbolic_equal_with_timeout",
]

DEFAULT_BUDGET_S = 5.0
PREVIEW_CHARS = 200  # what logs show of an answer (`slime_core.error_text.preview`), never the whole input
_EXACT_DIGITS = 40  # exact constants must agree to this many significant digits
_FLOAT_REL_TOL = 1e-12  # a decimal equals an exact value only if it is that value (0.5 = 1/2), up to fp noise
_TIME = re.compile(r"^\d{1,2}:\d{2}$")
_SPACED_DIGITS = re.compile(r"\d \d")
# A digit that is a LaTeX argument, not a number of its own: a sub/superscript (`\log_2 8`, `x^2 3`) or a
# command's bare argument (`\sqrt 2 3`, `\binom 5 2`); the space after it separates arguments, not numbers.
_DIGIT_ARGUMENT = re.compile(r"(?:[_^]|\\[a-zA-Z]+)\s*\d")
_RELATION = re.compile(r"[=<>]|\\(?:[lg]eq?|neq?|ne|to|in|mapsto|approx|sim)(?![a-zA-Z])")
# A command with its name-like argument (`\begin{pmatrix}`, `\mathbb{R}`), else a bare command (`\sqrt`, `\pi`).
_COMMAND = re.compile(r"\\(?:begin|end|mathbb|mathcal|mathfrak|operatorname)\s*\{[^{}]*\}|\\[a-zA-Z]+")
_VARIABLE_LETTERS = frozenset("abcdfghjklmnopqrstuvwxyz")


def require_label(label: object) -> None:
    """Raises `ValueError("math reward needs a label (set --label-key)")` when `label` is None."""
    if label is None:
        raise ValueError("math reward needs a label (set --label-key)")


def extract_label_answer(label: object) -> str:
    r"""The final answer of a label: a GSM8K solution's `#### x`, a boxed answer, or the label itself.

    A float label (a numeric column) is the fraction it stores (`_float_label`: `0.3333333333333333` is 1/3).

    A solution whose final statement boxes several parts (`$x = \boxed{2}$ and $y = \boxed{3}$`) has them all, joined
    by ", " (`2, 3`), read by the rule a response's final boxes are read by (`answers.final_boxed_answers`): as its
    last box alone, the whole answer scored 0 and its last half 1. Boxes in earlier statements are superseded.

    Raises:
        ValueError: if `label` is None.
    """
    require_label(label)
    if isinstance(label, float) and math.isfinite(label):
        return _float_label(label)
    text = str(label)
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    if text.count("\\boxed") + text.count("\\fbox") > 1:
        parts = _distinct_parts(final_boxed_answers(text).answers)
        if len(parts) > 1:
            return ", ".join(parts)
    boxed = extract_boxed(text, unclosed=True)  # a label's missing brace is a typo
    return boxed if boxed is not None else text.strip()


_FLOAT_LABEL_DENOMINATOR = 10**6
_FLOAT_DIGITS = 15  # significant digits of a float that stands for a non-terminating value (1/3: 16)


def _float_label(label: float) -> str:
    r"""A float label as the exact value it stands for: the simplest fraction (denominator up to 10^6) it rounds from.

    A float column cannot hold 1/3 or 2/7, so `0.3333333333333333` scored 0 against the exact answer `\frac{1}{3}`
    (and against `0.\overline{3}`); the fraction whose float is the label is what it stores. Only a float of 15+
    significant digits is such a value; a shorter one (`0.1`, `2.5`) or one no such fraction gives is read as written
    (`repr`), and an answer that prints the float (`0.3333333333333333`) is a rounded decimal, not 1/3.
    """
    text = repr(label)
    if len(text.lstrip("-").replace(".", "").lstrip("0")) < _FLOAT_DIGITS:
        return text  # a decimal as typed (0.1, 2.5, 3.14159): the value it names
    value = fractions.Fraction(label).limit_denominator(_FLOAT_LABEL_DENOMINATOR)
    if float(value) != label:
        return text
    if value.denominator == 1:
        return str(value.numerator)
    return f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _distinct_parts(answers: list[str]) -> list[str]:
    r"""The answers of a label's final statement, a restated one once (`\boxed{5}, i.e. \boxed{5.0}` is one part)."""
    return answers if len(_distinct(answers)) > 1 else answers[:1]


def grade_fast(pred: str | None, gold: str | None) -> tuple[bool | None, str, str]:
    """The cheap part of `grade_answer`: cleaning, letters, times, string equality, exact numbers.

    Args:
        pred: extracted model answer, or None.
        gold: extracted ground-truth answer, or None.

    Returns:
        `(verdict, gold_text, pred_text)`; `verdict` is None when only `symbolic_equal` can decide, which
        then takes the cleaned texts. A side longer than `GRADE_MAX_CHARS` is not read: None with the texts as
        given, which `symbolic_equal` skips as too long (undecided, logged).
    """
    if pred is None or gold is None:
        return False, "", ""
    if len(pred) > GRADE_MAX_CHARS or len(gold) > GRADE_MAX_CHARS:
        return None, gold, pred
    gold_roman, pred_roman = roman_options(gold), roman_options(pred)
    if gold_roman is not None and pred_roman is not None and not gold_roman.hedged:
        # Statements "I only", "I, III": the sets named must agree; numerals offered as alternatives are a hedge.
        same = not pred_roman.hedged and pred_roman.numerals == gold_roman.numerals
        return same, ", ".join(sorted(gold_roman.numerals)), ", ".join(sorted(pred_roman.numerals))
    gold_options = multi_select_label(gold)
    if gold_options is not None and (pred_options := letter_set(pred)) is not None:
        # Options "A, C" / "AC" / "\text{A and C}": the sets picked must agree; letters offered with "or" are a hedge.
        same = not pred_options.hedged and pred_options.letters == gold_options.letters
        return same, ", ".join(sorted(gold_options.letters)), ", ".join(sorted(pred_options.letters))
    p, g = clean_answer(pred), clean_answer(gold)
    if g.letter and not g.text:  # a multiple-choice label: the letter decides (`b` names B here)
        return choice_letter(p) == g.letter, g.letter, p.letter or p.text
    if p.letter and not p.text:  # only a letter: right if the label names the same one
        return p.letter == choice_letter(g), g.text, p.letter
    if not p.text or not g.text:
        return False, g.text, p.text
    if _TIME.match(p.text) and _TIME.match(g.text):
        return same_time(p, g), g.text, p.text
    # What both sides name must agree: the choice letter, the variable, the unit (one side's alone is dropped).
    # Case folded like the text (`X = 5` is `x = 5`).
    for mine, theirs in ((p.letter, g.letter), (p.variable, g.variable), (p.unit, g.unit)):
        if mine and theirs and mine.lower() != theirs.lower():
            return False, g.text, p.text
    if p.text.lower() == g.text.lower():  # case folded as the original does: `\Delta` = `\delta`
        return True, g.text, p.text
    if _two_numbers(p.text) or _two_numbers(g.text):
        return False, g.text, p.text  # "2 3" is two numbers, not 23 (and not 2·3)
    pred_value, gold_value = parse_number(p.text), parse_number(g.text)
    if pred_value is not None and gold_value is not None:
        same = pred_value == gold_value
        if p.percent != g.percent:  # 50% is 0.5 (its value) as well as 50 (the original drops the sign)
            same = same or (pred_value / 100 if p.percent else pred_value) == (
                gold_value / 100 if g.percent else gold_value
            )
        return same, g.text, p.text
    if different_brackets(p.text, g.text):
        return False, g.text, p.text  # `\{1, 2\}` (a set) is not `(1, 2)` (a pair or interval): math-verify said so
    pred_variables, gold_variables = _variables(p.text), _variables(g.text)
    if pred_variables is not None and gold_variables is not None and pred_variables != gold_variables:
        return False, g.text, p.text  # `3s` is not `3t`, nor `3` (math-verify drops `s`, `t` as units)
    return None, g.text, p.text


def _two_numbers(text: str) -> bool:
    """Whether `text` has two numbers side by side ("2 3"); a digit that is a LaTeX argument is not one."""
    return bool(_SPACED_DIGITS.search(_DIGIT_ARGUMENT.sub("x", text)))


def _variables(text: str) -> frozenset[str] | None:
    r"""The letters an expression names as variables (case folded; `e` and `i` are constants), or None.

    None (not compared) for an equation, inequality or function definition (`f(x) = 2x` is `2x`), whose letters
    are not all the answer's.
    """
    if _RELATION.search(text):
        return None
    return frozenset(_COMMAND.sub(" ", text).lower()) & _VARIABLE_LETTERS


# Different spellings one final statement may restate its answer in (`5`, `5.0`, `x = 5`); more is no answer.
_MAX_SPELLINGS = 16


def _distinct(answers: list[str]) -> list[str]:
    """The first answer, then the first that differs from it (cheap checks: cleaning, exact numbers), if any.

    Callers only ask whether there is exactly one distinct answer, so this stops at the second: comparing every
    answer with every earlier one took 29 s of inline CPU for a 12 KB response of 1,000 different boxes (291 s
    for 3,000). A repeated spelling is compared once; more than `_MAX_SPELLINGS` spellings count as a hedge.
    """
    spellings = list(dict.fromkeys(answers))
    if len(spellings) > _MAX_SPELLINGS:
        return spellings[:2]
    for answer in spellings[1:]:
        if not grade_fast(answer, spellings[0])[0]:
            return [spellings[0], answer]
    return spellings[:1]


def final_pairs(final: FinalAnswers, gold: str) -> list[tuple[str, str]] | None:
    r"""What to compare for a response's final boxed answers: `(prediction, gold)` pairs that must all be equal.

    The rule every final-answer grader shares (module docstring): one answer (restatements of one value count
    once) is compared with the whole label, if it has as many parts; as many boxes as the label has parts are its
    parts: in order when labelled, else together; anything else (a hedge, a wrong number of parts) is wrong. Boxes
    that name other parts in words (`The minimum is \boxed{2} and the maximum is \boxed{3}`: `final.parts`) are
    read as labelled parts when there are as many as the label's.

    Args:
        final: the response's final boxed answers (`answers.final_boxed_answers`).
        gold: the label's answer (`extract_label_answer`).

    Returns:
        The pairs, or None when the answer is wrong whatever the values (no answer, a hedge, a part count that
        is not the label's).
    """
    answers, labelled = final.answers, final.labelled
    if not answers:
        return None
    gold_split = Split.of(gold)  # each side is split once per grade; the checks below read its parts up to 5 times
    gold_parts = gold_split.unwrapped
    if len(answers) < len(final.parts) == len(gold_parts):  # parts named in words: "the maximum is \boxed{3}"
        answers, labelled = list(final.parts), True
    if len(answers) > 1 and multi_select_label(gold) is not None and letter_set(", ".join(answers)) is not None:
        return [(", ".join(answers), gold)]  # `\boxed{A} and \boxed{C}` picks the options A and C of `AC`
    if len(answers) > 1 and len(answers) == len(gold_parts):
        named = named_pairs(answers, gold_parts) or positional_pairs(answers, gold_parts)
        if named is not None:
            return named
        return list(zip(answers, gold_parts, strict=True)) if labelled else [(", ".join(answers), gold)]
    distinct = _distinct(answers)
    if len(distinct) != 1:
        return None  # a hedge
    (answer,) = distinct
    if roman_options(answer) is not None and roman_options(gold) is not None:
        return [(answer, gold)]  # "I, III" is one answer, a set of statements, not two parts
    if multi_select_label(gold) is not None and letter_set(answer) is not None:
        return [(answer, gold)]  # "AC" is one answer, a set of options, however many parts "A, C" splits into
    applies, union = union_pair(answer, gold)
    if applies:
        return None if union is None else [union]
    split = Split.of(answer)
    if not split.same_count(gold_split):
        return None
    named = named_pairs(split.wrapped, gold_split.wrapped) or positional_pairs(split.unwrapped, gold_split.unwrapped)
    if named is not None:
        return named
    return [(split.joined(), gold_split.joined())]


def single_final_answer(text: str) -> str | None:
    r"""The one final boxed answer of `text` for graders without multi-part answers (`boxed_f1`, `boxed_gpqa`, ...).

    Returns:
        The content of the final statement's box (restatements of one value count once), or None when there is
        none (no box, retracted) or several different ones (a hedge: `oxed{3} or oxed{5}`).
    """
    distinct = _distinct(final_boxed_answers(text).answers)
    return distinct[0] if len(distinct) == 1 else None


def _exact_veto(gold, pred) -> bool:
    """Re-checks math-verify's "equal" for two numeric constants; True keeps the verdict."""
    import sympy

    if not (isinstance(gold, sympy.Expr) and isinstance(pred, sympy.Expr)):
        return True
    if gold.free_symbols or pred.free_symbols or not (gold.is_number and pred.is_number):
        return True
    g_value, p_value = sympy.N(gold, _EXACT_DIGITS + 10), sympy.N(pred, _EXACT_DIGITS + 10)
    diff, scale = abs(g_value - p_value), max(abs(g_value), abs(p_value))
    if diff == 0:
        return True
    # math-verify rounds to 6 places when either side is a decimal (0.333333 "=" 1/3): a decimal equals an exact
    # value only if it is that value, up to float noise (0.5 = 1/2); exact constants must agree to 40 digits.
    inexact = gold.has(sympy.Float) or pred.has(sympy.Float)
    tolerance = _FLOAT_REL_TOL if inexact else 10.0 ** (-_EXACT_DIGITS)
    return bool(diff <= tolerance * scale)


def _math_verify(gold_text: str, pred_text: str) -> bool | None:
    """math-verify's verdict with exactness restored, or None if it could not parse one side."""
    import math_verify.grader
    import math_verify.parser
    from math_verify import parse, verify

    # Its own timeouts (SIGALRM) are off on purpose: `run_with_deadline` bounds the whole check.
    math_verify.grader.TIMEOUT_WARNING_SHOWN = math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    gold = parse(f"\\boxed{{{gold_text}}}", parsing_timeout=None)
    pred = parse(f"\\boxed{{{pred_text}}}", parsing_timeout=None)
    if not gold or not pred:
        return None
    if tree_too_big(gold[0]) or tree_too_big(pred[0]):
        raise _TooCostly("an integer power or factorial too big to evaluate")
    # A solution set given as an inequality (`1 \le x < 3` for `[1, 3)`) counts as the set, either way round:
    # math-verify's default allows it only when the label is the inequality, so the label's form decided.
    if not verify(gold, pred, timeout_seconds=None, allow_set_relation_comp=True):
        return False
    return _exact_veto(gold[0], pred[0])


def _sympy_fallback(gold_text: str, pred_text: str) -> bool:
    """LaTeX → sympy with a grammar-based parser (no eval), then `simplify(a - b) == 0`."""
    import sympy
    from latex2sympy2_extended import latex2sympy

    gold, pred = latex2sympy(gold_text), latex2sympy(pred_text)
    if tree_too_big(gold) or tree_too_big(pred):
        raise _TooCostly("an integer power or factorial too big to evaluate")
    return bool(sympy.simplify(gold - pred) == 0)


class _TooCostly(Exception):  # noqa: N818
    pass


def _symbolic(gold_text: str, pred_text: str) -> bool:
    try:
        verdict = _math_verify(gold_text, pred_text)
    except _TooCostly:
        raise
    except Exception as e:  # math-verify raises a zoo of sympy errors on odd input
        logger.debug(
            "math-verify failed on %s vs %s: %s",
            preview(gold_text, PREVIEW_CHARS),
            preview(pred_text, PREVIEW_CHARS),
            e,
        )
        verdict = None
    if verdict is not None:
        return verdict
    try:
        return _sympy_fallback(gold_text, pred_text)
    except _TooCostly:
        raise
    except Exception as e:
        logger.debug(
            "sympy fallback failed on %s vs %s: %s",
            preview(gold_text, PREVIEW_CHARS),
            preview(pred_text, PREVIEW_CHARS),
            e,
        )
        return False


def symbolic_equal_with_timeout(gold_n: str, pred_n: str, timeout_s: float) -> bool | None:
    """The symbolic check under one wall-clock budget, on any thread (the grading workers run this too).

    Args:
        gold_n: cleaned ground truth (from `grade_fast`).
        pred_n: cleaned prediction.
        timeout_s: seconds for the whole check, > 0.

    Returns:
        The verdict, or None when the answer is too costly to evaluate or the budget ran out (the reason is
        logged at debug level; callers log the sample).
    """
    reason = costly_reason(gold_n) or costly_reason(pred_n)
    if reason is not None:
        logger.debug(
            "symbolic check skipped (%s): %s vs %s",
            reason,
            preview(gold_n, PREVIEW_CHARS),
            preview(pred_n, PREVIEW_CHARS),
        )
        return None
    prepare_worker()  # sympy & co.'s start-up takes seconds: not part of the budget
    try:
        return run_with_deadline(_symbolic, gold_n, pred_n, budget_s=timeout_s)
    except (GradingTimeout, _TooCostly) as e:
        logger.debug(
            "symbolic check gave up (%s): %s vs %s", e, preview(gold_n, PREVIEW_CHARS), preview(pred_n, PREVIEW_CHARS)
        )
        return None


def symbolic_equal(gold_n: str, pred_n: str, budget_s: float = DEFAULT_BUDGET_S) -> bool:
    """`symbolic_equal_with_timeout` with "undecided" counted as not equal (logged as a warning)."""
    verdict = symbolic_equal_with_timeout(gold_n, pred_n, budget_s)
    if verdict is None:
        logger.warning(
            "math answer %s counted as not equal to %s: symbolic check skipped or over its %g s budget",
            preview(pred_n, PREVIEW_CHARS),
            preview(gold_n, PREVIEW_CHARS),
            budget_s,
        )
        return False
    return verdict


@functools.cache
def prepare_worker() -> None:
    """Pays the symbolic graders' one-time start-up once (a grading worker calls it at its start-up).

    Imports math-verify and sympy and runs one comparison, which loads math-verify's LaTeX grammar lazily: on a
    busy machine that start-up takes seconds, and inside the first answer's budget it graded a correct answer
    undecided. Also marks math-verify's "timeout is disabled" warnings as shown: its own timeouts (SIGALRM, main
    thread only) are off on purpose; `run_with_deadline` bounds the whole check instead.
    """
    import latex2sympy2_extended  # noqa: F401
    import math_verify.grader
    import math_verify.parser
    import sympy  # noqa: F401

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    _symbolic("1", "1")


def grade_answer(pred: str | None, gold: str | None, budget_s: float = DEFAULT_BUDGET_S) -> bool:
    """Whether a predicted final answer equals the ground truth (inline; bounded by `budget_s` on any thread).

    Args:
        pred: extracted model answer (e.g. the content of the last box), or None.
        gold: extracted ground-truth answer.
        budget_s: seconds for the symbolic part.

    Returns:
        True if equal after cleaning, as exact numbers, or symbolically.
    """
    verdict, gold_n, pred_n = grade_fast(pred, gold)
    if verdict is not None:
        return verdict
    return symbolic_equal(gold_n, pred_n, budget_s)
