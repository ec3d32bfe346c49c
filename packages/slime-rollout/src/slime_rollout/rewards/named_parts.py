r"""Boxes that name different parts of one answer in words: `The minimum is \boxed{2} and the maximum is \boxed{3}`.

`answers.offered_together` reads two boxes as one statement only when nothing but joining words stands between them
(`\boxed{2} and \boxed{3}`, `x = \boxed{2}, y = \boxed{3}`); anything else is a derivation, after which the later
box supersedes the earlier one. A multi-part answer written in sentences was therefore read as its last part and
scored 0 against the label's parts. `names_next_part` tells such a list from a derivation:

* a part label between the boxes (`(b)`, `(ii)`, `Part b`, `part (b)`): `(a) The area is \boxed{2}. (b) The
  perimeter is \boxed{3}.`, `\boxed{2} for part (a) and \boxed{3} for part (b)`;
* or the later box introduced by a name of its own, in the clause right before it: `the maximum is`, `and for $y$
  is`, `the largest is`, `the value of y is`; a name that is no part's (`the answer is`, `we get`, `so it is`,
  `the correct value is`) or the same name as the earlier box's (`The area is \boxed{2}. ... The area is
  \boxed{3}.`: a recomputation) is a derivation.

Text that mentions a mistake is always a derivation (`retraction.mentions_mistake`). The reading is offered to
`math_utils.final_pairs` as an alternative (`FinalAnswers.parts`), taken only when it gives the label's number of
parts: an intermediate result boxed in a sentence of its own (`The discriminant is \boxed{9}. ... The root is
\boxed{3}.`) stays superseded against a one-part label. Linear-time patterns on short texts.
"""

from __future__ import annotations

import re

from slime_rollout.rewards.retraction import expand_contractions, mentions_mistake

__all__ = ["names_next_part"]

_MARKUP = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{|\\(?:q?quad|[ ,;:!])|\\[\[\]()]|[$*{}]")
_PART_LABEL = re.compile(
    r"(?i)(?:^|(?<=[\s.;,:]))\(\s*(?:[a-h]|i{1,3}|iv|vi{0,3})\s*\)|\bpart\s*\(?\s*(?:[a-h]|[1-9]|i{1,3}|iv|vi{0,3})\b"
)
_CLAUSE_BREAK = re.compile(r"[.;,!?\n]")
_LEAD = re.compile(r"(?i)^(?:\s|and\b|also\b|while\b|whereas\b|but\b)+")
# A name and a copula: "the maximum is", "for y is", "the value of y is", "the largest root:".
_NAMING = re.compile(
    r"(?i)^(?:(?:for|the|its|their|our)\s+)*"
    r"(?P<name>[a-z]+(?:\s+[a-z]+){0,2}?(?:\s+(?:of|for|at)\s+[^\s,;:.]{1,20})?)\s*(?:is|are|was|were|equals|=|:)$"
)
# Words of a name that make it a restatement or a derivation, not a part: "the answer is", "we get", "so it is".
_NOT_PART_NAMES = frozenset(
    "answer answers result results solution solutions final it this that which what there here we i you get gets "
    "got obtain obtained so thus hence therefore then correct corrected actual actually true right new revised "
    "updated instead now again indeed simplified simplifies checking check verify verified wait hmm".split()
)
_MAX_CHARS = 200  # a longer text between two boxes is a derivation


def _name_before(text: str) -> str | None:
    """The name the last clause of `text` gives the box after it ("the maximum is" → "maximum"), or None."""
    clause = _LEAD.sub("", _CLAUSE_BREAK.split(text)[-1]).strip()
    match = _NAMING.match(" ".join(clause.split()))
    if match is None:
        return None
    name = match["name"].lower()
    return None if _NOT_PART_NAMES.intersection(name.split()) else name


def _plain(text: str) -> str:
    return expand_contractions(_MARKUP.sub(" ", text))


def names_next_part(before: str, between: str) -> bool:
    r"""Whether the box after `between` is another named part of the box before it (module docstring).

    Args:
        before: the text before the earlier box (its last clause names that box, if any).
        between: the text from the end of the earlier box to the start of the later one.
    """
    if len(between) > _MAX_CHARS:
        return False
    text = _plain(between)
    if mentions_mistake(text):
        return False
    if _PART_LABEL.search(text):
        return True
    name = _name_before(text)
    return name is not None and name != _name_before(_plain(before[-_MAX_CHARS:]))
