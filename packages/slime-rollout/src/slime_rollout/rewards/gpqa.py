r"""`--rm-type gpqa`: multiple-choice grading by option (GPQA, Rein et al., 2023).

The question's options decide what an answer can be: `metadata["valid_letters"]` (a string or a list), else
one letter per entry of `metadata["choices"]` (a list, or a dict letter → text), else A-J. The correct option
is `metadata["correct_letter"]`, a letter label, a 0-based index label, or the label's text matched against the
choices.

The response's pick is read from its final part (after the reasoning; an unclosed `<think>` has none):

* the last explicit statement ("the answer is (B)", "Answer: B", "B is correct", `\boxed{B}`); a letter that is
  not one of the question's options is no pick at all (never replaced by another letter of the text); "A or B",
  "A, C", "A and C" are a hedge, no pick; a statement taken back by the text after it ("Answer: B. Actually no,
  it's A.") is no pick (`slime_rollout.rewards.retraction`, the math graders' rule);
* else an option given by its text ("Final answer: 42 J"), when exactly one option's text is stated;
* else the last standalone capital letter among the options that is not negated ("not A", "A is not correct"; the
  original's fallback takes any).

Without a determinable correct option, the stated answer must equal the label's text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from slime_rollout.rewards.answers import doubted_after, strip_reasoning
from slime_rollout.rewards.retraction import judged_wrong, negated_before, retracts

__all__ = ["extract_choice_letter", "gpqa_reward"]

_DEFAULT_LETTERS = "ABCDEFGHIJ"
# Explicit statements; group 1 is the letter (capital, or lower case when nothing word-like follows it).
_LETTER = r"\(?\s*([A-Z]\b|[a-z](?=\s*\)?\s*(?:[.,:;!)]|$)))\s*\)?"
_STATEMENTS = [
    re.compile(rf"(?i:answer)\b\s*(?:is|:|=)?\s*(?:(?i:option|choice)\s+)?[:\s]*{_LETTER}", re.M),
    re.compile(rf"(?i:correct\s+(?:option|choice))\s*(?:is|:)?\s*{_LETTER}", re.M),
    re.compile(rf"\\boxed\{{\s*(?:\\text\{{)?{_LETTER}\}}?\s*\}}"),
    re.compile(rf"{_LETTER}\s+(?i:is\s+(?:the\s+)?correct)", re.M),
    # A correction names the new pick: "Answer: B. Actually no, it's A."
    re.compile(rf"(?i:\b(?:no|wait|actually)[,:;]?\s+it(?:'s|\u2019s|\s+is)\s+){_LETTER}", re.M),
]
# Two letters joined by or, /, and, &, or a comma: several picks, a hedge ("A or B", "A, C", "A and C").
_HEDGE = re.compile(
    r"[A-Za-z]\s*\)?\s*(?:or|/|and|&|,)\s*\(?\s*[A-Z]\b(?!')(?!\s+(?:think|believe|guess|am|was|would|will)\b)"
)
_LEADING_LETTER = re.compile(r"[A-Za-z]\b")
_ANSWER_TEXT = re.compile(r"(?i)(?:final\s+answer|answer)\s*(?:is|:)\s*([^\n]{1,200})")
# A run of whitespace, read as one space (one newline if it holds one): the patterns above try `\s*` at every
# position, so a long run made them quadratic (200,000 spaces took 308 s on the event loop).
_SPACE_RUN = re.compile(r"\s+")


def _squeezed(region: str) -> str:
    """`region` with each whitespace run as one newline (if it holds one) or one space: linear-time matching."""
    return _SPACE_RUN.sub(lambda m: "\n" if "\n" in m.group() else " ", region)


def _normalize_text(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", str(text).lower()).strip()


def _valid_letters(metadata: Mapping[str, Any]) -> str:
    given = metadata.get("valid_letters")
    if given:
        items = list(given) if isinstance(given, str) else [str(x) for x in given]
        return "".join(dict.fromkeys(x.strip().upper() for x in items if x.strip()))
    choices = metadata.get("choices")
    if choices:
        if isinstance(choices, Mapping):
            return "".join(str(k).strip().upper() for k in choices)
        return string.ascii_uppercase[: len(choices)]
    return _DEFAULT_LETTERS


def _choice_items(metadata: Mapping[str, Any], letters: str) -> list[tuple[str, str]]:
    choices = metadata.get("choices") or []
    if isinstance(choices, Mapping):
        return [(str(k).strip().upper(), str(v)) for k, v in choices.items()]
    return list(zip(letters, (str(c) for c in choices), strict=False))


def _stated_letter(region: str) -> tuple[bool, str | None]:
    """(whether an explicit statement was found, its letter upper-cased, or None for a hedge "A or B")."""
    last: re.Match[str] | None = None
    for pattern in _STATEMENTS:
        for m in pattern.finditer(region):
            if last is None or m.start(1) > last.start(1):
                last = m
    if last is None:
        return False, None
    if _HEDGE.match(region, last.start(1)):
        return True, None
    letter = last.group(1).upper()
    # Taken back by what follows ("Answer: B. Actually no, it's A."): no pick, by the math graders' rule.
    if retracts(region[last.end() :], lambda value: _first_letter(value) != letter):
        return True, None
    # Doubted with another pick stated before ("Answer: A. Answer: B is also plausible"): a hedge, as in math.
    if doubted_after(region[last.end() :]) and any(m.upper() != letter for m in _earlier_letters(region, last)):
        return True, None
    return True, letter


def _earlier_letters(region: str, last: re.Match[str]) -> list[str]:
    """The letters of the explicit statements before `last`."""
    return [m.group(1) for pattern in _STATEMENTS for m in pattern.finditer(region, 0, last.start()) if m.group(1)]


def _first_letter(value: str) -> str | None:
    """The option letter a corrected value starts with ("(C), since ..." → "C"), or None."""
    m = _LEADING_LETTER.match(value.strip("$(). "))
    return m.group().upper() if m else None


def _standalone_letters(region: str, letters: str) -> list[str]:
    """Capital option letters standing alone, less those negated ("not A", "A is not correct", "isn't A")."""
    found = []
    for m in re.finditer(r"\b([A-Z])\b", region):
        if m.group(1) in letters and not negated_before(region[: m.start()]) and not judged_wrong(region[m.end() :]):
            found.append(m.group(1))
    return found


def _named_options(text: str, items: Sequence[tuple[str, str]]) -> set[str]:
    said = f" {_normalize_text(text)} "
    return {letter for letter, choice in items if _normalize_text(choice) and f" {_normalize_text(choice)} " in said}


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
    region = _squeezed(region)
    metadata = {"valid_letters": valid_letters, "choices": choices}
    letters = _valid_letters(metadata)
    found, letter = _stated_letter(region)
    if found:
        return letter if letter is not None and letter in letters else None
    by_text = _stated_choice_text(region, _choice_items(metadata, letters))
    if by_text is not None:
        return by_text
    standalone = _standalone_letters(region, letters)
    return standalone[-1] if standalone else None


def _correct_letter(label: Any, metadata: Mapping[str, Any], letters: str) -> str | None:
    if metadata.get("correct_letter"):
        return str(metadata["correct_letter"]).strip().upper()
    if isinstance(label, int | float) and not isinstance(label, bool):
        index = int(label)
        return letters[index] if 0 <= index < len(letters) else None
    text = str(label).strip() if label is not None else ""
    if len(text) == 1 and text.upper() in string.ascii_uppercase:
        return text.upper()  # a letter label; one outside the options can never be picked
    for letter, choice in _choice_items(metadata, letters):
        if text and _normalize_text(choice) == _normalize_text(text):
            return letter
    return None


def gpqa_reward(response: str, label: Any, metadata: Mapping[str, Any] | None = None) -> float:
    """1.0 if the response picks the correct option, else 0.0 (see the module docstring).

    Args:
        response: model output.
        label: the correct option: letter, 0-based index, or its text.
        metadata: the sample's metadata (`valid_letters`, `choices`, `correct_letter`), optional.
    """
    metadata = metadata or {}
    letters = _valid_letters(metadata)
    correct = _correct_letter(label, metadata, letters)
    if correct is not None:
        picked = extract_choice_letter(response, letters, metadata.get("choices"))
        return 1.0 if picked == correct else 0.0
    region = strip_reasoning(response or "")
    stated = _ANSWER_TEXT.findall(_squeezed(region or ""))
    if label is None or not stated:
        return 0.0
    return 1.0 if _normalize_text(stated[-1]) == _normalize_text(str(label)) else 0.0
