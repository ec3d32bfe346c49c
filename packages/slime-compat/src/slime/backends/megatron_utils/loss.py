"""`slime.backends.megatron_utils.loss`: the original's `vanilla_tis_function` and `icepop_function`.

Original launch scripts name them in `--custom-tis-function-path slime.backends.megatron_utils.loss.icepop_function`
and custom TIS functions call them; both accept the original's call `fn(args, *, pg_loss, train_log_probs,
rollout_log_probs, loss_masks, **kwargs)` and run `slime_core.algorithms.tis`.
"""

from __future__ import annotations

from typing import Any

import torch

from slime_core.algorithms import tis

__all__ = ["icepop_function", "vanilla_tis_function"]


def vanilla_tis_function(
    args: Any,
    *,
    pg_loss: torch.Tensor,
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """Truncated IS: `pg_loss [T] · clamp(exp(lp_train - lp_rollout), --tis-clip-low, --tis-clip)`, masks unchanged.

    Returns:
        `(pg_loss [T], loss_masks, {"tis", "tis_clipfrac", "tis_abs": [T]})` (`slime_core.algorithms.tis`).
    """
    return tis.vanilla_tis_function(
        args=args,
        pg_loss=pg_loss,
        train_log_probs=train_log_probs,
        rollout_log_probs=rollout_log_probs,
        loss_masks=loss_masks,
    )


def icepop_function(
    args: Any,
    *,
    pg_loss: torch.Tensor,
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """IcePop: the weight `exp(lp_train - lp_rollout)` inside `[--tis-clip-low, --tis-clip]`, 0 outside.

    Returns:
        `(pg_loss [T], loss_masks, {"tis", "tis_clipfrac", "tis_abs": [T]})` (`slime_core.algorithms.tis`).
    """
    return tis.icepop_function(
        args=args,
        pg_loss=pg_loss,
        train_log_probs=train_log_probs,
        rollout_log_probs=rollout_log_probs,
        loss_masks=loss_masks,
    )
