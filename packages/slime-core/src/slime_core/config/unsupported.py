"""Original slime flags that this version parses but does not implement.

Launch scripts from the original carry these flags, so they stay parseable (and listed in `--help`), but a
flag that changes nothing must not pass silently: setting one to anything but its default is a
`ConfigError` that names the flag and says what to do instead. A flag leaves this table when it is
implemented; `tests/slime-core/test_config_honored.py` checks that every field is either read by some
code or listed here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError, field_to_flag, non_default

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = [
    "UNSUPPORTED",
    "UNSUPPORTED_FLAGS",
    "UNSUPPORTED_FLAG_DEFAULTS",
    "check_unsupported",
    "unsupported_flag_note",
]

# field name -> why it is not implemented / what to use instead (one clause, shown after the flag).
UNSUPPORTED: dict[str, str] = {
    "async_save": "checkpoints are written synchronously",
    "check_weight_update_equal": (
        "no full engine-vs-checkpoint compare; --check-weight-sync compares SGLang's /weights_checker checksums of a "
        "sample with the pushed bytes (MoE experts included, as SGLang's fused w13_weight / w2_weight)"
    ),
    "ci_disable_kl_checker": "no built-in CI checks; the test suite asserts these properties",
    "ci_load_grad_norm": "no built-in CI checks; the test suite asserts these properties",
    "ci_save_grad_norm": "no built-in CI checks; the test suite asserts these properties",
    "ci_test": "no built-in CI checks; the test suite asserts these properties",
    "ci_train_rollout_logprob_abs_diff_threshold": "no built-in CI checks; watch train/train_rollout_logprob_abs_diff",
    "custom_convert_samples_to_train_data_path": "train data is a typed RolloutBatch; use reward/sample hooks",
    "custom_megatron_before_log_prob_hook_path": "no Megatron step hooks; use a custom loss or reward hook",
    "custom_megatron_before_train_step_hook_path": "no Megatron step hooks; use a custom loss or reward hook",
    "custom_megatron_init_path": "no Megatron init hook",
    "custom_model_provider_path": "models are built from the HF config of --hf-checkpoint",
    "data_pad_size_multiplier": "packed micro-batches are padded only as TP/SP/CP require",
    "distributed_backend": "the trainer uses nccl on GPU and gloo on CPU, chosen automatically",
    "fetch_trajectory_retry_times": "no rollout buffer server; use --rollout-function-path",
    "fsdp_cpu_backend": "collectives use the default process group (nccl on GPU, gloo on CPU)",
    "fsdp_state_dict_cpu_offload": "checkpoints are sharded (DCP) and HF export gathers tensor by tensor",
    "http_proxy": "engine requests always go direct, never through a proxy",
    "keep_old_actor": "old log-probs are recomputed with the weights before each rollout's first step",
    "log_correct_samples": "correct-sample length/entropy statistics are not collected",
    "log_probs_max_tokens_per_gpu": "log-prob forwards reuse the training micro-batches (--max-tokens-per-gpu)",
    "lora_dropout": "adapters train without dropout (peft lora_dropout 0), as the engines serve them",
    "megatron_config_path": (
        "pass Megatron flags on the command line; the PPO critic takes --critic-load/--critic-save/--critic-lr/"
        "--critic-lr-warmup-iters"
    ),
    "memory_snapshot_dir": "no built-in memory profiler; use torch.cuda.memory._record_memory_history",
    "memory_snapshot_num_steps": "no built-in memory profiler; use torch.cuda.memory._record_memory_history",
    "min_batch_collection_ratio": "no rollout buffer server; use --rollout-function-path",
    "model_name": "the architecture is read from the HF config of --hf-checkpoint",
    "prefill_num_servers": "no prefill/decode disaggregation",
    "profile_target": "no built-in profiler; run the trainer under torch.profiler or nsys",
    "recompute_loss_function": "the loss is not activation-checkpointed (FSDP recomputes its lm_head chunks anyway)",
    "record_memory_history": "no built-in memory profiler; use torch.cuda.memory._record_memory_history",
    "ref_ckpt_step": "the reference model loads the latest step of --ref-load",
    "release_train": "trainer processes stay alive; use --colocate to free GPU memory between phases",
    "rollout_buffer_url": "no rollout buffer server; use --rollout-function-path",
    "rollout_data_postprocess_path": "no trainer-side rollout-data hook; use --custom-reward-post-process-path",
    "rollout_task_type": "no rollout buffer server; use --rollout-function-path",
    "save_debug_train_data": "train batches are not dumped; use --save-debug-rollout-data",
    "sglang_config": "no multi-model / server-group engine config; one engine group serves the policy",
    "use_distributed_post": "engine requests come from the rollout manager's async HTTP client",
    "use_pytorch_profiler": "no built-in profiler; run the trainer under torch.profiler or nsys",
    "use_rollout_entropy": "the reported entropy is the trainer's (train/entropy_loss)",
    "use_stateless_adam": "Adam keeps its moments; --reset-optimizer-states zeroes them every rollout",
}


_NO_PROFILER = "no built-in profiler; run the trainer under torch.profiler or nsys"
_FSDP_LORA = "LoRA is --lora-rank R --lora-alpha A [--lora-target-modules ...] with --train-backend fsdp"

# Original flags that are not even config fields: `parse_args` answers them with the same one-line error.
UNSUPPORTED_FLAGS: dict[str, str] = {
    "--custom-update-weight-post-write-path": "no hook after disk weight writes; --weight-sync disk reloads the files",
    # The later original's Megatron LoRA (scripts/run-qwen3-30B-A3B-lora.sh); "did you mean --use-rs?" misled.
    "--use-lora": _FSDP_LORA,
    "--lora-target-preset": "name the adapted modules with --lora-target-modules (FSDP LoRA: --lora-rank R)",
    "--save-lora": "--save-hf writes the adapter in PEFT's format under --lora-rank (FSDP LoRA)",
    "--lora-load": "no adapter loading; a LoRA run resumes from --load (FSDP LoRA: --lora-rank R)",
    "--lora-weight-decay": "under --lora-rank, --weight-decay applies to the adapters (FSDP LoRA)",
    "--lora-learning-rate": "under --lora-rank, --lr is the adapters' rate (FSDP LoRA)",
    # The original's FSDP LoRA (reverted in THUDM/slime#370) and Megatron-Bridge LoRA: unknown flags got
    # "did you mean --recompute-modules?"-style guesses.
    "--lora-adapter-path": "no adapter loading; LoRA trains a fresh adapter and resumes from --load (--lora-rank R)",
    "--enable-lora": "no Megatron-Bridge LoRA; " + _FSDP_LORA,
    "--lora-save-merged-hf": "--save-hf with --lora-save-merged writes the merged model too (FSDP LoRA)",
    "--load-forge-rollout-data": "no Forge rollout dumps; replay --save-debug-rollout-data dumps with "
    "--load-debug-rollout-data",
    "--megatron-deepgemm-forward-layers": "no DeepGEMM FP8 forward; the trainer computes in bf16",
    "--megatron-deepgemm-forward-modules": "no DeepGEMM FP8 forward; the trainer computes in bf16",
    "--megatron-deepgemm-moe-forward-layers": "no DeepGEMM FP8 forward; the trainer computes in bf16",
    "--megatron-deepgemm-moe-forward-modules": "no DeepGEMM FP8 forward; the trainer computes in bf16",
    "--memory-recorder": "no built-in memory profiler; use torch.cuda.memory._record_memory_history",
    "--memory-snapshot-path": "no built-in memory profiler; use torch.cuda.memory._record_memory_history",
    "--override-lr-scheduler": (
        "a resumed run continues the checkpoint's schedule and refuses other --lr/--min-lr/warmup/decay values; "
        "--no-load-optim starts the optimizer and the schedule afresh"
    ),
    "--use-checkpoint-lr-scheduler": "a resumed run continues the checkpoint's schedule (other values are refused)",
    "--profile-step-start": _NO_PROFILER,
    "--profile-step-end": _NO_PROFILER,
    "--rollout-data-transport": "rollout batches reach the trainer through Ray's object store",
    "--wandb-run-name": "the W&B run is named from --wandb-group (resume one with --wandb-run-id)",
    "--warmup-ratio": "use --lr-warmup-fraction",
    # The original derives use_critic from the estimator and ignores unknown flags, so its PPO docs pass it.
    "--use-critic": "the PPO critic is on exactly with --advantage-estimator ppo, as in the original, which derives it",
}


# The original's default of a value flag of `UNSUPPORTED_FLAGS`, where that default is what this version does: given
# with it (a launch script that spells the default out), the flag changes nothing and is accepted, as a config
# field at its default is.
UNSUPPORTED_FLAG_DEFAULTS: dict[str, str] = {
    "--rollout-data-transport": "object-store",
    "--memory-recorder": "torch",  # read only by the original's memory profiler, off by default
}


def unsupported_flag_note(flag: str) -> str:
    """What to use instead of `flag` of `UNSUPPORTED_FLAGS`, saying which value is accepted where one is."""
    note = UNSUPPORTED_FLAGS[flag]
    if flag in UNSUPPORTED_FLAG_DEFAULTS:
        note += f" ({UNSUPPORTED_FLAG_DEFAULTS[flag]}, the original's default, is accepted)"
    return note


def check_unsupported(args: SlimeArgs) -> None:
    """Rejects any flag of `UNSUPPORTED` set to a value other than its default.

    Raises:
        ConfigError: the first such flag, e.g. "--use-opd is not implemented in this version
            (no on-policy distillation ...); remove it".
    """
    given = non_default(args, UNSUPPORTED)
    if given:
        name = given[0]
        raise ConfigError(f"{field_to_flag(name)} is not implemented in this version ({UNSUPPORTED[name]}); remove it")
