"""`compute_actor_loss`: the policy objective both training backends call once per micro-batch.

Legend: `N` samples in the micro-batch, `L_i` response length, `T = Σ L_i`.

    loss = pg_loss - entropy_coef·entropy_loss + kl_loss_coef·kl_loss

Every term is reduced to a SUM over the micro-batch's samples (default: each sample's masked token
sum divided by its loss denominator; `--calculate-per-token-loss`: the masked token sum). The backend
divides by the step's global sample count (or token count), so micro-batches and DP ranks add up.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

import torch

from slime_core.algorithms._flatten import concat_per_sample
from slime_core.algorithms.kl import compute_approx_kl
from slime_core.algorithms.mis import compute_mis_weights_with_cp, mismatch_metrics
from slime_core.algorithms.policy_loss import compute_opsm_mask
from slime_core.algorithms.reducers import Reducer, default_reducer, segment_sums
from slime_core.algorithms.registry import get_policy_loss
from slime_core.algorithms.tis import icepop_function, vanilla_tis_function
from slime_core.config import SlimeArgs, plugin_view
from slime_core.config.mismatch import uses_mis_helper
from slime_core.error_text import preview, shape_or_type
from slime_core.estimators import get_estimator
from slime_core.hook_deadline import call_hook_with_deadline, hook_bounds, hook_label
from slime_core.plugins import load_function

logger = logging.getLogger(__name__)

__all__ = ["compute_actor_loss", "policy_loss_name"]

_TIS_FUNCTIONS = {"truncate": vanilla_tis_function, "icepop": icepop_function}


def policy_loss_name(advantage_estimator: str) -> str:
    """The registered policy loss an advantage estimator trains with (its spec's `policy_loss`).

    Raises:
        KeyError: unknown estimator (the message lists the known ones).
    """
    return get_estimator(advantage_estimator).policy_loss


def _pg_reducer(cfg: SlimeArgs, total_lengths, response_lengths, loss_masks, default: Reducer) -> Reducer:
    path = cfg.custom_pg_loss_reducer_function_path
    if not path:
        return default
    factory = load_function(path, flag="--custom-pg-loss-reducer-function-path")
    per_token = cfg.calculate_per_token_loss
    bounds = {"what": hook_label(f"--custom-pg-loss-reducer-function-path {path}"), **hook_bounds(cfg)}
    # Extension over the original signature: factories that declare `args` get the run config.
    extra = {"args": plugin_view(cfg)} if "args" in inspect.signature(factory).parameters else {}
    reducer = call_hook_with_deadline(
        factory, total_lengths, response_lengths, loss_masks, per_token, **extra, **bounds
    )
    if not callable(reducer):
        raise ValueError(f"{bounds['what']}: returned {type(reducer).__name__} {preview(reducer)}, not a reducer "
                         "(a function of the per-token pg_loss [T] to a scalar tensor)")  # fmt: skip

    def reduce(values: torch.Tensor) -> torch.Tensor:
        out = call_hook_with_deadline(reducer, values, **bounds)  # the reducer it made is its code too
        if not (isinstance(out, torch.Tensor) and out.dim() == 0):
            # A [T] or per-sample result made the loss a vector: the backward failed far from here, naming nothing.
            raise ValueError(
                f"{bounds['what']}: its reducer returned {shape_or_type(out)}, not a scalar tensor (0-d, with grad)"
            )
        return out

    return reduce


def _check_options(cfg: SlimeArgs, rollout_log_probs, ref_log_probs, entropy) -> None:
    if cfg.use_tis and cfg.use_rollout_logprobs:
        raise ValueError("--use-tis and --use-rollout-logprobs are mutually exclusive")
    if (cfg.use_tis or cfg.get_mismatch_metrics) and rollout_log_probs is None:
        flag = "--use-tis" if cfg.use_tis else "--get-mismatch-metrics"
        raise ValueError(f"{flag} needs rollout_log_probs (the engine's log-probs of every sample)")
    if cfg.use_rollout_logprobs and rollout_log_probs is None:
        raise ValueError("--use-rollout-logprobs needs rollout_log_probs")
    if cfg.use_kl_loss and ref_log_probs is None:
        raise ValueError("--use-kl-loss needs ref_log_probs (is --ref-load set?)")
    if cfg.entropy_coef != 0 and entropy is None:
        raise ValueError("--entropy-coef != 0 needs the per-token entropy")


def _opsm_clipfrac(per_token: bool, dropped: torch.Tensor, mask: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """`opsm_clipfrac`: per sample, the dropped share of its own trainable tokens, summed over the samples.

    Each sample counts `Σ_t d_t·m_t / max(Σ_t m_t, 1)` (`d` the dropped tokens, `m` the loss mask), in [0, 1],
    whatever its rollout siblings; after the division by the step's sample count the metric is the mean, over
    samples, of the share of each sample's trainable tokens that OPSM dropped. OPSM drops a token when its
    sequence drifted (mean `lp_old - lp` > δ) *and its own advantage* is negative, so:

    * with one advantage per sequence (GRPO, GSPO, CISPO) a drifted sample with A < 0 loses every token and
      counts 1: the metric is the fraction of sequences dropped (what the original documents:
      "the count of masked sequences");
    * with per-token advantages (PPO/GAE, REINFORCE++ returns) only the A < 0 tokens of a drifted sample are
      dropped, so it counts the fraction it lost (advantages [-1, +1, -1, +1] on a drifted sample: 0.5).

    With `--calculate-per-token-loss` every metric is a token mean: the dropped trainable tokens `Σ_t d_t·m_t`
    are summed, so the metric is the fraction of trainable tokens dropped.

    Differs from the original's code (`slime/utils/ppo_utils.py: compute_opsm_mask`), which counts
    `Σ_t d_t / max(Σ_t m_t, 1)`: its numerator also counts dropped tokens whose loss mask is 0 (tool output,
    which carries the sample's advantage too), so a dropped multi-turn sample counts more than 1 (mask [1, 0],
    both tokens dropped: 2.0 there, 1.0 here); it uses that per-sample form with `--calculate-per-token-loss`
    too. The two agree whenever every response token is trainable and the loss is per sample. MIGRATION.md
    lists this difference.

    Args:
        per_token: `--calculate-per-token-loss`.
        dropped: `[T]` float32, 1.0 on tokens OPSM drops (`compute_opsm_mask`).
        mask: `[T]` float32 loss mask.
        lengths: N response lengths summing to T.

    Returns:
        A scalar: the micro-batch's sum (the backend divides by the step's sample or token count).
    """
    if per_token:
        return (dropped * mask).sum()
    own = segment_sums(mask, lengths).clamp(min=1.0)
    return (segment_sums(dropped * mask, lengths) / own).sum()


def _tis_function(cfg: SlimeArgs):
    path = cfg.custom_tis_function_path
    if path:
        fn = load_function(path, flag="--custom-tis-function-path")
        return functools.partial(
            call_hook_with_deadline, fn, what=f"--custom-tis-function-path {path}", **hook_bounds(cfg)
        )
    if not cfg.use_tis or uses_mis_helper(cfg):
        return compute_mis_weights_with_cp  # without --use-tis (--get-mismatch-metrics) it only measures
    mode = cfg.tis_mode
    if mode not in _TIS_FUNCTIONS:
        raise ValueError(f"unknown --tis-mode {mode!r}; known: {sorted(_TIS_FUNCTIONS)}")
    return _TIS_FUNCTIONS[mode]


def _checked_tis_output(out: Any, what: str, lengths: list[int]) -> tuple[Any, Any, Any]:
    """A custom TIS function's `(pg_loss [T], loss_masks N×[L_i], {name: [T]})`, checked against the micro-batch.

    A `pg_loss` of another shape was broadcast into the loss without a word (a `[1]` or per-sample `[N]` one trained
    on wrong values); the other mistakes failed as bare unpacking or broadcasting errors naming no plugin.

    Raises:
        ValueError: naming `what` and the part that does not fit.
    """
    total = sum(lengths)
    shape = f"(pg_loss [{total}], loss_masks {len(lengths)}×[L_i], metrics dict of [{total}] tensors)"
    if not (isinstance(out, tuple | list) and len(out) == 3):
        raise ValueError(f"{what}: must return {shape}, got {type(out).__name__} {preview(out)}")
    pg_loss, masks, metrics = out
    if not (isinstance(pg_loss, torch.Tensor) and tuple(pg_loss.shape) == (total,)):
        raise ValueError(
            f"{what}: returned pg_loss {shape_or_type(pg_loss)}, expected a [{total}] tensor (one value per token)"
        )
    if not (isinstance(masks, list | tuple) and all(isinstance(m, torch.Tensor) for m in masks)):
        raise ValueError(
            f"{what}: returned loss_masks {type(masks).__name__}, expected a list of {len(lengths)} tensors"
        )
    concat_per_sample(f"{what}: its loss_masks", masks, lengths)
    if not isinstance(metrics, dict):
        raise ValueError(f"{what}: returned metrics {type(metrics).__name__}, expected a dict of [{total}] tensors")
    for name, value in metrics.items():
        if not (isinstance(value, torch.Tensor) and tuple(value.shape) == (total,)):
            raise ValueError(
                f"{what}: returned metric {name!r} {shape_or_type(value)}, expected a [{total}] tensor "
                "(one value per token)"
            )
    return pg_loss, masks, metrics


def compute_actor_loss(
    cfg: SlimeArgs,
    *,
    log_probs: list[torch.Tensor],
    old_log_probs: list[torch.Tensor],
    advantages: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    loss_denominators: list[float],
    ref_log_probs: list[torch.Tensor] | None = None,
    rollout_log_probs: list[torch.Tensor] | None = None,
    entropy: list[torch.Tensor] | None = None,
    total_lengths: list[int] | None = None,
    train_log_probs: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss of one micro-batch, a SUM over its samples (see module docstring).

    The policy loss is the `--advantage-estimator` spec's (gspo → sequence ratio, cispo → CISPO, else PPO
    clip). With `--use-rollout-logprobs` the rollout log-probs replace `old_log_probs`. With `--use-opsm`
    (off-policy sequence masking) tokens with `A < 0` in sequences whose mean `lp_old - lp` exceeds
    `--opsm-delta` get loss 0. With `--use-tis` the per-token policy loss is multiplied by
    `compute_tis_weights(old, rollout)`, or passed through `--custom-tis-function-path`
    `fn(args=, pg_loss=[T], train_log_probs=N×[L_i], rollout_log_probs=N×[L_i], loss_masks=N×[L_i],
    total_lengths=, response_lengths=) -> (pg_loss [T], modified loss_masks N×[L_i], {name: [T]})`; the
    modified masks then replace the numerator masks of every term (denominators unchanged). Without
    `--custom-tis-function-path`, `--tis-level` other than token, `--tis-mode clip/mask`, `--use-rs` or
    `--tis-batch-normalize` select the MIS helper (`slime_core.algorithms.mis.compute_mis_weights_with_cp`).
    `--get-mismatch-metrics` calls the TIS function even without `--use-tis` (the MIS helper by default, which then
    leaves the loss unchanged) and adds the `mis_*` mismatch metrics (`slime_core.algorithms.mis.mismatch_metrics`).

    Args:
        cfg: run config; reads `advantage_estimator`, `eps_clip`, `eps_clip_high` (None → eps_clip),
            `eps_clip_c`, `entropy_coef`, `use_kl_loss`, `kl_loss_coef`, `kl_loss_type`, `use_unbiased_kl`,
            `use_tis`, `tis_clip`, `tis_clip_low`, `tis_mode`, `calculate_per_token_loss`,
            `use_rollout_logprobs`, `custom_pg_loss_reducer_function_path`, `custom_tis_function_path`,
            `use_opsm`, `opsm_delta`, `get_mismatch_metrics` and the MIS settings (`slime_core.config.mismatch`).
            Plugins (reducer factory, TIS function) receive it as `args`.
        log_probs: N `[L_i]` float32 current log-probs (requires grad).
        old_log_probs: N `[L_i]` log-probs of the policy that produced the data (no grad needed).
        advantages: N `[L_i]`.
        loss_masks: N `[L_i]` in {0, 1}; all-zero samples contribute 0.
        loss_denominators: N floats, per-sample denominators of the default reducer.
        ref_log_probs: N `[L_i]`, needed with `--use-kl-loss`.
        rollout_log_probs: N `[L_i]` engine log-probs; needed with `--use-tis`/`--use-rollout-logprobs`.
        entropy: N `[L_i]` per-token entropies (with grad if `entropy_coef != 0`); needed then.
        total_lengths: N prompt+response lengths, only forwarded to a custom pg reducer (else None).
        train_log_probs: N `[L_i]` trainer log-probs of the sampling policy for the TIS function and the mismatch
            metrics; None: `old_log_probs`, or the detached `log_probs` under `--use-rollout-logprobs`.

    Returns:
        `(loss, metrics)`: `loss` a scalar with grad (an empty micro-batch gives a zero without grad:
        skip its backward); `metrics` detached scalars, each the same kind of
        sum: loss, pg_loss, pg_clipfrac, ppo_kl, entropy_loss, [kl_loss], [train_rollout_logprob_abs_diff],
        [opsm_clipfrac], [tis, tis_clipfrac, tis_abs, ois] (or the custom TIS function's metrics, or the MIS
        helper's `mis_*`), [the `mis_*` mismatch metrics with `--get-mismatch-metrics`]. As in the
        original, `tis` is the raw ratio `exp(lp_old - lp_roll)`, TIS metrics and `ois` are averaged over the
        tokens before a custom TIS function's rejections. `opsm_clipfrac` counts each sample's dropped share of
        its own trainable tokens (the original also counts dropped tokens whose loss mask is 0; see
        `_opsm_clipfrac`).

    Raises:
        KeyError: unknown policy loss.
        ValueError: mismatched shapes or inputs missing for the configured options.
        slime_core.plugins.PluginError: a custom reducer/TIS import path cannot be loaded.
    """
    _check_options(cfg, rollout_log_probs, ref_log_probs, entropy)
    lengths = [int(m.shape[0]) for m in loss_masks]
    mask = concat_per_sample("loss_masks", loss_masks, lengths)
    lp = concat_per_sample("log_probs", log_probs, lengths)
    use_rollout = cfg.use_rollout_logprobs
    roll = None if rollout_log_probs is None else concat_per_sample("rollout_log_probs", rollout_log_probs, lengths)
    old = roll.detach() if use_rollout else concat_per_sample("old_log_probs", old_log_probs, lengths).detach()
    adv = concat_per_sample("advantages", advantages, lengths).detach()

    per_token = cfg.calculate_per_token_loss
    reduce = default_reducer(per_token, lengths, mask, loss_denominators)
    pg_masks = loss_masks  # what a custom pg reducer factory gets: the TIS function's masks once it ran

    name = policy_loss_name(cfg.advantage_estimator)
    pg_tok, clipfrac_tok, ppo_kl_tok = get_policy_loss(name)(
        cfg, log_probs=lp, old_log_probs=old, advantages=adv, loss_mask=mask, response_lengths=lengths
    )
    metrics: dict[str, torch.Tensor] = {}
    if cfg.use_opsm:
        dropped = compute_opsm_mask(ppo_kl_tok.detach(), adv, mask, lengths, cfg.opsm_delta)
        pg_tok = pg_tok * (1.0 - dropped)
        metrics["opsm_clipfrac"] = _opsm_clipfrac(per_token, dropped, mask, lengths)
    # Mismatch metrics are means over the tokens before any rejection (the original's pre-RS reducer): a TIS
    # function that rejects tokens must not drive its own metrics towards 0 by removing them from the average.
    metric_reduce = reduce
    if cfg.use_tis or cfg.get_mismatch_metrics:
        if train_log_probs is not None:
            trainer = concat_per_sample("train_log_probs", train_log_probs, lengths).detach()
        else:
            trainer = lp.detach() if use_rollout else old  # under --use-rollout-logprobs `old` is the engine's
        out = _tis_function(cfg)(
            args=plugin_view(cfg),
            pg_loss=pg_tok,
            train_log_probs=list(trainer.split(lengths)),
            rollout_log_probs=list(roll.split(lengths)),
            loss_masks=loss_masks,
            total_lengths=total_lengths,
            response_lengths=lengths,
        )
        if cfg.custom_tis_function_path:
            out = _checked_tis_output(
                out, hook_label(f"--custom-tis-function-path {cfg.custom_tis_function_path}"), lengths
            )
        pg_tok, new_masks, tis_metrics = out
        # Rejected tokens leave the numerators; the denominators stay the rollout's mask sums. Rebuilt from what it
        # returned whatever object that is, as the original does: masks zeroed in place and returned were taken for
        # unchanged (compared by identity), so the tokens they rejected stayed in the loss.
        mask = concat_per_sample("modified loss_masks", new_masks, lengths)
        reduce = default_reducer(per_token, lengths, mask, loss_denominators)
        pg_masks = new_masks
        if cfg.get_mismatch_metrics and "mis_kl" not in tis_metrics:
            # A TIS function without them (token TIS, a user's own): add the helper's, under its names.
            gap = mismatch_metrics(list(trainer.split(lengths)), list(roll.split(lengths)), loss_masks)
            metrics.update({f"mis_{k}": metric_reduce(v.to(pg_tok.device)) for k, v in gap.items()})
        metrics.update({k: metric_reduce(v) for k, v in tis_metrics.items()})
        metrics["ois"] = metric_reduce(torch.exp((-ppo_kl_tok.detach()).clamp(-20.0, 20.0)))

    # Built once, after the TIS function, as the original does: a factory that counts or logs its calls saw two.
    pg_loss = _pg_reducer(cfg, total_lengths, lengths, pg_masks, reduce)(pg_tok)
    entropy_loss = reduce(concat_per_sample("entropy", entropy, lengths)) if entropy is not None else lp.new_zeros(())
    loss = pg_loss - cfg.entropy_coef * entropy_loss
    if cfg.use_kl_loss:
        ref = concat_per_sample("ref_log_probs", ref_log_probs, lengths)
        ratio = torch.exp((lp - old).clamp(-20.0, 20.0)) if cfg.use_unbiased_kl else None
        kl_loss = reduce(compute_approx_kl(lp, ref, cfg.kl_loss_type, ratio))
        loss = loss + cfg.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss
    if roll is not None:
        metrics["train_rollout_logprob_abs_diff"] = reduce(((lp if use_rollout else old) - roll).abs())

    metrics.update(
        loss=loss,
        pg_loss=pg_loss,
        pg_clipfrac=reduce(clipfrac_tok),
        ppo_kl=reduce(ppo_kl_tok),
        entropy_loss=entropy_loss,
    )
    return loss, {k: v.detach() for k, v in metrics.items()}
