"""`compute_actor_loss`: the policy objective both training backends call once per micro-batch.

Legend: `N` samples in the micro-batch, `L_i` response length, `T = Σ L_i`.

    loss = pg_loss - entropy_coef·entropy_loss + kl_loss_coef·kl_loss

Every term is reduced to a SUM over the micro-batch's samples (default: each sample's masked token
sum divided by its loss denominator; `--calculate-per-token-loss`: the masked token sum). The backend
divides by the step's global sample count (or token count), so micro-batches and DP ranks add up.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

import torch

from slime_core.algorithms._flatten import concat_per_sample
from slime_core.algorithms.kl import compute_approx_kl
from slime_core.algorithms.policy_loss import compute_tis_weights
from slime_core.algorithms.reducers import Reducer, default_reducer
from slime_core.algorithms.registry import get_policy_loss

logger = logging.getLogger(__name__)

__all__ = ["compute_actor_loss", "policy_loss_name"]

_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def policy_loss_name(advantage_estimator: str) -> str:
    """The registered policy loss used for an advantage estimator: gspo, cispo, else ppo."""
    return advantage_estimator if advantage_estimator in ("gspo", "cispo") else "ppo"


def _load_function(path: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"--custom-pg-loss-reducer-function-path must be 'module.function', got {path!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load --custom-pg-loss-reducer-function-path {path!r}: {exc}") from exc


def _pg_reducer(args: Any, total_lengths, response_lengths, loss_masks, default: Reducer) -> Reducer:
    path = getattr(args, "custom_pg_loss_reducer_function_path", None)
    if not path:
        return default
    factory = _load_function(path)
    per_token = getattr(args, "calculate_per_token_loss", False)
    # Extension over the original signature: factories that declare `args` get the run config.
    if "args" in inspect.signature(factory).parameters:
        return factory(total_lengths, response_lengths, loss_masks, per_token, args=args)
    return factory(total_lengths, response_lengths, loss_masks, per_token)


def _check_options(args: Any, rollout_log_probs, ref_log_probs, entropy) -> None:
    if getattr(args, "use_tis", False):
        if getattr(args, "use_rollout_logprobs", False):
            raise ValueError("--use-tis and --use-rollout-logprobs are mutually exclusive")
        if rollout_log_probs is None:
            raise ValueError("--use-tis needs rollout_log_probs")
    if getattr(args, "use_rollout_logprobs", False) and rollout_log_probs is None:
        raise ValueError("--use-rollout-logprobs needs rollout_log_probs")
    if getattr(args, "use_kl_loss", False) and ref_log_probs is None:
        raise ValueError("--use-kl-loss needs ref_log_probs (is --ref-load set?)")
    if getattr(args, "entropy_coef", 0.0) != 0 and entropy is None:
        raise ValueError("--entropy-coef != 0 needs the per-token entropy")


def compute_actor_loss(
    args: Any,
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss of one micro-batch, a SUM over its samples (see module docstring).

    The policy loss follows `args.advantage_estimator` (gspo → sequence ratio, cispo → CISPO, else PPO
    clip). With `--use-rollout-logprobs` the rollout log-probs replace `old_log_probs`. With `--use-tis`
    the per-token policy loss is multiplied by `compute_tis_weights(old, rollout)`.

    Args:
        args: run config; reads `advantage_estimator`, `eps_clip` (0.2), `eps_clip_high` (None → eps_clip),
            `eps_clip_c` (None), `entropy_coef` (0), `use_kl_loss` (False), `kl_loss_coef` (0), `kl_loss_type`
            ("low_var_kl"), `use_unbiased_kl` (False), `use_tis` (False), `tis_clip` (2.0), `tis_clip_low` (0),
            `tis_mode` ("truncate"), `calculate_per_token_loss` (False), `use_rollout_logprobs` (False),
            `custom_pg_loss_reducer_function_path` (None). Missing optional fields take these defaults.
        log_probs: N `[L_i]` float32 current log-probs (requires grad).
        old_log_probs: N `[L_i]` log-probs of the policy that produced the data (no grad needed).
        advantages: N `[L_i]`.
        loss_masks: N `[L_i]` in {0, 1}; all-zero samples contribute 0.
        loss_denominators: N floats, per-sample denominators of the default reducer.
        ref_log_probs: N `[L_i]`, needed with `--use-kl-loss`.
        rollout_log_probs: N `[L_i]` engine log-probs; needed with `--use-tis`/`--use-rollout-logprobs`.
        entropy: N `[L_i]` per-token entropies (with grad if `entropy_coef != 0`); needed then.
        total_lengths: N prompt+response lengths, only forwarded to a custom pg reducer (else None).

    Returns:
        `(loss, metrics)`: `loss` a scalar with grad; `metrics` detached scalars, each the same kind of
        sum: loss, pg_loss, pg_clipfrac, ppo_kl, entropy_loss, [kl_loss], [train_rollout_logprob_abs_diff],
        [tis, tis_clipfrac, tis_abs].

    Raises:
        KeyError: unknown policy loss.
        ValueError: mismatched shapes or inputs missing for the configured options.
    """
    _check_options(args, rollout_log_probs, ref_log_probs, entropy)
    lengths = [int(m.shape[0]) for m in loss_masks]
    mask = concat_per_sample("loss_masks", loss_masks, lengths)
    lp = concat_per_sample("log_probs", log_probs, lengths)
    use_rollout = getattr(args, "use_rollout_logprobs", False)
    roll = None if rollout_log_probs is None else concat_per_sample("rollout_log_probs", rollout_log_probs, lengths)
    old = roll if use_rollout else concat_per_sample("old_log_probs", old_log_probs, lengths).detach()
    adv = concat_per_sample("advantages", advantages, lengths).detach()

    reduce = default_reducer(getattr(args, "calculate_per_token_loss", False), lengths, mask, loss_denominators)
    pg_reduce = _pg_reducer(args, total_lengths, lengths, loss_masks, reduce)

    name = policy_loss_name(args.advantage_estimator)
    if name == "cispo" and args.eps_clip < 1.0:
        _warn_once(f"CISPO with --eps-clip {args.eps_clip} < 1 clips low ratios; the paper uses eps_clip=1")
    pg_tok, clipfrac_tok, ppo_kl_tok = get_policy_loss(name)(
        args, log_probs=lp, old_log_probs=old, advantages=adv, loss_mask=mask, response_lengths=lengths
    )
    metrics: dict[str, torch.Tensor] = {}
    if getattr(args, "use_tis", False):
        weights, tis_clipfrac = compute_tis_weights(
            old,
            roll,
            getattr(args, "tis_clip_low", 0.0),
            getattr(args, "tis_clip", 2.0),
            getattr(args, "tis_mode", "truncate"),
        )
        pg_tok = pg_tok * weights
        metrics["tis"] = reduce(weights)
        metrics["tis_clipfrac"] = reduce(tis_clipfrac)
        metrics["tis_abs"] = reduce((torch.exp((old - roll).clamp(-20.0, 20.0)) - 1).abs())

    pg_loss = pg_reduce(pg_tok)
    entropy_loss = reduce(concat_per_sample("entropy", entropy, lengths)) if entropy is not None else lp.new_zeros(())
    loss = pg_loss - getattr(args, "entropy_coef", 0.0) * entropy_loss
    if getattr(args, "use_kl_loss", False):
        ref = concat_per_sample("ref_log_probs", ref_log_probs, lengths)
        ratio = torch.exp(lp - old) if getattr(args, "use_unbiased_kl", False) else None
        kl_loss = reduce(compute_approx_kl(lp, ref, getattr(args, "kl_loss_type", "low_var_kl"), ratio))
        loss = loss + getattr(args, "kl_loss_coef", 0.0) * kl_loss
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
