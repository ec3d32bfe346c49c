"""Config groups for evaluation, metrics logging, debugging dumps and CI checks."""

from __future__ import annotations

from typing import Any, Literal

from slime_core.config.base import ArgsGroup, arg, field_to_flag, non_default, warn_once

__all__ = ["EVAL_ONLY_FIELDS", "DebugArgs", "EvalArgs", "HealthArgs", "LoggingArgs", "warn_eval_only_flags"]


class EvalArgs(ArgsGroup):
    """Evaluation rollouts; unset sampling values fall back to the rollout's."""

    eval_function_path: str | None = arg(None, "Import path of the eval rollout function (default: rollout fn).")
    eval_interval: int | None = arg(
        None, "Evaluate before training and every this many rollouts; without it no eval runs (as the original).", ge=1
    )
    eval_prompt_data: list[str] | None = arg(None, "Eval datasets as pairs: name path [name path ...].")
    eval_config: str | None = arg(None, "YAML file with per-dataset eval settings.")
    skip_eval_before_train: bool = arg(False, "Do not evaluate before the first training step.")
    eval_input_key: str | None = arg(None, "Eval dataset prompt field (default: --input-key).")
    eval_label_key: str | None = arg(None, "Eval dataset label field (default: --label-key).")
    eval_tool_key: str | None = arg(None, "Eval dataset tools field (default: --tool-key).")
    n_samples_per_eval_prompt: int = arg(1, "Responses per eval prompt.", ge=1)
    eval_temperature: float | None = arg(
        None, "Eval sampling temperature (0: greedy, as SGLang reads it; eval needs no log-probs at it).", ge=0
    )
    eval_top_p: float | None = arg(None, "Eval top-p.", gt=0, le=1)
    eval_top_k: int | None = arg(None, "Eval top-k.")
    eval_max_response_len: int | None = arg(None, "Eval maximum new tokens.", ge=1)
    eval_max_prompt_len: int | None = arg(None, "Eval maximum prompt tokens.", ge=1)
    eval_min_new_tokens: int | None = arg(None, "Eval minimum new tokens.", ge=0)
    eval_max_context_len: int | None = arg(None, "Eval maximum context (default: --rollout-max-context-len).", ge=1)


class LoggingArgs(ArgsGroup):
    """Metrics sinks."""

    use_wandb: bool = arg(False, "Log metrics to Weights & Biases.")
    wandb_mode: Literal["online", "offline", "disabled"] | None = arg(None, "W&B mode.")
    wandb_dir: str | None = arg(None, "W&B local directory.")
    wandb_key: str | None = arg(None, "W&B API key.")
    wandb_host: str | None = arg(None, "W&B host.")
    wandb_team: str | None = arg(None, "W&B entity.")
    wandb_group: str | None = arg(None, "W&B group.")
    wandb_project: str | None = arg(None, "W&B project.")
    wandb_run_id: str | None = arg(None, "W&B run id to resume.")
    disable_wandb_random_suffix: bool = arg(False, "Do not append a random suffix to the W&B run name.")
    wandb_always_use_train_step: bool = arg(False, "Use train steps as the x-axis of every metric.")
    use_tensorboard: bool = arg(True, "Log metrics to TensorBoard (on by default here; --no-use-tensorboard).")
    output_dir: str = arg(
        "outputs",
        "Directory for run outputs: tensorboard/ (unless --tensorboard-dir), reward_curve.png, engine_logs/, "
        "weight_sync/ (disk weight sync) and ref_load_hf/ (an FSDP --ref-load converted from torch_dist); "
        "checkpoints go to --save, HF exports to --save-hf.",
    )
    tensorboard_dir: str | None = arg(None, "TensorBoard log directory (default: <output-dir>/tensorboard).")
    tb_project_name: str | None = arg(
        None, "TensorBoard log directory, relative to --output-dir unless absolute (--tensorboard-dir wins)."
    )
    tb_experiment_name: str | None = arg(None, "TensorBoard run name: a subdirectory of the log directory.")
    log_multi_turn: bool = arg(
        False,
        "Log multi-turn statistics per rollout: multi_turn/raw_response_length/response_length_{mean,max,min,"
        "clip_ratio} (all response tokens), multi_turn/wo_obs_response_length/response_length_{mean,max,min} "
        "(model tokens only), multi_turn/multi_turn_metric/round_number_{mean,max,min} (metadata round_number, "
        "or num_turns of the built-in multi-turn generate).",
    )
    log_passrate: bool = arg(False, "Log pass@k.")
    log_reward_category: str | None = arg(None, "Reward-dict key whose values are counted as error categories.")
    log_correct_samples: bool = arg(False, "Log statistics of correct samples.")


