"""Checks that run before anything starts (no Ray, no engines), so bad config or data fails in one line."""

from __future__ import annotations

import logging
import os

from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)


def _check_rows(spec: str, cfg: SlimeArgs, flag: str) -> None:
    from slime_app.data_checks import check_prompt_rows
    from slime_rollout.data_source import load_prompt_rows

    try:
        rows = load_prompt_rows(spec)
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag}: file not found: {spec}") from None
    if not rows:
        raise ValueError(f"{flag} {spec}: no rows")
    check_prompt_rows(rows, cfg, where=f"{flag} {spec}")


# Fields naming a function or class by import path (env_path names an env; *_config_path are files).
PLUGIN_FIELDS = (
    "rollout_function_path", "custom_generate_function_path", "custom_rm_path", "custom_reward_post_process_path",
    "dynamic_sampling_filter_path", "rollout_sample_filter_path", "rollout_all_samples_process_path",
    "rollout_sample_hook_path", "buffer_filter_path", "data_source_path", "eval_function_path",
    "custom_rollout_log_function_path", "custom_eval_rollout_log_function_path", "custom_loss_function_path",
    "custom_advantage_function_path", "custom_tis_function_path", "custom_pg_loss_reducer_function_path",
)  # fmt: skip


def _check_plugins(cfg: SlimeArgs) -> None:
    """Imports every plugin path here, so a typo fails in one line instead of inside a Ray actor.

    A plugin whose own module imports something this driver process lacks (a GPU-only package, say) is
    left to the workers, with a warning: their environment may differ.
    """
    from slime_core.config.base import field_to_flag
    from slime_core.plugins import PluginError, load_function

    for name in PLUGIN_FIELDS:
        path = getattr(cfg, name)  # a SlimeArgs field (tests/apps/test_preflight.py checks the list)
        if not path:
            continue
        try:
            load_function(path, flag=field_to_flag(name))
        except PluginError as e:
            if e.missing_dependency is None:
                raise
            logger.warning("%s (left to the workers)", e)


def _has_chat_template(model_dir: str) -> bool:
    """Whether the HF tokenizer files in `model_dir` carry a chat template (True when it cannot tell)."""
    import json

    if any(os.path.exists(os.path.join(model_dir, f)) for f in ("chat_template.jinja", "chat_template.json")):
        return True
    config = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.exists(config):
        return True  # no tokenizer files here: the tokenizer's own loader reports that
    with open(config, encoding="utf-8") as f:
        return bool(json.load(f).get("chat_template"))


def preflight(cfg: SlimeArgs) -> None:
    """Validates paths and data files named by the config.

    Raises:
        FileNotFoundError: a model directory or data file does not exist (message names the flag).
        ValueError: a data file is malformed (message names the flag, file and line/row), or
            `--train-backend megatron` on a local run without CUDA.
        slime_core.plugins.PluginError: a plugin path does not resolve (message names the flag).
    """
    if cfg.train_backend == "megatron" and not (cfg.ray_address or os.environ.get("RAY_ADDRESS")):
        import torch

        if not torch.cuda.is_available():  # a remote cluster's GPUs are not visible from here: checked locally only
            raise ValueError(
                "--train-backend megatron needs CUDA GPUs (megatron-core's optimizer and pipeline schedules are "
                "CUDA-only); on this machine use --train-backend fsdp"
            )
    _check_plugins(cfg)
    if cfg.apply_chat_template and cfg.hf_checkpoint and not _has_chat_template(cfg.hf_checkpoint):
        raise ValueError(
            f"--apply-chat-template: the tokenizer of --hf-checkpoint {cfg.hf_checkpoint} has no chat template "
            "(no 'chat_template' in tokenizer_config.json, no chat_template.jinja); drop the flag or add one"
        )
    if cfg.hf_checkpoint and not os.path.isdir(cfg.hf_checkpoint):
        raise FileNotFoundError(f"--hf-checkpoint: not a directory: {cfg.hf_checkpoint}")
    if cfg.hf_checkpoint and not os.path.exists(os.path.join(cfg.hf_checkpoint, "config.json")):
        raise FileNotFoundError(f"--hf-checkpoint {cfg.hf_checkpoint}: no config.json (not a Hugging Face model dir)")
    if cfg.prompt_data and not cfg.load_debug_rollout_data:
        _check_rows(cfg.prompt_data, cfg, "--prompt-data")
    for _name, path in cfg.eval_datasets:
        _check_rows(path, cfg, "--eval-prompt-data")
