"""Train/inference mismatch correction (`--use-tis`): importance weights on the policy loss.

Legend: `N` samples, `L_i` response length, `T = Σ L_i`; per-token tensors `[T]` float32.

`vanilla_tis_function` (truncated IS) and `icepop_function` have the signature of
`--custom-tis-function-path`, so either can also be named there:
`fn(*, args, pg_loss [T], train_log_probs N×[L_i], rollout_log_probs N×[L_i], loss_masks N×[L_i],
total_lengths, response_lengths) -> (pg_loss [T], loss_masks N×[L_i], metrics {name: [T]})`.
"""

from __future__ import annotations

import logging

import torch

from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["compute_tis_weights", "icepop_function", "vanilla_tis_function"]

_MAX_LOG_RATIO = 20.0  # exp(±20) stays finite in fp32; beyond it a weight is clipped anyway


def compute_tis_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    tis_clip_low: float,
    tis_clip: float,
    mode: str = "truncate",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights correcting the trainer/engine mismatch (`--use-tis`).

    `w = exp(lp_old - lp_roll)`; "truncate" (truncated IS, Yao et al. 2025 "Your efficient RL framework
    secretly brings you off-policy RL training") clamps `w` to `[tis_clip_low, tis_clip]`; "icepop"
    (Ling team, 2025) sets `w = 0` outside that range and keeps it unchanged inside.

    Args:
        old_log_probs: `[T]` trainer log-probs of the rollout policy.
        rollout_log_probs: `[T]` engine log-probs.
        tis_clip_low: lower bound (`--tis-clip-low`, 0).
        tis_clip: upper bound (`--tis-clip`, 2.0).
        mode: "truncate" or "icepop" (`--tis-mode`).

    Returns:
        `(weights [T], clipfrac [T])`, both detached; clipfrac is 1.0 where `w` was changed.

    Raises:
        ValueError: on an unknown mode.
    """
    raw = torch.exp((old_log_probs - rollout_log_probs).detach().float().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    if mode == "truncate":
        weights = raw.clamp(tis_clip_low, tis_clip)
    elif mode == "icepop":
        weights = torch.where((raw >= tis_clip_low) & (raw <= tis_clip), raw, torch.zeros_like(raw))
    else:
        raise ValueError(f"unknown --tis-mode {mode!r}; known: ['truncate', 'icepop']")
    return weights, (weights != raw).float()


def _concat(tensors, like: torch.Tensor) -> torch.Tensor:
    return torch.cat([like.new_zeros(0, dtype=torch.float32)] + [t.float().to(like.device) for t in tensors])


def _tis(mode: str, cfg: SlimeArgs, pg_loss: torch.Tensor, train_log_probs, rollout_log_probs, loss_masks):
    old = _concat(train_log_probs, pg_loss)
    roll = _concat(rollout_log_probs, pg_loss)
    weights, clipfrac = compute_tis_weights(old, roll, cfg.tis_clip_low, cfg.tis_clip, mode)
    raw = torch.exp((old - roll).detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    # As in the original: `tis` is the raw ratio exp(old - rollout), not the applied (clamped / zeroed) weight,
    # so the metric shows the mismatch itself; how much of it the weights cut is `tis_clipfrac`.
    metrics = {"tis": raw, "tis_clipfrac": clipfrac, "tis_abs": (raw - 1).abs()}
    return pg_loss * weights, loss_masks, metrics


def vanilla_tis_function(
    *,
    args: SlimeArgs,
    pg_loss,
    train_log_probs,
    rollout_log_probs,
    loss_masks,
    total_lengths=None,
    response_lengths=None,
):
    """Truncated IS: `pg_loss · clamp(exp(lp_old - lp_roll), tis_clip_low, tis_clip)`; masks unchanged.

    Returns:
        `(pg_loss [T], loss_masks, {"tis", "tis_clipfrac", "tis_abs": [T]})`: `tis = exp(Δ)` the raw ratio
        (`Δ = lp_old - lp_roll`, clamped to ±20 before exp), `tis_clipfrac` 1 where the weight differs from it,
        `tis_abs = |exp(Δ) - 1|` (the original's metrics).
    """
    return _tis("truncate", args, pg_loss, train_log_probs, rollout_log_probs, loss_masks)


def icepop_function(
    *,
    args: SlimeArgs,
    pg_loss,
    train_log_probs,
    rollout_log_probs,
    loss_masks,
    total_lengths=None,
    response_lengths=None,
):
    """IcePop: weight `exp(lp_old - lp_roll)` kept inside `[tis_clip_low, tis_clip]`, 0 outside.

    Returns:
        `(pg_loss [T], loss_masks, {"tis", "tis_clipfrac", "tis_abs": [T]})`, as `vanilla_tis_function`'s
        (`tis` is the raw ratio, `tis_clipfrac` 1 where the weight was zeroed).
    """
    return _tis("icepop", args, pg_loss, train_log_probs, rollout_log_probs, loss_masks)
