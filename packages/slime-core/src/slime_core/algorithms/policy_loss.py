"""Policy-gradient losses (PPO clip, GSPO, CISPO) and off-policy sequence masking (OPSM).

Legend: `T` = concatenated response tokens of a micro-batch (`Σ L_i`); every per-token tensor is
`[T]` float32. `ppo_kl = lp_old - lp` (natural log), `ρ = exp(-ppo_kl) = π_θ/π_old`.

Each registered policy loss returns per-token `(loss, clipfrac, ppo_kl)`; the caller masks and
reduces them (see `reducers`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from slime_core.algorithms.reducers import segment_sums
from slime_core.algorithms.registry import register_policy_loss
from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "compute_cispo_loss",
    "compute_opsm_mask",
    "compute_policy_loss",
    "sequence_mean_ppo_kl",
]

# Log-ratios are clamped to ±20 before exp (ratio ∈ [2e-9, 4.9e8]): beyond that the update is
# meaningless and an fp32 overflow would turn the loss into inf/NaN.
_MAX_LOG_RATIO = 20.0


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(min=-_MAX_LOG_RATIO, max=_MAX_LOG_RATIO))


def compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), asymmetric and dual clip.

    `L1 = -ρA`, `L2 = -clip(ρ, 1-ε, 1+ε_high)·A`, `L = max(L1, L2)`; with dual clip
    (Ye et al. 2020, arXiv:1912.09729) `L = min(-c·A, max(L1, L2))` where `A < 0`.

    Args:
        ppo_kl: `[T]` `lp_old - lp` (carries the gradient through lp).
        advantages: `[T]`.
        eps_clip: ε (`--eps-clip`).
        eps_clip_high: ε_high (`--eps-clip-high`).
        eps_clip_c: dual-clip bound c > 1 (`--eps-clip-c`), or None.

    Returns:
        `(loss [T], clipfrac [T])`; clipfrac is 1.0 where `L2 > L1` (the clipped branch is active).

    Raises:
        ValueError: if `eps_clip_c` is given and not > 1.
    """
    ratio = _ratio(-ppo_kl)
    loss1 = -ratio * advantages
    loss2 = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * advantages
    loss = torch.maximum(loss1, loss2)
    clipfrac = (loss2 > loss1).float()
    if eps_clip_c is not None:
        if not eps_clip_c > 1.0:
            raise ValueError(f"--eps-clip-c must be > 1, got {eps_clip_c}")
        dual = torch.minimum(-eps_clip_c * advantages, loss)
        loss = torch.where(advantages < 0, dual, loss)
    return loss, clipfrac


def compute_cispo_loss(
    ppo_kl: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv:2506.13585): clipped IS weight, gradient through log-probs only.

    `L = -sg(clip(ρ, 1-ε, 1+ε_high))·A·lp`; every token keeps a gradient (no hard clipping).

    Args:
        ppo_kl: `[T]` `lp_old - lp` (only its value is used).
        log_probs: `[T]` current log-probs (requires grad).
        advantages: `[T]`.
        eps_clip: ε (canonical CISPO: 1.0, i.e. no lower bound).
        eps_clip_high: ε_high (canonical: ≈4).

    Returns:
        `(loss [T], clipfrac [T])`; clipfrac is 1.0 where the weight was clipped.
    """
    ratio = _ratio(-ppo_kl.detach())
    clipped = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    return -clipped * advantages * log_probs, (clipped != ratio).float()


def sequence_mean_ppo_kl(ppo_kl: torch.Tensor, loss_mask: torch.Tensor, response_lengths: Sequence[int]):
    """GSPO sequence-level log-ratio (Zheng et al. 2025, arXiv:2507.18071).

    `s_i = Σ_t ppo_kl_it·m_it / max(Σ_t m_it, 1)` broadcast to every token of sample i, so
    `exp(-s_i)` is the length-normalized sequence likelihood ratio. A masked token adds exactly 0, whatever its
    value (as in the loss reducers): a non-finite log-prob there (a tool token) does not make the sequence NaN.

    Args:
        ppo_kl: `[T]`.
        loss_mask: `[T]`.
        response_lengths: N ints summing to T.

    Returns:
        `[T]` float32.
    """
    mask = loss_mask.float()
    # where() rather than x·m: inf·0 is NaN, and one NaN token would poison its whole sequence's ratio.
    masked = torch.where(mask > 0, ppo_kl * mask, ppo_kl.new_zeros(()))
    per_seq = segment_sums(masked, response_lengths) / segment_sums(mask, response_lengths).clamp(min=1.0)
    lengths = torch.as_tensor(list(response_lengths), dtype=torch.long, device=ppo_kl.device)
    return torch.repeat_interleave(per_seq, lengths)


def compute_opsm_mask(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    response_lengths: Sequence[int],
    delta: float,
) -> torch.Tensor:
    """Off-policy sequence masking (`--use-opsm`, `--opsm-delta`): which tokens to drop.

    A token is dropped when its advantage is negative and its sequence's mean
    `Σ_t (lp_old - lp)·m / max(Σm, 1)` exceeds `delta` (the policy has drifted away from that sample).

    Args:
        ppo_kl: `[T]` `lp_old - lp` (detached by the caller).
        advantages: `[T]`.
        loss_mask: `[T]`.
        response_lengths: N ints summing to T.
        delta: threshold δ (1e-4).

    Returns:
        `[T]` float32, 1.0 on dropped tokens.
    """
    seq_kl = sequence_mean_ppo_kl(ppo_kl, loss_mask, response_lengths)
    return ((advantages < 0) & (seq_kl > delta)).float()


def _eps(cfg: SlimeArgs) -> tuple[float, float]:
    # None is the field's "same as --eps-clip" (validation fills it; a config copied without it keeps None).
    return cfg.eps_clip, cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high


@register_policy_loss("ppo")
def ppo_policy_loss(cfg: SlimeArgs, *, log_probs, old_log_probs, advantages, loss_mask, response_lengths):
    """Token-level PPO clip (`eps_clip`, `eps_clip_high`, `eps_clip_c`)."""
    ppo_kl = old_log_probs - log_probs
    loss, clipfrac = compute_policy_loss(ppo_kl, advantages, *_eps(cfg), cfg.eps_clip_c)
    return loss, clipfrac, ppo_kl


@register_policy_loss("gspo")
def gspo_policy_loss(cfg: SlimeArgs, *, log_probs, old_log_probs, advantages, loss_mask, response_lengths):
    """GSPO: PPO clip on the per-sequence mean log-ratio."""
    ppo_kl = sequence_mean_ppo_kl(old_log_probs - log_probs, loss_mask, response_lengths)
    loss, clipfrac = compute_policy_loss(ppo_kl, advantages, *_eps(cfg), cfg.eps_clip_c)
    return loss, clipfrac, ppo_kl


@register_policy_loss("cispo")
def cispo_policy_loss(cfg: SlimeArgs, *, log_probs, old_log_probs, advantages, loss_mask, response_lengths):
    """CISPO with `eps_clip`, `eps_clip_high`."""
    ppo_kl = old_log_probs - log_probs
    loss, clipfrac = compute_cispo_loss(ppo_kl, log_probs, advantages, *_eps(cfg))
    return loss, clipfrac, ppo_kl
