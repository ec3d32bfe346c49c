"""Megatron-style learning-rate schedule counted in optimizer steps.

Linear warmup from `--lr-warmup-init` (0) to `--lr` over `--lr-warmup-iters` steps (or
`--lr-warmup-fraction` × `decay_iters`, not rounded, as the original's Megatron), then decay to `--min-lr` over the
remaining `decay_iters - warmup` steps (`--lr-decay-style` constant | linear | cosine | inverse-square-root | WSD),
then flat at `--min-lr`: megatron-core's `OptimizerParamScheduler.get_lr`. WSD (warmup-stable-decay) holds `--lr`
until its anneal, the last `--lr-wsd-decay-iters` steps before `decay_iters`, shaped by `--lr-wsd-decay-style`.
`decay_iters` is `--lr-decay-iters` when set, else the run's total optimizer steps
`num_rollout * rollout_batch_size * n_samples_per_prompt // global_batch_size`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from slime_core.config import SlimeArgs

__all__ = ["build_lr_scheduler", "check_param_groups", "load_scheduler_state", "lr_at_step"]

_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
# `--lr-wsd-decay-style` -> the anneal's coefficient at the anneal's fraction `r` in [0, 1] (1 at `r = 0`, 0 at
# `r = 1`): megatron-core's `OptimizerParamScheduler.get_lr`, term for term.
_WSD_COEFFS = {
    "linear": lambda r: 1.0 - r,
    "cosine": lambda r: 0.5 * (math.cos(math.pi * r) + 1.0),
    "exponential": lambda r: (2.0 * math.pow(0.5, r)) - 1.0,
    "minus_sqrt": lambda r: 1.0 - math.sqrt(r),
}
# The decay length's key in a saved schedule (kept as written: checkpoints compare by it).
_RUN_LENGTH = "--lr-decay-iters (or the run's length)"


def lr_at_step(
    step: int,
    *,
    lr: float,
    min_lr: float,
    warmup: float,
    decay_iters: int,
    style: str,
    warmup_init: float = 0.0,
    wsd_iters: int | None = None,
    wsd_style: str = "exponential",
) -> float:
    """Learning rate used by optimizer step `step` (0-based): megatron-core's `OptimizerParamScheduler.get_lr`.

    megatron-core sets the rate of a step before it (the scheduler is built at step 0 and stepped after each
    optimizer step), so step `k` of a warmup uses `warmup_init + (lr - warmup_init) * k / warmup`: the first step
    runs at `warmup_init` and step `warmup` at `lr` (`megatron/core/optimizer_param_scheduler.py`).

    Args:
        step: number of optimizer steps already taken.
        lr: peak rate (`--lr`).
        min_lr: floor after decay (`--min-lr`).
        warmup: warmup steps (may be fractional: `--lr-warmup-fraction` × `decay_iters`); the rate is
            `warmup_init + (lr - warmup_init) * step / warmup` for `step <= warmup`.
        decay_iters: step at which decay reaches `min_lr`.
        style: `constant`, `linear`, `cosine`, `inverse-square-root` or `WSD` (`--lr-decay-style`;
            inverse-square-root is `max(min_lr, lr * sqrt(max(warmup, 1) / max(step, 1)))` after the warmup, in
            optimizer steps).
        warmup_init: rate the warmup starts from (`--lr-warmup-init`).
        wsd_iters: WSD only: the anneal's steps (`--lr-wsd-decay-iters`); it starts at `a = decay_iters - wsd_iters`,
            and a step `a < step <= decay_iters` after the warmup runs at
            `min_lr + coeff((step - a) / wsd_iters) * (lr - min_lr)`.
        wsd_style: WSD only: `coeff` of the anneal (`--lr-wsd-decay-style`): `linear` `1 - r`, `cosine`
            `(1 + cos(pi r)) / 2`, `exponential` `2 * 0.5**r - 1`, `minus_sqrt` `1 - sqrt(r)`.

    Returns:
        The learning rate.

    Raises:
        ValueError: on an unknown style, or WSD without `wsd_iters` or with an unknown `wsd_style`.
    """
    if style not in _STYLES:
        raise ValueError(f"--lr-decay-style must be one of {_STYLES}, got {style!r}")
    if style == "WSD" and (wsd_iters is None or wsd_style not in _WSD_COEFFS):
        raise ValueError(
            f"--lr-decay-style WSD needs --lr-wsd-decay-iters (got {wsd_iters}) and a --lr-wsd-decay-style of "
            f"{tuple(_WSD_COEFFS)} (got {wsd_style!r})"
        )
    if warmup > 0 and step <= warmup:
        return warmup_init + (lr - warmup_init) * step / warmup
    if style == "constant":
        return lr
    if step > decay_iters:
        return min_lr
    if style == "inverse-square-root":
        return max(min_lr, lr * math.sqrt(max(warmup, 1)) / math.sqrt(max(step, 1)))
    if style == "WSD":
        # megatron-core counts the anneal back from the decay's end, whatever the warmup: a step inside the warmup
        # took the warmup's rate above, and an anneal longer than the decay starts part-way through.
        anneal_start = decay_iters - wsd_iters
        if step <= anneal_start:
            return lr
        return min_lr + _WSD_COEFFS[wsd_style]((step - anneal_start) / wsd_iters) * (lr - min_lr)
    # Here warmup < step <= decay_iters, so the span is positive (also where warmup >= decay_iters, which
    # megatron-core refuses: its rate there is --lr through the warmup, then --min-lr).
    frac = (step - warmup) / (decay_iters - warmup)
    if style == "linear":
        coeff = 1.0 - frac
    else:
        coeff = 0.5 * (math.cos(math.pi * frac) + 1.0)
    return min_lr + coeff * (lr - min_lr)


def _decay_iters(cfg: SlimeArgs) -> int:
    if cfg.lr_decay_iters:
        return cfg.lr_decay_iters
    total = cfg.num_rollout * cfg.rollout_batch_size * cfg.n_samples_per_prompt // cfg.global_batch_size
    return total or 1


def _warmup_iters(cfg: SlimeArgs, decay_iters: int) -> float:
    fraction = cfg.lr_warmup_fraction
    iters = cfg.lr_warmup_iters
    if fraction is None:
        return iters
    if iters:
        raise ValueError("give only one of --lr-warmup-iters and --lr-warmup-fraction")
    # The original's Megatron: `lr_warmup_fraction * lr_decay_steps`, a float (rounding down started the decay up to a
    # step early and reached --lr a step sooner than megatron-core does).
    return float(fraction) * decay_iters


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: SlimeArgs) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` implementing `lr_at_step`; its state dict holds the step count for resume.

    Args:
        optimizer: optimizer whose param groups have `initial_lr = --lr`.
        cfg: reads `lr`, `min_lr`, `lr_warmup_iters`, `lr_warmup_fraction`, `lr_warmup_init`, `lr_decay_style`,
            `lr_decay_iters`, `lr_wsd_decay_iters`, `lr_wsd_decay_style` (WSD), and `num_rollout`,
            `rollout_batch_size`, `n_samples_per_prompt`, `global_batch_size`.

    Raises:
        ValueError: an unknown decay style, WSD without `--lr-wsd-decay-iters`, or both `--lr-warmup-iters` and
            `--lr-warmup-fraction`.
    """
    lr = float(cfg.lr)
    decay_iters = _decay_iters(cfg)
    kwargs = dict(
        lr=lr,
        min_lr=float(cfg.min_lr),
        warmup=_warmup_iters(cfg, decay_iters),
        decay_iters=decay_iters,
        style=cfg.lr_decay_style,
        warmup_init=float(cfg.lr_warmup_init),
    )
    if cfg.lr_decay_style == "WSD":  # read only by WSD (and kept in the saved schedule only then)
        kwargs.update(wsd_iters=cfg.lr_wsd_decay_iters, wsd_style=cfg.lr_wsd_decay_style)
    lr_at_step(0, **kwargs)  # validates the style early
    if lr == 0.0:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.0)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at_step(step, **kwargs) / lr)
    scheduler.slime_schedule = _schedule_flags(kwargs)  # an attribute: LambdaLR.state_dict() saves it
    scheduler.slime_optimizer = _optimizer_flags(cfg)
    return scheduler