class DebugArgs(ArgsGroup):
    """Debug modes, dumps and CI assertions."""

    dry_run: bool = arg(
        False,
        "Check everything that needs no hardware (flags, batch sizes, data files and their first rows, tokenizer and "
        "chat template, plugins, architecture flags vs config.json, --load/--ref-load), print the resolved config "
        "and exit; starts no Ray, engine or GPU work.",
    )
    debug_rollout_only: bool = arg(False, "Only roll out (no trainer).")
    debug_train_only: bool = arg(False, "Only train (no engines); usually with --load-debug-rollout-data.")
    save_debug_rollout_data: str | None = arg(None, "Path template for rollout dumps ({rollout_id} substituted).")
    load_debug_rollout_data: str | None = arg(None, "Path template of rollout dumps to replay (implies train-only).")
    load_debug_rollout_data_subsample: float | None = arg(None, "Fraction of replayed samples to keep.", gt=0, le=1)
    save_debug_train_data: str | None = arg(None, "Path template for train-batch dumps ({rollout_id} substituted).")
    dump_details: str | None = arg(None, "Directory for rollout dumps (sets --save-debug-rollout-data).")
    memory_snapshot_dir: str = arg(".", "Directory for memory snapshots.")
    memory_snapshot_num_steps: int | None = arg(None, "Steps recorded in memory snapshots.", ge=1)
    profile_target: list[Literal["train_overall", "train_actor", "train_log_probs"]] = arg(
        ["train_overall"], "What the torch profiler records."
    )
    use_pytorch_profiler: bool = arg(False, "Run the torch profiler.")
    record_memory_history: bool = arg(False, "Record CUDA memory history.")
    ci_test: bool = arg(False, "Enable CI exactness assertions.")
    ci_disable_kl_checker: bool = arg(False, "Skip the CI first-step KL check.")
    ci_train_rollout_logprob_abs_diff_threshold: float = arg(
        0.1, "CI bound on train/rollout log-prob difference.", ge=0
    )
    ci_save_grad_norm: str | None = arg(None, "Save grad norms to this path (CI alignment).")
    ci_load_grad_norm: str | None = arg(None, "Compare grad norms with this file (CI alignment).")
    custom_config_path: str | None = arg(
        None, "YAML whose keys override config fields; unknown keys go to args.custom_config for plugins."
    )
    custom_config: dict = arg({}, "Settings from --custom-config-path that are not slime fields.", cli=False)


