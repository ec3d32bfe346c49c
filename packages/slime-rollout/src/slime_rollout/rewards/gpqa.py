"""`--rm-type gpqa`: multiple-choice grading by answer letter (GPQA, Rein et al., 2023)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["extract_choice_letter", "gpqa_reward"]

_DEFAULT_LETTERS = "ABCDEFGHIJ"


def _patterns(letters: str) -> list[re.Pattern[str]]:
    cls = f"[{letters}]"
    return [
        re.compile(rf"(?i)answer\s*(?:is|:)?\s*[:\s]*\(?\**\s*({cls})\b"),
        re.compile(rf"(?i)\(?\b({cls})\)?\s+is\s+(?:the\s+)?correct"),
        re.compile(rf"(?i)final\s+answer\s*(?:is|:)?\s*\(?\**\s*({cls})\b"),
        re.compile(rf"\\boxed\{{\s*\(?({cls})\)?\s*\}}"),
    ]


def extract_choice_letter(response: str, valid_letters: str = _DEFAULT_LETTERS) -> str | None:
    """The chosen option letter: explicit phrases first, else the last standalone capital letter.

    Args:
        response: model output; anything before the last `</think>` is ignored.
        valid_letters: the option letters of the question.
    """
    if "</think>" in response:
        response = response.rsplit("</think>", 1)[1]
    letters = "".join(sorted(set(valid_letters.upper())))
    for pattern in _patterns(letters):
        matches = pattern.findall(response)
        if matches:
            return matches[-1].upper()
    standalone = re.findall(rf"\b([{letters}])\b", response)
    return standalone[-1] if standalone else None


def _correct_letter(label: Any, metadata: Mapping[str, Any], letters: str) -> str | None:
    if metadata.get("correct_letter"):
        return str(metadata["correct_letter"]).strip().upper()
    if isinstance(label, int) and 0 <= label < len(letters):
        return letters[label]
    text = str(label).strip() if label is not None else ""
    if len(text) == 1 and text.upper() in letters:
        return text.upper()
    choices = metadata.get("choices")
    if choices and text:
        items = list(choices.items()) if isinstance(choices, Mapping) else list(zip(letters, choices, strict=False))
        for letter, choice in items:
            if str(choice).strip().lower() == text.lower():
                return str(letter).upper()
    return None


def gpqa_reward(response: str, label: Any, metadata: Mapping[str, Any] | None = None) -> float:
    """1.0 if the response picks the correct option, else 0.0.

    The correct letter comes from `metadata["correct_letter"]`, a letter or 0-based index label, or the
    label's text matched against `metadata["choices"]`; failing that, the label text must appear in
    the answer region.
    """
    metadata = metadata or {}
    letters = str(metadata.get("valid_letters") or _DEFAULT_LETTERS).upper()
    correct = _correct_letter(label, metadata, letters)
    if correct is None:
        region = response.rsplit("</think>", 1)[-1]
        return 1.0 if label is not None and str(label).strip().lower() in region.lower() else 0.0
    return 1.0 if extract_choice_letter(response, letters) == correct else 0.0
