"""Supervised fine-tuning loss (`--loss-type sft_loss`): negative log-likelihood of masked tokens."""

from __future__ import annotations

import logging

import torch

from slime_core.algorithms._flatten import concat_per_sample
from slime_core.algorithms.reducers import default_reducer
from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["compute_sft_loss"]


def compute_sft_loss(
    cfg: SlimeArgs,
    *,
    log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    loss_denominators: list[float],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`sft_loss = -reduce(lp)`, a SUM over samples like `compute_actor_loss`.

    Args:
        cfg: reads `calculate_per_token_loss`.
        log_probs: N `[L_i]` response log-probs (requires grad).
        loss_masks: N `[L_i]`.
        loss_denominators: N floats.

    Returns:
        `(loss, {"loss"})`, the metric detached.

    Raises:
        ValueError: on mismatched shapes.
    """
    lengths = [int(m.shape[0]) for m in loss_masks]
    mask = concat_per_sample("loss_masks", loss_masks, lengths)
    reduce = default_reducer(cfg.calculate_per_token_loss, lengths, mask, loss_denominators)
    loss = -reduce(concat_per_sample("log_probs", log_probs, lengths))
    return loss, {"loss": loss.detach()}
