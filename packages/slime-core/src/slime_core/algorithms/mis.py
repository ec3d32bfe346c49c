"""Train/inference mismatch: its metrics (`--get-mismatch-metrics`) and sequence-level importance sampling (MIS).

The built-in form of the original's helper (THUDM/slime `examples/train_infer_mismatch_helper/mis.py`, which
`--custom-tis-function-path ...mis.compute_mis_weights_with_cp` selects there), with its setting names
(`--tis-level`, `--tis-mode truncate|clip|mask`, `--tis-lower-bound`, `--tis-upper-bound`, `--use-rs`,
`--rs-level`, `--rs-lower-bound`, `--rs-upper-bound`, `--rs-veto-threshold`, `--tis-batch-normalize`; in the
original they come from the `--custom-config-path` YAML, which sets them here too) and metric names (`mis_*`).

Legend: `N` samples, `L_i` response length, `T = Σ L_i`; `m` a sample's loss mask, `Δ_t = lp_train_t - lp_roll_t`
(natural log; `lp_train` the trainer's log-probs of the policy that sampled, `lp_roll` the engine's).

A level turns Δ into each token's log-weight (Li, "Mathematical formulations of rollout correction methods",
verl docs `rollout_corr_math.md`; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
RL training"):

* token:     `log w_t = Δ_t`                       (per-token ratio; biased, low variance)
* sequence:  `log w_t = Σ_s m_s Δ_s`               (the sequence likelihood ratio; unbiased, high variance)
* geometric: `log w_t = Σ_s m_s Δ_s / Σ_s m_s`     (its geometric mean per token; biased, low variance)

`log w` is clamped to ±20 before `exp`. A mode bounds the weight `w` (upper `U`, lower `L`): truncate
`min(w, U)` (TIS), clip `clamp(w, L, U)`, mask: `w` unchanged but tokens with `w ∉ [L, U]` leave the loss
(rejection, MIS). Rejection sampling (`--use-rs`) drops tokens whose `--rs-level` weight is outside
`[rs_lower, rs_upper]`; `--rs-veto-threshold v` drops every token of a sequence holding a trainable token with
`exp(Δ_t) < v`. `--tis-batch-normalize` divides the weights by their mean over the micro-batch (token level: the
masked token mean; sequence level: the mean over samples of each sample's masked mean).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["compute_mis_weights", "compute_mis_weights_with_cp", "mis_bounds", "mismatch_metrics"]

_SAFETY_BOUND = 20.0  # exp(±20) stays finite in fp32; a weight that far out is bounded or rejected anyway
_LEVELS = ("token", "sequence", "geometric")

Metrics = dict[str, list[torch.Tensor]]


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _put(metrics: Metrics, name: str, value: torch.Tensor) -> None:
    metrics.setdefault(name, []).append(value.detach().float())


def _sequence_metrics(train: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """One sample's mismatch metrics, each `[L]` (a per-sequence value repeated on every token)."""
    ones = torch.ones_like(train)
    train_log_ppl = -_masked_mean(train, mask)
    roll_log_ppl = -_masked_mean(roll, mask)
    delta = train - roll
    rho = torch.exp(delta.clamp(-_SAFETY_BOUND, _SAFETY_BOUND))
    log_ppl_diff = train_log_ppl - roll_log_ppl  # = mean(lp_roll) - mean(lp_train) = log(ppl_train / ppl_roll)
    seq_log_ratio = (delta * mask).sum().clamp(-_SAFETY_BOUND, _SAFETY_BOUND)
    return {
        "training_log_ppl": train_log_ppl * ones,
        "training_ppl": torch.exp(train_log_ppl) * ones,
        "rollout_log_ppl": roll_log_ppl * ones,
        "rollout_ppl": torch.exp(roll_log_ppl) * ones,
        "kl": roll - train,  # k1 estimate of KL(π_roll || π_train) on tokens sampled from π_roll
        "k3_kl": rho - delta - 1.0,  # Schulman's k3 with r = π_train / π_roll: unbiased, never negative
        "log_ppl_diff": log_ppl_diff * ones,
        "log_ppl_abs_diff": log_ppl_diff.abs() * ones,
        "ppl_ratio": torch.exp(log_ppl_diff) * ones,
        "chi2_token": (_masked_mean(rho.square(), mask) - 1.0) * ones,  # χ² = E[ρ²] - 1 over the tokens
        "chi2_seq": (torch.exp(2.0 * seq_log_ratio) - 1.0) * ones,  # (Π_t ρ_t)² - 1
    }


