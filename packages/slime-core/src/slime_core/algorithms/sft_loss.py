"""Supervised fine-tuning loss (`--loss-type sft_loss`): negative log-likelihood of masked tokens."""

from __future__ import annotations

import logging
from typing import Any

import torch

from slime_core.algorithms._flatten import concat_per_sample
from slime_core.algorithms.reducers import default_reducer

logger = logging.getLogger(__name__)

__all__ = ["compute_sft_loss"]


def compute_sft_loss(
    args: Any,
    *,
    log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    loss_denominators: list[float],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`sft_loss = -reduce(lp)`, a SUM over samples like `compute_actor_loss`.

    Args:
        args: reads `calculate_per_token_loss` (False).
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
    reduce = default_reducer(getattr(args, "calculate_per_token_loss", False), lengths, mask, loss_denominators)
    loss = -reduce(concat_per_sample("log_probs", log_probs, lengths))
    return loss, {"loss": loss.detach()}
