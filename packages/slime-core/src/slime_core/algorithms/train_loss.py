"""`compute_train_loss`: the `--loss-type` dispatch both training backends call once per micro-batch.

Legend: `N` samples in the micro-batch, `L_i` response length, `T = Σ L_i`.

* `policy_loss` (default): `compute_actor_loss` (PPO/GSPO/CISPO clip, entropy bonus, KL loss, TIS, OPSM).
* `sft_loss`: `compute_sft_loss`, the negative log-likelihood `-reduce(lp)` of the masked response tokens.
* `custom_loss`: the function at `--custom-loss-function-path`, with the original slime signature
  `fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)`.

Whatever the loss type, the result is a SUM over the micro-batch's samples (the reducer's contract); the
backend divides it by the step's global sample count (or token count with `--calculate-per-token-loss`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from slime_core.algorithms.objective import compute_actor_loss
from slime_core.algorithms.reducers import default_reducer
from slime_core.algorithms.sft_loss import compute_sft_loss
from slime_core.plugins import load_function

logger = logging.getLogger(__name__)

__all__ = ["LOSS_TYPES", "compute_train_loss", "needs_old_log_probs"]

LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss")


def needs_old_log_probs(args: Any) -> bool:
    """Whether the trainer must compute old-policy log-probs before training.

    Not for `sft_loss` without reward-shaping KL (`--kl-coef`): the NLL never looks at them, so a backend
    can skip that forward pass.
    """
    return getattr(args, "loss_type", "policy_loss") != "sft_loss" or float(getattr(args, "kl_coef", 0.0) or 0.0) != 0


def _custom_loss(args: Any, batch: dict[str, Any], outputs: dict[str, list[torch.Tensor]], reduce) -> tuple:
    fn = load_function(args.custom_loss_function_path, flag="--custom-loss-function-path")
    result = fn(args, batch, outputs, reduce)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
        raise ValueError(
            f"--custom-loss-function-path {args.custom_loss_function_path}: must return (loss, metrics dict), "
            f"got {type(result).__name__}"
        )
    loss, metrics = result
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError(f"--custom-loss-function-path {args.custom_loss_function_path}: loss must be a scalar tensor")
    out = {k: torch.as_tensor(v, dtype=torch.float32, device=loss.device).detach() for k, v in metrics.items()}
    out.setdefault("loss", loss.detach())
    return loss, out


def compute_train_loss(
    args: Any,
    *,
    log_probs: list[torch.Tensor],
    old_log_probs: list[torch.Tensor] | None,
    advantages: list[torch.Tensor] | None,
    loss_masks: list[torch.Tensor],
    loss_denominators: list[float],
    ref_log_probs: list[torch.Tensor] | None = None,
    rollout_log_probs: list[torch.Tensor] | None = None,
    entropy: list[torch.Tensor] | None = None,
    total_lengths: list[int] | None = None,
    tokens: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Training loss of one micro-batch for `args.loss_type`, a SUM over its samples.

    For `custom_loss` the plugin is called as `fn(args, batch, logits, sum_of_sample_mean)`:

    * `batch`: dict of per-sample lists (the original rollout-data keys): `tokens` N×`[T_i]` int64,
      `total_lengths`, `response_lengths`, `loss_masks` N×`[L_i]`, `loss_denominators`, `advantages`
      N×`[L_i]` (None with `--disable-compute-advantages-and-returns`), `log_probs` (OLD policy, N×`[L_i]`,
      may be None), `ref_log_probs`, `rollout_log_probs` (None when absent).
    * `logits`: neither backend materializes the full `[T, V]` logits (FSDP computes the `lm_head` chunk
      by chunk, Megatron shards the vocabulary over TP), so this argument is the current policy's outputs
      at the response tokens: `{"log_probs": N×[L_i] (with grad), "entropy": N×[L_i] (with grad)}` at
      `--rollout-temperature`.
    * `sum_of_sample_mean`: the micro-batch reducer `Tensor[T] -> scalar` (per-token sum with
      `--calculate-per-token-loss`), applied to concatenated per-token values.

    It must return `(loss, metrics)`: a scalar tensor with grad that is a SUM over samples like the
    reducer's output, and a dict of scalar metrics (summed the same way; a `loss` entry is added if absent).

    Args:
        args: run config; reads `loss_type` ("policy_loss"), `custom_loss_function_path`, and what
            `compute_actor_loss` / `compute_sft_loss` read.
        log_probs: N `[L_i]` float32 current log-probs (requires grad).
        old_log_probs: N `[L_i]` old-policy log-probs; required for `policy_loss`.
        advantages: N `[L_i]`; required for `policy_loss`.
        loss_masks: N `[L_i]` in {0, 1}.
        loss_denominators: N floats.
        ref_log_probs: N `[L_i]` reference log-probs (as in `compute_actor_loss`).
        rollout_log_probs: N `[L_i]` engine log-probs (as in `compute_actor_loss`).
        entropy: N `[L_i]` per-token entropies (as in `compute_actor_loss`).
        total_lengths: N prompt+response lengths.
        tokens: N `[T_i]` prompt+response tokens (only given to a custom loss).

    Returns:
        `(loss, metrics)` with detached scalar metrics.

    Raises:
        ValueError: unknown `--loss-type`, `policy_loss` without advantages or old log-probs, or a custom
            loss returning something else than `(scalar tensor, dict)`.
        slime_core.plugins.PluginError: `--custom-loss-function-path` cannot be loaded.
    """
    loss_type = getattr(args, "loss_type", "policy_loss")
    if loss_type == "policy_loss":
        if advantages is None or old_log_probs is None:
            raise ValueError(
                "--loss-type policy_loss needs advantages and old log-probs "
                "(drop --disable-compute-advantages-and-returns, or use --loss-type sft_loss / custom_loss)"
            )
        return compute_actor_loss(
            args,
            log_probs=log_probs,
            old_log_probs=old_log_probs,
            advantages=advantages,
            loss_masks=loss_masks,
            loss_denominators=loss_denominators,
            ref_log_probs=ref_log_probs,
            rollout_log_probs=rollout_log_probs,
            entropy=entropy,
            total_lengths=total_lengths,
        )
    if loss_type == "sft_loss":
        return compute_sft_loss(args, log_probs=log_probs, loss_masks=loss_masks, loss_denominators=loss_denominators)
    if loss_type == "custom_loss":
        lengths = [int(m.shape[0]) for m in loss_masks]
        per_token = getattr(args, "calculate_per_token_loss", False)
        reduce = default_reducer(per_token, lengths, loss_masks, loss_denominators)
        batch = {
            "tokens": tokens,
            "total_lengths": total_lengths,
            "response_lengths": lengths,
            "loss_masks": loss_masks,
            "loss_denominators": loss_denominators,
            "advantages": advantages,
            "log_probs": old_log_probs,
            "ref_log_probs": ref_log_probs,
            "rollout_log_probs": rollout_log_probs,
        }
        return _custom_loss(args, batch, {"log_probs": log_probs, "entropy": entropy}, reduce)
    raise ValueError(f"unknown --loss-type {loss_type!r}; known: {', '.join(LOSS_TYPES)}")
