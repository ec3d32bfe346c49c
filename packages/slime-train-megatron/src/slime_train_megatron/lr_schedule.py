"""The Megatron backend's learning-rate schedule: megatron-core's `OptimizerParamScheduler`, sized like slime's.

Steps are optimizer steps. Decay runs over `--lr-decay-iters`, else over the whole run
(`num_rollout * rollout_batch_size * n_samples_per_prompt // global_batch_size`, the original's `train_iters`);
the warmup is `--lr-warmup-iters` or `--lr-warmup-fraction` × the decay steps (not rounded, as the original),
starting from `--lr-warmup-init`. megatron-core's warmup convention: optimizer step `k` (0-based) uses
`init + (lr - init) * k / warmup` for `k <= warmup`. `--lr-decay-style WSD` hands megatron-core the anneal's length
`--lr-wsd-decay-iters` and shape `--lr-wsd-decay-style`, as Megatron-LM's `get_optimizer_param_scheduler` does (in
optimizer steps here, in samples there: every length scales by `--global-batch-size` there, so the rates agree).
"""

from __future__ import annotations

import logging
from typing import Any

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from slime_core.config import SlimeArgs
from slime_train_megatron.settings import MegatronSettings

logger = logging.getLogger(__name__)

__all__ = ["SlimeParamScheduler", "build_lr_scheduler", "train_steps"]


def train_steps(cfg: SlimeArgs) -> int:
    """Optimizer steps of the whole run (the original's `train_iters`)."""
    return cfg.num_rollout * cfg.rollout_batch_size * cfg.n_samples_per_prompt // cfg.global_batch_size


class SlimeParamScheduler(OptimizerParamScheduler):
    """megatron-core's scheduler whose saved state also holds the WSD anneal, which a resume must share.

    megatron-core's `state_dict` leaves `wsd_decay_steps` and `lr_wsd_decay_style` out, so a resume with another
    `--lr-wsd-decay-iters` or `--lr-wsd-decay-style` went on with the new anneal with no word (Megatron-LM too), where
    every other flag of the schedule is compared. The rates are megatron-core's own (`get_lr` is not overridden).
    """

    def state_dict(self) -> dict:
        """megatron-core's state, plus `wsd_decay_steps` and `lr_wsd_decay_style` under WSD."""
        state = super().state_dict()
        if self.lr_decay_style == "WSD":
            state.update(wsd_decay_steps=self.wsd_decay_steps, lr_wsd_decay_style=self.lr_wsd_decay_style)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """megatron-core's load, after comparing the WSD anneal where both sides are WSD schedules.

        Another decay style on either side is megatron-core's own refusal (`lr_decay_style`).

        Raises:
            AssertionError: megatron-core's "class input value X and checkpoint value Y for NAME do not match"
                (`checkpoint.load_checkpoint` turns it into one line naming `--load`), for the anneal's length or
                style as for megatron-core's own fields.
        """
        if self.lr_decay_style == "WSD" and state_dict.get("lr_decay_style") == "WSD":
            for key, flag in _WSD_STATE:
                self._check_and_set(getattr(self, key), state_dict.get(key), flag)
        super().load_state_dict(state_dict)


# The WSD entries of the saved state, and the flag each comes from (named in the refusal of another value).
_WSD_STATE = (("wsd_decay_steps", "--lr-wsd-decay-iters"), ("lr_wsd_decay_style", "--lr-wsd-decay-style"))


def build_lr_scheduler(optimizer: Any, s: MegatronSettings, cfg: SlimeArgs) -> OptimizerParamScheduler:
    """Builds the scheduler (it sets the optimizer's rate for the first step).

    Args:
        optimizer: the megatron optimizer (anything with `param_groups`).
        s: settings; reads `lr`, `min_lr`, `lr_decay_style`, `lr_decay_iters`, `lr_warmup_iters`,
            `lr_warmup_fraction`, `lr_warmup_init`, `lr_wsd_decay_iters`, `lr_wsd_decay_style`, `weight_decay`.
        cfg: run config; reads `num_rollout`, `rollout_batch_size`, `n_samples_per_prompt`, `global_batch_size`
            (the run length when `--lr-decay-iters` is unset).

    Raises:
        ValueError: both warmup flags given, or `--lr-decay-style WSD` without `--lr-wsd-decay-iters`.
    """
    wsd = s.lr_decay_style == "WSD"
    if wsd and s.lr_wsd_decay_iters is None:  # validation refuses it first; megatron-core would assert
        raise ValueError("--lr-decay-style WSD needs --lr-wsd-decay-iters (the anneal's optimizer steps)")
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
    return SlimeParamScheduler(
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
        # Megatron-LM passes both whatever the style (megatron-core reads them only under WSD); None and its default
        # otherwise here, so a non-WSD schedule's state holds neither.
        wsd_decay_steps=s.lr_wsd_decay_iters if wsd else None,
        lr_wsd_decay_style=s.lr_wsd_decay_style if wsd else None,
    )
