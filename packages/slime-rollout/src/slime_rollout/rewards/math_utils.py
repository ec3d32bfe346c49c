r"""Answer extraction and equivalence for math rewards (`--rm-type math|deepscaler|boxed_*`).

Extraction: the last `\boxed{...}` (or `\fbox{...}`) of a text, with nested braces; GSM8K
solutions end in `#### <answer>`. Equivalence: normalized string equality first (commas in
numbers, `$`/`\$`, trailing periods, `\%`, `\text{}` units, `\dfrac`), then exact rational
comparison of plain numbers, then `math-verify` (symbolic, LaTeX-aware) with a grammar-based
LaTeX → sympy fallback (`latex2sympy2_extended`). Model text is never passed to `eval`/`sympify`.

`grade_answer` = `grade_fast` (the cheap checks) then `symbolic_equal` (the expensive ones), inline.
`symbolic_equal_with_timeout` is the same symbolic check under one SIGALRM budget, for the grading
worker processes of `slime_rollout.rewards.pool`.
"""

from __future__ import annotations

import fractions
import functools
import logging
import re
import signal
import threading
import time

logger = logging.getLogger(__name__)

__all__ = [
    "extract_boxed",
    "extract_label_answer",
    "grade_answer",
    "grade_fast",
    "normalize_answer",
    "parse_number",
    "prepare_worker",
    "symbolic_equal",
    "symbolic_equal_with_timeout",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` / `\fbox{...}` (or `\boxed 5`) in `text`, braces balanced.

    Args:
        text: model output or label.

    Returns:
        The inner text without the outer braces, or None if there is no (closed) box.
    """
    if not text:
        return None
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start:]
    cmd_len = len("\\boxed") if rest.startswith("\\boxed") else len("\\fbox")
    rest = rest[cmd_len:]
    if rest.startswith(" "):
        # `\boxed 5` form: the argument is the next token.
        match = re.match(r"\s+([^\s$]+)", rest)
        return match.group(1) if match else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None  # unclosed box: no answer


def extract_label_answer(label: object) -> str:
    """The final answer of a label: a GSM8K solution's `#### x`, a boxed answer, or the label itself.

    Args:
        label: str, int or float ground truth.

    Raises:
        ValueError: if `label` is None.
    """
    if label is None:
        raise ValueError("math reward needs a label (set --label-key)")
    text = str(label)
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    boxed = extract_boxed(text)
    return boxed if boxed is not None else text.strip()


_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_UNIT_WORDS = re.compile(
    r"\s*(?:dollars?|cents?|units?|degrees?|percent|meters?|cm|km|inches|feet|hours?|minutes?|"
    r"seconds?|days?|weeks?|years?|miles?|pounds?|kg|grams?)\s*$"
)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def normalize_answer(answer: str) -> str:
    r"""Canonical string form of a final answer (for string equality, not for semantics).

    Strips `$`, `\$`, `\!`, spaces, `\left`/`\right`, trailing periods, `%`/`\%`, `^\circ`, text
    wrappers and common unit words; removes thousands separators (`1,000` → `1000`); maps
    `\dfrac`/`\tfrac` to `\frac`; drops a leading `x =`.
    """
    s = str(answer).strip()
    s = _TEXT_WRAPPERS.sub(r"\1", s)
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "")
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\%", "").replace("%", "")
    s = _UNIT_WORDS.sub("", s)
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)
    s = s.strip().rstrip(".").strip()
    s = _THOUSANDS.sub("", s)
    s = s.replace(" ", "")
    # `\frac12` → `\frac{1}{2}`
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_LATEX_FRAC = re.compile(r"([-+]?)\\frac\{([-+]?[\d.]+)\}\{([-+]?[\d.]+)\}")


def parse_number(answer: str) -> fractions.Fraction | None:
    r"""Exact rational value of a plain number, `a/b` or `\frac{a}{b}` (after `normalize_answer`).

    Returns:
        The value, or None if the text is not such a number (no eval is involved).
    """
    s = normalize_answer(answer)
    try:
        if _NUMBER.fullmatch(s):
            return fractions.Fraction(s)
        match = _LATEX_FRAC.fullmatch(s)
        if match:
            sign, num, den = match.groups()
            value = fractions.Fraction(num) / fractions.Fraction(den)
            return -value if sign == "-" else value
        if re.fullmatch(r"[-+]?[\d.]+/[\d.]+", s):
            num, den = s.split("/")
            return fractions.Fraction(num) / fractions.Fraction(den)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _timeout_s() -> int | None:
    # math-verify times out with SIGALRM, which only works in the main thread; elsewhere (the
    # rollout's background event loop) run without its timeout. `async_rm` avoids that by grading the
    # symbolic path in worker processes (`symbolic_equal_with_timeout`).
    return 5 if threading.current_thread() is threading.main_thread() else None


def _math_verify_equal(gold: str, pred: str, timeout: int | None) -> bool | None:
    """math-verify's verdict, or None if it could not parse one side."""
    try:
        from math_verify import parse, verify
    except ImportError:  # pragma: no cover - declared dependency
        return None
    try:
        gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
        pred_parsed = parse(f"\\boxed{{{pred}}}", parsing_timeout=timeout)
        if not gold_parsed or not pred_parsed:
            return None
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    except Exception as e:  # math-verify raises a zoo of sympy errors on odd input
        logger.debug("math-verify failed on %r vs %r: %s", gold, pred, e)
        return None


def _sympy_equal(gold: str, pred: str) -> bool:
    """Fallback: LaTeX → sympy with a grammar-based parser (no eval), then `simplify(a - b) == 0`."""
    try:
        import sympy
        from latex2sympy2_extended import latex2sympy

        diff = sympy.simplify(latex2sympy(gold) - latex2sympy(pred))
        return bool(diff == 0)
    except Exception as e:
        logger.debug("sympy fallback failed on %r vs %r: %s", gold, pred, e)
        return False


def prepare_worker() -> None:
    """Imports the symbolic graders of a grading worker process once, at its start-up.

    Also marks math-verify's "timeout is disabled" warning as shown: `symbolic_equal_with_timeout`
    deliberately turns math-verify's timeouts off and bounds the whole check itself.
    """
    import latex2sympy2_extended  # noqa: F401
    import math_verify.grader
    import math_verify.parser
    import sympy  # noqa: F401

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True


class SymbolicTimeout(BaseException):
    """Raised by the SIGALRM handler of `symbolic_equal_with_timeout`.

    A `BaseException`, so the graders' own `except Exception` cannot turn it into a verdict.
    """


def _raise_symbolic_timeout(signum: int, frame: object) -> None:
    # Re-arm first: should some library swallow the exception, the alarm fires again a second later.
    signal.alarm(1)
    raise SymbolicTimeout


def grade_fast(pred: str | None, gold: str | None) -> tuple[bool | None, str, str]:
    """The cheap part of `grade_answer`: missing answers, normalized string equality, exact numbers.

    Args:
        pred: extracted model answer, or None.
        gold: extracted ground-truth answer, or None.

    Returns:
        `(verdict, gold_normalized, pred_normalized)`; `verdict` is None when only the symbolic path
        (`symbolic_equal`) can decide.
    """
    if pred is None or gold is None:
        return False, "", ""
    pred_n, gold_n = normalize_answer(pred), normalize_answer(gold)
    if not pred_n or not gold_n:
        return False, gold_n, pred_n
    if pred_n == gold_n:
        return True, gold_n, pred_n
    pred_v, gold_v = parse_number(pred), parse_number(gold)
    if pred_v is not None and gold_v is not None:
        return pred_v == gold_v, gold_n, pred_n
    return None, gold_n, pred_n


def symbolic_equal(gold_n: str, pred_n: str) -> bool:
    """The expensive part of `grade_answer`: math-verify, then the sympy fallback (inline).

    math-verify's timeouts are on only on the main thread (SIGALRM); the sympy fallback has none.

    Args:
        gold_n: normalized ground truth (from `grade_fast`).
        pred_n: normalized prediction.

    Returns:
        True if equal; False if not, if unparseable, or if math-verify timed out.
    """
    verdict = _math_verify_equal(gold_n, pred_n, _timeout_s())
    return verdict if verdict is not None else _sympy_equal(gold_n, pred_n)


@functools.cache
def _warm_up_symbolic() -> None:
    """Pays math-verify's and sympy's one-time start-up once, outside any answer's budget.

    Their lazy imports and LaTeX grammar load take seconds on a busy machine; inside the first answer's
    alarm they ran it out and graded a correct answer None.
    """
    _math_verify_equal("1", "1", None)
    _sympy_equal("1", "1")


def symbolic_equal_with_timeout(gold_n: str, pred_n: str, timeout_s: int) -> bool | None:
    """`symbolic_equal` under one SIGALRM budget for math-verify and the sympy fallback together.

    Runs in a grading worker process (`slime_rollout.rewards.pool`), on its main thread. math-verify's
    own per-step timeouts are off here: each would cancel this outer alarm when it ends.

    Args:
        gold_n: normalized ground truth.
        pred_n: normalized prediction.
        timeout_s: seconds for the whole check, >= 1.

    Returns:
        The verdict, or None if the budget ran out.

    Raises:
        ValueError: if called off the main thread (SIGALRM cannot be used there).
    """
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("symbolic_equal_with_timeout needs the main thread (it uses SIGALRM)")
    _warm_up_symbolic()
    # Save a timer someone else armed (e.g. pytest-timeout on a main thread) and re-arm it afterwards.
    started = time.monotonic()
    previous_delay, previous_interval = signal.getitimer(signal.ITIMER_REAL)
    previous_handler = signal.signal(signal.SIGALRM, _raise_symbolic_timeout)
    try:
        signal.alarm(max(1, int(timeout_s)))
        try:
            verdict = _math_verify_equal(gold_n, pred_n, None)
            return verdict if verdict is not None else _sympy_equal(gold_n, pred_n)
        finally:
            signal.alarm(0)
    except SymbolicTimeout:  # also when the alarm fires inside the inner `finally`
        return None
    finally:
        signal.alarm(0)  # the handler re-arms; a pending alarm with the default action would kill the worker
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay > 0:
            remaining = previous_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-3), previous_interval)


def grade_answer(pred: str | None, gold: str | None) -> bool:
    """Whether a predicted final answer equals the ground truth mathematically (inline, blocking).

    Args:
        pred: extracted model answer (e.g. the content of the last box), or None.
        gold: extracted ground-truth answer.

    Returns:
        True if equal after normalization, as exact numbers, or symbolically.
    """
    verdict, gold_n, pred_n = grade_fast(pred, gold)
    if verdict is not None:
        return verdict
    return symbolic_equal(gold_n, pred_n)
