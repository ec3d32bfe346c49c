"""Original slime flags that this version parses but does not implement.

Launch scripts from the original carry these flags, so they stay parseable (and listed in `--help`), but a
flag that changes nothing must not pass silently: setting one to anything but its default is a
`ConfigError` that names the flag and says what to do instead. A flag leaves this table when it is
implemented; `tests/slime-core/test_config_honored.py` checks that every field is either read by some
code or listed here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError, field_to_flag

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["UNSUPPORTED", "check_unsupported"]

# field name -> why it is not implemented / what to use instead (one clause, shown after the flag).
UNSUPPORTED: dict[str, str] = {
    "check_weight_update_equal": "no engine weight compare; watch train/train_rollout_logprob_abs_diff",
    "custom_convert_samples_to_train_data_path": "train data is a typed RolloutBatch; use reward/sample hooks",
    "fetch_trajectory_retry_times": "no rollout buffer server; use --rollout-function-path",
    "http_proxy": "engine requests always go direct, never through a proxy",
    "log_correct_samples": "correct-sample length/entropy statistics are not collected",
    "log_multi_turn": "multi-turn round statistics are not collected",
    "min_batch_collection_ratio": "no rollout buffer server; use --rollout-function-path",
    "prefill_num_servers": "no prefill/decode disaggregation",
    "rollout_buffer_url": "no rollout buffer server; use --rollout-function-path",
    "rollout_data_postprocess_path": "no trainer-side rollout-data hook; use --custom-reward-post-process-path",
    "rollout_health_check_first_wait": "no engine health monitor; restart the run with --load to resume",
    "rollout_health_check_interval": "no engine health monitor; restart the run with --load to resume",
    "rollout_health_check_timeout": "no engine health monitor; restart the run with --load to resume",
    "rollout_task_type": "no rollout buffer server; use --rollout-function-path",
    "sglang_config": "no multi-model / server-group engine config; one engine group serves the policy",
    "use_distributed_post": "engine requests come from the rollout manager's async HTTP client",
    "use_fault_tolerance": "no engine health monitoring and restart; restart the run with --load to resume",
}


def check_unsupported(args: SlimeArgs) -> None:
    """Rejects any flag of `UNSUPPORTED` set to a value other than its default.

    Raises:
        ConfigError: the first such flag, e.g. "--use-fault-tolerance is not implemented in this version
            (engine health monitoring ...); remove it".
    """
    fields = type(args).model_fields
    for name, reason in UNSUPPORTED.items():
        if getattr(args, name) != fields[name].get_default(call_default_factory=True):
            raise ConfigError(f"{field_to_flag(name)} is not implemented in this version ({reason}); remove it")
