r"""Unicode math in an answer written as the LaTeX the graders read: `√2`, `x²`, `½`, `3·4`, `≤`.

Chat models often answer in Unicode rather than LaTeX; math-verify reads none of these, so `\boxed{√2}` scored 0
against `\sqrt{2}`, `x²` against `x^2`, `½` against `\frac12`. `latex_from_unicode` rewrites them:

* vulgar fractions: `½` → `\frac{1}{2}` (after a digit, a mixed number: `1½` → `1\frac{1}{2}` = 3/2);
* superscripts: a run of them is one exponent (`x²` → `x^{2}`, `10⁻³` → `10^{-3}`);
* `√` before a number, a letter, a `(...)` group or a `{...}` group: `\sqrt{...}` (`√3/2` → `\sqrt{3}/2`,
  `√(x+1)` → `\sqrt{x+1}`); `∛` likewise as `\sqrt[3]{...}`;
* `·` `⋅` `∙` (products) → `\cdot`, `÷` → `\div`, `≤` `≥` `≠` → `\le` `\ge` `\ne`.

`ascii_forms` comes first and rewrites typographic forms of ASCII characters:

* invisible characters go: format characters (soft hyphen, zero-width space and joiners, direction marks, word
  joiner, byte-order mark) and variation selectors; mathematical alphanumerics (`𝑥`, `𝟓`, `𝜋`, U+1D400-1D7FF) are
  their NFKC forms, the letters, digits and Greek letters they style;
* full-width forms (`１２`, `＋12`, `－３`, `Ｂ`, `（１，２）`, U+FF01-FF5E and the ideographic space) as their
  NFKC forms, which are exactly ASCII; NFKC is not applied to the whole text, since it also turns `x²` into `x2`
  and `½` into `1⁄2`;
* a dash (`–` en, `—` em, `‒` figure, `―` bar, the small `﹣`) is a minus where a minus can stand: at the start of
  the answer, or after an operator, a relation, an opening bracket, a comma or a LaTeX command (`–12`, `(–1, 2)`,
  `x = –3`, `2 \times –3`). Anywhere else it joins two things, a range (`3–5`, pages, years) or a compound, and
  stays as written: `3–5` is not `3-5` = -2.
"""

from __future__ import annotations

import fractions
import re
import unicodedata

__all__ = ["ascii_forms", "latex_from_unicode"]

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


_FULL_WIDTH = re.compile("[\uff01-\uff5e\u3000]")
# Mathematical alphanumerics (`𝑥`, `𝟓`, `𝜋`): NFKC gives exactly the letter, digit or Greek letter they style.
_MATH_ALPHANUMERIC = re.compile("[\U0001d400-\U0001d7ff]")
# Invisible characters: format characters (soft hyphen, zero-width space and joiners, direction marks, word joiner,
# byte-order mark) and variation selectors (`5️`). They change nothing a reader sees; labels copied from web pages
# carry them, and `5\u200b` scored 0 against 5.
_INVISIBLE = re.compile("[\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff\ufe00-\ufe0f]")
_DASH = re.compile("[\u2012-\u2015\ufe58\ufe63]")
# After one of these (spaces skipped) a dash is a minus sign; `&` and `\\` start a matrix cell; the Unicode
# operators and relations too, since this runs before they are written as LaTeX (`x ≤ –2`).
_BEFORE_MINUS = frozenset("([{,;:=+-*/^<>|&\\≤≥≠≈×·⋅∙÷±∓∈→\u2212")
_BEGIN = re.compile(r"\\begin\{[A-Za-z*]+\}$")


def ascii_forms(text: str) -> str:
    r"""`text` in plain forms: no invisible characters, full-width and math-styled characters, minus dashes as `-`.

    The module docstring says which characters go and which stay.

    Args:
        text: an answer (a box's content, a label's answer or a multiple-choice response).

    Returns:
        The rewritten text: `"－１２"` → `"-12"`, `"(–1, 2)"` → `"(-1, 2)"`; `"3–5"` is unchanged (a range).
    """
    if _INVISIBLE.search(text):
        text = _INVISIBLE.sub("", text)
    if _FULL_WIDTH.search(text):
        text = _FULL_WIDTH.sub(lambda m: unicodedata.normalize("NFKC", m.group()), text)
    if _MATH_ALPHANUMERIC.search(text):
        text = _MATH_ALPHANUMERIC.sub(lambda m: unicodedata.normalize("NFKC", m.group()), text)
    if not _DASH.search(text):
        return text
    return _DASH.sub(lambda m: "-" if _minus_at(text, m.start()) else m.group(), text)


def _minus_at(text: str, i: int) -> bool:
    """Whether a dash at `text[i]` stands where a minus can: see `ascii_forms`."""
    j = i - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    if j < 0 or text[j] in _BEFORE_MINUS or _DASH.match(text[j]):
        return True
    if text[j] == "}" and _BEGIN.search(text, max(0, j - 40), j + 1):  # `\begin{pmatrix} –1`: the first cell
        return True
    k = j  # `\times –3`: a command's name before the dash
    while k >= 0 and text[k].isascii() and text[k].isalpha():
        k -= 1
    return k < j and k >= 0 and text[k] == "\\"


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