class HealthArgs(ArgsGroup):
    """Run-health checks: weight-sync content, the first-step log-prob gate, chat-template conformance, instability.

    The weight check is `slime_rollout.weight_sync.check`, the template check
    `slime_rollout.generation.template_check`; the instability rules live in `slime_app.instability` (a threshold of 0
    turns its rule off).
    """

    first_step_logprob_diff_threshold: float = arg(
        0.1,
        "Stop the run when the first step's mean |trainer - rollout log-prob| (train/train_rollout_logprob_abs_diff) "
        "exceeds this (engine weights, temperature or masks disagree with the trainer); 0: off.",
        ge=0,
    )
    check_weight_sync: bool = arg(
        True,
        "After a weight sync, compare every engine's checksums (/weights_checker) of a sample of the pushed tensors "
        "with the trainer's and stop the run if they differ or nothing could be compared.",
    )
    check_weight_sync_interval: int = arg(
        0, "Check the first weight sync and then every this many syncs (0: the first only).", ge=0
    )
    check_weight_sync_tensors: int = arg(4, "Engine parameters (fused q/k/v count as one) sampled per check.", ge=1)
    check_chat_template_samples: int = arg(
        8,
        "Multi-turn runs: compare the first N samples' token streams with the chat template's rendering of their "
        "conversation and report mismatches with the token position (0: off).",
        ge=0,
    )
    stop_on_instability: bool = arg(False, "Stop the run with one line when an instability rule fires.")
    instability_window: int = arg(10, "Rollouts in the rolling median that spike rules compare with.", ge=1)
    instability_warmup: int = arg(3, "Rollouts observed before the relative rules can fire (their baseline).", ge=1)
    instability_entropy_collapse: float = arg(
        0.1, "Warn when train/entropy_loss falls below this fraction of its warm-up median.", ge=0, lt=1
    )
    instability_entropy_blowup: float = arg(
        3.0, "Warn when train/entropy_loss rises above this multiple of its warm-up median.", ge=0
    )
    instability_kl_spike: float = arg(
        10.0,
        "Warn when train/ppo_kl, train/kl_loss or train/train_rollout_logprob_abs_diff jumps above this multiple of "
        "its rolling median.",
        ge=0,
    )
    instability_grad_norm_spike: float = arg(
        10.0, "Warn when train/grad_norm jumps above this multiple of its rolling median.", ge=0
    )
    instability_response_len_frac: float = arg(
        0.9, "Warn when rollout/response_len/mean reaches this fraction of --rollout-max-response-len.", ge=0, le=1
    )
    instability_truncated_ratio: float = arg(0.5, "Warn when rollout/truncated_ratio exceeds this.", ge=0, le=1)
    instability_zero_adv_group_frac: float = arg(
        0.9, "Warn when this fraction of the rollout's groups have equal rewards (zero GRPO advantage).", ge=0, le=1
    )
    instability_clipfrac: float = arg(0.2, "Warn when train/pg_clipfrac exceeds this.", ge=0, le=1)
    instability_reward_eval_gap: float = arg(
        0.05,
        "Warn (reward hacking) when, between two evals, the train reward rose and the eval score fell by at least "
        "this.",
        ge=0,
    )


EVAL_ONLY_FIELDS = (
    "eval_function_path",
    "skip_eval_before_train",
    "eval_input_key",
    "eval_label_key",
    "eval_tool_key",
    "n_samples_per_eval_prompt",
    "eval_temperature",
    "eval_top_p",
    "eval_top_k",
    "eval_max_response_len",
    "eval_max_prompt_len",
    "eval_min_new_tokens",
    "eval_max_context_len",
    "eval_reward_key",
    "custom_eval_rollout_log_function_path",
)
"""Fields only evaluation rollouts read: without eval data (`--eval-prompt-data` / `--eval-config`) they change
nothing. `--eval-interval` is not here: without eval data it is an error, as in the original."""


def warn_eval_only_flags(args: Any) -> list[str]:
    """Warns once, in one line, about eval-only flags set while the run has no eval data.

    A flag counts as set when it differs from its default; `--eval-max-context-len` equal to
    `--rollout-max-context-len` is the derived default (validation fills it in, and re-validates it in every worker).

    Args:
        args: the config under validation; reads `EVAL_ONLY_FIELDS`, `eval_prompt_data`, `eval_config`,
            `rollout_max_context_len`.

    Returns:
        The flags warned about (`--eval-top-p`, ...), empty when there is eval data or none is set.
    """
    if args.eval_prompt_data or args.eval_config is not None:
        return []
    derived = {"eval_max_context_len": args.rollout_max_context_len}
    given = [f for f in non_default(args, EVAL_ONLY_FIELDS) if not (f in derived and getattr(args, f) == derived[f])]
    flags = [field_to_flag(f) for f in given]
    if flags:
        warn_once(
            "eval_only:" + ",".join(flags),
            f"{' '.join(flags)}: no effect without eval data (--eval-prompt-data or --eval-config)",
        )
    return flags
