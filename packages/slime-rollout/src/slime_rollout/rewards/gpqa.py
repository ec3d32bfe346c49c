r"""`--rm-type gpqa`: multiple-choice grading by option (GPQA, Rein et al., 2023).

The question's options decide what an answer can be: `metadata["valid_letters"]` (a string or a list), else
one letter per entry of `metadata["choices"]` (a list, or a dict letter → text), else A-J. The correct option
is `metadata["correct_letter"]` (a letter, or a 0-based index), a letter label, a 0-based index label (a whole
number: 1 or 1.0), or the label's text matched against the choices; a correct option that is not one of the options
(label "E" of four, index 4) is an error, not a row that scores 0 whatever the response (the original scores it 0), and
so is a bool label or a fractional index (1.5, NaN): the original reads True as index 1 and truncates 1.5 to 1.
Texts are compared as words (case, punctuation and full-width forms aside), a space between a digit and a letter
optional: "4J" is the option "4 J" (the original compares "4j" with "4 j").

The response's pick is read from its final part (after the reasoning; an unclosed `<think>` has none); a letter
right after the word "option" or "choice" is an option letter in either case ("I choose option b.", as the
original reads it):

* the last explicit statement ("the answer is (B)", "Answer: B", "B is correct", `\boxed{B}`); a letter that is
  not one of the question's options is no pick at all (never replaced by another letter of the text); "A or B",
  "A, C", "A and C", "Either A or B is correct", `\boxed{A} \boxed{B}` (statements offered together, by the math
  graders' rule) and "Answer: B. A is also possible" are a hedge, no pick; a correction naming the letter alone
  ("Answer: A. Correction: B.", "No wait, B.") is the pick; a statement taken back by the text after it
  ("Answer: B. Actually no, it's A.") is no pick (`slime_rollout.rewards.retraction`, the math graders' rule);
* else an option given by its text ("Final answer: 42 J"), when exactly one option's text is stated other than
  negated ("The answer is not 42 J", "42 J is wrong": no pick);
* else the last standalone capital letter among the options that is not negated ("not A", "A is not correct", "I
  would not choose option b", "I don't think it's B", "I reject B"; the original's fallback takes any) and is not
  the word "I" or "A" ("I'd say B", "A quick check": a lower-case word that is not a verb or conjunction follows),
  unless it is offered together with another option (by the math graders' rule, `answers.offered_together`): "A or
  B", "A, B", "I'd go with A or maybe B", "A. B is also plausible" are a hedge, no pick (the original takes the last
  letter, B), while "Between A and B, I pick A" picks A.

A negated choice is no answer: an explicit statement the words before it negate ("I don't think the answer is B") is
not a statement, and a letter or text chosen against ("I would not choose option b") is no pick (the original reads
both as picking B).

A statement's pick followed in its sentence by another option in hedge words ("The answer is A, or maybe B"), or in
the two sentences after it by another option offered ("Answer: B. I'm not sure, it might be C.", "C could also be
right": `rewards.alternatives`, the math graders' rule), is a hedge too; a letter right after it with no words
between ("Answer: B. A quick check confirms it") is not, since a capital A or I is also a word.

Without a determinable correct option, the stated answer must equal the label's text.
"""

from __future__ import annotations

import itertools
import math
import numbers
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from slime_rollout.rewards.alternatives import unboxed_alternative
from slime_rollout.rewards.answers import doubted_after, offered_together, strip_reasoning
from slime_rollout.rewards.retraction import (
    expand_contractions,
    judged_wrong,
    mentions_mistake,
    negated_before,
    retracts,
)
from slime_rollout.rewards.unicode_math import ascii_forms

__all__ = ["extract_choice_letter", "gpqa_reward"]

