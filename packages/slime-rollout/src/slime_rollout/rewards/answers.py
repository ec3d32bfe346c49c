r"""Where a response's final answer is: outside its reasoning, in its `\boxed{}` (`final_boxed_answers`).

What a careful grader reads, and what this module therefore returns:

* only the text after the last `</think>`; a `<think>` that never closes means the response never left its
  reasoning, so it has no final answer (a box inside the reasoning is a draft, not an answer);
* every `\boxed{...}` / `\fbox{...}` / `\boxed 5` of that text, in order, nested braces balanced; a box whose
  brace never closes (a typo, or a response cut off right after it) still shows its answer up to the end of
  its line or formula;
* a box taken back by the text after it ("wait, that's wrong", "I made a mistake") does not count, and when
  that is the last box the response has no final answer;
* only the boxes of the final statement count: the last box and the boxes offered together with it. Two boxes
  are offered together when the text between them is a list ("\boxed{2} and \boxed{3}", "\boxed{3},
  \boxed{5}", "(a) \boxed{1} (b) \boxed{2}", "x = \boxed{1}, y = \boxed{2}", "i.e.") or a hedge ("or",
  "either", "maybe", "might also be"); any other text between them (a derivation, a correction: "but after
  fixing the sign error the result is", a second "Final answer:") makes the later box supersede the earlier
  one, as a reader (and the original's last-box rule) takes it. The grader then decides whether the final
  statement's boxes are one answer, the parts of a multi-part answer, or a hedge (which is wrong).

Everything is linear in the length of the text (braces are matched in one pass), so a 1 MB response is cheap.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = [
    "Box",
    "FinalAnswers",
    "extract_boxed",
    "final_boxed_answers",
    "find_boxes",
    "offered_together",
    "strip_reasoning",
]

_BOX_START = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_BRACES = re.compile(r"[{}]")
# An unclosed box's answer ends at the first of these (the end of its formula or line).
_UNCLOSED_END = re.compile(r"\$|\\\]|\\\)|\n")
# Phrases after the last box that take it back. Only explicit ones: "wait, let me verify ... yes" is not.
_RETRACTION = re.compile(
    r"(?i)\b(?:that(?:'s| is| was) (?:wrong|incorrect|not (?:right|correct))|this is (?:wrong|incorrect)"
    r"|(?:is|was) (?:wrong|incorrect)\b|i made (?:a|an) (?:mistake|error)|my mistake|oops|scratch that"
    r"|(?:that|this) can(?:'t|not) be right|the correct answer (?:is|should be)|should actually be)"
)
_RETRACTION_WINDOW = 600  # characters after the last box that are searched
# Words that offer two boxes as alternatives (a hedge): they keep the boxes together whatever else is said.
_HEDGE_WORDS = re.compile(
    r"(?i)\b(?:or|either|maybe|perhaps|possibly|alternatively|unsure|not sure|(?:could|might|may)(?: also)? be)\b"
)
# Words that only join the items of one list of answers ("x = 2 and y = 3", "(a) ... (b) ...", "i.e.").
_LIST_WORDS = frozenset(
    "and both respectively also as well ie eg namely that is equivalently part parts ii iii iv vi vii viii".split()
)
# What is dropped before reading the words between two boxes: math delimiters, spacing and text commands.
_BETWEEN_MARKUP = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{|\\(?:q?quad|[ ,;:!])|\\[\[\]()]|\$")
_WORD = re.compile(r"[A-Za-z]{2,}")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")


def strip_reasoning(text: str) -> str | None:
    """The part of a response after its reasoning.

    Returns:
        The text after the last `</think>`; the whole text without think tags; None when a `<think>` is
        never closed (everything is reasoning).
    """
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        return None
    return text


@dataclasses.dataclass(frozen=True, slots=True)
class Box:
    """One box of a text.

    Attributes:
        content: the text inside the outer braces.
        start: index of the box command in the text.
        end: index just past the box in the text.
        closed: False for a box whose brace never closes.
    """

    content: str
    start: int
    end: int
    closed: bool = True


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each `{` → index of its matching `}` (unmatched ones are absent), in one pass."""
    matches, stack = {}, []
    for m in _BRACES.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            matches[stack.pop()] = m.start()
    return matches


