"""`compute_train_loss`: the `--loss-type` dispatch the shared train step calls once per micro-batch.

Legend: `N` samples in the micro-batch, `L_i` response length, `T = Σ L_i`.

* `policy_loss` (default): `compute_actor_loss` (PPO/GSPO/CISPO clip, entropy bonus, KL loss, TIS, OPSM).
* `sft_loss`: `compute_sft_loss`, the negative log-likelihood `-reduce(lp)` of the masked response tokens.
* `custom_loss`: the function at `--custom-loss-function-path`, with the original slime signature
  `fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)`.

Whatever the loss type, the result is a SUM over the micro-batch's samples (the reducer's contract); the
backend divides it by the step's global sample count (or token count with `--calculate-per-token-loss`).
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
from typing import Any

import torch

from slime_core.algorithms.objective import compute_actor_loss
from slime_core.algorithms.reducers import default_reducer
from slime_core.algorithms.sft_loss import compute_sft_loss
from slime_core.config import SlimeArgs, plugin_view
from slime_core.error_text import shape_or_type
from slime_core.hook_deadline import call_hook_with_deadline, hook_bounds, hook_label
from slime_core.plugins import load_function

logger = logging.getLogger(__name__)

__all__ = ["LOSS_TYPES", "LossInputs", "compute_train_loss", "needs_old_log_probs"]

LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LossInputs:
    """What the loss of one micro-batch is computed from: N samples, per-sample lists in sample order.

    Example:
        >>> lp = [torch.tensor([-0.5, -1.0], requires_grad=True)]
        >>> inputs = LossInputs(log_probs=lp, old_log_probs=[lp[0].detach()], advantages=[torch.ones(2)],
        ...     loss_masks=[torch.ones(2)], loss_denominators=[2.0])
        >>> inputs.response_lengths
        [2]

    Attributes:
        log_probs: N `[L_i]` float32 current log-probs of the response tokens (requires grad), natural log,
            at `--rollout-temperature`.
        old_log_probs: N `[L_i]` log-probs of the policy that produced the data (no grad); None only where
            the loss never reads them (`sft_loss`).
        advantages: N `[L_i]` float32; None with `--disable-compute-advantages-and-returns`.
        loss_masks: N `[L_i]` float32 in {0, 1}, 1 = trainable token.
        loss_denominators: N floats, each sample's denominator in the default per-sample token mean.
        ref_log_probs: N `[L_i]` reference-model log-probs (needed with `--use-kl-loss`), or None.
        rollout_log_probs: N `[L_i]` engine log-probs (needed with `--use-tis` / `--use-rollout-logprobs`),
            or None.
        entropy: N `[L_i]` per-token entropies of the current policy (with grad when a loss term uses it),
            or None.
        total_lengths: N prompt+response lengths `T_i` (a custom reducer / custom loss reads them), or None.
        tokens: N `[T_i]` int64 prompt+response ids (only given to a custom loss), or None.
        train_log_probs: N `[L_i]` trainer log-probs of the sampling policy where `old_log_probs` are the
            engine's (`--use-rollout-logprobs` with `--get-mismatch-metrics`), or None.
        returns: N `[L_i]` returns of the advantage estimator (only given to a custom loss), or None.
        values: N `[L_i]` critic values (PPO; only given to a custom loss), or None.
        teacher_log_probs: N `[L_i]` OPD teacher log-probs (only given to a custom loss), or None.
    """

    log_probs: list[torch.Tensor]
    old_log_probs: list[torch.Tensor] | None
    advantages: list[torch.Tensor] | None
    loss_masks: list[torch.Tensor]
    loss_denominators: list[float]
    ref_log_probs: list[torch.Tensor] | None = None
    rollout_log_probs: list[torch.Tensor] | None = None
    entropy: list[torch.Tensor] | None = None
    total_lengths: list[int] | None = None
    tokens: list[torch.Tensor] | None = None
    train_log_probs: list[torch.Tensor] | None = None
    returns: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None
    teacher_log_probs: list[torch.Tensor] | None = None

    @property
    def response_lengths(self) -> list[int]:
        """`L_i` for each sample (from the loss masks)."""
        return [int(m.shape[0]) for m in self.loss_masks]


def needs_old_log_probs(cfg: SlimeArgs) -> bool:
    """Whether the trainer must compute old-policy log-probs before training.

    Not for `sft_loss` without reward-shaping KL (`--kl-coef`): the NLL never looks at them, so a backend
    can skip that forward pass.
    """
    return cfg.loss_type != "sft_loss" or cfg.kl_coef != 0


def _custom_loss(args: SlimeArgs, batch: dict[str, Any], outputs: dict[str, list[torch.Tensor]], reduce) -> tuple:
    # A user plugin: it receives the config as `args`, the original signature.
    fn = load_function(args.custom_loss_function_path, flag="--custom-loss-function-path")
    what = hook_label(f"--custom-loss-function-path {args.custom_loss_function_path}")
    result = call_hook_with_deadline(fn, plugin_view(args), batch, outputs, reduce, what=what, **hook_bounds(args))
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
        raise ValueError(f"{what}: must return (loss, metrics dict), got {type(result).__name__}")
    loss, metrics = result
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError(f"{what}: loss must be a scalar tensor")
    out = {}
    for name, value in metrics.items():
        # The original packs them into one tensor of scalars: a per-token metric or a string failed here as a bare
        # torch error, or (a [T] tensor) was summed over micro-batches of other sizes far from here.
        if not (isinstance(value, numbers.Real) or (isinstance(value, torch.Tensor) and value.numel() == 1)):
            raise ValueError(
                f"{what}: metric {name!r} ({shape_or_type(value)}) is not a scalar (a number or a one-element tensor)"
            )
        out[name] = torch.as_tensor(value, dtype=torch.float32, device=loss.device).detach().reshape(())
    out.setdefault("loss", loss.detach())
    return loss, out


def compute_train_loss(cfg: SlimeArgs, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Training loss of one micro-batch for `--loss-type`, a SUM over its samples.

    For `custom_loss` the plugin is called as `fn(args, batch, logits, sum_of_sample_mean)`:

    * `batch`: dict of per-sample lists (the original rollout-data keys): `tokens` (and, as the original names
      them, `unconcat_tokens`) N×`[T_i]` int64, `total_lengths`, `response_lengths`, `loss_masks` N×`[L_i]`,
      `loss_denominators` (also as `rollout_mask_sums`: each sample's rollout's trainable tokens, at least 1),
      `advantages` and `returns` N×`[L_i]` (None with `--disable-compute-advantages-and-returns`), `log_probs`
      (OLD policy, N×`[L_i]`, may be None), `ref_log_probs`, `rollout_log_probs`, `values` (PPO's critic),
      `teacher_log_probs` (OPD) (None when absent).
    * `logits`: neither backend materializes the full `[T, V]` logits (FSDP computes the `lm_head` chunk
      by chunk, Megatron shards the vocabulary over TP), so this argument is the current policy's outputs
      at the response tokens: `{"log_probs": N×[L_i] (with grad), "entropy": N×[L_i] (with grad)}` at
      `--rollout-temperature`.
    * `sum_of_sample_mean`: the micro-batch reducer `Tensor[T] -> scalar` (per-token sum with
      `--calculate-per-token-loss`), applied to concatenated per-token values.

    It must return `(loss, metrics)`: a scalar tensor with grad that is a SUM over samples like the
    reducer's output, and a dict of scalar metrics (summed the same way; a `loss` entry is added if absent).

    Args:
        cfg: run config; reads `loss_type`, `custom_loss_function_path`, `calculate_per_token_loss` and what
            `compute_actor_loss` / `compute_sft_loss` read. A custom loss receives it as `args`.
        inputs: the micro-batch's per-sample tensors (`LossInputs`).

    Returns:
        `(loss, metrics)` with detached scalar metrics.

    Raises:
        ValueError: unknown `--loss-type`, `policy_loss` without advantages or old log-probs, or a custom
            loss returning something else than `(scalar tensor, dict)`.
        slime_core.plugins.PluginError: `--custom-loss-function-path` cannot be loaded.
    """
    loss_type = cfg.loss_type
    if loss_type == "policy_loss":
        if inputs.advantages is None or inputs.old_log_probs is None:
            raise ValueError(
                "--loss-type policy_loss needs advantages and old log-probs "
                "(drop --disable-compute-advantages-and-returns, or use --loss-type sft_loss / custom_loss)"
            )
        return compute_actor_loss(
            cfg,
            log_probs=inputs.log_probs,
            old_log_probs=inputs.old_log_probs,
            advantages=inputs.advantages,
            loss_masks=inputs.loss_masks,
            loss_denominators=inputs.loss_denominators,
            ref_log_probs=inputs.ref_log_probs,
            rollout_log_probs=inputs.rollout_log_probs,
            entropy=inputs.entropy,
            total_lengths=inputs.total_lengths,
            train_log_probs=inputs.train_log_probs,
        )
    if loss_type == "sft_loss":
        return compute_sft_loss(
            cfg, log_probs=inputs.log_probs, loss_masks=inputs.loss_masks, loss_denominators=inputs.loss_denominators
        )
    if loss_type == "custom_loss":
        lengths = inputs.response_lengths
        reduce = default_reducer(cfg.calculate_per_token_loss, lengths, inputs.loss_masks, inputs.loss_denominators)
        batch = {
            "tokens": inputs.tokens,
            "unconcat_tokens": inputs.tokens,  # the original's name for the per-sample ids
            "total_lengths": inputs.total_lengths,
            "response_lengths": lengths,
            "loss_masks": inputs.loss_masks,
            "loss_denominators": inputs.loss_denominators,
            "rollout_mask_sums": inputs.loss_denominators,  # what the original's get_sum_of_sample_mean takes
            "advantages": inputs.advantages,
            "returns": inputs.returns,
            "log_probs": inputs.old_log_probs,
            "ref_log_probs": inputs.ref_log_probs,
            "rollout_log_probs": inputs.rollout_log_probs,
            "values": inputs.values,
            "teacher_log_probs": inputs.teacher_log_probs,
        }
        return _custom_loss(cfg, batch, {"log_probs": inputs.log_probs, "entropy": inputs.entropy}, reduce)
    raise ValueError(f"unknown --loss-type {loss_type!r}; known: {', '.join(LOSS_TYPES)}")
