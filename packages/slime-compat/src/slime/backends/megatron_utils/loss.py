"""`slime.backends.megatron_utils.loss`: the original's TIS functions and the losses a custom loss wraps.

Original launch scripts name `vanilla_tis_function` / `icepop_function` in `--custom-tis-function-path
slime.backends.megatron_utils.loss.icepop_function` and custom TIS functions call them; both accept the original's call
`fn(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs)` and run `slime_core.algorithms.tis`.
`policy_loss_function` and `sft_loss_function` are the built-in losses with the original's
`fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)`, for a `--custom-loss-function-path` that adds a term
to one of them (`slime_core.algorithms.compute_train_loss` says what `batch` and `logits` hold here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from slime_core.algorithms import compute_actor_loss, compute_sft_loss, tis

__all__ = ["icepop_function", "policy_loss_function", "sft_loss_function", "vanilla_tis_function"]


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


def policy_loss_function(
    args: Any, batch: dict[str, Any], logits: dict[str, list[torch.Tensor]], sum_of_sample_mean: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The `--loss-type policy_loss` loss of one micro-batch, called the original's way from a custom loss.

    Args:
        args: the run's args, as the custom loss got them.
        batch: the custom loss's batch (`log_probs` the old policy's, `advantages`, `loss_masks`,
            `loss_denominators`, `ref_log_probs`, `rollout_log_probs`, `total_lengths`: N per-sample entries).
        logits: the custom loss's `{"log_probs": N×[L_i], "entropy": N×[L_i]}` of the current policy (with grad).
        sum_of_sample_mean: the micro-batch reducer; the same one is built from `batch` here.

    Returns:
        `(loss, metrics)` of `slime_core.algorithms.compute_actor_loss`: a SUM over the samples, as the reducer's.

    Raises:
        ValueError: what `compute_actor_loss` raises (e.g. no advantages with
            `--disable-compute-advantages-and-returns`).
    """
    log_probs = logits["log_probs"]
    old = batch["log_probs"] if batch["log_probs"] is not None else [lp.detach() for lp in log_probs]
    if batch["advantages"] is None:
        raise ValueError("policy_loss_function needs advantages (drop --disable-compute-advantages-and-returns)")
    return compute_actor_loss(
        args,
        log_probs=log_probs,
        old_log_probs=old,
        advantages=batch["advantages"],
        loss_masks=batch["loss_masks"],
        loss_denominators=batch["loss_denominators"],
        ref_log_probs=batch["ref_log_probs"],
        rollout_log_probs=batch["rollout_log_probs"],
        entropy=logits["entropy"],
        total_lengths=batch["total_lengths"],
    )


def sft_loss_function(
    args: Any, batch: dict[str, Any], logits: dict[str, list[torch.Tensor]], sum_of_sample_mean: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The `--loss-type sft_loss` loss (`-reduce(log_probs)`) of one micro-batch, called the original's way.

    Args and Returns as `policy_loss_function` (`slime_core.algorithms.compute_sft_loss`).
    """
    return compute_sft_loss(
        args,
        log_probs=logits["log_probs"],
        loss_masks=batch["loss_masks"],
        loss_denominators=batch["loss_denominators"],
    )
