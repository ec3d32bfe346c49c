r"""Presentational LaTeX in a final answer: markup that changes how an answer looks, never what it is.

Models dress their final answer up, and label sets carry typesetting: `\boxed{\textcolor{red}{5}}`,
`\boxed{\underline{5}}`, `\boxed{{\bf 5}}`, `\boxed{\large 5}`, `\boxed{\hspace{1cm}5}`, MATH's `10,\!000` (a
negative thin space that closes up a thousands separator; the original's normalizer removes `\!` and `,\!` too).
math-verify reads none of these as the value inside, so a right answer scored 0. `strip_markup` removes them
before an answer is cleaned (`normalize.clean_answer`) or split into parts (`parts.answer_parts`):

* wrappers keep their content: `\underline{x}`, `\boldsymbol{x}`, `\bm{x}`, `\pmb{x}`, `\mathsf{x}`, `\mathtt{x}`,
  `\mathnormal{x}`, `\texttt{x}`, `\textsf{x}`, `\textsl{x}`, `\textup{x}`, `\textsc{x}`, `\textmd{x}`, `\emph{x}`,
  `\textcolor{c}{x}`, `\colorbox{c}{x}`, `\fcolorbox{c}{c}{x}`;
* switches go: `\bf`, `\it`, `\sf`, `\tt`, `\sl`, `\sc`, `\rm` (not `\rm{lcm}(`, a function name that
  `normalize` reads), the `\...series` / `\...shape` / `\...family` forms, sizes (`\tiny` ... `\Huge`), math styles
  (`\textstyle`, `\scriptstyle`), `\color{c}`;
* spacing goes with its argument: `\hspace{1cm}`, `\vspace*{2pt}`, `\phantom{0}`, `\hphantom{x}`, `\vphantom{x}`,
  `\kern2pt`, `\mkern-3mu`, and `\!`; so do layout and marks (`\hfill`, `\newline`, `\tag{1}`, `\label{eq}`,
  `\checkmark`, `\qed`, `\blacksquare`), an arrow or "therefore" that opens the answer (`\implies 5`,
  `\therefore 5`) and row breaks `\\` that end it;
* braces that then wrap the whole answer go (`{\bf 5}` is `{ 5}`, then `5`).

Meaningful commands stay: `\overline{3}` (a repeating decimal), `\text{}` and `\mathbf{}` (read by `normalize` and
`units`), `\cancel{}`. Linear in the text: one scan for the markup, one for the braces.
"""

from __future__ import annotations

import re

__all__ = ["closing_braces", "strip_markup"]

_COLOR = r"(?:\[[^\]{}]{0,20}\])?\s*\{[^{}]{0,40}\}"  # `[rgb]{1,0,0}` or `{red}`
# A command whose last braced argument is kept (the `{` that opens it ends the match).
_WRAPPER = (
    r"\\(?:underline|boldsymbol|bm|pmb|mathsf|mathtt|mathnormal|texttt|textsf|textsl|textup|textsc|textmd|emph"
    rf"|textcolor{_COLOR}|colorbox{_COLOR}|fcolorbox{_COLOR}\s*\{{[^{{}}]{{0,40}}\}})\s*(?=\{{)"
)
_SWITCH = (
    r"\\(?:(?:bf|it|sf|tt|sl|sc|rm(?!\s*\{)|normalfont|(?:bf|md)series|(?:it|sl|sc|up)shape|(?:rm|sf|tt)family"
    r"|tiny|scriptsize|footnotesize|small|normalsize|large|Large|LARGE|huge|Huge"
    rf"|textstyle|scriptstyle|scriptscriptstyle)(?![A-Za-z])|color{_COLOR})"
)
# Spacing whose argument goes too (a phantom's content is invisible: `\phantom{0}5` is 5).
# Layout and marks that go (`\tag{1}` and `\label{eq}` with their argument): `5 \checkmark`, `5 \qed`, `5 \hfill`.
_SPACING = (
    r"\\(?:[hv]space\*?|[hv]?phantom|tag\*?|label)\s*(?=\{)|\\m?kern\s*-?\d*\.?\d+\s*[a-z]{2}|\\!"
    r"|\\(?:checkmark|blacksquare|qed|qedsymbol|hfill|newline|nonumber|notag)(?![A-Za-z])"
)
# An arrow or "therefore" that opens the answer (`\implies 5`, `\therefore x = 5`) and a row break that ends it.
_OPENING = re.compile(r"^\s*\\(?:implies|therefore|Rightarrow|Longrightarrow)(?![A-Za-z])")
_MARKUP = re.compile(rf"(?P<wrapper>{_WRAPPER})|(?P<spacing>{_SPACING})|{_SWITCH}")
_BRACES = re.compile(r"(?<!\\)[{}]")  # `\{` and `\}` are set braces, not groups


def closing_braces(text: str, braces: re.Pattern[str] = _BRACES) -> dict[int, int]:
    r"""Index of each opening `{` → index of its matching `}` (unmatched ones are absent), in one pass.

    Args:
        text: LaTeX.
        braces: what counts as a brace; by default group braces only (`\{`, `\}` are set braces).
    """
    matches, stack = {}, []
    for m in braces.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            matches[stack.pop()] = m.start()
    return matches


def strip_markup(text: str) -> str:
    r"""`text` without presentational LaTeX (the module docstring lists what goes and what stays).

    Args:
        text: an answer (a box's content or a label's answer).

    Returns:
        The answer as written, less its markup: `\textcolor{red}{\frac{1}{2}}` → `\frac{1}{2}`, `10,\!000` →
        `10,000`, `{\bf 5}` → `5`. Text without a backslash is returned as is.
    """
    if "\\" not in text:
        return text
    text = _without_closing_breaks(_OPENING.sub("", text))
    closing: dict[int, int] | None = None
    cut: list[tuple[int, int]] = []  # spans to delete, in order, not overlapping
    position = 0
    for m in _MARKUP.finditer(text):
        if m.start() < position:
            continue
        if m.group("wrapper") or (m.group("spacing") and text.startswith("{", m.end())):
            closing = closing_braces(text) if closing is None else closing
            end = closing.get(m.end())
            if end is None:
                continue  # an unclosed argument: left as written
            if m.group("wrapper"):  # the command and its braces go, the content stays
                cut += [(m.start(), m.end() + 1), (end, end + 1)]
                position = m.end() + 1
            else:  # `\hspace{1cm}`: the whole command goes
                cut.append((m.start(), end + 1))
                position = end + 1
            continue
        cut.append((m.start(), m.end()))
        position = m.end()
    if not cut:
        return text.strip()
    cut.sort()
    pieces, start = [], 0
    for cut_start, cut_end in cut:
        pieces.append(text[start:cut_start])
        start = max(start, cut_end)
    pieces.append(text[start:])
    return _unwrap_group("".join(pieces))


def _without_closing_breaks(text: str) -> str:
    r"""`text` without the row breaks `\\` (and spaces) that end it; one backward scan, no copies on the way."""
    end = len(text)
    while True:
        while end and text[end - 1].isspace():
            end -= 1
        if not text.endswith("\\\\", 0, end):
            return text[:end]
        end -= 2


_MAX_UNWRAP = 4  # brace pairs around a whole answer taken off (each costs a scan of the text)


def _unwrap_group(text: str) -> str:
    """`text` without braces around the whole of it (`{ 5}` → `5`), up to `_MAX_UNWRAP` pairs."""
    text = text.strip()
    for _ in range(_MAX_UNWRAP):
        if not (text.startswith("{") and closing_braces(text).get(0) == len(text) - 1):
            break
        text = text[1:-1].strip()
    return text
