"""Token accounting of one training rollout on the trainer side: which tokens carried a gradient.

A response token moves the policy-gradient term only when it is trainable (loss mask 1) and its advantage is
non-zero. GRPO-style estimators give every token of a group with equal rewards an advantage of exactly 0
(`slime_core.reward_postprocess._normalize_group` writes exact zeros), so those tokens cost generation and
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
    if advantages is not None:
        for i, (adv, mask) in enumerate(zip(advantages, loss_masks, strict=True)):
            if adv.shape != mask.shape:
                raise ValueError(f"sample {i}: advantages {tuple(adv.shape)} vs loss mask {tuple(mask.shape)}")
    if not loss_masks:
        return {"tokens_trained": 0.0, "tokens_zero_advantage": 0.0}
    # All samples at once on the host (the advantages are host tensors; `.cpu()` is then free).
    trainable = torch.cat([m.reshape(-1).cpu() for m in loss_masks]) != 0
    if advantages is None:
        trained, zero = int(trainable.sum()), 0
    else:
        nonzero = torch.cat([a.detach().reshape(-1).cpu() for a in advantages]) != 0
        trained, zero = int((trainable & nonzero).sum()), int((trainable & ~nonzero).sum())
    return {"tokens_trained": float(trained), "tokens_zero_advantage": float(zero)}
