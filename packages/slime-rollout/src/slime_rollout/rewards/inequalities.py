r"""A solution set written as inequalities joined by "or", read as the union of intervals it names.

`x<1 \text{ or } x>2` and `(-\infty,1)\cup(2,\infty)` are one answer, the set of reals below 1 or above 2. The
part splitter (`parts.answer_parts`) takes "or" as a list of answers, so the first counted as two parts
against the label's one and scored 0 whichever side was the label; math-verify, given it whole, reads a set of
two relations, not their union. `as_interval_union` rewrites it in interval notation, which math-verify compares
as sets (endpoints and open/closed ends included: `x \le 1 \text{ or } x > 2` is `(-\infty,1]\cup(2,\infty)`).

Read: two or more pieces joined by `or` (plain, in `\text{}`/`\mathrm{}`), `\lor`, `\vee`, optionally in
set-builder notation (`\{x \mid ...\}`); each piece is `x < a`, `a < x` or a chain `a < x \le b` (relations `<`,
`>`, `\le`, `\leq`, `\leqslant`, `≤` and their `>` forms), one variable letter in all pieces, endpoints without
variable letters (numbers, `\frac{1}{2}`, `\sqrt{2}`, `\pi`). Anything else (different variables, an equation, a
letter endpoint such as `x < a`) is left as written.
"""

from __future__ import annotations

import re

__all__ = ["as_interval_union", "union_pair"]

_OR = re.compile(r"\\(?:text|mathrm|textrm)\s*\{\s*or\s*\}|\\(?:lor|vee)(?![a-zA-Z])|\bor\b")
_RELATIONS = (
    (re.compile(r"\\(?:leqslant|leq|le)(?![a-zA-Z])|≤|<="), "<="),
    (re.compile(r"\\(?:geqslant|geq|ge)(?![a-zA-Z])|≥|>="), ">="),
    (re.compile(r"\\lt(?![a-zA-Z])"), "<"),
    (re.compile(r"\\gt(?![a-zA-Z])"), ">"),
)
_SPLIT_RELATION = re.compile(r"(<=|>=|<|>)")
_VARIABLE = re.compile(r"[a-zA-Z]")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_LATEX_SPACE = re.compile(r"\\[,;:! ]|~")
# Set-builder notation around the pieces: `\{x \mid x<1 \text{ or } x>2\}` (also `|` or `:` for "such that").
_SET_BUILDER = re.compile(r"^\\\{\s*([a-zA-Z])\s*(?:\\mid|\||:)(.*)\\\}$", re.DOTALL)
_MAX_CHARS = 500  # an answer longer than this is not a short solution set: left to the other checks


def as_interval_union(text: str, *, min_pieces: int = 2) -> tuple[str, str] | None:
    r"""`(variable, union)` for inequalities joined by "or" (module docstring), else None.

    Args:
        text: one answer (a box's content or a label's answer).
        min_pieces: the fewest pieces read (1 reads a single inequality too: `x > 2` → `(2,\infty)`).

    Returns:
        The variable letter and the set in interval notation, pieces in the order written
        (`x<1 \text{ or } x>2` → `("x", r"(-\infty,1)\cup(2,\infty)")`); None when `text` is not `min_pieces` or
        more such pieces of one variable.
    """
    if len(text) > _MAX_CHARS:
        return None
    s = _LATEX_SPACE.sub(" ", text).replace("\\left", "").replace("\\right", "").strip().strip("$").strip()
    for pattern, relation in _RELATIONS:
        s = pattern.sub(relation, s)
    builder = _SET_BUILDER.match(s)
    if builder:
        s = builder.group(2)
    pieces = _OR.split(s)
    if len(pieces) < min_pieces:
        return None
    variables, intervals = set(), []
    for piece in pieces:
        read = _interval(piece)
        if read is None:
            return None
        variables.add(read[0])
        intervals.append(read[1])
    if len(variables) != 1 or (builder and builder.group(1) not in variables):
        return None
    return variables.pop(), "\\cup".join(intervals)


def _interval(piece: str) -> tuple[str, str] | None:
    """`(variable, interval)` of one piece: `x < a`, `a < x` or `a < x < b` (either direction), else None."""
    # A thousands separator is not the interval's comma: `x < 1,000` ends at 1000.
    tokens = [_THOUSANDS.sub("", t.replace("{,}", ",")).strip() for t in _SPLIT_RELATION.split(piece)]
    if len(tokens) not in (3, 5) or any(not t for t in tokens):
        return None
    terms, relations = tokens[0::2], tokens[1::2]
    names = [i for i, term in enumerate(terms) if _is_variable(term)]
    if len(names) != 1 or any(_VARIABLE.search(_without_commands(t)) for i, t in enumerate(terms) if i != names[0]):
        return None
    if {r[0] for r in relations} == {"<", ">"}:
        return None  # `1 < x > 2` is no interval
    if relations[0][0] == ">":  # written downwards: read it upwards
        terms, relations = terms[::-1], [r.replace(">", "<") for r in relations[::-1]]
        names = [len(terms) - 1 - names[0]]
    variable, at = terms[names[0]], names[0]
    if len(terms) == 2 and at == 0:  # x < b
        return variable, f"(-\\infty,{terms[1]}{']' if relations[0] == '<=' else ')'}"
    if len(terms) == 2:  # a < x
        return variable, f"{'[' if relations[0] == '<=' else '('}{terms[0]},\\infty)"
    if at != 1:
        return None  # `x < a < b`: the variable must be in the middle of a chain
    left = "[" if relations[0] == "<=" else "("
    right = "]" if relations[1] == "<=" else ")"
    return variable, f"{left}{terms[0]},{terms[2]}{right}"


def _is_variable(term: str) -> bool:
    return len(term) == 1 and term.isalpha()


def _without_commands(term: str) -> str:
    r"""`term` without LaTeX commands (`\frac`, `\sqrt`, `\pi`, `\infty`), so only variable letters remain."""
    return re.sub(r"\\[a-zA-Z]+", "", term)


def union_pair(pred: str, gold: str) -> tuple[bool, tuple[str, str] | None]:
    r"""`(applies, pair)` for a solution set given as inequalities joined by "or" on either side.

    `x<1 \text{ or } x>2` is one answer, the union `(-\infty,1)\cup(2,\infty)` (module docstring), not the two
    parts "or" lists elsewhere (`math_utils.final_pairs` asks this first).

    Args:
        pred: the response's one final answer.
        gold: the label's answer.

    Returns:
        `applies`: whether either side is a union of inequalities (False: grade as usual). `pair`: both sides in
        interval notation (the other side read as one inequality if it is one, else as written), or None when
        they name different variables (wrong).
    """
    pred_set, gold_set = as_interval_union(pred), as_interval_union(gold)
    if pred_set is None and gold_set is None:
        return False, None
    pred_set = pred_set or as_interval_union(pred, min_pieces=1)
    gold_set = gold_set or as_interval_union(gold, min_pieces=1)
    if pred_set and gold_set and pred_set[0].lower() != gold_set[0].lower():
        return True, None  # `y<1 or y>2` for `x<1 or x>2`
    return True, (pred_set[1] if pred_set else pred, gold_set[1] if gold_set else gold)
