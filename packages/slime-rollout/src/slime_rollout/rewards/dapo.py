"""`--rm-type dapo`: DAPO / Minerva-style `Answer: X` grading with a score dict (use `--reward-key score`).

Only the last 300 characters of the response are read; the answer is the last `Answer: ...` line.
Reference: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025).
"""

from __future__ import annotations

import re
from typing import Any

from slime_rollout.rewards.math_utils import extract_boxed, extract_label_answer, normalize_answer

__all__ = ["dapo_reward"]

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def _label_string(label: object) -> str:
    gold = normalize_answer(extract_label_answer(label))
    # The original casts integral labels to an int string ("18.0" -> "18").
    try:
        value = float(gold)
        if value.is_integer():
            return str(int(value))
    except ValueError:
        pass
    return gold


def dapo_reward(response: str, label: object, *, strict_box: bool = False) -> dict[str, Any]:
    r"""Scores a response DAPO-style.

    Args:
        response: model output.
        label: ground-truth answer.
        strict_box: read the answer from the last `\boxed{}` instead of an `Answer:` line.

    Returns:
        `{"score": 1.0 | -1.0, "acc": bool, "pred": str}`.
    """
    tail = response[-300:]
    if strict_box:
        pred = extract_boxed(tail) or ""
    else:
        matches = _ANSWER_LINE.findall(tail)
        pred = matches[-1] if matches else ""
        boxed = extract_boxed(pred)
        if boxed is not None:
            pred = boxed
    pred = normalize_answer(pred)
    acc = bool(pred) and pred == _label_string(label)
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}
