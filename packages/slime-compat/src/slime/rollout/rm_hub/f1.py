"""`slime.rollout.rm_hub.f1`: SQuAD token F1 (original module path)."""

from __future__ import annotations

from slime_rollout.rewards.f1 import f1_precision_recall, normalize_text

__all__ = ["f1_score", "normalize_answer"]

normalize_answer = normalize_text


def f1_score(prediction: str | None, ground_truth: str) -> tuple[float, float, float]:
    """`(f1, precision, recall)` of the normalized tokens (Rajpurkar et al., 2016); zeros for a None prediction."""
    if prediction is None:
        return 0.0, 0.0, 0.0
    return f1_precision_recall(prediction, ground_truth)