_DEFAULT_LETTERS = "ABCDEFGHIJ"
_OPTION_LETTER = re.compile(r"[A-Za-z]")
# Explicit statements; group 1 is the letter (capital, or lower case when nothing word-like follows it).
_LETTER = r"\(?\s*([A-Z]\b|[a-z](?=\s*\)?\s*(?:[.,:;!)]|$)))\s*\)?"
_STATEMENTS = [
    re.compile(rf"(?i:answer)\b\s*(?:is|:|=)?\s*(?:(?i:option|choice)\s+)?[:\s]*{_LETTER}", re.M),
    re.compile(rf"(?i:correct\s+(?:option|choice))\s*(?:is|:)?\s*{_LETTER}", re.M),
    re.compile(rf"\\boxed\{{\s*(?:\\text\{{)?{_LETTER}\}}?\s*\}}"),
    re.compile(rf"{_LETTER}\s+(?i:is\s+(?:the\s+)?correct)", re.M),
    # A correction names the new pick: "Answer: B. Actually no, it's A."
    re.compile(rf"(?i:\b(?:no|wait|actually)[,:;]?\s+it(?:'s|\u2019s|\s+is)\s+){_LETTER}", re.M),
    # ... or names it alone: "Answer: A. Correction: B.", "Answer: A. No wait, B."
    re.compile(
        rf"(?i:\b(?:correction|no,?\s+wait|i\s+mean|make\s+that|scratch\s+that)[,:;]?\s+){_LETTER}(?=\s*(?:[.!]|$))",
        re.M,
    ),
]
# Two letters joined by or, /, and, &, or a comma: several picks, a hedge ("A or B", "A, C", "A and C").
_HEDGE = re.compile(
    r"[A-Za-z]\s*\)?\s*(?:or|/|and|&|,)\s*\(?\s*[A-Z]\b(?!')(?!\s+(?:think|believe|guess|am|was|would|will)\b)"
)
_LEADING_LETTER = re.compile(r"[A-Za-z]\b")
# Another option joined to the pick from before it ("Either A or B is correct").
_HEDGE_BEFORE = re.compile(r"\b([A-Z])\s*\)?\s*(?:or|/|and|&)\s*\(?\s*$")
# An option said to be possible too, right after its letter ("A is also possible", "C also seems right").
_ALSO_POSSIBLE = re.compile(
    r"\s*\)?\s*(?:is|seems|looks|could be|might be|may be|would be)?\s*(?:also|equally)\s+"
    r"(?:(?:seems|looks|be)\s+)?(?:possible|plausible|valid|correct|right|likely|acceptable)\b",
    re.IGNORECASE,
)
_BOX_MARKUP = re.compile(r"\\(?:boxed|fbox)\s*\{|\\text\s*\{|\}")
# The next capital letter after a statement's pick within its sentence, with the text before it (group 1).
_LETTER_AFTER = re.compile(r"([^.!?\n]{0,80}?)\(?\b([A-Z])\b")
_WORDS = re.compile(r"[A-Za-z]{2,}")
_CAPITAL = re.compile(r"\b([A-Z])\b")
# "I" and "A" as words, not options: the pronoun ("I'd say B", "I checked") and the article ("A quick check"). An
# option letter is followed by punctuation or by a verb or conjunction ("A is", "A because").
_WORD_NOT_LETTER = re.compile(
    r"I(?:['\u2019]|\s+(?!(?:is|was|seems|looks|because|since|as|and|or|but|fits|matches|gives|holds)\b)[a-z])"
    r"|A\s+(?!(?:is|was|seems|looks|because|since|as|and|or|but|fits|matches|gives|holds|would|could|must|should"
    r"|might|may|can|will|appears|remains|works|satisfies|best)\b)[a-z]"
)
_MAX_WALK = 64  # letters read back from the last one: a final statement is short
_MAX_LETTERS = 256  # capital letters read for the fallback pick, the last ones of the response
_ANSWER_TEXT = re.compile(r"(?i)(?:final\s+answer|answer)\s*(?:is|:)\s*([^\n]{1,200})")
# A run of whitespace, read as one space (one newline if it holds one): the patterns above try `\s*` at every
# position, so a long run made them quadratic (200,000 spaces took 308 s on the event loop).
_SPACE_RUN = re.compile(r"\s+")
# A lower-case letter after "option"/"choice" names the option ("I choose option b."; the original reads any case).
_OPTION_WORD_LETTER = re.compile(r"(\b(?i:option|choice)\s*\(?\s*)([a-z])\b(?!['\u2019])")
# Between a digit and a letter a space is optional in a text answer: "4J" is "4 J", "H2O" is "H 2 O".
_DIGIT_LETTER_SPACE = re.compile(r"(?<=[0-9]) (?=[a-z])|(?<=[a-z]) (?=[0-9])")
_DIGIT_LETTER_EDGE = re.compile(r"(?<=[0-9])(?=[a-z])|(?<=[a-z])(?=[0-9])")
# The words right before an option that choose against it: "I would not choose option B", "I don't think the answer
# is B", "it is not option B", "I reject B" (contractions expanded). `negated_before` reads only "not B".
_CHOICE_NOUN = r"(?:(?:the\s+)?(?:correct\s+|right\s+|final\s+)?(?:option|choice|answer)\s*(?:is\s+|:\s*)?)?"
_NEGATED_CHOICE = re.compile(
    r"(?i)(?:\b(?:not|never|cannot)\s+(?:(?:really|even|ever)\s+)?"
    r"(?:(?:choose|pick|select|go\s+(?:with|for)|opt\s+for|take|say|mark|recommend)\s+"
    r"|(?:think|believe|agree)\s+(?:that\s+)?(?:it\s+is\s+)?)?"
    r"|\b(?:reject(?:ing)?|eliminat(?:e|ing)|rul(?:e|ing)\s+out|exclud(?:e|ing)|discard(?:ing)?|avoid(?:ing)?)\s+)"
    rf"{_CHOICE_NOUN}[(\s]*$"
)


