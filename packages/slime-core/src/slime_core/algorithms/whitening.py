"""Masked advantage whitening (`--normalize-advantages`), split so a backend can all-reduce.

A backend computes `stats = whitening_stats(...)` on its rank, all-reduces `stats` (SUM) over its
DP×CP group, then calls `apply_whitening(..., stats)`; on one process it just passes the local
stats. Required by the REINFORCE++ estimators (Hu et al. 2025).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

__all__ = ["apply_whitening", "whitening_stats"]

_EPS = 1e-8


def whitening_stats(advantages: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """Masked moment sums `[Σm, ΣA·m, ΣA²·m]` over all samples.

    Args:
        advantages: N tensors `[L_i]`.
        masks: N tensors `[L_i]` in {0, 1}.

    Returns:
        `[3]` float64 on the advantages' device (float64 so millions of tokens sum without drift).

    Raises:
        ValueError: on mismatched lengths or shapes.
    """
    if len(advantages) != len(masks):
        raise ValueError(f"advantages has {len(advantages)} entries, masks has {len(masks)}")
    device = advantages[0].device if advantages else torch.device("cpu")
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    for i, (a, m) in enumerate(zip(advantages, masks, strict=True)):
        if a.shape != m.shape:
            raise ValueError(f"advantages[{i}] {tuple(a.shape)} and masks[{i}] {tuple(m.shape)} differ")
        a64, m64 = a.detach().double(), m.double()
        stats += torch.stack([m64.sum(), (a64 * m64).sum(), (a64.square() * m64).sum()])
    return stats


def apply_whitening(
    advantages: list[torch.Tensor],
    masks: list[torch.Tensor],
    stats: torch.Tensor,
    *,
    shift_mean: bool = True,
    epsilon: float = _EPS,
) -> list[torch.Tensor]:
    """Whiten advantages with (possibly all-reduced) masked moments.

    `μ = ΣAm/Σm`, `σ² = (ΣA²m/Σm - μ²)·N/(N-1)` with `N = Σm` (Bessel correction only when N > 1),
    `A ← (A - μ)/sqrt(σ² + ε)`, applied to every token (masked tokens do not enter the loss); with
    `shift_mean=False`, `A ← (A - μ)/sqrt(σ² + ε) + μ` (scaled around the mean, which is kept). These are the
    original's `distributed_masked_whiten(values, mask, shift_mean=True, epsilon=1e-8)` options; no flag of the
    original sets them, so the trainer uses the defaults. With `N = 0` the advantages are returned unchanged
    (the original raises; an all-masked batch trains on nothing either way).

    Args:
        advantages: N tensors `[L_i]`.
        masks: N tensors `[L_i]` (unused beyond shape checks; the masking is in `stats`).
        stats: `[3]` from `whitening_stats`, summed over the ranks that share the statistics.
        shift_mean: subtract the mean (True) or keep it (False).
        epsilon: ε added to the variance, > 0.

    Returns:
        N float32 tensors `[L_i]`.

    Raises:
        ValueError: if `stats` is not `[3]` or `epsilon` is not positive.
    """
    if stats.shape != (3,):
        raise ValueError(f"stats must be [3] (Σm, ΣAm, ΣA²m), got {tuple(stats.shape)}")
    if not epsilon > 0:
        raise ValueError(f"whitening epsilon must be > 0, got {epsilon}")
    count, total, total_sq = (float(s) for s in stats.double().cpu())
    if count <= 0:
        logger.warning("advantage whitening skipped: no trainable tokens")
        return [a.float().clone() for a in advantages]
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)  # max(): rounding can make it slightly negative
    if count > 1:
        var *= count / (count - 1)
    rstd = 1.0 / (var + epsilon) ** 0.5
    back = 0.0 if shift_mean else mean
    return [(a.float() - mean) * rstd + back for a in advantages]
