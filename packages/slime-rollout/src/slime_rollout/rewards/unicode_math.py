r"""Unicode math in an answer written as the LaTeX the graders read: `√2`, `x²`, `½`, `3·4`, `≤`.

Chat models often answer in Unicode rather than LaTeX; math-verify reads none of these, so `\boxed{√2}` scored 0
against `\sqrt{2}`, `x²` against `x^2`, `½` against `\frac12`. `latex_from_unicode` rewrites them:

* vulgar fractions: `½` → `\frac{1}{2}` (after a digit, a mixed number: `1½` → `1\frac{1}{2}` = 3/2);
* superscripts: a run of them is one exponent (`x²` → `x^{2}`, `10⁻³` → `10^{-3}`);
* `√` before a number, a letter, a `(...)` group or a `{...}` group: `\sqrt{...}` (`√3/2` → `\sqrt{3}/2`,
  `√(x+1)` → `\sqrt{x+1}`); `∛` likewise as `\sqrt[3]{...}`;
* `·` `⋅` `∙` (products) → `\cdot`, `÷` → `\div`, `≤` `≥` `≠` → `\le` `\ge` `\ne`.
"""

from __future__ import annotations

import fractions
import re
import unicodedata

__all__ = ["latex_from_unicode"]

_SUPERSCRIPTS = {"⁰": "0", "¹": "1", "²": "2", "³": "3", "⁴": "4", "⁵": "5", "⁶": "6", "⁷": "7", "⁸": "8", "⁹": "9",
                 "⁺": "+", "⁻": "-", "ⁿ": "n"}  # fmt: skip
_SUPERSCRIPT_RUN = re.compile(f"[{''.join(_SUPERSCRIPTS)}]+")
_VULGAR = re.compile("[\u00bc-\u00be\u2150-\u215e]")
_ROOT = re.compile(
    r"([√∛])\s*(\((?P<paren>[^()]*)\)|\{(?P<brace>[^{}]*)\}|(?P<atom>\d+(?:\.\d+)?|[A-Za-z]|\\[A-Za-z]+))"
)
_SYMBOLS = str.maketrans({"·": r" \cdot ", "⋅": r" \cdot ", "∙": r" \cdot ", "÷": r" \div ", "≤": r" \le ",
                          "≥": r" \ge ", "≠": r" \ne "})  # fmt: skip
_ANY = re.compile(f"[√∛{''.join(_SUPERSCRIPTS)}·⋅∙÷≤≥≠\u00bc-\u00be\u2150-\u215e]")


def latex_from_unicode(text: str) -> str:
    r"""`text` with its Unicode math written in LaTeX (module docstring); unchanged when it has none.

    Args:
        text: an answer (a box's content or a label's answer).

    Returns:
        The rewritten text, e.g. `"2√2 + x²"` → `"2\sqrt{2} + x^{2}"`.
    """
    if not _ANY.search(text):
        return text
    text = _VULGAR.sub(_fraction, text)
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^{" + "".join(_SUPERSCRIPTS[c] for c in m.group()) + "}", text)
    text = _ROOT.sub(_root, text)
    return text.translate(_SYMBOLS)


def _fraction(match: re.Match[str]) -> str:
    value = fractions.Fraction(unicodedata.numeric(match.group())).limit_denominator(10)
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _root(match: re.Match[str]) -> str:
    inner = next(g for g in (match.group("paren"), match.group("brace"), match.group("atom")) if g is not None)
    return f"\\sqrt{{{inner}}}" if match.group(1) == "√" else f"\\sqrt[3]{{{inner}}}"