def _optimizer_flags(cfg: SlimeArgs) -> dict[str, float]:
    """The AdamW settings a resume must share with its checkpoint (kept in the scheduler's state dict, compared).

    `Optimizer.load_state_dict` puts the saved param groups' values over this run's: unchecked, a resume with
    another `--weight-decay` or `--adam-beta2` would train on with the saved ones, with no word.
    """
    return {"--weight-decay": float(cfg.weight_decay), "--adam-beta1": float(cfg.adam_beta1),
            "--adam-beta2": float(cfg.adam_beta2), "--adam-eps": float(cfg.adam_eps)}  # fmt: skip


def _differences(wanted: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    """`"--flag here-value here vs saved-value saved"` for each flag whose values differ (one side may lack it)."""
    flags = [flag for flag in dict.fromkeys([*wanted, *saved]) if wanted.get(flag) != saved.get(flag)]
    return [f"{flag} {wanted.get(flag, '(unused)')} here vs {saved.get(flag, '(unused)')} saved" for flag in flags]


def _schedule_flags(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The flag values that set the rate of some step (kept in the scheduler's state dict, compared on resume)."""
    out: dict[str, Any] = {"--lr": kwargs["lr"], "--lr-decay-style": kwargs["style"]}
    if kwargs["warmup"]:
        out["--lr-warmup-iters (or --lr-warmup-fraction)"] = kwargs["warmup"]
        out["--lr-warmup-init"] = kwargs["warmup_init"]
    if kwargs["style"] != "constant":
        out["--min-lr"] = kwargs["min_lr"]
        out[_RUN_LENGTH] = kwargs["decay_iters"]
    if kwargs["style"] == "WSD":
        out["--lr-wsd-decay-iters"] = kwargs["wsd_iters"]
        out["--lr-wsd-decay-style"] = kwargs["wsd_style"]
    return out


def check_param_groups(scheduler: torch.optim.lr_scheduler.LRScheduler, state: dict[str, Any]) -> None:
    """Refuses a saved schedule whose optimizer had another number of parameter groups than this run's.

    Checkpoints saved before issue 27 pass 86 hold one AdamW group (weight decay on every parameter); this run's
    optimizer has a decayed and an undecayed group (`trainer_parts.build_optimizer`). Unchecked, DCP's loader stops
    on a missing `param_groups.1` key and the checkpoint is called damaged.

    Raises:
        ValueError: the counts differ (names `--load` and `--no-load-optim`).
    """
    saved, here = len(state.get("base_lrs", ())), len(scheduler.optimizer.param_groups)
    if saved and saved != here:
        raise ValueError(
            f"--load: the checkpoint's optimizer has {saved} parameter group(s), this run's {here} (--weight-decay "
            "skips biases and norms, as megatron-core, since issue 27 pass 86; a checkpoint saved before decayed "
            "every parameter): resume it with --no-load-optim to start the optimizer and its schedule afresh"
        )


def load_scheduler_state(scheduler: torch.optim.lr_scheduler.LambdaLR, state: dict[str, Any]) -> None:
    """Restores a scheduler and writes its current rate back into the optimizer's param groups.

    A resumed run continues the checkpoint's schedule, so the flags that set it must be the saved ones: the original's
    Megatron refuses a change (without `--override-opt_param-scheduler`), and here `LambdaLR.load_state_dict` restored
    `base_lrs`, the saved `--lr`, under this run's warmup and decay: a resume with another `--lr` trained at the old
    one with no word. `LRScheduler.load_state_dict` alone leaves the optimizer's `lr` untouched until the next
    `step()`.

    The AdamW settings (`--weight-decay`, `--adam-beta1/2`, `--adam-eps`) are compared the same way: the optimizer
    state the checkpoint restores carries the saved ones.

    Raises:
        ValueError: another number of optimizer parameter groups (`check_param_groups`); a flag of the schedule or of
            AdamW differs from the checkpoint's (each named with both values); a
            checkpoint saved before the flags were stored is compared by `--lr` only (before the AdamW ones were: by
            the schedule's).
    """
    check_param_groups(scheduler, state)
    wanted, wanted_lrs = getattr(scheduler, "slime_schedule", None), list(scheduler.base_lrs)
    saved, saved_lrs = state.get("slime_schedule"), list(state.get("base_lrs", wanted_lrs))
    hint = ""
    if saved is not None and wanted is not None:
        differ = _differences(wanted, saved)
        if _RUN_LENGTH in saved and wanted.get(_RUN_LENGTH) != saved[_RUN_LENGTH]:  # the run's length differs
            hint = (
                f" (the run's length is --num-rollout x --rollout-batch-size x --n-samples-per-prompt / "
                f"--global-batch-size optimizer steps; --lr-decay-iters {saved[_RUN_LENGTH]} keeps the saved decay)"
            )
    else:
        shown = ", ".join  # several param groups share one --lr
        differ = [] if saved_lrs == wanted_lrs else [
            f"--lr {shown(f'{v:g}' for v in wanted_lrs)} here vs {shown(f'{v:g}' for v in saved_lrs)} saved"
        ]  # fmt: skip
    wanted_adam, saved_adam = getattr(scheduler, "slime_optimizer", None), state.get("slime_optimizer")
    adam = _differences(wanted_adam, saved_adam) if wanted_adam is not None and saved_adam is not None else []
    if differ or adam:
        what, state_of = (
            ("learning-rate schedule differs", "schedule") if not adam
            else ("optimizer settings differ", "optimizer state") if not differ
            else ("learning-rate schedule and optimizer settings differ", "schedule and optimizer state")
        )  # fmt: skip
        raise ValueError(
            f"--load: the checkpoint's {what} from this run's flags ({'; '.join(differ + adam)}); a resumed run "
            f"continues the checkpoint's {state_of}: give the saved values{hint}, or --no-load-optim to start the "
            "optimizer and its schedule afresh"
        )
    scheduler.load_state_dict(state)
    for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
        group["lr"] = lr
