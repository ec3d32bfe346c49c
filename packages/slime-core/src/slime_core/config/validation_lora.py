"""Rules of LoRA runs (`--lora-rank`, `--lora-target-modules`, `--exclude-modules`), part of `derive_and_validate`.

The original's FSDP LoRA took `--target-modules all-linear` or a comma-separated list, less `--exclude-modules`;
here both spellings resolve to the HF module names the trainer's peft wraps and SGLang adapts.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError, field_to_flag, non_default, warn_once
from slime_core.config.opd import trainer_side_teacher
from slime_core.config.training import LORA_TARGET_MODULES
from slime_core.extensions import TRAIN_BACKENDS, train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["check_lora"]


def check_lora(args: SlimeArgs) -> None:
    """`--lora-rank` and its knobs: a LoRA backend, no critic or trainer-side teacher, adapter-only sync, the targets.

    Sets `--weight-sync lora`, the adapter directory (`--update-weight-disk-dir`) and `--lora-target-modules` to the
    module names it stands for (`_lora_targets`).

    Raises:
        ConfigError: naming the flag.
    """
    if not args.lora_rank:
        if args.weight_sync == "lora":
            raise ConfigError("--weight-sync lora syncs a LoRA adapter: set --lora-rank")
        fields = ("lora_alpha", "lora_target_modules", "lora_exclude_modules", "lora_save_merged")
        knobs = [field_to_flag(f) for f in non_default(args, fields)]
        if knobs:  # full fine-tuning: no adapter for them to shape
            warn_once("lora_knobs", f"{' / '.join(knobs)}: no effect without --lora-rank (LoRA is off)")
        return
    if not train_backend_spec(args).supports_lora:
        supported = [n for n in TRAIN_BACKENDS.names() if _supports_lora(n)]
        raise ConfigError(f"--lora-rank needs a LoRA backend (--train-backend {' or '.join(supported)}), "
                          f"got {args.train_backend}")  # fmt: skip
    if args.use_critic:
        raise ConfigError(f"--lora-rank with --advantage-estimator {args.advantage_estimator}: the critic has no LoRA")
    if trainer_side_teacher(args):
        raise ConfigError(
            f"--lora-rank with --opd-type {args.opd_type}: a trainer-side teacher needs full weights; "
            "use --opd-type sglang (a teacher engine)"
        )
    if args.weight_sync not in ("auto", "lora"):
        raise ConfigError(
            f"--weight-sync {args.weight_sync}: with --lora-rank only the adapter is synced (--weight-sync lora)"
        )
    args.lora_target_modules = _lora_targets(args.lora_target_modules, args.lora_exclude_modules)
    args.weight_sync = "lora"
    if args.update_weight_disk_dir is None:  # adapters travel as files the engines load
        args.update_weight_disk_dir = os.path.join(args.output_dir, "weight_sync")


def _module_names(values: list[str], flag: str) -> list[str]:
    """Space- or comma-separated module names (the original's `--target-modules q_proj,v_proj`), checked.

    A value is split on commas and whitespace both: one quoted value `"q_proj v_proj"` (a shell variable, a YAML
    string) was refused as the module name `q_proj v_proj`, which read as if both names were wrong.
    """
    names = [n for v in values for n in re.split(r"[,\s]+", v) if n]
    unknown = [n for n in names if n not in (*LORA_TARGET_MODULES, "all-linear", "all")]
    if unknown:
        raise ConfigError(
            f"{flag} {' '.join(unknown)}: not a module an adapter can target; use {', '.join(LORA_TARGET_MODULES)} "
            "or all-linear (the HF names, which SGLang adapts too)"
        )
    return names


def _lora_targets(targets: list[str], excluded: list[str]) -> list[str]:
    """`--lora-target-modules` with `all-linear` / `all` expanded, less `--exclude-modules`, in the canonical order.

    Idempotent (validation may run again on a validated config). peft reads a list entry `all-linear` as a module
    name, matched nothing, and stopped the trainer after the engines started; `q_proj,foo` adapted q_proj only.
    """
    names = set(_module_names(targets, "--lora-target-modules"))
    if names & {"all-linear", "all"}:
        names = set(LORA_TARGET_MODULES)
    names -= set(_module_names(excluded, "--exclude-modules"))
    if not names:
        raise ConfigError("--lora-target-modules: no module left to adapt (give at least one, less --exclude-modules)")
    return [n for n in LORA_TARGET_MODULES if n in names]


def _supports_lora(name: str) -> bool:
    try:
        return TRAIN_BACKENDS.get(name).supports_lora
    except ImportError:  # a backend whose package is not importable here is not offered
        return False
