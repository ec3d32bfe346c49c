"""Config rules of on-policy distillation (`--use-opd`, as the original's `slime_validate_args`).

`--opd-type sglang`: the teacher is an SGLang-API engine. Either the original's plugins fetch its log-probs
(`--custom-rm-path slime.rollout.on_policy_distillation.reward_func` +
`--custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards`, pure
distillation), or, without a reward post-process function, the rollout asks the engine at `--rm-url` itself
and the task reward (`--rm-type` / `--custom-rm-path`, or 0 when none is set) stays what it is.
`--opd-type megatron` / `fsdp`: the trainer holds the teacher weights of `--opd-teacher-load`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError, warn_once

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["builtin_teacher_scoring", "validate_opd"]


def builtin_teacher_scoring(args: SlimeArgs) -> bool:
    """Whether the rollout scores the teacher itself (`--opd-type sglang` without a reward post-process hook)."""
    return args.use_opd and args.opd_type == "sglang" and args.custom_reward_post_process_path is None


def validate_opd(args: SlimeArgs) -> None:
    """Checks the `--use-opd` / `--opd-*` flags.

    Raises:
        ConfigError: `--use-opd` without `--opd-type`; a teacher checkpoint with the sglang type or without
            `--use-opd`; a trainer-side type without an existing `--opd-teacher-load`; `--opd-type fsdp` with
            the Megatron backend; built-in sglang scoring without `--rm-url`, or sharing it with `--rm-type
            remote_rm`.
    """
    if not args.use_opd:
        if args.opd_teacher_load is not None:
            raise ConfigError("--opd-teacher-load is set but --use-opd is not; add --use-opd or remove it")
        if args.opd_type is not None:
            warn_once("opd_type", f"--opd-type {args.opd_type} has no effect without --use-opd")
        return
    if args.opd_type is None:
        raise ConfigError("--use-opd requires --opd-type sglang (teacher engine) or megatron/fsdp (trainer-side)")
    if args.opd_type == "sglang":
        if args.opd_teacher_load is not None:
            raise ConfigError(
                "--opd-teacher-load is for a trainer-side teacher; with --opd-type sglang the teacher engine at "
                "--rm-url scores the responses (remove --opd-teacher-load)"
            )
        if builtin_teacher_scoring(args):
            if not args.rm_url:
                raise ConfigError(
                    "--opd-type sglang needs the teacher engine's generate URL: --rm-url http://host:port/generate"
                )
            if args.rm_type in ("remote_rm", "boxed_remote_rm") and args.custom_rm_path is None:
                raise ConfigError(
                    "--opd-type sglang scores the teacher at --rm-url, which --rm-type remote_rm also uses; "
                    "give the task reward another way (--custom-rm-path)"
                )
        return
    if args.opd_type == "fsdp" and args.train_backend != "fsdp":
        raise ConfigError("--opd-type fsdp needs --train-backend fsdp (use --opd-type megatron with Megatron)")
    if args.opd_teacher_load is None:
        raise ConfigError(f"--opd-type {args.opd_type} requires --opd-teacher-load (the teacher checkpoint)")
    if not os.path.exists(args.opd_teacher_load):
        raise ConfigError(f"--opd-teacher-load {args.opd_teacher_load} does not exist")
