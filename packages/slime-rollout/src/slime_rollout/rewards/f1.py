"""`--rm-type f1`: SQuAD token-level F1 (Rajpurkar et al., 2016) between response and label."""

from __future__ import annotations

import collections
import re
import string

__all__ = ["f1_precision_recall", "f1_reward", "normalize_text"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_EXACT_ONLY = {"yes", "no", "noanswer"}


def normalize_text(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD normalization)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def f1_precision_recall(response: str, label: str) -> tuple[float, float, float]:
    """`(f1, precision, recall)` of the normalized tokens; `yes`/`no`/`noanswer` must match exactly.

    Args:
        response: predicted answer text.
        label: one ground-truth answer.

    Returns:
        Three floats in [0, 1]; all 0 when no token is shared.
    """
    pred, gold = normalize_text(str(response)), normalize_text(str(label))
    if (pred in _EXACT_ONLY or gold in _EXACT_ONLY) and pred != gold:
        return 0.0, 0.0, 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0, 0.0, 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1_reward(response: str, label: object) -> float:
    """Token F1 in [0, 1]; `yes`/`no`/`noanswer` answers must match exactly (F1 is then 0 or 1).

    Args:
        response: predicted answer text.
        label: ground-truth answer (a list of references takes the best F1).
    """
    if isinstance(label, list | tuple):
        return max((f1_reward(response, ref) for ref in label), default=0.0)
    return f1_precision_recall(response, str(label))[0]
