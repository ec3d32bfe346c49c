"""Config rules of on-policy distillation (`--use-opd`, as the original's `slime_validate_args`).

`--opd-type sglang`: the teacher is an SGLang-API engine. Either the original's plugins fetch its log-probs
(`--custom-rm-path slime.rollout.on_policy_distillation.reward_func` +
`--custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards`, pure
distillation), or, without a reward post-process function, the rollout asks the engine at `--rm-url` itself
and the task reward (`--rm-type` / `--custom-rm-path`, or 0 when none is set) stays what it is.
A trainer-side teacher (`--opd-type` naming `--train-backend`, or `megatron`, the original's value, with any
backend): the trainer holds the teacher weights of `--opd-teacher-load`. The backend's record says whether it can
(`TrainBackendSpec.supports_opd_teacher`), so a package's backend takes part without a name list here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError, non_default, warn_once
from slime_core.extensions import TRAIN_BACKENDS, train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["ENGINE_TEACHER", "builtin_teacher_scoring", "trainer_side_teacher", "validate_opd"]

#: `--opd-type` of a teacher engine (the original's value).
ENGINE_TEACHER = "sglang"
#: The original's `--opd-type` of a teacher in the trainer; its launch scripts pass it whatever the backend.
_ORIGINAL_TRAINER_TEACHER = "megatron"


def builtin_teacher_scoring(args: SlimeArgs) -> bool:
    """Whether the rollout scores the teacher itself (`--opd-type sglang` without a reward post-process hook)."""
    return args.use_opd and args.opd_type == ENGINE_TEACHER and args.custom_reward_post_process_path is None


def trainer_side_teacher(args: SlimeArgs) -> bool:
    """Whether the training backend holds the OPD teacher's weights (`--use-opd` with a non-`sglang` type)."""
    return args.use_opd and args.opd_type is not None and args.opd_type != ENGINE_TEACHER


def validate_opd(args: SlimeArgs) -> None:
    """Checks the `--use-opd` / `--opd-*` flags.

    Raises:
        ConfigError: an `--opd-type` that is neither sglang, megatron nor a registered train backend holding a
            teacher; `--use-opd` without `--opd-type`; a teacher checkpoint with the sglang type or without
            `--use-opd`; a trainer-side type without an existing `--opd-teacher-load`, naming another backend
            than `--train-backend` (`--opd-type fsdp` with Megatron), or with a backend that cannot hold a teacher;
            built-in sglang scoring without `--rm-url`, or sharing it with `--rm-type remote_rm`.
    """
    if args.opd_type is not None:
        _check_opd_type(args.opd_type)
    _check_teacher_reply_reward(args)
    if not args.use_opd:
        if args.opd_teacher_load is not None:
            raise ConfigError("--opd-teacher-load is set but --use-opd is not; add --use-opd or remove it")
        if args.opd_type is not None:
            warn_once("opd_type", f"--opd-type {args.opd_type} has no effect without --use-opd")
        if non_default(args, ("opd_kl_coef",)):  # the teacher's reverse KL enters the advantages under --use-opd only
            warn_once("opd_kl_coef", f"--opd-kl-coef {args.opd_kl_coef} has no effect without --use-opd")
        return
    if args.opd_type is None:
        raise ConfigError("--use-opd requires --opd-type sglang (teacher engine) or megatron/fsdp (trainer-side)")
    if args.opd_kl_coef == 0:
        # The teacher is still asked (or held and run) every rollout, for the logged opd_reverse_kl only.
        warn_once(
            "opd_kl_coef_zero",
            "--use-opd with --opd-kl-coef 0: the teacher's log-probs do not enter the advantages (only the "
            "opd_reverse_kl metric is logged), yet the teacher scores every sample; give a positive --opd-kl-coef "
            "or drop --use-opd",
        )
    if args.opd_type == ENGINE_TEACHER:
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
    _check_trainer_teacher(args)
    if args.opd_teacher_load is None:
        raise ConfigError(f"--opd-type {args.opd_type} requires --opd-teacher-load (the teacher checkpoint)")
    if not os.path.exists(args.opd_teacher_load):
        raise ConfigError(f"--opd-teacher-load {args.opd_teacher_load} does not exist")


#: The original's teacher-scoring reward function and where it maps to here (`slime_rollout.plugins`).
_TEACHER_REPLY_REWARDS = frozenset(
    {"slime.rollout.on_policy_distillation.reward_func", "slime_rollout.generation.opd.reward_func"}
)


def _check_teacher_reply_reward(args: SlimeArgs) -> None:
    """The original's OPD `reward_func` (a teacher reply as the reward) needs a post-process that turns it into one.

    Without one the default rollout trained on a dict reward: the run failed at its first batch with "reward is a
    dict with keys ['meta_info', 'text']; set --reward-key", a key that holds no number. A custom
    `--rollout-function-path` may turn the replies into rewards itself, so it is left alone.
    """
    if args.custom_rm_path not in _TEACHER_REPLY_REWARDS or args.custom_reward_post_process_path is not None:
        return
    if non_default(args, ("rollout_function_path",)):
        return
    raise ConfigError(
        f"--custom-rm-path {args.custom_rm_path} returns the teacher's reply, not a reward: add "
        "--custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards (pure "
        "distillation, rewards 0), or drop --custom-rm-path: --use-opd --opd-type sglang scores the teacher itself "
        "and keeps the task reward of --rm-type"
    )


def _holds_teacher(name: str) -> bool:
    try:
        return TRAIN_BACKENDS.get(name).supports_opd_teacher
    except ImportError:  # a backend whose package is not importable here is not offered
        return False


def _teacher_holders() -> str:
    return ", ".join(n for n in TRAIN_BACKENDS.names() if _holds_teacher(n))


def _check_opd_type(opd_type: str) -> None:
    """`sglang`, the original's `megatron`, or a registered train backend whose record holds a teacher."""
    if opd_type in (ENGINE_TEACHER, _ORIGINAL_TRAINER_TEACHER):
        return
    if opd_type not in TRAIN_BACKENDS or not _holds_teacher(opd_type):
        raise ConfigError(
            f"--opd-type {opd_type}: expected sglang (a teacher engine), megatron (the teacher in the trainer) or a "
            f"train backend that holds a teacher ({_teacher_holders()})"
        )


def _check_trainer_teacher(args: SlimeArgs) -> None:
    """A trainer-side type names the running backend (or is `megatron`), and that backend can hold a teacher."""
    backend = args.train_backend
    if args.opd_type not in (backend, _ORIGINAL_TRAINER_TEACHER):
        raise ConfigError(
            f"--opd-type {args.opd_type} needs --train-backend {args.opd_type} (use --opd-type megatron with "
            f"--train-backend {backend})"
        )
    if not train_backend_spec(args).supports_opd_teacher:
        raise ConfigError(
            f"--opd-type {args.opd_type}: --train-backend {backend} cannot hold a teacher (its record sets no "
            f"supports_opd_teacher); use --opd-type sglang (a teacher engine) or a backend that can "
            f"({_teacher_holders()})"
        )