def _clean(train: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor):
    m = mask.float()
    # Non-trainable tokens (tool output) carry a rollout log-prob of 0.0: zero both sides there so they add nothing.
    train = torch.where(m > 0, train.detach().float(), torch.zeros_like(m))
    roll = torch.where(m > 0, roll.detach().float().to(m.device), torch.zeros_like(m))
    return train, roll, m


def _check_lists(train_log_probs, rollout_log_probs, loss_masks) -> None:
    if not len(train_log_probs) == len(rollout_log_probs) == len(loss_masks):
        raise ValueError(
            f"train_log_probs, rollout_log_probs and loss_masks must have one entry per sample, got "
            f"{len(train_log_probs)}, {len(rollout_log_probs)} and {len(loss_masks)}"
        )
    for i, (t, r, m) in enumerate(zip(train_log_probs, rollout_log_probs, loss_masks, strict=True)):
        if not t.shape == r.shape == m.shape:
            raise ValueError(f"sample {i}: train {tuple(t.shape)}, rollout {tuple(r.shape)}, mask {tuple(m.shape)}")


def mismatch_metrics(
    train_log_probs: list[torch.Tensor], rollout_log_probs: list[torch.Tensor], loss_masks: list[torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Per-token mismatch metrics of `--get-mismatch-metrics` (the original helper's `add_ppl_metrics`).

    Each value is `[T]` float32, to be reduced by the loss reducer (the mean over each sample's trainable tokens,
    then over samples): `training_log_ppl = -mean_t lp_train`, `training_ppl = exp(.)`, `rollout_log_ppl`,
    `rollout_ppl` likewise, `kl = lp_roll - lp_train` (k1 of KL(π_roll‖π_train)), `k3_kl = exp(Δ) - Δ - 1`,
    `log_ppl_diff = mean lp_roll - mean lp_train` (`log_ppl_abs_diff` its absolute value, `ppl_ratio =
    exp(log_ppl_diff)`), `chi2_token = mean_t exp(Δ_t)² - 1`, `chi2_seq = exp(2·Σ_t Δ_t) - 1` (Δ clamped to ±20
    before `exp`). Per-sequence values are repeated on every token of the sample.

    Args:
        train_log_probs: N `[L_i]` trainer log-probs of the sampling policy.
        rollout_log_probs: N `[L_i]` engine log-probs.
        loss_masks: N `[L_i]` in {0, 1}.

    Returns:
        `{name: [T] float32}` (names without the `mis_` prefix the training metrics carry).

    Raises:
        ValueError: the lists or their shapes disagree.
    """
    _check_lists(train_log_probs, rollout_log_probs, loss_masks)
    per_name: Metrics = {}
    for train, roll, mask in zip(train_log_probs, rollout_log_probs, loss_masks, strict=True):
        for name, value in _sequence_metrics(*_clean(train, roll, mask)).items():
            _put(per_name, name, value)
    if not per_name:
        return {}
    return {name: torch.cat(values) for name, values in per_name.items()}


def mis_bounds(args: Any) -> tuple[float, float, float, float]:
    """`(tis_lower, tis_upper, rs_lower, rs_upper)`, filling unset bounds as the original helper does.

    `--tis-upper-bound` defaults to `--tis-clip`, `--tis-lower-bound` to `1 / upper`, the `--rs-*` bounds to the
    TIS ones.
    """
    upper = args.tis_upper_bound if args.tis_upper_bound is not None else args.tis_clip
    lower = args.tis_lower_bound if args.tis_lower_bound is not None else 1.0 / upper
    rs_lower = args.rs_lower_bound if args.rs_lower_bound is not None else lower
    rs_upper = args.rs_upper_bound if args.rs_upper_bound is not None else upper
    return lower, upper, rs_lower, rs_upper


def _level_log_weight(delta: torch.Tensor, mask: torch.Tensor, level: str, flag: str) -> torch.Tensor:
    if level == "token":
        log_w = delta
    elif level == "sequence":
        log_w = (delta * mask).sum().expand_as(delta)
    elif level == "geometric":
        log_w = _masked_mean(delta, mask).expand_as(delta)
    else:
        raise ValueError(f"unknown {flag} {level!r}; known: {list(_LEVELS)}")
    return log_w.clamp(-_SAFETY_BOUND, _SAFETY_BOUND)


def _bound(args: Any, w: torch.Tensor, mask: torch.Tensor, metrics: Metrics, lower: float, upper: float):
    """`(bounded weights, mask after rejection)` for `--tis-mode`; records its fractions."""
    mode = args.tis_mode
    if mode == "truncate":
        _put(metrics, "tis_truncate_fraction", (w > upper).float())
        return w.clamp(max=upper) * mask, mask
    if mode not in ("clip", "mask"):
        raise ValueError(f"--tis-mode {mode!r} is not an MIS mode; known: ['clip', 'mask', 'truncate']")
    _put(metrics, f"tis_{mode}_fraction_low", (w < lower).float())
    _put(metrics, f"tis_{mode}_fraction_high", (w > upper).float())
    if mode == "clip":
        return w.clamp(lower, upper) * mask, mask
    return w * mask, mask * ((w >= lower) & (w <= upper)).float()


def _reject(args: Any, delta, mask, new_mask, log_w, metrics: Metrics, lower: float, upper: float) -> torch.Tensor:
    """`--use-rs`: the mask after rejecting out-of-range weights and vetoed sequences."""
    if args.rs_level != args.tis_level:
        log_w = _level_log_weight(delta, mask, args.rs_level, "--rs-level")
    rs_w = torch.exp(log_w)
    _put(metrics, "rs_mask_fraction_low", (rs_w < lower).float())
    _put(metrics, "rs_mask_fraction_high", (rs_w > upper).float())
    new_mask = new_mask * ((rs_w >= lower) & (rs_w <= upper)).float()
    if args.rs_veto_threshold is not None:
        catastrophic = (delta < math.log(args.rs_veto_threshold)) & (mask > 0)
        vetoed = catastrophic.any()
        _put(metrics, "rs_catastrophic_token_fraction", catastrophic.float())
        _put(metrics, "rs_catastrophic_seq_fraction", vetoed.float().expand_as(mask))
        new_mask = new_mask * (~vetoed).float()
    return new_mask


def _batch_normalize(args: Any, weights: list[torch.Tensor], masks: list[torch.Tensor], metrics: Metrics):
    if args.tis_level == "token":
        total = sum((w * m).sum() for w, m in zip(weights, masks, strict=True))
        mean = total / max(sum(float(m.sum()) for m in masks), 1.0)
    elif args.tis_level == "sequence":
        mean = sum(_masked_mean(w, m) for w, m in zip(weights, masks, strict=True)) / len(weights)
    else:
        raise ValueError(f"--tis-batch-normalize works with --tis-level token or sequence, not {args.tis_level!r}")
    factor = torch.as_tensor(mean, dtype=torch.float32)
    if float(factor) <= 1e-8:  # all weights 0: nothing to rescale
        factor = torch.ones(())
    for w in weights:
        _put(metrics, "batch_norm_factor", factor.to(w.device).expand_as(w))
    return [w / factor.to(w.device) for w in weights]


def compute_mis_weights(
    args: Any,
    *,
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
) -> tuple[list[torch.Tensor] | None, list[torch.Tensor], Metrics]:
    """Importance weights, rejection masks and metrics of the MIS helper (module docstring), per sample.

    Without `--use-tis` only the mismatch metrics are computed (weights None, masks unchanged): the original's
    `--get-mismatch-metrics` use of the helper.

    Args:
        args: the run config; reads `use_tis`, `tis_level`, `tis_mode`, the bounds (`mis_bounds`), `use_rs`,
            `rs_level`, `rs_veto_threshold`, `tis_batch_normalize`.
        train_log_probs: N `[L_i]` trainer log-probs of the sampling policy.
        rollout_log_probs: N `[L_i]` engine log-probs.
        loss_masks: N `[L_i]` in {0, 1}.

    Returns:
        `(weights, masks, metrics)`: N `[L_i]` float32 weights (0 on masked tokens) or None; N `[L_i]` masks
        with rejected tokens at 0; `{name: N × [L_i]}` per-token metrics (unprefixed, as the original's).

    Raises:
        ValueError: mismatched inputs, an unknown level or mode, or batch normalization at the geometric level.
    """
    _check_lists(train_log_probs, rollout_log_probs, loss_masks)
    metrics: Metrics = {}
    cleaned = [_clean(t, r, m) for t, r, m in zip(train_log_probs, rollout_log_probs, loss_masks, strict=True)]
    for train, roll, mask in cleaned:
        for name, value in _sequence_metrics(train, roll, mask).items():
            _put(metrics, name, value)
    if not args.use_tis:
        return None, loss_masks, metrics
    lower, upper, rs_lower, rs_upper = mis_bounds(args)
    weights, new_masks = [], []
    for train, roll, mask in cleaned:
        delta = train - roll
        log_w = _level_log_weight(delta, mask, args.tis_level, "--tis-level")
        w = torch.exp(log_w)
        _put(metrics, "tis_weight_before_bound", w)
        w, new_mask = _bound(args, w, mask, metrics, lower, upper)
        _put(metrics, "tis_weight_after_bound", w)
        if args.use_rs:
            new_mask = _reject(args, delta, mask, new_mask, log_w, metrics, rs_lower, rs_upper)
        _put(metrics, "is_ratio_mean_after_tis_rs", w)
        weights.append(w)
        new_masks.append(new_mask)
    masks = [m for _, _, m in cleaned]
    if args.tis_batch_normalize:
        weights = _batch_normalize(args, weights, masks, metrics)
    for w, m in zip(weights, masks, strict=True):
        kept = w[m > 0]
        empty = kept.numel() == 0  # a sample without trainable tokens reports 0, as the original
        _put(metrics, "is_ratio_mean_final", _masked_mean(w, m).expand_as(w))
        _put(metrics, "is_ratio_min_final", (w.new_zeros(()) if empty else kept.min()).expand_as(w))
        _put(metrics, "is_ratio_max_final", (w.new_zeros(()) if empty else kept.max()).expand_as(w))
    return weights, new_masks, metrics


def compute_mis_weights_with_cp(
    args: Any,
    *,
    pg_loss: torch.Tensor,
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    total_lengths: list[int] | None = None,
    response_lengths: list[int] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """The MIS helper in the `--custom-tis-function-path` signature (the original's name and call).

    Both backends hand the loss whole responses (context-parallel shards are gathered before it), so unlike the
    original no context-parallel gather or slice happens here.

    Args:
        args: the run config (see `compute_mis_weights`).
        pg_loss: `[T]` per-token policy loss.
        train_log_probs: N `[L_i]` trainer log-probs of the sampling policy.
        rollout_log_probs: N `[L_i]` engine log-probs.
        loss_masks: N `[L_i]` in {0, 1}.
        total_lengths: N prompt+response lengths (unused; part of the signature).
        response_lengths: N `L_i` (unused; the masks carry them).
        **kwargs: further keywords of the call, ignored.

    Returns:
        `(pg_loss · w [T], masks N × [L_i], {"mis_<name>": [T]})`; without `--use-tis`, `pg_loss` unchanged and
        only the mismatch metrics.

    Raises:
        ValueError: as `compute_mis_weights`.
    """
    weights, masks, metrics = compute_mis_weights(
        args, train_log_probs=train_log_probs, rollout_log_probs=rollout_log_probs, loss_masks=loss_masks
    )
    if weights is not None and weights:
        pg_loss = pg_loss * torch.cat(weights).to(pg_loss.device)
    flat = {f"mis_{name}": torch.cat(values).to(pg_loss.device) for name, values in metrics.items() if values}
    return pg_loss, masks, flat
