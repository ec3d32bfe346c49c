"""Cross-field validation and derived defaults of `SlimeArgs`.

`derive_and_validate(args)` runs once per validation, in a fixed order (placement before batch
sizes before algorithm rules), fills the defaults that depend on other flags and raises
`ConfigError` naming the flags on the first broken rule. Every derivation is idempotent, so a
validated config survives `to_dict()` / `from_dict()` unchanged.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from slime_core.config.base import ConfigError, field_to_flag, non_default, warn_once, warnings_silenced
from slime_core.config.critic import validate_critic
from slime_core.config.megatron_checks import check_megatron_flags
from slime_core.config.mismatch import validate_mismatch
from slime_core.config.monitoring import warn_eval_only_flags
from slime_core.config.opd import validate_opd
from slime_core.config.save_hf import CONTAINED_PATH_FLAGS, PROTECTED_PATH_FLAGS, check_save_hf
from slime_core.config.sglang_ep import check_expert_parallel
from slime_core.config.sglang_flags import check_managed_sglang_flags
from slime_core.config.true_on_policy import check_true_on_policy
from slime_core.config.unsupported import check_unsupported
from slime_core.config.validation_fully_async import check_fully_async
from slime_core.config.validation_lora import check_lora
from slime_core.config.validation_multimodal import check_multimodal
from slime_core.config.validation_placement import check_placement, colocated_gpu_split, gpu_engine
from slime_core.config.validation_routing_replay import check_routing_replay
from slime_core.config.validation_trainer import check_trainer_flags
from slime_core.estimators import get_estimator
from slime_core.extensions import engine_spec, train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["colocated_gpu_split", "derive_and_validate"]

logger = logging.getLogger(__name__)


def derive_and_validate(args: SlimeArgs) -> None:
    """Fills derived defaults on `args` in place and checks every cross-field rule.

    Raises:
        ConfigError: A rule is broken; the message names the flags involved.
    """
    check_unsupported(args)  # first: a flag that would do nothing is the clearest error
    args = _Draft(args)  # type: ignore[assignment]  # the frozen instance, writable until it is returned
    _engines(args)
    _debug_modes(args)
    check_placement(args)
    check_fully_async(args)
    _batch_sizes(args)
    _num_rollout(args)
    # An eval-only run (--num-rollout 0) trains nothing: the algorithm's and the trainer's warnings are not for it
    # (their errors still are: the same flags resume into a training run).
    with warnings_silenced(args.num_rollout == 0):
        _algorithm(args)
        check_trainer_flags(args)
    _multi_turn_flags(args)
    _lengths(args)
    _top_k(args)
    _eval(args)
    _checkpoint_and_dumps(args)
    check_lora(args)
    _weight_sync(args)
    _passthrough(args)
    check_multimodal(args)
    check_routing_replay(args)
    check_true_on_policy(args)


class _Draft:
    """Writable view of a config under validation: derived defaults are filled in before it is frozen."""

    __slots__ = ("_target",)

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self._target).model_fields:
            raise AttributeError(f"SlimeArgs has no field {name!r}")
        # Bypasses the frozen check; only validation writes here, before anyone else sees the instance.
        object.__setattr__(self._target, name, value)


def _cuda_available() -> bool:
    import torch  # Imported lazily: only needed to resolve "auto" defaults.

    return torch.cuda.is_available()


def _engines(args: SlimeArgs) -> None:
    if args.rollout_engine is None:
        args.rollout_engine = "sglang" if _cuda_available() else "reference"
    if args.engine_python is None:
        args.engine_python = sys.executable
    if args.rollout_external_engine_addrs:
        urls = [a if "://" in a else f"http://{a}" for a in args.rollout_external_engine_addrs]
        if args.rollout_engine_urls and args.rollout_engine_urls != urls:
            raise ConfigError("--rollout-external-engine-addrs and --rollout-engine-urls disagree; give only one")
        args.rollout_engine_urls = urls


def _debug_modes(args: SlimeArgs) -> None:
    if args.load_debug_rollout_data is not None:
        args.debug_train_only = True
    if args.debug_rollout_only and args.debug_train_only:
        raise ConfigError("--debug-rollout-only and --debug-train-only (or --load-debug-rollout-data) are exclusive")
    if args.debug_rollout_only and (args.colocate or args.offload):
        # No trainer runs, so there is nothing to share GPUs with or to offload.
        warn_once("debug_rollout_colocate", "--debug-rollout-only: ignoring --colocate/--offload (no trainer runs)")
        if args.colocate and args.rollout_num_gpus is None and gpu_engine(args):
            # The GPUs the colocated run's engines would have had, as the original: its engines, not one.
            args.rollout_num_gpus = args.actor_num_nodes * args.actor_num_gpus_per_node
        args.colocate = False
        args.offload = False
        args.offload_train = False
        args.offload_rollout = False


def _batch_sizes(args: SlimeArgs) -> None:
    rbs, n = args.rollout_batch_size, args.n_samples_per_prompt
    total = rbs * n
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = rbs
    if args.over_sampling_batch_size < rbs:
        raise ConfigError(
            f"--over-sampling-batch-size ({args.over_sampling_batch_size}) must be >= --rollout-batch-size ({rbs})"
        )
    steps, gbs = args.num_steps_per_rollout, args.global_batch_size
    if steps is None and gbs is None:
        steps = 1
    if steps is not None:
        if total % steps:
            raise ConfigError(
                f"--num-steps-per-rollout {steps} does not divide --rollout-batch-size * --n-samples-per-prompt "
                f"= {rbs} * {n} = {total}"
            )
        if gbs is not None and gbs * steps != total:
            raise ConfigError(
                f"--global-batch-size {gbs} * --num-steps-per-rollout {steps} != --rollout-batch-size * "
                f"--n-samples-per-prompt = {rbs} * {n} = {total}"
            )
        gbs = total // steps
    else:
        assert gbs is not None
        if total % gbs:
            raise ConfigError(
                f"--global-batch-size {gbs} does not divide --rollout-batch-size * --n-samples-per-prompt "
                f"= {rbs} * {n} = {total}"
            )
        steps = total // gbs
    args.global_batch_size, args.num_steps_per_rollout = gbs, steps
    if gbs % args.micro_batch_size:
        raise ConfigError(f"--micro-batch-size {args.micro_batch_size} does not divide --global-batch-size {gbs}")


def _num_rollout(args: SlimeArgs) -> None:
    # With --num-epoch alone, --num-rollout = epochs × (prompts // --rollout-batch-size) is counted from the data
    # before the run starts (slime_app.resolve); until then it is None.
    if args.num_rollout is None and args.num_epoch is None:
        raise ConfigError("--num-rollout or --num-epoch is required")
    if args.num_rollout == 0 and args.eval_interval is None:
        # The original's train.py evaluates once when --num-rollout is 0 and --eval-interval is set; without it
        # the run started Ray, the engines and the trainer to do nothing.
        raise ConfigError(
            "--num-rollout 0 trains nothing; with --eval-interval (and --eval-prompt-data or --eval-config) it "
            "evaluates the loaded model once, as the original's eval-only run"
        )
    if args.num_rollout == 0 and args.debug_train_only:
        # The eval-only run's one eval needs engines, which these modes do not start: it started Ray and the trainer,
        # said that no eval runs, and ended (the original stopped on the missing engines in its eval).
        raise ConfigError(
            "--num-rollout 0 only evaluates, and --debug-train-only (or --load-debug-rollout-data) starts no engine "
            "to evaluate with: drop one of them"
        )
    if args.start_rollout_id is not None and args.num_rollout and args.start_rollout_id >= args.num_rollout:
        # The loop runs rollouts start..num_rollout-1 and evaluates no --start-rollout-id start: nothing ran.
        raise ConfigError(
            f"--start-rollout-id {args.start_rollout_id} is not below --num-rollout {args.num_rollout}: the run "
            "would train nothing (rollout ids start..num_rollout-1); raise --num-rollout or lower --start-rollout-id"
        )
    if args.num_epoch is not None and args.disable_rollout_global_dataset:
        raise ConfigError(
            "--num-epoch counts passes over --prompt-data; with --disable-rollout-global-dataset give --num-rollout"
        )


_TIS_FIELDS = ("tis_clip", "tis_clip_low", "tis_mode")


def _importance_sampling_knobs(args: SlimeArgs) -> None:
    """Warns once about TIS / OPSM settings whose switch is off (the loss never reads them then).

    Raises:
        ConfigError: `--custom-tis-function-path` without `--use-tis` or `--get-mismatch-metrics` (a function of the
            user's that would never be called: it changes the loss when it is).
    """
    if args.custom_tis_function_path and not (args.use_tis or args.get_mismatch_metrics):
        # The loss calls it only under one of them (as the original's loss.py): it weighted nothing, said nothing.
        raise ConfigError(
            f"--custom-tis-function-path {args.custom_tis_function_path} is called only with --use-tis (it weights the "
            "policy loss) or --get-mismatch-metrics (its metrics only): add one, or drop the flag"
        )
    tis = [field_to_flag(f) for f in non_default(args, _TIS_FIELDS)]
    if tis and not (args.use_tis or args.get_mismatch_metrics):
        # The loss calls the TIS function (built-in or --custom-tis-function-path) under these two only; its weights
        # and the mismatch helper's bounds (--tis-upper-bound defaults to --tis-clip) are what read the others.
        flags = " and ".join(tis)
        verb = "have" if len(tis) > 1 else "has"
        warn_once("tis_clip", f"{flags} {verb} no effect without --use-tis or --get-mismatch-metrics")
    if non_default(args, ("opsm_delta",)) and not args.use_opsm:
        warn_once("opsm_delta", "--opsm-delta has no effect without --use-opsm")


def _algorithm(args: SlimeArgs) -> None:
    if args.n_samples_per_prompt == 1 and not args.disable_grpo_std_normalization:
        # The std of a single-sample group is 0; normalizing by it would divide by zero.
        args.disable_grpo_std_normalization = True
    if args.kl_coef != 0 and args.kl_loss_coef != 0:
        raise ConfigError("--kl-coef and --kl-loss-coef cannot both be non-zero (reward KL vs loss KL)")
    if args.kl_loss_coef != 0 and not args.use_kl_loss:
        warn_once("kl_loss_coef", "--kl-loss-coef has no effect without --use-kl-loss")
    if args.ref_update_interval is not None and not args.with_ref:
        # No reference model is loaded, so there is none to refresh (the original skips it as silently).
        warn_once(
            "ref_update_interval",
            f"--ref-update-interval {args.ref_update_interval} has no effect without a reference model "
            "(--use-kl-loss or --kl-coef)",
        )
    if args.with_ref and args.ref_load is None and args.hf_checkpoint is None:
        raise ConfigError("--use-kl-loss / --kl-coef need a reference model: give --ref-load or --hf-checkpoint")
    _estimator(args)
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.eps_clip_c is not None and args.eps_clip_c <= 1.0:
        raise ConfigError(f"--eps-clip-c must be > 1 (dual clip), got {args.eps_clip_c}")
    if args.use_rollout_logprobs and args.use_tis:
        raise ConfigError("--use-rollout-logprobs and --use-tis are mutually exclusive")
    if args.tis_clip_low > args.tis_clip:
        raise ConfigError(f"--tis-clip-low ({args.tis_clip_low}) must be <= --tis-clip ({args.tis_clip})")
    _importance_sampling_knobs(args)
    validate_mismatch(args)
    if args.loss_type == "custom_loss" and args.custom_loss_function_path is None:
        raise ConfigError("--loss-type custom_loss requires --custom-loss-function-path")
    if args.disable_compute_advantages_and_returns and args.loss_type == "policy_loss":
        raise ConfigError(
            "--disable-compute-advantages-and-returns leaves the policy loss without advantages; "
            "use it with --loss-type sft_loss or custom_loss"
        )
    if args.loss_type == "sft_loss":
        _policy_terms_without_effect(args)
    if args.only_train_params_name_list and args.freeze_params_name_list:
        raise ConfigError("--only-train-params-name-list and --freeze-params-name-list are mutually exclusive")
    if args.lr_warmup_fraction is not None and args.lr_warmup_iters:
        raise ConfigError("--lr-warmup-iters and --lr-warmup-fraction are mutually exclusive")
    if args.bf16 and args.fp16:
        raise ConfigError("--bf16 and --fp16 are mutually exclusive")
    if args.mask_offpolicy_in_partial_rollout and not args.partial_rollout:
        warn_once("mask_offpolicy", "--mask-offpolicy-in-partial-rollout has no effect without --partial-rollout")


def _policy_terms_without_effect(args: SlimeArgs) -> None:
    """Warns once about policy-loss terms given with `--loss-type sft_loss`, whose NLL reads none of them.

    The original's `sft_loss_function` ignores them too; a KL loss still loads and runs the reference model, and PPO
    still trains its critic.
    """
    given = [
        flag
        for flag, on in (
            ("--use-kl-loss", args.use_kl_loss),
            (f"--kl-coef {args.kl_coef}", args.kl_coef != 0),
            (f"--entropy-coef {args.entropy_coef}", args.entropy_coef != 0),
            ("--use-tis", args.use_tis),
            ("--use-opsm", args.use_opsm),
            # Its critic still trains every step (a value model's memory and compute): its values feed advantages.
            (f"--advantage-estimator {args.advantage_estimator} (its critic)", args.use_critic),
        )
        if on
    ]
    if given:
        warn_once(
            "sft_policy_terms",
            f"--loss-type sft_loss: {', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect (the loss is "
            "the negative log-likelihood of the trained tokens only); drop them",
        )


def _multi_turn_flags(args: SlimeArgs) -> None:
    """Multi-turn flags the default generate function does not read (eval rollouts use it too)."""
    multi_turn = [f for f, on in (("--env-path", args.env_path), ("--max-turns", args.max_turns > 1)) if on]
    if multi_turn and not args.custom_generate_function_path:
        # The default generate is single-turn and reads neither: the run trained without its env, unannounced.
        warn_once(
            "multi_turn_flags",
            f"{' and '.join(multi_turn)} {'has' if len(multi_turn) == 1 else 'have'} no effect with the default "
            "single-turn generate function (samples whose "
            "generate_function_path names another aside); set --custom-generate-function-path "
            "slime_rollout.generation.multi_turn.generate",
        )


def _estimator(args: SlimeArgs) -> None:
    """The `--advantage-estimator` spec's own rules (required flags, hook), the critic's, then OPD's."""
    spec = get_estimator(args.advantage_estimator)  # a registered name: the field's choices are the registry's
    spec.validate(args)
    if _single_sample_groups_learn_nothing(args, spec.group_wise):
        warn_once(
            "single_sample_groups",
            f"--n-samples-per-prompt 1 with --advantage-estimator {args.advantage_estimator}: every prompt group "
            "holds one sample, so every reward minus its group's mean is 0: all advantages and the policy-gradient "
            "loss are 0 (only a KL or entropy term trains); use --n-samples-per-prompt 2 or more",
        )
    validate_critic(args)
    validate_opd(args)


def _single_sample_groups_learn_nothing(args: SlimeArgs, group_wise: bool) -> bool:
    """A policy-loss run whose estimator normalizes rewards within groups of one sample (advantages all 0).

    The original runs it too; said, not refused. Not with a `--custom-reward-post-process-path` (it may normalize
    otherwise), OPD (its teacher term is added to the advantages) or `--debug-rollout-only` (nothing trains).
    """
    return (
        args.n_samples_per_prompt == 1 and group_wise and args.loss_type == "policy_loss" and not args.use_opd
        and args.custom_reward_post_process_path is None and not args.debug_rollout_only
    )  # fmt: skip


def _lengths(args: SlimeArgs) -> None:
    ctx = args.rollout_max_context_len
    if ctx is not None:
        if args.rollout_max_prompt_len is None:
            args.rollout_max_prompt_len = ctx - 1
        elif args.rollout_max_prompt_len > ctx - 1:
            raise ConfigError(
                f"--rollout-max-prompt-len ({args.rollout_max_prompt_len}) must be <= --rollout-max-context-len - 1 "
                f"({ctx - 1})"
            )
    if args.eval_max_context_len is None:
        args.eval_max_context_len = ctx


def _top_k(args: SlimeArgs) -> None:
    # SGLang's SamplingParams.verify refuses any other value on every request: the run failed at its first rollout.
    for field in ("rollout_top_k", "eval_top_k"):
        value = getattr(args, field)
        if value is not None and value != -1 and value < 1:
            raise ConfigError(f"{field_to_flag(field)} {value}: top-k is -1 (off) or at least 1, as SGLang takes it")


def _no_tilde_paths(args: SlimeArgs) -> None:
    """Refuses a path flag that starts with `~`: nothing here expands it.

    A shell expands `~` only when it is unquoted at the start of a word; `--save '~/ckpt'` or `save: ~/ckpt` in a
    `--config` YAML reached the run as written, and the run created a folder named `~` in the working directory.
    """
    for field in ("save_hf", *PROTECTED_PATH_FLAGS, *CONTAINED_PATH_FLAGS):
        value = getattr(args, field, None)
        paths = list(value[1::2]) if field == "eval_prompt_data" and value else [value]
        for path in paths:
            if isinstance(path, str) and path.startswith("~"):
                raise ConfigError(
                    f"{field_to_flag(field)} {path!r}: starts with '~', which nothing expands here (it was "
                    f"quoted, or came from --config); write the full path, e.g. {os.path.expanduser(path)!r}"
                )


def _eval(args: SlimeArgs) -> None:
    data = args.eval_prompt_data
    if data is not None and len(data) == 1:
        # The original's legacy form: one path is the "aime" dataset.
        args.eval_prompt_data = data = ["aime", data[0]]
    if data is not None and (len(data) == 0 or len(data) % 2):
        raise ConfigError(f"--eval-prompt-data takes pairs 'name path [name path ...]', got {len(data)} values")
    if data is not None:
        names = data[0::2]
        if len(set(names)) != len(names):
            raise ConfigError(f"--eval-prompt-data: duplicate dataset names in {names}")
    if args.eval_interval is not None and not data and args.eval_config is None:
        raise ConfigError("--eval-interval requires --eval-prompt-data or --eval-config")  # the original asserts
    if args.eval_interval is not None and args.debug_train_only:
        warn_once(
            "eval_train_only",
            "--eval-interval with --debug-train-only (or --load-debug-rollout-data): no engines run, so no eval runs "
            "(as in the original)",
        )
    if args.eval_interval is None and (data or args.eval_config is not None):
        # The original evaluates only with --eval-interval; its scripts turn eval off by leaving the flag out.
        given = "--eval-prompt-data" if data else "--eval-config"
        warn_once(
            "eval_without_interval",
            f"{given} without --eval-interval: no eval runs (as in the original); set --eval-interval N to evaluate "
            "before training and every N rollouts",
        )
    warn_eval_only_flags(args)


def _checkpoint_and_dumps(args: SlimeArgs) -> None:
    if args.save_interval is not None and args.save is None:
        raise ConfigError("--save-interval requires --save")
    _no_tilde_paths(args)
    check_save_hf(args)
    _saves_without_training(args)
    if args.dump_details is not None and args.save_debug_rollout_data is None:
        args.save_debug_rollout_data = os.path.join(args.dump_details, "rollout_data", "{rollout_id}.pt")


def _saves_without_training(args: SlimeArgs) -> None:
    """Warns once when `--save` / `--save-hf` are given to a run that trains nothing, so writes neither.

    The loop saves and exports after trained rollouts only (as the original's train.py): an eval-only run and a
    `--debug-rollout-only` run ended with the folders empty and no word of it.
    """
    if args.debug_rollout_only:
        why = "--debug-rollout-only (no trainer runs)"
    elif args.num_rollout == 0:
        why = "--num-rollout 0 (an eval-only run: nothing is trained)"
    else:
        return
    given = [field_to_flag(f) for f in ("save", "save_hf") if getattr(args, f) is not None]
    if given:
        warn_once(
            "saves_without_training",
            f"{' and '.join(given)}: nothing is saved with {why}; checkpoints and HF exports follow trained rollouts",
        )


def _weight_sync(args: SlimeArgs) -> None:
    if args.update_weight_transport == "disk" and args.update_weight_disk_dir is None:
        raise ConfigError("--update-weight-transport disk requires --update-weight-disk-dir")
    if args.weight_sync == "auto":
        if args.update_weight_transport == "disk":
            args.weight_sync = "disk"
        elif args.colocate:
            args.weight_sync = "tensor"
        # CUDA first: without it the engine's record is not needed, so a config builds where only slime-core (or
        # a trainer package) is installed, without the engines' package.
        elif args.update_weight_transport == "nccl" or (_cuda_available() and engine_spec(args).needs_gpu):
            args.weight_sync = "distributed"
        else:
            args.weight_sync = "disk"
    if args.weight_sync == "disk" and args.update_weight_disk_dir is None:
        args.update_weight_disk_dir = os.path.join(args.output_dir, "weight_sync")
    if args.update_weights_interval != 1 and not args.async_train:
        # As the original's train.py, which reads it only in train_async.py.
        warn_once(
            "update_weights_interval",
            f"--update-weights-interval {args.update_weights_interval} has no effect without --async: the sync loop "
            "pushes the weights after every step (as the original's train.py); add --async to push every "
            f"{args.update_weights_interval} rollouts",
        )
    _delta_weight_sync(args)


#: Flags that configure `--update-weight-mode delta` only.
DELTA_ONLY_FIELDS = ("update_weight_delta_encoding", "update_weight_delta_checksum")


def _delta_weight_sync(args: SlimeArgs) -> None:
    if args.update_weight_mode != "delta":
        given = [field_to_flag(f) for f in non_default(args, DELTA_ONLY_FIELDS)]
        if given:
            warn_once("delta_flags", f"{' / '.join(given)}: no effect without --update-weight-mode delta")
        if args.update_weight_local_checkpoint_dir is not None:
            # The original's full disk sync has every engine host copy the checkpoint there first; ours never does.
            warn_once(
                "delta_local_dir",
                "--update-weight-local-checkpoint-dir: no effect without --update-weight-mode delta; a full disk "
                "sync's engines load each version from --update-weight-disk-dir (the original copies it into that "
                "folder on each engine host first)",
            )
        return
    # Else --dry-run calls it valid and the run stops only once the weight updater is built (after Ray and engines).
    if args.update_weight_delta_checksum == "blake3" and importlib.util.find_spec("blake3") is None:
        raise ConfigError(
            "--update-weight-delta-checksum blake3 needs the blake3 package, which is not installed "
            "(`uv pip install blake3`); or use xxh3-128 (the default) or adler32"
        )
    if args.weight_sync == "lora":  # the advice below would be refused by the LoRA check
        raise ConfigError(
            "--update-weight-mode delta with --lora-rank: only the adapter is synced (--weight-sync lora, a few MB "
            "of files the engines load), which has no delta path; use --update-weight-mode full"
        )
    if args.weight_sync not in ("tensor", "disk"):
        raise ConfigError(
            f"--update-weight-mode delta: --weight-sync {args.weight_sync} has no delta path; use --weight-sync disk "
            "(any engine) or tensor (reference engine)"
        )
    if args.weight_sync == "tensor" and not engine_spec(args).applies_weight_deltas:
        raise ConfigError(
            f"--update-weight-mode delta with --weight-sync tensor: --rollout-engine {args.rollout_engine} cannot "
            "verify and apply an encoded delta (no /update_weights_from_delta; SGLang 0.5.16 has none); use "
            "--weight-sync disk (deltas verified into --update-weight-local-checkpoint-dir, then reloaded) or "
            "--update-weight-mode full"
        )
    if args.weight_sync == "disk" and args.update_weight_local_checkpoint_dir is None:
        args.update_weight_local_checkpoint_dir = os.path.join(args.update_weight_disk_dir, "local")


def _passthrough(args: SlimeArgs) -> None:
    check_managed_sglang_flags(args.sglang_args)
    pp = _sglang_int(args, "pp_size", 1)
    if args.rollout_num_gpus_per_engine % pp:
        raise ConfigError(
            f"--rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine} must be divisible by "
            f"--sglang-pp-size {pp}"
        )
    dp = _sglang_int(args, "dp_size", 1)
    if dp > 1 and not args.sglang_args.get("enable_dp_attention"):
        raise ConfigError("--sglang-dp-size > 1 requires --sglang-enable-dp-attention")
    tp = args.rollout_num_gpus_per_engine // pp
    if dp > 1 and tp % dp:
        # SGLang's own check (ServerArgs: `assert self.tp_size % self.dp_size == 0`) failed in the engine's start-up.
        raise ConfigError(
            f"--sglang-dp-size {dp} must divide each engine's tensor-parallel size {tp} (--rollout-num-gpus-per-engine "
            f"{args.rollout_num_gpus_per_engine} / --sglang-pp-size {pp}): DP attention splits an engine's TP ranks "
            "into that many groups"
        )
    check_expert_parallel(args.sglang_args, gpus_per_engine=args.rollout_num_gpus_per_engine, pp=pp)
    spec = train_backend_spec(args)
    if spec.megatron_native:
        # Parse the parallel sizes now so a bad value fails at startup, not inside a worker.
        _ = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size)
        _ = args.expert_model_parallel_size
    else:
        _fsdp_context_parallel(args)
    check_megatron_flags(args)


