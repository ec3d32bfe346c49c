"""Small QA rewards for environments: normalized exact match, token F1 and a format score.

The normalization is the usual SQuAD one (lower case, drop punctuation and the articles a/an/the,
collapse whitespace), as used by Search-R1's `qa_em` scorer. Math grading lives on the rollout side
(`slime_rollout.rewards`); slime-envs deliberately does not import it.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Iterable

__all__ = ["em_with_format", "exact_match", "f1_score", "normalize_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-cases, removes punctuation and articles, and collapses whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(label: str | Iterable[str]) -> list[str]:
    if isinstance(label, str):
        return [label]
    golds = [str(x) for x in label]
    if not golds:
        raise ValueError("label has no gold answers")
    return golds


def exact_match(prediction: str | None, label: str | Iterable[str]) -> float:
    """1.0 if the normalized prediction equals any normalized gold answer, else 0.0.

    Args:
        prediction: the model's answer (None counts as wrong).
        label: one gold answer or a list of acceptable ones.
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(label)))


def f1_score(prediction: str | None, label: str | Iterable[str]) -> float:
    """Max over gold answers of the token-level F1 of the normalized strings (SQuAD v1.1).

    F1 = 2PR / (P + R) with P = |common| / |pred tokens|, R = |common| / |gold tokens|, where common
    counts tokens with multiplicity.
    """
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in _golds(label):
        gold_tokens = normalize_answer(gold).split()
        common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
        num_same = sum(common.values())
        if num_same == 0:
            continue
        precision = num_same / len(pred_tokens)
        recall = num_same / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def em_with_format(
    prediction: str | None, label: str | Iterable[str], *, well_formed: bool, format_score: float = 0.0
) -> float:
    """Search-R1 style reward: 1.0 for a correct answer, `format_score` for a well-formed wrong one.

    Args:
        prediction: the extracted answer, or None if the response has no answer.
        label: gold answer(s).
        well_formed: whether the trajectory followed the expected tag format.
        format_score: reward for a well-formed but wrong (or missing) answer, e.g. 0.2.
    """
    if exact_match(prediction, label) == 1.0:
        return 1.0
    return format_score if well_formed else 0.0