def _negated_choice(before: str) -> bool:
    """Whether the text right before an option (a letter or its text; the last 80 characters) chooses against it."""
    return bool(negated_before(before) or _NEGATED_CHOICE.search(expand_contractions(before[-80:])))


def _squeezed(region: str) -> str:
    """`region` with each whitespace run as one newline (if it holds one) or one space: linear-time matching."""
    return _SPACE_RUN.sub(lambda m: "\n" if "\n" in m.group() else " ", region)


def _normalize_text(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", ascii_forms(str(text)).lower()).strip()  # full-width text as ASCII


def _compact_text(text: str) -> str:
    """`_normalize_text` without the spaces between a digit and a letter ("4 J" and "4J" are both "4j")."""
    return _DIGIT_LETTER_SPACE.sub("", _normalize_text(text))


def _same_text(a: str, b: str) -> bool:
    """Whether two answers are the same text: words compared case-folded, a digit-letter space optional."""
    return _compact_text(a) == _compact_text(b)


def _text_pattern(choice: str) -> re.Pattern[str] | None:
    """A pattern finding the option text `choice` as whole words in `_normalize_text` output, or None if empty.

    A space is optional wherever a digit meets a letter, so the choice "4 J" is found in "answer 4j" and "4J" in
    "answer 4 j"; "4 J" is not found in "14 j" or "4 joules".
    """
    compact = _compact_text(choice)
    if not compact:
        return None
    body = " ?".join(re.escape(part) for part in _DIGIT_LETTER_EDGE.split(compact))
    return re.compile(rf"(?<![a-z0-9]){body}(?![a-z0-9])")


def _given(value: Any) -> bool:
    """Whether a metadata value is there and not empty; a numpy array's truth value is an error, not an answer."""
    if value is None:
        return False
    return len(value) > 0 if hasattr(value, "__len__") else bool(value)


def _valid_letters(metadata: Mapping[str, Any]) -> str:
    """The options' letters: `valid_letters` (a list, or a string: "ABCD", "A,B,C"), else one per choice, else A-J.

    A string's separators are not options ("A,B,C" made "," an option, so the index label 1 named ","); a list may
    be a numpy array (a plugin's or a pandas-read row's; its truth value raised).
    """
    given = metadata.get("valid_letters")
    if _given(given):
        items = _OPTION_LETTER.findall(given) if isinstance(given, str) else [str(x) for x in given]
        return "".join(dict.fromkeys(x.strip().upper() for x in items if x.strip()))
    choices = metadata.get("choices")
    if _given(choices):
        if isinstance(choices, Mapping):
            return "".join(str(k).strip().upper() for k in choices)
        return string.ascii_uppercase[: len(choices)]
    return _DEFAULT_LETTERS


def _choice_items(metadata: Mapping[str, Any], letters: str) -> list[tuple[str, str]]:
    choices = metadata.get("choices")
    if not _given(choices):
        return []
    if isinstance(choices, Mapping):
        return [(str(k).strip().upper(), str(v)) for k, v in choices.items()]
    return list(zip(letters, (str(c) for c in choices), strict=False))


def _stated_letter(region: str) -> tuple[bool, str | None]:
    """(whether an explicit statement was found, its letter upper-cased, or None for a hedge "A or B")."""
    found = sorted((m for pattern in _STATEMENTS for m in pattern.finditer(region)), key=lambda m: -m.start(1))
    # The last statement that the words before it do not negate ("I don't think the answer is B" is none), among the
    # last `_MAX_WALK`: each check costs ~0.1 ms, and 50,000 negated statements held the event loop for seconds.
    last = next(
        (m for m in found[:_MAX_WALK] if not _negated_choice(region[max(0, m.start(1) - 80) : m.start(1)])), None
    )
    if last is None:
        return False, None
    letter = last.group(1).upper()
    before = _HEDGE_BEFORE.search(region[max(0, last.start(1) - 40) : last.start(1)])
    if _HEDGE.match(region, last.start(1)) or (before and before.group(1) != letter):
        return True, None
    if _offered_with_another(region, last, letter):
        return True, None
    # Another option offered after it without a statement ("Answer: B. I'm not sure, it might be C."), as in math.
    if unboxed_alternative(region[last.end() :], lambda value: value.upper() != letter, letters=True):
        return True, None
    # Taken back by what follows ("Answer: B. Actually no, it's A."): no pick, by the math graders' rule.
    if retracts(region[last.end() :], lambda value: _first_letter(value) != letter):
        return True, None
    # Doubted with another pick stated before ("Answer: A. Answer: B is also plausible"): a hedge, as in math.
    if doubted_after(region[last.end() :]) and any(m.upper() != letter for m in _earlier_letters(region, last)):
        return True, None
    # Another option offered in hedge words right after it ("The answer is A, or maybe B").
    following = _LETTER_AFTER.match(region, last.end(1))  # from the letter: its match may end past a line break
    if following and following.group(2) != letter and _WORDS.search(following.group(1)):
        if offered_together(following.group(1)):
            return True, None
    return True, letter


def _offered_with_another(region: str, last: re.Match[str], letter: str) -> bool:
    r"""Whether another option is offered together with the pick (by the math graders' rule).

    The statement just before, with only list or hedge text between (`\boxed{A} \boxed{B}`, `Answer: A; maybe
    B`); or an option after it said to be possible too (`Answer: B. A is also possible`).
    """
    end = last.start(1)
    earlier = [m for pattern in _STATEMENTS for m in pattern.finditer(region, 0, end) if m.end(1) <= end]
    if earlier:
        previous = max(earlier, key=lambda m: m.start(1))
        between = _BOX_MARKUP.sub(" ", region[previous.end(1) : last.start(1)])
        if previous.group(1).upper() != letter and offered_together(between):
            return True
    for m in itertools.islice(_CAPITAL.finditer(region, last.end()), 8):
        if m.group(1) != letter and _ALSO_POSSIBLE.match(region, m.end()):
            return True
    return False


def _earlier_letters(region: str, last: re.Match[str]) -> list[str]:
    """The letters of the explicit statements before `last`."""
    return [m.group(1) for pattern in _STATEMENTS for m in pattern.finditer(region, 0, last.start()) if m.group(1)]


def _first_letter(value: str) -> str | None:
    """The option letter a corrected value starts with ("(C), since ..." → "C"), or None."""
    m = _LEADING_LETTER.match(value.strip("$(). "))
    return m.group().upper() if m else None


def _standalone_letters_backwards(region: str, letters: str) -> Iterator[re.Match[str]]:
    """Capital option letters standing alone, last first, less those negated ("not A", "A is not correct").

    Only the last `_MAX_LETTERS` capital letters are looked at: each costs a negation check (~30 µs), and a 1 MB
    response of negated letters ("not A, " × 140,000) held the event loop, where grading runs, for 4.7 s.
    """
    for m in reversed(list(_CAPITAL.finditer(region))[-_MAX_LETTERS:]):
        before, after = region[max(0, m.start() - 60) : m.start()], region[m.end() : m.end() + 80]
        if m.group(1) in letters and not _WORD_NOT_LETTER.match(m.group(1) + after) and not _negated_choice(before):
            if not judged_wrong(after):
                yield m


def _last_unhedged(region: str, letters: str) -> str | None:
    """The last standalone letter, or None when there is none or options are offered with it ("A or B").

    Walks back from the last letter while the text between two letters is a list or a hedge, as
    `answers.final_boxed_answers` walks back over boxes; more than one option in that final statement is a hedge.
    The walk reads only the final statement (at most `_MAX_WALK` letters), so a long response costs one scan.
    """
    found = itertools.islice(_standalone_letters_backwards(region, letters), _MAX_WALK)
    last = next(found, None)
    if last is None:
        return None
    hedged_after, later = doubted_after(region[last.end() :]), last
    for earlier in found:
        between = region[earlier.end() : later.start()]
        if not offered_together(between) and not (later is last and hedged_after and not mentions_mistake(between)):
            break
        if earlier.group(1) != last.group(1):
            return None
        later = earlier
    return last.group(1)


def _named_options(text: str, items: Sequence[tuple[str, str]]) -> set[str]:
    """The options whose text `text` names, less those chosen against ("not 42 J", "42 J is wrong")."""
    said = _normalize_text(expand_contractions(text))
    named = set()
    for letter, choice in items:
        pattern = _text_pattern(choice)
        matches = list(pattern.finditer(said))[-_MAX_WALK:] if pattern else []  # the last mentions: bounded cost
        if any(
            not _negated_choice(said[max(0, m.start() - 80) : m.start()])
            and not judged_wrong(said[m.end() : m.end() + 80])
            for m in matches
        ):
            named.add(letter)
    return named


def _stated_choice_text(region: str, items: Sequence[tuple[str, str]]) -> str | None:
    """The one option whose text is stated as the answer (else named in the text at all), or None."""
    if not items:
        return None
    stated = _ANSWER_TEXT.findall(region)
    named = _named_options(stated[-1] if stated else region, items)
    return named.pop() if len(named) == 1 else None


def extract_choice_letter(
    response: str, valid_letters: str | Sequence[str] = _DEFAULT_LETTERS, choices: Any = None
) -> str | None:
    """The option a response picks (see the module docstring), or None.

    Args:
        response: model output.
        valid_letters: the question's option letters (a string or a list).
        choices: the option texts (list, or dict letter → text), to recognise an answer given as text.
    """
    region = strip_reasoning(response or "")
    if region is None:
        return None
    region = _squeezed(ascii_forms(region))  # a full-width `Ｂ` is the option B
    region = _OPTION_WORD_LETTER.sub(lambda m: m.group(1) + m.group(2).upper(), region)
    metadata = {"valid_letters": valid_letters, "choices": choices}
    letters = _valid_letters(metadata)
    found, letter = _stated_letter(region)
    if found:
        return letter if letter is not None and letter in letters else None
    by_text = _stated_choice_text(region, _choice_items(metadata, letters))
    if by_text is not None:
        return by_text
    return _last_unhedged(region, letters)


def _label_index(label: Any) -> int | None:
    """The 0-based option index a number label gives (1, 1.0, numpy's 1), or None when `label` is not a number.

    Raises:
        ValueError: a bool (the original reads True as index 1; it names no option), or a number that is not
            whole (1.5, NaN, infinity: the original truncates 1.5 to 1).
    """
    if isinstance(label, bool | np.bool_):
        raise ValueError(
            f"gpqa label {label!r} is a bool, not an option: give the correct option as a letter, a 0-based index "
            "or its text (--label-key names the column)"
        )
    if isinstance(label, numbers.Integral):
        return int(label)
    if isinstance(label, numbers.Real):
        value = float(label)
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"gpqa label {label!r} is no option index: an index label is a whole number (0 is A)")
        return int(value)
    return None


