"""Token accounting of one training rollout on the trainer side: which tokens carried a gradient.

A response token moves the policy-gradient term only when it is trainable (loss mask 1) and its advantage is
non-zero. GRPO-style estimators give every token of a group with equal rewards an advantage of exactly 0
(`slime_core.train_data._normalize_group` writes exact zeros), so those tokens cost generation and
forward/backward time and teach nothing. The counts here feed the `goodput/*` metrics of the run loop.

Legend: `N` samples on this rank, `L_i` response length of sample i.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["trained_token_sums"]


def trained_token_sums(
    advantages: Sequence[torch.Tensor] | None, loss_masks: Sequence[torch.Tensor]
) -> dict[str, float]:
    """Counts this rank's trainable tokens with a non-zero and with a zero advantage.

    Args:
        advantages: N `[L_i]` float advantages, or None when the loss uses none (`--loss-type sft_loss` and
            custom losses with `--disable-compute-advantages-and-returns`: every trainable token then carries
            a gradient).
        loss_masks: N `[L_i]` float32 in {0, 1}.

    Returns:
        `{"tokens_trained": ..., "tokens_zero_advantage": ...}` as floats (sums for
        `StepBackend.reduce_metric_sums`).

    Raises:
        ValueError: an advantage and a mask of different lengths.
    """
    trained = 0
    zero = 0
    for i, mask in enumerate(loss_masks):
        trainable = mask != 0
        if advantages is None:
            trained += int(trainable.sum())
            continue
        adv = advantages[i]
        if adv.shape != mask.shape:
            raise ValueError(f"sample {i}: advantages {tuple(adv.shape)} vs loss mask {tuple(mask.shape)}")
        nonzero = adv.detach().to(mask.device) != 0
        trained += int((trainable & nonzero).sum())
        zero += int((trainable & ~nonzero).sum())
    return {"tokens_trained": float(trained), "tokens_zero_advantage": float(zero)}
