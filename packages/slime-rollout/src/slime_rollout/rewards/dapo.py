r"""`--rm-type dapo`: DAPO / Minerva-style `Answer: X` grading with a score dict (use `--reward-key score`).

The answer is the last `Answer: ...` line of the response's final part (after its reasoning: a `<think>` that
never closes has no answer), read in its last 300 characters as the original does. Markdown around it
(`**Answer:** 73`, `Answer: **73**`, `` `73` ``), `$...$` and a `\boxed{}` are taken off; the value is then
compared like the math grader's cheap checks (`math_utils.grade_fast`: units, number words, exact numbers:
`73.0` = `73`, `1,000` = `1000`), never symbolically, so grading stays cheap string work on the event loop.
Reference: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025).
"""

from __future__ import annotations

import re
from typing import Any

from slime_rollout.rewards.answers import extract_boxed, strip_reasoning
from slime_rollout.rewards.math_utils import extract_label_answer, grade_fast, normalize_answer

__all__ = ["dapo_reward"]

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_MARKDOWN = re.compile(r"\*\*|__|`")
_TAIL_CHARS = 300  # the original reads only the end of the response (MATH-500's longest answer: 159 chars)


def _predicted(response: str, strict_box: bool) -> str:
    region = strip_reasoning(response or "")
    if region is None:
        return ""
    tail = _MARKDOWN.sub("", region[-_TAIL_CHARS:])
    if strict_box:
        return extract_boxed(tail) or ""
    matches = _ANSWER_LINE.findall(tail)
    pred = matches[-1].strip().strip("*").strip() if matches else ""
    boxed = extract_boxed(pred)
    return boxed if boxed is not None else pred


def dapo_reward(response: str, label: object, *, strict_box: bool = False) -> dict[str, Any]:
    r"""Scores a response DAPO-style.

    Args:
        response: model output.
        label: ground-truth answer.
        strict_box: read the answer from the last `\boxed{}` instead of an `Answer:` line.

    Returns:
        `{"score": 1.0 | -1.0, "acc": bool, "pred": str}` (`pred`: the normalized predicted answer).

    Raises:
        ValueError: if `label` is None.
    """
    pred = _predicted(response, strict_box)
    gold = extract_label_answer(label)
    acc = bool(pred) and grade_fast(pred, gold)[0] is True
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": normalize_answer(pred) if pred else ""}