def _correct_letter(label: Any, metadata: Mapping[str, Any], letters: str) -> str | None:
    """The correct option's letter (see the module docstring); "index N" for an out-of-range metadata index.

    Raises:
        ValueError: a bool label or `correct_letter`, or a fractional index label (`_label_index`).
    """
    given = metadata.get("correct_letter")
    if isinstance(given, bool | np.bool_):
        raise ValueError(f"gpqa metadata correct_letter {given!r} is a bool: give a letter or a 0-based index")
    if isinstance(given, numbers.Integral):
        # A 0-based index, as an index label is (it was read as the text "1", which names no option).
        return letters[int(given)] if 0 <= int(given) < len(letters) else f"index {given}"
    if given:
        return str(given).strip().upper()
    index = _label_index(label)
    if index is not None:
        return letters[index] if 0 <= index < len(letters) else None
    text = ascii_forms(str(label)).strip() if label is not None else ""
    if len(text) == 1 and text.upper() in string.ascii_uppercase:
        return text.upper()  # a letter label (one outside the options is refused by `gpqa_reward`)
    for letter, choice in _choice_items(metadata, letters):
        if text and _same_text(choice, text):
            return letter
    return None


def gpqa_reward(response: str, label: Any, metadata: Mapping[str, Any] | None = None) -> float:
    """1.0 if the response picks the correct option, else 0.0 (see the module docstring).

    Args:
        response: model output.
        label: the correct option: letter, 0-based index, or its text.
        metadata: the sample's metadata (`valid_letters`, `choices`, `correct_letter`), optional.

    Raises:
        ValueError: neither a label nor a `correct_letter` in the metadata (nothing to compare with), they name
            no option (a letter outside the options, an index out of range), or the label is a bool or a
            fractional index (1.5, NaN). `async_rm` adds the sample's index to the message.
    """
    metadata = metadata or {}
    letters = _valid_letters(metadata)
    correct = _correct_letter(label, metadata, letters)
    if correct is None and label is None:
        raise ValueError("gpqa reward needs a label (set --label-key) or metadata['correct_letter']")
    out_of_range = isinstance(label, numbers.Real) and correct is None  # a bool label was refused above
    if out_of_range or (correct is not None and correct not in letters):
        # No response can pick it: every sample of the row scored 0 without a word.
        raise ValueError(
            f"gpqa label {label!r} (metadata correct_letter {metadata.get('correct_letter')!r}) names no option: "
            f"the options are {', '.join(letters)} (metadata valid_letters / choices)"
        )
    if correct is not None:
        picked = extract_choice_letter(response, letters, metadata.get("choices"))
        return 1.0 if picked == correct else 0.0
    region = strip_reasoning(response or "")
    stated = _ANSWER_TEXT.findall(_squeezed(ascii_forms(region or "")))
    if label is None or not stated:
        return 0.0
    return 1.0 if _same_text(stated[-1], str(label)) else 0.0
