r"""What symbolic grading must not evaluate: answers whose evaluation would take unbounded time or memory.

Such work happens inside single C calls (big-integer powers, factorials) that no timeout interrupts, or in sympy's
recursions (`factorial(10**100)`), which `rewards.deadline` stops only late. `costly_reason` screens the text before
parsing (length, literal factorials, big literals, power towers, huge exponents, `1E999999999`); `tree_too_big`
screens the parsed, unevaluated expression (integer powers and growing functions whose arguments are estimated, so
`(10^{100})!` counts by its value). `math_utils.symbolic_equal_with_timeout` skips both as "undecided".
"""

from __future__ import annotations

import functools
import re

__all__ = ["GRADE_MAX_CHARS", "SYMBOLIC_MAX_CHARS", "costly_reason", "tree_too_big"]

SYMBOLIC_MAX_CHARS = 1000  # longer answers are compared as strings and numbers only
# Longer answers are not compared at all (counted as undecided): cleaning and splitting a 1 MB box held the event
# loop for 1-5 s. Ten times the longest answer a label may have (`slime_rollout.preflight` refuses longer ones).
GRADE_MAX_CHARS = 10 * SYMBOLIC_MAX_CHARS

_FACTORIAL = re.compile(r"\d{4,}\s*!")
_BIG_LITERAL = re.compile(r"\d{301,}")
_EXPONENT = re.compile(r"\^\s*(\{|\d+|\\?[a-zA-Z]+)")
# Scientific notation (`1E999999999`): sympy turns the decimal into an exact rational, 10^999999999, in one C call
# that no deadline stops (the inline grader hung past 300 s). `e` too: `1.0e999999999` reads as the same number.
_SCI_EXPONENT = re.compile(r"\d\.?[eE]\s*[+-]?\s*\d{5,}")


def costly_reason(text: str) -> str | None:
    """Why evaluating `text` symbolically could take unbounded time or memory, or None if it cannot.

    Such work happens inside single C calls (big-integer powers, factorials) that no timeout interrupts.
    """
    if len(text) > SYMBOLIC_MAX_CHARS:
        return f"longer than {SYMBOLIC_MAX_CHARS} characters"
    if _FACTORIAL.search(text):
        return "factorial of a 4+ digit number"
    if _BIG_LITERAL.search(text):
        return "integer of 300+ digits"
    if _SCI_EXPONENT.search(text):
        return "scientific notation with an exponent of 5+ digits"
    for m in _EXPONENT.finditer(text):
        token = m.group(1)
        if token == "{":
            group = _brace_group(text, m.end(1) - 1)
            if group is None or "^" in group or "!" in group or re.search(r"\d{5,}", group):
                return "nested or huge exponent"
        elif token.isdigit() and len(token) >= 5:
            return "exponent of 5+ digits"
        rest = text[m.end() :].lstrip()
        if rest.startswith("^"):
            return "power tower"
    return None


def _brace_group(text: str, start: int) -> str | None:
    depth = 0
    for i in range(start, min(len(text), start + SYMBOLIC_MAX_CHARS)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


# Integer functions whose evaluation grows with their argument's value (sympy computes `factorial(10**100)` by
# recursion, for ever); their argument is estimated, not only read as a literal (`(10^{100})!` parses unevaluated).
_GROWING_FUNCTIONS = (
    "factorial", "factorial2", "subfactorial", "binomial", "gamma", "RisingFactorial", "FallingFactorial",
    "fibonacci", "lucas", "bell", "catalan", "harmonic", "primepi", "partition",
)  # fmt: skip
_MAX_FUNCTION_ARGUMENT = 5000
_MAX_EXPONENT = 10**5


def _exceeds(value, limit: int) -> bool:
    """Whether a sympy number's absolute value is over `limit`, estimated to a few digits (a symbol is not)."""
    if value.is_Integer:
        return abs(int(value)) > limit
    if not value.is_number:
        return False
    try:
        return bool(abs(value.evalf(5)) > limit)
    except (TypeError, ValueError, ArithmeticError):
        return True  # not even an estimate: not evaluated either


@functools.cache
def _growing_classes() -> tuple[type, ...]:
    """The sympy classes of `_GROWING_FUNCTIONS` (a name that is not a class in this sympy has no node to find)."""
    import sympy

    return tuple(obj for obj in (getattr(sympy, name) for name in _GROWING_FUNCTIONS) if isinstance(obj, type))


def tree_too_big(expr) -> bool:
    r"""Backstop on the parsed (unevaluated) expression: integer powers and growing functions too big to evaluate.

    Arguments are estimated, so unevaluated arithmetic counts by its value: `(10^{100})!` (the factorial of
    `Pow(10, 100)`) ran 7 s past its 10 s budget inside sympy's recursion, `\binom{10^6}{5 \cdot 10^5}` took the whole
    budget.
    """
    import sympy

    growing = _growing_classes()
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow):
            base, exp = node.args
            if base.is_number and base not in (0, 1, -1) and _exceeds(exp, _MAX_EXPONENT):
                return True
        elif isinstance(node, growing):
            if any(_exceeds(a, _MAX_FUNCTION_ARGUMENT) for a in node.args):
                return True
    return False