def find_boxes(text: str) -> list[Box]:
    r"""All boxes of `text` in order (a box inside another box's content is part of it, not a new one).

    Args:
        text: any text.

    Returns:
        The boxes; `\boxed 5` (space form) takes the next whitespace-delimited token.
    """
    boxes: list[Box] = []
    closing = None
    position = 0
    for m in _BOX_START.finditer(text):
        if m.start() < position:
            continue  # nested in the previous box
        start = m.end()
        if text.startswith("{", start):
            if closing is None:
                closing = _closing_braces(text)
            end = closing.get(start)
            if end is not None:
                boxes.append(Box(content=text[start + 1 : end], start=m.start(), end=end + 1))
                position = end + 1
                continue
            stop = _UNCLOSED_END.search(text, start + 1)
            stop_at = stop.start() if stop else len(text)
            content = text[start + 1 : stop_at].strip()
            if content:
                boxes.append(Box(content=content, start=m.start(), end=stop_at, closed=False))
            position = stop_at
            continue
        token = re.match(r"[ \t]+([^\s$]+)", text[start : start + 200])
        if token:
            boxes.append(Box(content=token.group(1), start=m.start(), end=start + token.end()))
            position = start + token.end()
    return boxes


def extract_boxed(text: str | None) -> str | None:
    r"""Content of the last box of `text` (closed or not), or None (the original `last_boxed_only_string`)."""
    if not text:
        return None
    boxes = find_boxes(text)
    return boxes[-1].content if boxes else None


@dataclasses.dataclass(frozen=True, slots=True)
class FinalAnswers:
    """The boxed answers of a response's final part.

    Attributes:
        answers: box contents of the final statement in order (empty when there is no valid final answer).
        reason: why `answers` is empty ("no box", "reasoning never closed", "retracted"), else "".
        num_superseded: earlier boxes that a later statement replaced (a corrected or restated answer).
    """

    answers: list[str]
    reason: str = ""
    num_superseded: int = 0


def final_boxed_answers(response: str) -> FinalAnswers:
    """The boxed answers a careful grader would read in `response` (see the module docstring).

    Args:
        response: the model output.

    Returns:
        The final part's box contents, or none with the reason.
    """
    region = strip_reasoning(response or "")
    if region is None:
        return FinalAnswers(answers=[], reason="reasoning never closed")
    boxes = find_boxes(region)
    if not boxes:
        return FinalAnswers(answers=[], reason="no box")
    last = boxes[-1]
    # The last box is taken back by what follows it ("\boxed{12}. Wait, that's wrong ...").
    if _RETRACTION.search(region[last.end : last.end + _RETRACTION_WINDOW]):
        return FinalAnswers(answers=[], reason="retracted")  # no final answer
    first = len(boxes) - 1
    while first > 0 and offered_together(region[boxes[first - 1].end : boxes[first].start]):
        first -= 1
    return FinalAnswers(answers=[b.content for b in boxes[first:]], num_superseded=first)


def offered_together(between: str) -> bool:
    r"""Whether two boxes with `between` between them are given as one statement (a list or a hedge).

    Args:
        between: the text from the end of one box to the start of the next.

    Returns:
        False when the text takes the earlier box back ("that's wrong"). Else True for a hedge ("or",
        "either", "maybe", "could also be", ... in the sentence right after the earlier box or right before the
        later one) or a list (only punctuation, math, one-letter names and joining words: "and", "(b)", "x =",
        "i.e.", "part"); False for anything else (a derivation or a correction), after which the later box
        supersedes the earlier one.
    """
    text = _BETWEEN_MARKUP.sub(" ", between)
    if _RETRACTION.search(text):
        return False  # the earlier box was taken back ("\boxed{3}. Oops, it could be \boxed{5}")
    sentences = _SENTENCE_BREAK.split(text.strip())
    # A hedge sits right after the earlier box or right before the later one; an "or" deep inside a derivation
    # between them ("for 2 or more terms") is not one.
    if _HEDGE_WORDS.search(sentences[0]) or _HEDGE_WORDS.search(sentences[-1]):
        return True
    return all(word.lower() in _LIST_WORDS for word in _WORD.findall(text))