def _fsdp_context_parallel(args: SlimeArgs) -> None:
    """`--context-parallel-size` of a backend that does not take Megatron's parallel flags (FSDP's Ulysses)."""
    cp = args.context_parallel_size
    if cp == 1:
        return
    if not train_backend_spec(args).supports_cp:
        raise ConfigError(f"--context-parallel-size {cp}: --train-backend {args.train_backend} has no context parallel")
    world = args.actor_num_nodes * args.actor_num_gpus_per_node
    if cp < 1 or world % cp:
        raise ConfigError(
            f"--context-parallel-size {cp} must divide the trainer's ranks (--actor-num-nodes × "
            f"--actor-num-gpus-per-node = {world})"
        )
    if args.attn_implementation not in (None, "auto", "slime_varlen", "slime_flex"):
        raise ConfigError(
            f"--context-parallel-size {cp} (FSDP) needs --attn-implementation slime_varlen or slime_flex, "
            f"got {args.attn_implementation}"
        )


def _sglang_int(args: SlimeArgs, key: str, default: int) -> int:
    value = args.sglang_args.get(key, default)
    if isinstance(value, bool):  # A flag given without a value; int(True) would silently be 1.
        value = str(value)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"--sglang-{key.replace('_', '-')}: expected an integer, got {value!r}") from None
