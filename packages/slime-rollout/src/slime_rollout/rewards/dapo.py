r"""`--rm-type dapo`: DAPO / Minerva-style `Answer: X` grading with a score dict (use `--reward-key score`).

The answer is the last `Answer: ...` line of the response's final part (after its reasoning: a `<think>` that
never closes has no answer), read in its last 300 characters as the original does. Markdown around it
(`**Answer:** 73`, `Answer: **73**`, `` `73` ``), `$...$` and a `\boxed{}` are taken off; the value is then
compared like the math grader's cheap checks (`math_utils.grade_fast`: units, number words, exact numbers:
`73.0` = `73`, `1,000` = `1000`), never symbolically, so grading stays cheap string work on the event loop.
Boxes on the answer line (and the boxes of `--rm-type boxed_dapo`, which reads the last box instead of an
`Answer:` line) follow the math graders' final-answer rule (`math_utils.final_pairs`): `Answer: \boxed{3} or
\boxed{5}` is a hedge and wrong, a multi-part answer needs the label's number of parts. An answer line taken back
by the text after it (`Answer: 5\nActually, that's wrong.`, `Answer: 5\nWait, the answer is 7.`) or negated
by its own words (`Answer: 5 is wrong`) is no answer, by the math graders' rule (`slime_rollout.rewards.retraction`);
one followed by another value offered (`Answer: 6\nOr maybe 5.`) is a hedge, by the same rule as a box
(`slime_rollout.rewards.alternatives`).
Reference: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025).
"""

from __future__ import annotations

import re
from typing import Any

from slime_core.registry import Problem
from slime_rollout.rewards.alternatives import unboxed_alternative
from slime_rollout.rewards.answers import (
    FinalAnswers,
    contradicted,
    final_boxed_answers,
    find_boxes,
    strip_reasoning,
)
from slime_rollout.rewards.math_utils import extract_label_answer, final_pairs, grade_fast, normalize_answer
from slime_rollout.rewards.retraction import negates_itself, retracts
from slime_rollout.rewards.unicode_math import ascii_forms

__all__ = ["SCORE_KEYS", "dapo_reward", "preflight"]

#: The numbers of the score dict, what `--reward-key` may select (`pred` is the answer's text).
SCORE_KEYS = ("score", "acc")

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_MARKDOWN = re.compile(r"\*\*|__|`")
_TAIL_CHARS = 300  # the original reads only the end of the response (MATH-500's longest answer: 159 chars)


def _final_answers(response: str, strict_box: bool) -> FinalAnswers:
    """The answer(s) of the response's last `Answer:` line, or of its final boxes with `strict_box`."""
    region = strip_reasoning(response or "")
    if region is None:
        return FinalAnswers(answers=[], reason="reasoning never closed")
    tail = _MARKDOWN.sub("", ascii_forms(region[-_TAIL_CHARS:]))  # "Answer：１２" (full-width) is "Answer: 12"
    if strict_box:
        return final_boxed_answers(tail)
    matches = list(_ANSWER_LINE.finditer(tail))
    if not matches:
        return FinalAnswers(answers=[], reason="no answer line")
    line = matches[-1].group(1).strip().strip("*").strip()
    final = final_boxed_answers(line) if find_boxes(line) else FinalAnswers(answers=[line] if line else [])
    if not final.answers:
        return FinalAnswers(answers=[], reason=final.reason or "no answer line")
    # The same rule as a box's: "Answer: 5\nActually, that's wrong." takes the answer back.
    after, differs = tail[matches[-1].end() :], lambda value: not _same(value, final.answers)
    if negates_itself(line) or retracts(after, differs, lambda values: contradicted(values, final.answers)):
        return FinalAnswers(answers=[], reason="retracted")
    # ... and "Answer: 6\nOr maybe 5." offers two answers, as a box followed by one does (`rewards.alternatives`).
    if unboxed_alternative(after, differs):
        return FinalAnswers(answers=[], reason="hedge")
    return final


def _same(value: str, answers: list[str]) -> bool:
    """Whether a corrected value ("the correct answer is 6") is the stated answer (then it affirms it)."""
    return len(answers) == 1 and grade_fast(value.strip("$ "), answers[0])[0] is True


def dapo_reward(response: str, label: object, *, strict_box: bool = False) -> dict[str, Any]:
    r"""Scores a response DAPO-style.

    Args:
        response: model output.
        label: ground-truth answer.
        strict_box: read the answer from the final `\boxed{}` (`--rm-type boxed_dapo`) instead of an `Answer:`
            line.

    Returns:
        `{"score": 1.0 | -1.0, "acc": bool, "pred": str}` (`pred`: the normalized predicted answer; the parts
        of a multi-part or hedged answer joined by ", ").

    Raises:
        ValueError: if `label` is None.
    """
    final = _final_answers(response, strict_box)
    gold = extract_label_answer(label)
    pairs = final_pairs(final, gold)
    acc = pairs is not None and all(grade_fast(pred, gold_part)[0] is True for pred, gold_part in pairs)
    pred = ", ".join(normalize_answer(answer) for answer in final.answers)
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


def preflight(cfg: Any) -> list[Problem]:
    """The record's pre-launch check: the score is a dict, so `--reward-key` must pick one of its numbers.

    Without it the run generated a whole rollout and then stopped at the first reward it read ("reward is a dict
    with keys [...]; set --reward-key"); `--reward-key pred` (the answer's text) stopped there too.

    Args:
        cfg: the run config; reads `reward_key` and `eval_reward_key` (eval falls back to `reward_key`).
    """
    problems = []
    for flag, key in (("--reward-key", cfg.reward_key), ("--eval-reward-key", cfg.eval_reward_key)):
        if key is None and flag == "--eval-reward-key":
            continue  # eval reads --reward-key
        if key not in SCORE_KEYS:
            given = "not set" if key is None else f"{key!r}, which is not a number of it"
            problems.append(Problem(message=(
                f"its reward is a dict {{'score': 1.0 or -1.0, 'acc': True or False, 'pred': the answer}}; {flag} is "
                f"{given}: set {flag} score (the DAPO recipe's) or acc"
            )))  # fmt: skip
    return problems
