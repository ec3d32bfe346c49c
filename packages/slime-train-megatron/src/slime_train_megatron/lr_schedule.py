"""The Megatron backend's learning-rate schedule: megatron-core's `OptimizerParamScheduler`, sized like slime's.

Steps are optimizer steps. Decay runs over `--lr-decay-iters`, else over the whole run
(`num_rollout * rollout_batch_size * n_samples_per_prompt // global_batch_size`, the original's `train_iters`);
the warmup is `--lr-warmup-iters` or `--lr-warmup-fraction` × the decay steps (not rounded, as the original),
starting from `--lr-warmup-init`. megatron-core's warmup convention: optimizer step `k` (0-based) uses
`init + (lr - init) * k / warmup` for `k <= warmup`.
"""

from __future__ import annotations

import logging
from typing import Any

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from slime_core.config import SlimeArgs
from slime_train_megatron.settings import MegatronSettings

logger = logging.getLogger(__name__)

__all__ = ["build_lr_scheduler", "train_steps"]


def train_steps(cfg: SlimeArgs) -> int:
    """Optimizer steps of the whole run (the original's `train_iters`)."""
    return cfg.num_rollout * cfg.rollout_batch_size * cfg.n_samples_per_prompt // cfg.global_batch_size


def build_lr_scheduler(optimizer: Any, s: MegatronSettings, cfg: SlimeArgs) -> OptimizerParamScheduler:
    """Builds the scheduler (it sets the optimizer's rate for the first step).

    Args:
        optimizer: the megatron optimizer (anything with `param_groups`).
        s: settings; reads `lr`, `min_lr`, `lr_decay_style`, `lr_decay_iters`, `lr_warmup_iters`,
            `lr_warmup_fraction`, `lr_warmup_init`, `weight_decay`.
        cfg: run config; reads `num_rollout`, `rollout_batch_size`, `n_samples_per_prompt`, `global_batch_size`
            (the run length when `--lr-decay-iters` is unset).

    Raises:
        ValueError: both warmup flags given, or `--lr-decay-style WSD` (its anneal length flags are not supported).
    """
    if s.lr_decay_style == "WSD":
        raise ValueError("--lr-decay-style WSD is not supported (no --lr-wsd-decay-iters); use linear or cosine")
    decay = s.lr_decay_iters or train_steps(cfg)
    warmup = s.lr_warmup_iters
    if s.lr_warmup_fraction is not None:
        if warmup:
            raise ValueError("give only one of --lr-warmup-iters and --lr-warmup-fraction")
        # Not rounded: the original's `lr_warmup_fraction * lr_decay_steps` (0.25 x 30 = 7.5 steps, not 7).
        warmup = s.lr_warmup_fraction * decay
    style = s.lr_decay_style
    if style == "constant" and not s.lr_decay_iters and s.lr_warmup_fraction is None:
        # No rate depends on it: not the run's length, which a resume with more --num-rollout changes (and the
        # checkpoint check below would refuse).
        decay = warmup + 1
    decay = max(decay, warmup + 1)  # megatron-core requires warmup < decay steps
    return OptimizerParamScheduler(
        optimizer,
        init_lr=s.lr_warmup_init if warmup else s.lr,
        max_lr=s.lr,
        min_lr=s.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=decay,
        lr_decay_style=style,
        start_wd=s.weight_decay,
        end_wd=s.weight_decay,
        wd_incr_steps=decay,
        wd_incr_style="constant",
        # Megatron-LM's default: a resume whose --lr, --min-lr, warmup or decay differ from the checkpoint's fails
        # (megatron-core's own default took the checkpoint's values with no word); checkpoint.py names the flags.
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=False,
    )
