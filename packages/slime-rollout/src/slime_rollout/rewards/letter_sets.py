r"""Multiple-select answers ("A, C", "AC", "\text{A and C}", "(A), (C)"): compared as unordered sets of options.

Multiple-select questions are labelled `A, C` or `AC`; models answer `\boxed{AC}`, `\boxed{\text{A and C}}`,
`\boxed{(A), (C)}`, `\boxed{C, A}`. Read as text or as a list of parts these scored 0 whenever the spelling or the
number of parts differed from the label's (`AC` is one part, `A, C` two). `letter_set` reads an answer as the set
of option letters it names; words that only join or qualify them ("and", "both", "options", "are correct", commas,
`&`, `+`) are dropped. An answer that offers letters as alternatives ("A or C", "either A or C", "maybe A") is a
hedge, wrong against any label. Anything else in it (a digit, another word, a relation) makes it no such answer.

Letters are the options A to J, upper case, each named once: alone (`A`), run together (`AC`, `CA`), or in brackets
(`(A)`; lower case only there, `(a)`, since a bare `a` is a variable). The graders read an answer this way only
where the label is a set of two or more letters (`math_utils.grade_fast`, `final_pairs`), so a single letter in
prose or a one-letter label is graded as before.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from slime_rollout.rewards.roman_options import HEDGES, MARKUP, WRAPPER_COMMANDS

__all__ = ["LetterSet", "letter_set", "multi_select_label"]

_OPTIONS = frozenset("ABCDEFGHIJ")
_JOINERS = frozenset(
    "and both all only option options choice choices answer answers is are correct true the".split()
    + list("&+/,;.()[]{}")
)
# The roman-numeral options' hedges, wrappers and markup, plus `\mathbf{AC}`, `\{A, C\}` and `\left(A\right)`.
_WRAPPER = re.compile(rf"\\(?:{WRAPPER_COMMANDS}|mathbf)\s*\{{([^{{}}]*)\}}")
_MARKUP = re.compile(rf"{MARKUP}|\\[{{}}]|\\left|\\right")
_TOKEN = re.compile(r"\(\s*[A-Za-z]\s*\)|[A-Za-z]+|\\&|[^\sA-Za-z]")
_MAX_CHARS = 200  # a longer answer is no list of options
_CAPITAL_OPTION = re.compile(r"[A-J]")


@dataclasses.dataclass(frozen=True, slots=True)
class LetterSet:
    """The options an answer picks.

    Attributes:
        letters: the option letters named, upper case (`{"A", "C"}`).
        hedged: True when they are offered as alternatives ("A or C").
    """

    letters: frozenset[str]
    hedged: bool


# Pure, and asked about one label for every sample of its group and about each side several times per grade.
@functools.lru_cache(maxsize=4096)
def letter_set(answer: str) -> LetterSet | None:
    r"""The option letters `answer` names (module docstring), or None if it is not a set of option letters.

    Args:
        answer: a final answer (box content or label), e.g. `\text{A and C}`.

    Returns:
        `LetterSet(frozenset({"A", "C"}), hedged=False)` for that example; None when the answer has anything
        besides option letters and joining words, names a letter twice (`AA`), or names none.
    """
    if len(answer) > _MAX_CHARS or not _CAPITAL_OPTION.search(answer.upper()):
        return None  # most answers are numbers: one scan decides
    text = _MARKUP.sub(" ", _WRAPPER.sub(r" \1 ", answer)).replace("\\&", " & ")
    letters: list[str] = []
    hedged = False
    for token in _TOKEN.findall(text):
        if token.startswith("(") and len(token) > 1:
            letters.append(token.strip("() ").upper())
        elif token.lower() in _JOINERS:
            continue
        elif token.lower() in HEDGES:
            hedged = True
        elif token.isupper() and token.isalpha():
            letters.extend(token)  # `A`, or options run together: `AC`
        else:
            return None
    if not letters or len(set(letters)) != len(letters) or not _OPTIONS.issuperset(letters):
        return None
    return LetterSet(frozenset(letters), hedged)


@functools.lru_cache(maxsize=4096)
def multi_select_label(gold: str) -> LetterSet | None:
    """The options of a multiple-select label (two or more letters, not a hedge), else None.

    A label run together must name its options in alphabetical order (`AC`, not `CA`, which is more likely a
    segment or a name than a set of options); a listed one may take any order (`C, A`).
    """
    options = letter_set(gold)
    if options is None or options.hedged or len(options.letters) < 2:
        return None
    bare = _MARKUP.sub("", _WRAPPER.sub(r"\1", gold)).strip()
    if bare.isalpha() and bare != "".join(sorted(bare)):
        return None
    return options
