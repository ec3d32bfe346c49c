"""Per-token KL estimators between the policy and a base policy (ref or old).

Schulman, "Approximating KL Divergence" (2020): with `d = log π(x) - log π_base(x)` on samples
`x ~ π`, `k1 = d`, `k2 = d²/2`, `k3 = exp(-d) - 1 + d` (unbiased, non-negative, low variance).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

__all__ = ["KL_TYPES", "compute_approx_kl"]

KL_TYPES = ("k1", "k2", "k3", "low_var_kl")


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(π || π_base) (`--kl-loss-type`).

    With `d = log_probs - log_probs_base`:
    `k1 = d`; `k2 = d²/2`; `k3 = low_var_kl = exp(-d) - 1 + d`; `low_var_kl` is then clamped to
    `[-10, 10]` (as in the original, the clamp is applied after the importance weight).

    Args:
        log_probs: `[...]` float, current policy log-probs (natural log).
        log_probs_base: `[...]` float, same shape, base (reference) policy log-probs.
        kl_type: one of "k1", "k2", "k3", "low_var_kl".
        importance_ratio: optional `[...]` weight `π_θ/π_old = exp(lp - lp_old)` for the unbiased KL
            estimate of DeepSeek-V3.2 (`--use-unbiased-kl`); multiplied in before the clamp.

    Returns:
        `[...]` float32 per-token KL estimates.

    Raises:
        ValueError: on an unknown `kl_type` or mismatched shapes.
    """
    if log_probs.shape != log_probs_base.shape:
        raise ValueError(f"log_probs {tuple(log_probs.shape)} and base {tuple(log_probs_base.shape)} differ in shape")
    d = log_probs.float() - log_probs_base.float()
    if kl_type == "k1":
        kl = d
    elif kl_type == "k2":
        kl = d.square() / 2
    elif kl_type in ("k3", "low_var_kl"):
        kl = torch.exp(-d) - 1 + d
    else:
        raise ValueError(f"unknown kl type (--kl-loss-type) {kl_type!r}; known: {list(KL_TYPES)}")
    if importance_ratio is not None:
        kl = kl * importance_ratio.float()
    if kl_type == "low_var_kl":
        kl = kl.clamp(min=-10.0, max=10.0)
    return kl
