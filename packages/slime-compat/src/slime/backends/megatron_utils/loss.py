"""`slime.backends.megatron_utils.loss`: the original's `vanilla_tis_function` and `icepop_function`.

Original launch scripts name them in `--custom-tis-function-path slime.backends.megatron_utils.loss.icepop_function`
and custom TIS functions call them; both accept the original's call `fn(args, *, pg_loss, train_log_probs,
rollout_log_probs, loss_masks, **kwargs)` and run `slime_core.algorithms.tis`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from slime_core.algorithms import tis

__all__ = ["icepop_function", "vanilla_tis_function"]


TisResult = tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]


def _original_call(fn: Callable[..., TisResult], doc: str) -> Callable[..., TisResult]:
    """`fn` (keyword-only in `slime_core.algorithms.tis`) callable the original's way, `args` positional."""

    def call(
        args: Any,
        *,
        pg_loss: torch.Tensor,
        train_log_probs: list[torch.Tensor],
        rollout_log_probs: list[torch.Tensor],
        loss_masks: list[torch.Tensor],
        **kwargs: Any,
    ) -> TisResult:
        return fn(args=args, pg_loss=pg_loss, train_log_probs=train_log_probs, rollout_log_probs=rollout_log_probs,
                  loss_masks=loss_masks)  # fmt: skip

    call.__name__ = call.__qualname__ = fn.__name__
    call.__doc__ = doc + '\n\nReturns:\n    `(pg_loss [T], loss_masks, {"tis", "tis_clipfrac", "tis_abs": [T]})`.'
    return call


vanilla_tis_function = _original_call(
    tis.vanilla_tis_function,
    "Truncated IS: `pg_loss [T] · clamp(exp(lp_train - lp_rollout), --tis-clip-low, --tis-clip)`, masks unchanged.",
)
icepop_function = _original_call(
    tis.icepop_function,
    "IcePop: the weight `exp(lp_train - lp_rollout)` inside `[--tis-clip-low, --tis-clip]`, 0 outside.",
)
