r"""Whether a response takes its answer back or negates it: one rule for the math, dapo and gpqa graders.

Contractions are expanded first (`isn't` → `is not`, `can't` → `cannot`, `that's` → `that is`, `I'm` → `I am`), so
every phrase below is matched in one spelling. Negation is a class of words, not a list of phrases: not, never,
cannot, false, wrong, incorrect, invalid, mistaken.

* **Negated** answers are not offered: one right after a negation (`not \boxed{3}`, `never \boxed{5}`, `It cannot
  be \boxed{5}`, `rather than`, `instead of`: `negated_before`) or judged right after it (`\boxed{5} is false`,
  `\boxed{5} isn't correct`, `is wrong`: `judged_wrong`), or whose own words negate it (`\boxed{\text{5 is
  wrong}}`: `negates_itself`).
* A **retraction** (`retracts`) is text after the final answer about that answer: a judgement of "that"/"this"/"this
  answer"/"my answer" (`that isn't right`, `this answer is wrong`, `that's not it`), "I was wrong", an interjection
  (`oops`, `scratch that`, `no wait`, `actually, no,`, `my mistake.`, `I made a mistake` unless placed "earlier"),
  giving up (`I give up`, `I cannot determine it`), a correction to a different value (`the correct answer is 6`),
  or the answer stated again at the start of a sentence as plainly another value (`Wait, the answer is 7.`, `Final
  answer: 7` after `\boxed{5}`: `restated_values`, read by the graders where the values are plainly different).
  Other mentions of wrongness (`Option B is wrong, so ...`, `the other root -3 is wrong`) and asides in parentheses
  are not about the answer. The original graders read no retraction at all (the last box or `Answer:` line counts).
* `mentions_mistake` is the weaker test for text between two answers: any correction there makes the later answer
  supersede the earlier one.

All patterns are linear-time; `retracts` reads at most `WINDOW` characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "WINDOW",
    "expand_contractions",
    "judged_wrong",
    "mentions_mistake",
    "negated_before",
    "negates_itself",
    "restated_values",
    "retraction",
    "retracts",
]

WINDOW = 600  # characters after an answer that are searched for a retraction
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
_CONTRACTIONS = [
    (re.compile(r"(?i)\bcan't\b"), "cannot"),
    (re.compile(r"(?i)\bwon't\b"), "will not"),
    (re.compile(r"(?i)\bain't\b"), "is not"),
    (re.compile(r"(?i)n't\b"), " not"),
    (re.compile(r"(?i)\b(that|this|it|what|there|here|he|she|answer)'s\b"), r"\1 is"),
    (re.compile(r"(?i)\bI'm\b"), "I am"),
    (re.compile(r"(?i)'re\b"), " are"),
    (re.compile(r"(?i)'ve\b"), " have"),
    (re.compile(r"(?i)'d\b"), " would"),
    (re.compile(r"(?i)'ll\b"), " will"),
]
_NEGATION = r"(?:not|never|cannot|false|wrong|incorrect|invalid|mistaken)"
_WRONG = (
    r"(?:(?:definitely|clearly|certainly|actually|also|obviously)\s+)?"
    r"(?:not\s+(?:right|correct|it|true|valid|the\s+(?:correct\s+|right\s+)?answer)|wrong|incorrect|false|invalid|mistaken)\b"
)
_NEGATED_BEFORE = re.compile(
    r"(?i)\b(?:not|never|rather\s+than|instead\s+of|other\s+than|cannot(?:\s+possibly)?\s+be|not\s+be|not\s+equal)"
    r"\s*(?:\$\s*)?$"
)
_JUDGED_WRONG = re.compile(
    rf"(?i)^\s*\$?\s*\)?\s*(?:is|was|would\s+be|must\s+be|seems|looks)\s+{_WRONG}|^\s*\$?\s*cannot\s+be\s+(?:right|correct)\b"
)
_LATER = r"(?!\s+(?:earlier|before|previously|at\s+first|initially|above))"
_RETRACTION = re.compile(
    rf"(?i)\b(?:(?:that|this)(?:\s+(?:answer|result|value|solution))?|(?:my|the)\s+(?:final\s+)?(?:answer|result)"
    rf"(?:\s+above)?)\s+(?:is|was|seems|looks)\s+{_WRONG}"
    r"|\b(?:that|this)\s+cannot\s+be\s+(?:right|correct)\b"
    rf"|\bI\s+(?:was|am)\s+wrong\b{_LATER}"
    r"|\boops\b|\bscratch\s+that\b|\bmy\s+mistake(?=\s*(?:[.!,;:]|$))"
    rf"|\bI\s+made\s+(?:a|an)\s+(?:mistake|error)\b{_LATER}"
    r"|\bno,?\s+wait\b|\bwait,?\s+no\s*[,.!:;]|\bactually,?\s+no\s*[,.!:;]"
    r"|\bI\s+give\s+up\b|\bI\s+(?:cannot|am\s+(?:not\s+able|unable)\s+to)\s+(?:determine|finish|solve)\b"
)
# Any mention of a mistake or of wrongness between two answers: the later one corrects the earlier one.
_MISTAKE = re.compile(
    rf"(?i)\b(?:(?:that|this)\s+(?:is|was)\s+{_WRONG}|(?:is|was)\s+(?:wrong|incorrect)\b|I\s+made\s+(?:a|an)\s+"
    r"(?:mistake|error)|my\s+mistake|oops|scratch\s+that|(?:that|this)\s+cannot\s+be\s+right"
    r"|the\s+correct\s+answer\s+(?:is|should\s+be)|should\s+actually\s+be)"
)
# A correction that names its value: a retraction only when the value differs from the answer.
_CORRECTED_VALUE = re.compile(
    r"(?i)\b(?:the )?(?:correct|right|actual) answer (?:is|should be|would be)\s*:?\s*(?P<value>.*?)"
    r"(?=\.(?:\s|$)|[;\n]|$)|\bshould actually be\s*:?\s*(?P<value2>.*?)(?=\.(?:\s|$)|[;\n]|$)"
)
# The answer stated again in so many words at the start of a sentence ("Wait, the answer is 7.", "Final answer: 7",
# "So my answer is 7"): not inside one ("For n = 4, the answer is 7" names a case). Its value ends its clause.
_RESTATED_VALUE = re.compile(
    r"(?i)(?:^|(?<=[.!?;\n]))[\s*]*(?:(?:so|thus|therefore|hence|wait|actually|hmm+|no|oh|sorry|correction|instead"
    r"|then|ok(?:ay)?|well|again)\b[\s,:!-]*)*(?:(?:the|my)\s+)?(?:final\s+)?answer\s*(?:\*\*)?\s*"
    r"(?:is|should\s+be|would\s+be|must\s+be|:)\s*(?:\*\*)?\s*:?\s*(?P<value>[^\n;]*?)"
    r"(?=\.(?:\s|$)|,\s*(?:not|rather than|instead of)\b|[;\n]|$)"
)
_ANSWER_WORD = re.compile(r"(?i)answer")
# Words before a corrected value that are not part of it ("the correct answer is indeed 5").
_FILLER = re.compile(r"(?i)^(?:(?:indeed|actually|really|still|just|exactly|clearly|definitely|in fact|thus)\b[\s,]*)+")
_PARENTHESES = re.compile(r"\([^()]*\)")
_TEXT_WORDS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{([^{}]*)\}")


def expand_contractions(text: str) -> str:
    """`text` with English contractions written out (`isn't` → `is not`, `can't` → `cannot`, `I'd` → `I would`)."""
    if not text.isascii():  # the curly apostrophes are not ASCII (`isascii` is O(1), a translate is a copy)
        text = text.translate(_APOSTROPHES)
    if "'" not in text:  # every contraction has one; most text has none, and 10 scans cost ~10 µs per 600 chars
        return text
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    return text


def negated_before(text: str) -> int:
    """Characters at the end of `text` (the text right before an answer) that negate it, 0 if none.

    `"It cannot be "` → 13, `"definitely not $"` → 5 (the length is of `text` as written, contractions included).
    """
    tail = text[-60:]
    m = _NEGATED_BEFORE.search(expand_contractions(tail))
    if not m:
        return 0
    # The match is on the expanded text: find how much of the written tail expands to it.
    for size in range(1, len(tail) + 1):
        if len(expand_contractions(tail[-size:])) >= len(m.group()):
            return size
    return len(tail)


def judged_wrong(text: str) -> int:
    """Characters at the start of `text` (the text right after an answer) that judge it wrong, 0 if none.

    `" is false."` → 9, `" isn't correct"` → 14.
    """
    head = text[:80]
    m = _JUDGED_WRONG.match(expand_contractions(head))
    if not m:
        return 0
    for size in range(1, len(head) + 1):
        if len(expand_contractions(head[:size])) >= m.end():
            return size
    return len(head)


def negates_itself(answer: str) -> bool:
    r"""Whether an answer's own words negate its value (`\text{5 is wrong}`, `\text{not } 5`).

    A word alone is an answer, not a negation (`\text{False}` to a true/false question), so a digit must be there.
    """
    words = " ".join(_TEXT_WORDS.findall(answer)) or answer
    return bool(re.search(r"\d", answer) and re.search(rf"(?i)\b{_NEGATION}\b", expand_contractions(words)))


def mentions_mistake(text: str) -> bool:
    """Whether text between two answers corrects the earlier one ("that's wrong", "I made a mistake", "oops")."""
    return bool(_MISTAKE.search(expand_contractions(text)))


def retracts(after: str, differs: Callable[[str], bool], restated: Callable[[list[str]], bool] | None = None) -> bool:
    """Whether the text after a final answer takes that answer back (module docstring).

    Args:
        after: the text that follows the answer.
        differs: whether a value named by a correction ("the correct answer is 6") differs from the answer; the
            same value affirms it.
        restated: whether the values the text states as the answer again (`restated_values`) take the answer
            back; None reads no restatement.
    """
    return retraction(after, differs, restated) is not None


def retraction(
    after: str, differs: Callable[[str], bool], restated: Callable[[list[str]], bool] | None = None
) -> str | None:
    """What takes the answer back, as `retracts` reads it: `"retracted"`, `"restated"` (by `restated`) or None.

    One pass over the window: a restatement is read only where nothing else took the answer back.
    """
    if judged_wrong(after):
        return "retracted"
    window = _window(after)
    if _RETRACTION.search(window):
        return "retracted"
    for m in _CORRECTED_VALUE.finditer(window):
        value = _FILLER.sub("", (m.group("value") or m.group("value2") or "").strip()).rstrip(".").strip()
        if value and differs(value):
            return "retracted"
    # Most text after a box states no answer: skip the restatement pattern (the grader's hot path).
    if restated is not None and _ANSWER_WORD.search(after, 0, WINDOW) and restated(_restated_in(window)):
        return "restated"
    return None


def restated_values(after: str) -> list[str]:
    r"""The values the text after a final answer states as the answer again, at the start of a sentence.

    `". Wait, the answer is 7."` gives `["7"]`, `"Final answer: $7$"` gives `["$7$"]`; `"For n = 4, the answer is 7"`
    (a case inside a sentence) and an aside in parentheses give none. Callers take the answer back only when a value
    is plainly another one (`answers.contradicts`), so a restatement in another form keeps it.

    Args:
        after: the text that follows the answer (its first `WINDOW` characters are read).
    """
    if not _ANSWER_WORD.search(after, 0, WINDOW):
        return []  # most text after a box states no answer: skip the window's rewrites (the grader's hot path)
    return _restated_in(_window(after))


def _restated_in(window: str) -> list[str]:
    """`restated_values` of a window `_window` built."""
    values = []
    for m in _RESTATED_VALUE.finditer(window):
        value = _FILLER.sub("", m.group("value").strip()).strip(" .*")
        if value:
            values.append(value)
    return values


def _window(after: str) -> str:
    """The text read after an answer: `WINDOW` characters, asides in parentheses dropped, contractions expanded."""
    # `\(7\)` is math, not an aside in parentheses: read it as `$7$`.
    window = after[:WINDOW].replace("\\(", "$").replace("\\)", "$")
    return expand_contractions(_PARENTHESES.sub(" ", window))
