r"""Where a response's final answer is: outside its reasoning, in its `\boxed{}` (`final_boxed_answers`).

What a careful grader reads, and what this module therefore returns:

* only the text after the last `</think>`; a `<think>` that never closes means the response never left its
  reasoning, so it has no final answer (a box inside the reasoning is a draft, not an answer);
* every `\boxed{...}` / `\fbox{...}` / `\boxed 5` of that text, in order, nested braces balanced. A box whose
  brace never closes is no answer, as in the original (`last_boxed_only_string` returns None): when it is the last
  box (a response cut at `--rollout-max-response-len` inside `\boxed{18`) the response has no final answer, and an
  earlier one is skipped (it never hides the boxes after it);
* a box taken back by the text after it does not count, and when that is the last box the response has no final
  answer; a negated box (`not \boxed{3}`, `It cannot be \boxed{5}`, `\boxed{5} isn't correct`,
  `\boxed{\text{5 is wrong}}`) is not an offered answer, and its phrase is dropped. Both are read by
  `slime_rollout.rewards.retraction`, the rule dapo and gpqa share (contractions expanded, negation as a word class);
* only the boxes of the final statement count: the last box and the boxes offered together with it. Two boxes are
  offered together when the text between them is a list ("\boxed{2} and \boxed{3}", "\boxed{3}, \boxed{5}", "(a)
  \boxed{1} (b) \boxed{2}", "x = \boxed{1}, y = \boxed{2}", "i.e.") or a hedge. A hedge is an expression of doubt or
  of an alternative anywhere between them ("not sure", "not certain", "maybe", "perhaps", "alternatively",
  "otherwise", "vs", "another possibility", "another answer", "possible too", "I'd also accept", "some might argue",
  "torn", "unless", "depending", "not confident", "also plausible", "a second guess"), or a weak one ("or",
  "either", "could be", "might be", "candidate", "guess", "is another") in the sentence right after the earlier box
  or right before the later one (an "or" deep inside a derivation, "for 2 or more terms", is not one), or a
  condition ("if", "when") in the earlier box's own sentence; doubt or a condition in the sentence right after the
  last box (`\boxed{3} if n is even and \boxed{5} otherwise`, `\boxed{5} is also plausible`, `\boxed{5} is
  another`) makes it a hedge with the box before it; boxes of different cases ("Case 1: \boxed{3} Case 2:
  \boxed{5}", "Answer 2:") are offered together (as labelled parts) unless the case is given up between them;
  confidence words alone ("likely", "probably") do not. An unboxed alternative of another value in the two
  sentences after the last box is a hedge too (`\boxed{5} or 3`, `\boxed{5}. I'm not sure, it might be 3`, unless
  rejected right after; not `\boxed{5}, attained when n = 2 or 3`: `rewards.alternatives`).
  Any other text between
  them (a derivation, a correction: "but after fixing the sign error the result is", a second "Final answer:"), and
  any text that corrects ("that's wrong", "I made a mistake", "is incorrect"), makes the later box supersede the
  earlier one, as a reader (and the original's last-box rule) takes it. The grader then decides whether the final
  statement's boxes are one answer, the parts of a multi-part answer (`FinalAnswers.labelled`: "(a)", "part", "x ="
  between them: the order counts), or a hedge (which is wrong).

Everything is linear in the length of the text (braces are matched in one pass), so a 1 MB response is cheap.
"""

from __future__ import annotations

import dataclasses
import re

from slime_rollout.rewards.alternatives import unboxed_alternative
from slime_rollout.rewards.markup import closing_braces
from slime_rollout.rewards.named_parts import names_next_part
from slime_rollout.rewards.normalize import clean_answer, normalize_answer, parse_number
from slime_rollout.rewards.retraction import (
    expand_contractions,
    judged_wrong,
    mentions_mistake,
    negated_before,
    negates_itself,
    retraction,
)

__all__ = [
    "Box",
    "FinalAnswers",
    "contradicted",
    "contradicts",
    "doubted_after",
    "extract_boxed",
    "final_boxed_answers",
    "find_boxes",
    "offered_together",
    "strip_reasoning",
]

