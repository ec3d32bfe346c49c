r"""Answers that name roman-numeral statements ("I only", "II and III", "I, III"): compared as sets.

Multiple-choice questions of the "which of the statements I, II, III hold?" kind (AMC, MATH's counting and
logic items) are labelled `\text{I only}`, `\text{II and III}`, `I, III`; models answer `\boxed{\text{I and III}}`,
`\boxed{I, III}`, `\boxed{\text{Both I and III}}`. Written differently, they were strings that did not match (`I,
III` scored 0 against `\text{I and III}`, `\text{I only}` against `I`). `roman_options` reads such an answer as
the set of numerals it names; words that only join or qualify them ("and", "only", "both", "statements", "are
true", commas) are dropped. An answer that offers numerals as alternatives ("I or II", "either II or III", "maybe
I") is a hedge, wrong against any label. Anything else in the answer (a number, another word such as "not", a
variable) makes it no such answer, and it is graded as before.

Numerals are upper case (`I` to `X`); lower-case ones only in brackets (`(i) and (iii)`), since a bare `i` is the
imaginary unit.
"""

from __future__ import annotations

import dataclasses
import functools
import re

__all__ = ["HEDGES", "MARKUP", "STATEMENTS_IN_TEXT", "WRAPPER_COMMANDS", "RomanOptions", "roman_options"]

_NUMERALS = frozenset(["I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X"])
_NUMERAL = "|".join(sorted(_NUMERALS, key=lambda n: (-len(n), n)))  # longest first: "III" is not "I" + "II"
_NUMERAL_BUT_I = "|".join(sorted(_NUMERALS - {"I"}, key=lambda n: (-len(n), n)))
#: Regex text of roman-numeral statements inside prose ("Maybe II.", "or I and III"), for `rewards.alternatives`;
#: case-sensitive wherever it is embedded. A bare "I" starts one only before "only": it is also the pronoun.
STATEMENTS_IN_TEXT = rf"(?-i:(?:{_NUMERAL_BUT_I}|I(?=\s+only))(?:\s+(?:and|only)(?:\s+(?:{_NUMERAL}))?)*)(?![A-Za-z])"
_JOINERS = frozenset(["and", "only", "both", "all", "statement", "statements", "option", "options", "&", "+",
                      "is", "are", "true", "correct", "hold", "holds"])  # fmt: skip
HEDGES = frozenset(["or", "either", "maybe", "perhaps", "possibly"])  # words that offer options as alternatives
# LaTeX commands whose braced text is read as plain text (`\text{I and II}`); `letter_sets` reads these too.
WRAPPER_COMMANDS = "text|textbf|textit|textrm|textnormal|mathrm|mbox"
_WRAPPER = re.compile(rf"\\(?:{WRAPPER_COMMANDS})\s*\{{([^{{}}]*)\}}")
# Markup dropped before reading (math delimiters, spacing commands); `letter_sets` drops these and a few more.
MARKUP = r"\$|\\[()\[\] ,;:!]|\\q?quad\b|~"
_MARKUP = re.compile(MARKUP)
_TOKEN = re.compile(r"\([A-Za-z]+\)|[A-Za-z]+|\\&|[^\sA-Za-z,;]")
_MAX_CHARS = 200  # a longer answer is no list of statements


@dataclasses.dataclass(frozen=True, slots=True)
class RomanOptions:
    """The statements an answer names.

    Attributes:
        numerals: the numerals named, upper case (`{"I", "III"}`).
        hedged: True when they are offered as alternatives ("I or II").
    """

    numerals: frozenset[str]
    hedged: bool


# Pure, and asked about the same strings several times per grade (`final_pairs`, then `grade_fast` on each side)
# and about one label for every sample of its group: cached, bounded.
@functools.lru_cache(maxsize=4096)
def roman_options(answer: str) -> RomanOptions | None:
    r"""The roman-numeral statements `answer` names (module docstring), or None if it is not such an answer.

    Args:
        answer: a final answer (box content or label), e.g. `\text{II and III}`.

    Returns:
        `RomanOptions(frozenset({"II", "III"}), hedged=False)` for that example; None when the answer has anything
        besides numerals and joining words, or no numeral.
    """
    if len(answer) > _MAX_CHARS:
        return None
    text = _MARKUP.sub(" ", _WRAPPER.sub(r" \1 ", answer)).replace("\\&", " and ")
    numerals: set[str] = set()
    hedged = False
    for token in _TOKEN.findall(text):
        bracketed = token.startswith("(")
        word = token.strip("()")
        numeral = word.upper() if bracketed else word
        if numeral in _NUMERALS and (bracketed or word.isupper()):
            numerals.add(numeral)
        elif word.lower() in HEDGES:
            hedged = True
        elif word.lower() not in _JOINERS:
            return None
    return RomanOptions(frozenset(numerals), hedged) if numerals else None
