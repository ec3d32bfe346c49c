"""Clipped value loss for the PPO critic (`--advantage-estimator ppo`).

Legend: `T` = concatenated response tokens of a micro-batch, per-token tensors `[T]` float32.
"""

from __future__ import annotations

import logging

import torch

from slime_core.algorithms._flatten import concat_per_sample
from slime_core.algorithms.reducers import default_reducer
from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["compute_critic_loss", "compute_value_loss"]


def compute_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    value_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss (PPO, Schulman et al. 2017; as in slime `loss.py`).

    `V_clip = V_old + clamp(V - V_old, -c, c)`, `L = max((V_clip - R)², (V - R)²)` (no ½ factor).

    Args:
        values: `[T]` current critic values (requires grad).
        old_values: `[T]` values at rollout time.
        returns: `[T]` GAE returns.
        value_clip: c (`--value-clip`, 0.2).

    Returns:
        `(loss [T], clipfrac [T])`; clipfrac is 1.0 where `|V - V_old| > c`.
    """
    values, old_values, returns = values.float(), old_values.float(), returns.float()
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    loss = torch.maximum((clipped - returns).square(), (values - returns).square())
    clipfrac = ((values - old_values).abs() > value_clip).float()
    return loss, clipfrac


def compute_critic_loss(
    cfg: SlimeArgs,
    *,
    values: list[torch.Tensor],
    old_values: list[torch.Tensor],
    returns: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    loss_denominators: list[float],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Micro-batch critic loss, reduced like `compute_actor_loss` (a SUM over samples).

    Args:
        cfg: reads `value_clip`, `calculate_per_token_loss`.
        values: N `[L_i]` current values (requires grad).
        old_values: N `[L_i]`.
        returns: N `[L_i]`.
        loss_masks: N `[L_i]`.
        loss_denominators: N floats.

    Returns:
        `(loss, {"value_loss", "value_clipfrac"})`, metrics detached scalars.

    Raises:
        ValueError: on mismatched shapes.
    """
    lengths = [int(m.shape[0]) for m in loss_masks]
    mask = concat_per_sample("loss_masks", loss_masks, lengths)
    reduce = default_reducer(cfg.calculate_per_token_loss, lengths, mask, loss_denominators)
    loss_tok, clipfrac = compute_value_loss(
        concat_per_sample("values", values, lengths),
        concat_per_sample("old_values", old_values, lengths),
        concat_per_sample("returns", returns, lengths),
        cfg.value_clip,
    )
    loss = reduce(loss_tok)
    return loss, {"value_loss": loss.detach(), "value_clipfrac": reduce(clipfrac).detach()}