# Boxes read for the final statement, the last ones of the response: negation and statement checks cost ~75 µs a
# box, so a 1 MB response of 100,000 boxes held the event loop (grading runs there) for 4.5 s. Earlier boxes are
# superseded; a final statement of more boxes is no answer a label has.
_MAX_BOXES = 256
_BOX_START = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_BRACES = re.compile(r"[{}]")
# An unclosed box's answer ends at the first of these (the end of its formula or line).
_UNCLOSED_END = re.compile(r"\$|\\\]|\\\)|\n")
# Doubt or an alternative, anywhere between two boxes: a hedge.
_HEDGE_PHRASES = re.compile(
    r"(?i)\b(?:not (?:\d+ ?%\s*|entirely |completely |totally |fully |quite |very |too )?(?:sure|certain)"
    r"|unsure|uncertain|maybe|perhaps|possibly|alternatively|otherwise|vs|versus"
    r"|(?:an)?other (?:possibility|possible (?:answer|value|solution)|candidate|answer|solution)"
    r"|(?:second|alternative) (?:answer|solution)|possible (?:too|as well)"
    r"|also possible|or else|also accept|(?:might|may|could|would) argue|torn|cannot decide|undecided|hard to say"
    r"|arguably|depending|unless|or possibly|not confident|less (?:sure|certain|confident)"
    r"|on the other hand|equally (?:likely|plausible|valid|possible)|(?:second|alternative|other) guess"
    r"|also (?:(?:seems|looks|is|be) )?(?:plausible|possible|valid|likely|acceptable)"
    r"|also (?:seems|looks) (?:right|correct)|(?:could|can|might) also see|lean(?:ing)? (?:towards?|to))\b"
)
# Doubt about the box it follows: a hedge with the box before when it is in the sentence right after the last box
# ("\boxed{5} is also plausible", "\boxed{5} is another") or right after the earlier one ("\boxed{3} is one
# candidate"); deep inside a derivation between the boxes it is not one.
_DOUBT = r"\b(?:guess(?:ing)?|candidate|(?:is|as|be) another|one option|an option)\b"
_DOUBT_WORDS = re.compile(_DOUBT, re.IGNORECASE)
# Weak hedge words: a hedge only in the sentence right after the earlier box or right before the later one. A
# conditional there ("\boxed{3} (if we count the empty set) and \boxed{5}") offers both answers, each in its case.
_HEDGE_WORDS = re.compile(r"(?i)\b(?:or|either|(?:could|might|may)(?: also)? be)\b")
# A condition in the earlier box's own sentence; one in a later sentence is usually a derivation ("If we recheck").
_CONDITION = re.compile(r"(?i)\b(?:if|when|in case|provided)\b")
# Doubt or a condition in the sentence right after the last box: with an earlier box, a hedge ("\boxed{5} otherwise").
_HEDGE_AFTER = re.compile(rf"{_HEDGE_PHRASES.pattern}|{_DOUBT}|\b(?:if|unless|otherwise|when)\b", re.IGNORECASE)
# A case label ("Case 1:", "in case (b)", "Answer 2:"): boxes of different cases are offered together.
_CASE = re.compile(
    r"(?i)\bcase\s*(?:\d+|\(?[a-h]\)?(?![A-Za-z])|\(?[ivx]+\)?(?![A-Za-z]))|\b(?:answer|solution)\s*#?\d+\s*:"
)
# A case given up between its box and the next case ("Case 1: \boxed{3}, which contradicts x > 4. Case 2: ..."):
# its box is superseded, not offered.
_CASE_REJECTED = re.compile(
    r"(?i)\b(?:contradicts?|contradiction|reject(?:ed)?|discard(?:ed)?|invalid|not valid|extraneous|impossible"
    r"|fails|does not (?:work|satisfy|hold)|ruled out|not allowed)\b"
)
# Part labels between boxes: the parts of a labelled answer, whose order counts.
_PART_LABEL = re.compile(r"(?i)\(\s*(?:[a-h]|i{1,3}|iv|vi{0,3})\s*\)|\bpart\b|(?<![A-Za-z\\])[A-Za-z]\s*=")
# Words that only join the items of one list of answers ("x = 2 and y = 3", "(a) ... (b) ...", "i.e.").
_LIST_WORDS = frozenset(
    "and both respectively also as well ie eg namely that is equivalently part parts ii iii iv vi vii viii".split()
)
# What is dropped before reading the words between two boxes: math delimiters, spacing and text commands.
_BETWEEN_MARKUP = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{|\\(?:q?quad|[ ,;:!])|\\[\[\]()]|\$")
_WORD = re.compile(r"[A-Za-z]{2,}")
_AFTER_CHARS = 300  # text after the last box read for a hedge in its sentence
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
    starts = list(_BOX_START.finditer(text))
    for i, m in enumerate(starts):
        if m.start() < position:
            continue  # nested in the previous box
        start = m.end()
        if text.startswith("{", start):
            if closing is None:
                closing = closing_braces(text, _BRACES)
            end = closing.get(start)
            if end is not None:
                boxes.append(Box(content=text[start + 1 : end], start=m.start(), end=end + 1))
                position = end + 1
                continue
            # Up to the end of its formula or line, or the next box (an unclosed box never hides a later one);
            # searched only up to that next box, so 100,000 unclosed boxes stay linear.
            limit = starts[i + 1].start() if i + 1 < len(starts) else len(text)
            stop = _UNCLOSED_END.search(text, start + 1, limit)
            stop_at = stop.start() if stop else limit
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


def extract_boxed(text: str | None, *, unclosed: bool = False) -> str | None:
    r"""Content of the last box of `text`, or None (the original `last_boxed_only_string` + `remove_boxed`).

    Args:
        text: any text.
        unclosed: also read a last box whose brace never closes (up to the end of its line or formula). Off, such
            a box is None, as in the original: a response cut inside `\boxed{18` has given no answer. Labels are
            read with it on (a label's missing brace is a typo, not a cut-off answer).
    """
    if not text:
        return None
    boxes = find_boxes(text)
    if not boxes or not (boxes[-1].closed or unclosed):
        return None
    return boxes[-1].content


@dataclasses.dataclass(frozen=True, slots=True)
class FinalAnswers:
    r"""The boxed answers of a response's final part.

    Attributes:
        answers: box contents of the final statement in order (empty when there is no valid final answer).
        reason: why `answers` is empty ("no box", "unclosed box", "reasoning never closed", "retracted", "hedge"),
            else "".
        num_superseded: earlier boxes that a later statement replaced (a corrected or restated answer); every box
            before the last `_MAX_BOXES` counts as one.
        labelled: the final statement's boxes are labelled parts ("(a) ... (b) ...", "x = ..., y = ..."), so
            their order counts.
        parts: the box contents when earlier boxes that name other parts in words (`The minimum is \boxed{2} and
            the maximum is \boxed{3}`: `named_parts.names_next_part`) belong to the final statement too, in order;
            empty when there are none. `math_utils.final_pairs` reads them as labelled parts when they are the
            label's number of parts.
    """

    answers: list[str]
    reason: str = ""
    num_superseded: int = 0
    labelled: bool = False
    parts: tuple[str, ...] = ()


def _readings(text: str) -> set[str]:
    r"""What an answer may mean here: its exact value, else its cleaned text (no symbolic check).

    A percent has two readings, its number and its value (`50%` is `50` and `0.5`, as `math_utils.grade_fast`
    takes it), so "\boxed{\frac12}, or 50%" restates the box instead of offering another answer.
    """
    value = parse_number(text)
    if value is None:
        return {normalize_answer(text).lower()}
    return {str(value), str(value / 100)} if clean_answer(text).percent else {str(value)}


def _differ(a: str, b: str) -> bool:
    """Whether two answers share no reading (`_readings`)."""
    return not _readings(a) & _readings(b)


def _retraction(after: str, box: Box, answers: list[str]) -> str | None:
    """What takes the last box back in the text after it (`retraction.retraction`), or None.

    `"restated"`: the answer stated again as plainly another value than all `answers` (`contradicted`).
    """

    def differs(value: str) -> bool:
        inner = extract_boxed(value)
        value = inner if inner is not None else value.strip("$ ")
        return bool(value) and _differ(value, box.content)

    return retraction(after, differs, lambda values: contradicted(values, answers))


def contradicted(values: list[str], answers: list[str]) -> bool:
    r"""Whether a value restated as the answer after a final statement is plainly another value than all its answers.

    "\boxed{5}. Wait, the answer is 7." (`values` from `retraction.restated_values`, compared by `contradicts`).
    Compared with every answer of the statement, so "x = \boxed{2}, y = \boxed{3}. So the answer is 2" keeps it.
    """
    return any(all(contradicts(value, answer) for answer in answers) for value in values)


def contradicts(value: str, answer: str) -> bool:
    r"""Whether a value stated as the answer after `answer` ("Wait, the answer is 7.") is plainly another answer.

    Only where nothing is left to judge: both are exact numbers (`parse_number`: `7`, `-7`, `rac{14}{2}`, `7
    apples`, `3 million`) of no common reading (`50%` is `50` and `0.5`), or both a lone option letter and
    different. Anything else (`\sqrt{8}` after `2\sqrt2`, `7 since 3 + 4 = 7`) is not read as a contradiction.
    """
    value = value.strip("$ ")
    if parse_number(value) is not None and parse_number(answer) is not None:
        return _differ(value, answer)
    mine, theirs = clean_answer(value), clean_answer(answer)
    if mine.letter and theirs.letter and not mine.text and not theirs.text and value.strip("() ").isupper():
        return mine.letter != theirs.letter
    return False


def _negated_spans(region: str, boxes: list[Box]) -> dict[int, tuple[int, int]]:
    """Index of each negated box → the span of the box with its negation phrase (module docstring)."""
    spans = {}
    for i, box in enumerate(boxes):
        before = negated_before(region[max(0, box.start - 60) : box.start])
        after = judged_wrong(region[box.end : box.end + 80])
        if before or after or negates_itself(box.content):
            spans[i] = (box.start - before, box.end + after)
    return spans


def _between(region: str, start: int, end: int, cut: list[tuple[int, int]]) -> str:
    """`region[start:end]` without the cut spans (negated boxes)."""
    pieces, position = [], start
    for cut_start, cut_end in cut:
        if cut_end <= position or cut_start >= end:
            continue
        pieces.append(region[position : max(position, cut_start)])
        position = max(position, cut_end)
    pieces.append(region[position:end])
    return " ".join(pieces)


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
    found = find_boxes(region)
    if not found:
        return FinalAnswers(answers=[], reason="no box")
    if not found[-1].closed:  # cut off inside its last box (or a typo): no final answer, as in the original
        return FinalAnswers(answers=[], reason="unclosed box")
    found = [box for box in found if box.closed]  # an earlier unclosed box offers nothing
    num_unread = max(0, len(found) - _MAX_BOXES)
    found = found[num_unread:]
    negated = _negated_spans(region, found)
    boxes = [b for i, b in enumerate(found) if i not in negated]
    if not boxes:
        return FinalAnswers(answers=[], reason="retracted")  # every box was negated
    last = boxes[-1]
    cut = sorted(negated.values())
    first, labelled = len(boxes) - 1, False
    hedged_after = doubted_after(region[last.end :])
    while first > 0:
        between = _between(region, boxes[first - 1].end, boxes[first].start, cut)
        last_pair = first == len(boxes) - 1
        cased = _in_other_cases(region, boxes[first - 1], between)
        if (
            not offered_together(between)
            and not cased
            and not (last_pair and hedged_after and not mentions_mistake(between))
        ):
            break
        labelled = labelled or cased or bool(_PART_LABEL.search(between))
        first -= 1
    num_superseded = num_unread + len(found) - len(negated) - (len(boxes) - first)
    answers = [b.content for b in boxes[first:]]
    # The last box is taken back by what follows it ("\boxed{12}. Wait, that's wrong ..."). The same pass reads the
    # answer restated as another value ("\boxed{5}. Wait, the answer is 7."), which a hedge outranks.
    taken_back = _retraction(region[last.end :], last, answers)
    if taken_back == "retracted":
        return FinalAnswers(answers=[], reason="retracted")  # no final answer
    if _unboxed_alternative(region[last.end : last.end + _AFTER_CHARS], last):
        return FinalAnswers(answers=[], reason="hedge")  # "\boxed{5} or 3"
    if taken_back == "restated":
        return FinalAnswers(answers=[], reason="retracted", num_superseded=num_superseded + len(answers))
    first_part = _first_named_part(region, boxes, first, cut)
    parts = tuple(b.content for b in boxes[first_part:]) if first_part < first else ()
    return FinalAnswers(answers=answers, num_superseded=num_superseded, labelled=labelled, parts=parts)


def _in_other_cases(region: str, earlier: Box, between: str) -> bool:
    r"""Whether two boxes answer different cases ("Case 1: \boxed{3}. Case 2: \boxed{5}"): offered together.

    A case label opens the later box's sentence and one stands before the earlier box (in the `_AFTER_CHARS` before
    it); a case given up between them (`_CASE_REJECTED`, a mistake) leaves the later box to supersede it, as a
    correction does.
    """
    sentences = _SENTENCE_BREAK.split(between.strip())
    before = region[max(0, earlier.start - _AFTER_CHARS) : earlier.start]
    if not _CASE.search(sentences[-1]) or not _CASE.search(before):
        return False
    return not (_CASE_REJECTED.search(between) or mentions_mistake(between))


def _first_named_part(region: str, boxes: list[Box], first: int, cut: list[tuple[int, int]]) -> int:
    """The first box of the final statement with the boxes that name other parts in words (`FinalAnswers.parts`)."""
    while first > 0:
        earlier = boxes[first - 1]
        between = _between(region, earlier.end, boxes[first].start, cut)
        before = region[max(0, earlier.start - _AFTER_CHARS) : earlier.start]
        if not (offered_together(between) or names_next_part(before, between)):
            break
        first -= 1
    return first


def _unboxed_alternative(after: str, last: Box) -> bool:
    """Whether the text right after the last box offers another value without a box (`rewards.alternatives`)."""
    return unboxed_alternative(after, lambda value: _differ(value, last.content))


def doubted_after(after: str) -> bool:
    r"""Whether the sentence right after an answer doubts it or names a condition ("\boxed{5} is also plausible").

    With an earlier, different answer this makes the two a hedge (the module docstring); the math graders and gpqa
    read it alike.

    Args:
        after: the text that follows the answer (only its first `_AFTER_CHARS` characters are read).
    """
    text = expand_contractions(_BETWEEN_MARKUP.sub(" ", after[:_AFTER_CHARS])).strip()
    return bool(_HEDGE_AFTER.search(_SENTENCE_BREAK.split(text, maxsplit=1)[0]))


def offered_together(between: str) -> bool:
    r"""Whether two boxes with `between` between them are given as one statement (a list or a hedge).

    Args:
        between: the text from the end of one box to the start of the next.

    Returns:
        False when the text corrects the earlier box ("that's wrong", "I made a mistake", "is incorrect"). Else
        True for a hedge (doubt or an alternative anywhere: "not sure", "maybe", "otherwise", "vs", "another
        possibility"; or "or", "either", "could be" in the sentence right after the earlier box or right before
        the later one) or a list (only punctuation, math, one-letter names and joining words: "and", "(b)",
        "x =", "i.e.", "part"); False for anything else (a derivation or a correction), after which the later box
        supersedes the earlier one.
    """
    text = expand_contractions(_BETWEEN_MARKUP.sub(" ", between))  # "I'd also accept" is "I would also accept"
    if mentions_mistake(text):
        return False  # the earlier box was taken back ("\boxed{3}. Oops, it could be \boxed{5}")
    if _HEDGE_PHRASES.search(text):
        return True
    sentences = _SENTENCE_BREAK.split(text.strip())
    # A weak hedge word sits right after the earlier box or right before the later one; an "or" deep inside a
    # derivation between them ("for 2 or more terms") is not one.
    if _HEDGE_WORDS.search(sentences[0]) or _HEDGE_WORDS.search(sentences[-1]) or _CONDITION.search(sentences[0]):
        return True
    if _DOUBT_WORDS.search(sentences[0]) or _DOUBT_WORDS.search(sentences[-1]):
        return True
    return all(word.lower() in _LIST_WORDS for word in _WORD.findall(text))
