"""Checks that run before anything starts (no Ray, no engines), so bad config or data fails in one line."""

from __future__ import annotations

import logging
import os

from slime_app.checkpoints import check_checkpoints
from slime_app.fp8_rollout import check_fp8_rollout
from slime_app.model_files import (
    check_hf_weights,
    check_json_files,
    check_model_type,
    check_opd_teacher,
    weight_readers,
)
from slime_app.ray_start import ray_address
from slime_app.resume_point import check_data_cursor, check_replay_dumps
from slime_core.config import SlimeArgs
from slime_core.config.base import field_to_flag
from slime_core.extensions import ROLLOUT_ENGINES, TRAIN_BACKENDS, engine_spec, run_preflight_hooks, train_backend_spec
from slime_core.registry import Registry

logger = logging.getLogger(__name__)


# Fields naming a function or class by import path (env_path names an env; *_config_path are files).
PLUGIN_FIELDS = (
    "rollout_function_path", "custom_generate_function_path", "custom_rm_path", "custom_reward_post_process_path",
    "dynamic_sampling_filter_path", "rollout_sample_filter_path", "rollout_all_samples_process_path",
    "rollout_sample_hook_path", "buffer_filter_path", "data_source_path", "eval_function_path",
    "custom_rollout_log_function_path", "custom_eval_rollout_log_function_path", "custom_loss_function_path",
    "custom_advantage_function_path", "custom_tis_function_path", "custom_pg_loss_reducer_function_path",
)  # fmt: skip


# How the run calls each plugin: (positional arguments, keyword arguments always passed, the call as shown).
# Keywords the run passes only when the plugin declares them (e.g. `evaluation=` to a custom generate) are
# left out. Kept next to the call sites' docstrings; tests/apps/test_preflight.py binds the built-in defaults.
PLUGIN_CALLS: dict[str, tuple[int, tuple[str, ...], str]] = {
    "rollout_function_path": (3, ("evaluation",), "(args, rollout_id, data_source, evaluation=...)"),
    "eval_function_path": (3, ("evaluation",), "(args, rollout_id, data_source, evaluation=...)"),
    "custom_generate_function_path": (3, (), "(args, sample, sampling_params)"),
    "custom_rm_path": (2, (), "(args, sample), or (args, samples) with --group-rm or a fan-out generate's list"),
    "custom_reward_post_process_path": (2, (), "(args, samples)"),
    "dynamic_sampling_filter_path": (2, (), "(args, samples)"),
    "rollout_sample_filter_path": (2, (), "(args, samples)"),
    "rollout_all_samples_process_path": (3, (), "(args, all_samples, data_source)"),
    # evaluation= / rollout_id= go only to a hook that declares them (the original's _accepted_kwargs).
    "rollout_sample_hook_path": (2, (), "(args, sample) [+ evaluation=..., rollout_id=... if it takes them]"),
    "buffer_filter_path": (4, (), "(args, rollout_id, buffer, num_samples)"),
    "data_source_path": (1, (), "(args)"),
    "custom_rollout_log_function_path": (5, (), "(rollout_id, args, samples, metrics, rollout_time)"),
    "custom_eval_rollout_log_function_path": (4, (), "(rollout_id, args, data, metrics)"),
    "custom_loss_function_path": (4, (), "(args, batch, outputs, reduce)"),
    "custom_advantage_function_path": (2, (), "(args, rollout_data)"),
    "custom_tis_function_path": (
        0,
        ("args", "pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks", "total_lengths", "response_lengths"),
        "(args=, pg_loss=, train_log_probs=, rollout_log_probs=, loss_masks=, total_lengths=, response_lengths=)",
    ),
    "custom_pg_loss_reducer_function_path": (4, (), "(total_lengths, response_lengths, loss_masks, per_token)"),
}


# Plugins the run calls synchronously and uses what they return at once, as the original does: an `async def` one
# returned an un-awaited coroutine, refused later as a wrong value ("did not set rollout_data['advantages']", "must
# return (raw_rewards, rewards)") with a "coroutine was never awaited" warning. The others are awaited when async.
SYNC_ONLY = (
    "buffer_filter_path", "custom_reward_post_process_path", "custom_loss_function_path",
    "custom_advantage_function_path", "custom_tis_function_path", "custom_pg_loss_reducer_function_path",
)  # fmt: skip


# Keywords the run passes only to a plugin whose signature names them (the original's `_accepted_kwargs`): bound
# when declared, so a keyword-only one without a default (drgrpo's `*, args`) is not refused.
DECLARED_KEYWORDS: dict[str, tuple[str, ...]] = {
    "custom_generate_function_path": ("evaluation",),  # slime_rollout.generation.group_rollout
    "rollout_sample_hook_path": ("evaluation", "rollout_id"),  # ditto
    "custom_pg_loss_reducer_function_path": ("args",),  # slime_core.algorithms.objective
}


def check_plugin_call(fn: object, field: str, flag: str, path: str) -> None:
    """Checks that `fn`'s signature accepts the call the run will make (`PLUGIN_CALLS[field]`).

    A wrong signature otherwise surfaces mid-run as a TypeError inside a Ray worker. Callables without an
    introspectable signature (builtins) are not checked. The keywords of `DECLARED_KEYWORDS[field]` that the
    signature names are bound too, as the run passes them. An `async def` plugin of a `SYNC_ONLY` field is refused.

    Raises:
        slime_core.plugins.PluginError: the call cannot bind (message names the flag, path and both signatures), or
            an `async def` plugin the run calls synchronously.
    """
    import inspect

    from slime_core.plugins import PluginError

    n_positional, keywords, shown = PLUGIN_CALLS[field]
    if field in SYNC_ONLY and (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)):
        raise PluginError(
            f"{flag} {path}: it is an async def, but the run calls it synchronously and uses its value at once (as "
            "the original does): make it a plain def"
        )
    try:
        signature = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return
    declared = [k for k in DECLARED_KEYWORDS.get(field, ()) if k in signature.parameters]
    try:
        signature.bind(*([None] * n_positional), **dict.fromkeys((*keywords, *declared)))
    except TypeError as e:
        raise PluginError(
            f"{flag} {path}: its signature {signature} cannot take the run's call {shown} ({e})"
        ) from None


def check_plugin_config(fn: object, cfg: SlimeArgs, flag: str, path: str) -> None:
    """Runs a plugin's own `check_config(cfg) -> list[str]` when it has one (e.g. `slime_core.algorithms.drgrpo`).

    Raises:
        ValueError: the first problem it reports (message names the flag and path).
    """
    check = getattr(fn, "check_config", None)
    problems = check(cfg) if callable(check) else []
    if problems:
        raise ValueError(f"{flag} {path}: {problems[0]}")


def _plugin_paths(cfg: SlimeArgs) -> list[tuple[str, str, str]]:
    """`(field, flag, import path)` of every plugin the config names (`--rollout-sample-hook-path` holds a list).

    An `--eval-config` dataset's own generate and reward functions are included (its flag names the dataset).
    """
    from slime_core.config.base import field_to_flag

    out = []
    for name in PLUGIN_FIELDS:
        value = getattr(cfg, name)  # a SlimeArgs field (tests/apps/test_preflight.py checks the list)
        for path in value if isinstance(value, list) else [value]:
            if path:
                out.append((name, field_to_flag(name), path))
    if cfg.eval_config:
        # A dataset's own generate and reward functions (the original's per-dataset overrides): a wrong path failed
        # only at the first eval, after --eval-interval rollouts of training with --skip-eval-before-train.
        from slime_rollout.generation.eval import eval_datasets

        for dataset in eval_datasets(cfg):
            for name in ("custom_generate_function_path", "custom_rm_path"):
                if dataset[name]:
                    out.append((name, f"--eval-config {cfg.eval_config} dataset {dataset['name']!r} {name}",
                                dataset[name]))  # fmt: skip
    return out


def _check_plugins(cfg: SlimeArgs) -> None:
    """Imports every plugin and checks its signature against the run's call: one line before Ray starts.

    Paths are resolved by `slime_rollout.plugins.load_function`, the loader the run uses (original paths such
    as `slime.rollout.rm_hub.async_rm` included). A plugin whose own module imports something missing is an
    error too, since a local run's workers share this environment; only with a remote cluster
    (`--ray-address` / `RAY_ADDRESS`), whose workers may have packages the driver lacks, is it left to the
    workers with a warning. A missing `slime.*` module is the original's training stack, which no
    environment here provides: always an error.

    Raises:
        slime_core.plugins.PluginError: the first plugin that does not resolve (message names the flag).
        ValueError: a plugin's own `check_config` refuses the flags (`check_plugin_config`).
    """
    from slime_core.plugins import PluginError
    from slime_rollout.plugins import load_function

    remote = bool(ray_address(cfg))
    for field, flag, path in _plugin_paths(cfg):
        if path == SlimeArgs.model_fields[field].default:
            # Ours, bound by tests/apps/test_preflight.py; importing the default rollout function here cost the
            # driver ~2 CPU-s on every run (the rollout actor imports it for the run).
            continue
        try:
            fn = load_function(path, flag=flag)
            check_plugin_call(fn, field, flag, path)
        except PluginError as e:
            missing = e.missing_dependency
            if missing is None:
                raise
            if missing == "slime" or missing.startswith("slime."):
                raise PluginError(
                    f"{e}; this slime provides the original's plugin modules (slime.utils.*, slime.rollout.*, "
                    f"slime.backends.megatron_utils.loss / cp_utils, slime.agent.adapters.openai), not "
                    f"{missing} (MIGRATION.md lists what to use instead)"
                ) from e
            if not remote:
                raise PluginError(f"{e} (install it in this environment: the run's workers use it too)") from e
            logger.warning("%s (left to the workers of the remote cluster)", e)
            continue
        check_plugin_config(fn, cfg, flag, path)


def _check_architecture(cfg: SlimeArgs, *, dry_run: bool = False) -> list[str]:
    """Megatron architecture flags (and what SGLang can serve) against `--hf-checkpoint`'s config.json.

    Args:
        cfg: the validated config.
        dry_run: judge the GPU run's plan (SGLang unless `--rollout-engine` says otherwise), not this machine's.

    Raises:
        ValueError: a flag contradicts config.json (all such flags named), or SGLang would serve another model than
            the trainer trains (`slime_core.config.sglang_heads`).
    """
    import json

    from slime_core.config.architecture import check_architecture, is_dense_config
    from slime_core.config.sglang_heads import tied_head_refusal
    from slime_core.config.sglang_moe import dense_model_moe_flags

    with open(os.path.join(cfg.hf_checkpoint, "config.json"), encoding="utf-8") as f:
        hf_config = json.load(f)
    megatron_native = train_backend_spec(cfg).megatron_native
    report = check_architecture(list(cfg.megatron_args), hf_config, megatron_native)
    split = _head_split(cfg, hf_config, megatron_native)
    if split:
        raise ValueError(f"--hf-checkpoint {cfg.hf_checkpoint}: the attention heads do not split: {'; '.join(split)}")
    engine_moe = dense_model_moe_flags(dict(cfg.sglang_args), hf_config)
    if engine_moe:
        raise ValueError(
            f"--hf-checkpoint {cfg.hf_checkpoint} is a dense model (model_type {hf_config.get('model_type')!r}, its "
            f"config.json names no experts): SGLang MoE flags cannot apply: {' '.join(engine_moe)}"
        )
    head = tied_head_refusal(hf_config) if _serves_with_sglang(cfg, dry_run) else None
    if head:
        raise ValueError(f"--hf-checkpoint {cfg.hf_checkpoint}: {head}")
    layers = _layer_split(cfg, hf_config) if megatron_native else []
    if layers:
        raise ValueError(f"--hf-checkpoint {cfg.hf_checkpoint}: the Megatron layout does not fit: {'; '.join(layers)}")
    if megatron_native and cfg.expert_model_parallel_size > 1 and is_dense_config(hf_config):
        # Megatron-LM refuses EP without --num-experts; megatron-core alone would build empty expert groups and
        # spend the ranks on data parallelism the flag did not ask for.
        raise ValueError(
            f"--expert-model-parallel-size {cfg.expert_model_parallel_size}: --hf-checkpoint {cfg.hf_checkpoint} is "
            f"a dense model (model_type {hf_config.get('model_type')!r}, its config.json names no experts): there "
            "are no experts to split; remove the flag"
        )
    if report.mismatches:
        raise ValueError(
            f"--hf-checkpoint {cfg.hf_checkpoint}: Megatron architecture flags disagree with its config.json (the "
            f"model is built from config.json; fix or remove them): {'; '.join(report.mismatches)}"
        )
    notes = []
    if report.checked:
        notes.append(f"{len(report.checked)} Megatron architecture flags agree with config.json")
    if report.unchecked:
        notes.append(
            f"not checked (config.json of model_type {hf_config.get('model_type')!r} does not say): "
            f"{' '.join(report.unchecked)}"
        )
    return notes


def _serves_with_sglang(cfg: SlimeArgs, dry_run: bool) -> bool:
    """Whether the run's engines are SGLang: `--rollout-engine sglang`, or a dry run that names no engine."""
    return cfg.rollout_engine == "sglang" or (dry_run and "rollout_engine" not in cfg.model_fields_set)


def _head_split(cfg: SlimeArgs, hf_config: dict, megatron_native: bool) -> list[str]:
    """`slime_core.config.head_split` for the GPU run of `cfg` (SGLang unless `--rollout-engine` says otherwise)."""
    from slime_core.config.head_split import head_split_problems

    sglang = cfg.rollout_engine == "sglang" or "rollout_engine" not in cfg.model_fields_set
    sizes = {}
    for key in ("dp_size", "pp_size"):
        try:
            sizes[key] = int(cfg.sglang_args.get(key, 1))
        except (TypeError, ValueError):
            sizes[key] = 1  # validation names a bad --sglang-dp-size / --sglang-pp-size
    return head_split_problems(
        hf_config,
        engine_tp=cfg.rollout_num_gpus_per_engine if sglang else None,
        engine_dp_attention=sizes["dp_size"] if cfg.sglang_args.get("enable_dp_attention") else 1,
        engine_pp=sizes["pp_size"],
        megatron_tp=cfg.tensor_model_parallel_size if megatron_native else None,
        ulysses_cp=None if megatron_native else cfg.context_parallel_size,
    )


def _layer_split(cfg: SlimeArgs, hf_config: dict) -> list[str]:
    """`slime_core.config.layer_split` for the Megatron flags of `cfg` (empty when config.json gives no layer count)."""
    from slime_core.config.layer_split import layer_split_problems

    text = hf_config.get("text_config") or hf_config.get("llm_config") or hf_config
    num_layers = text.get("num_hidden_layers")
    if not isinstance(num_layers, int):
        return []
    experts = text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts")
    uneven = {}
    for key in ("first", "last"):
        flag = f"--decoder-{key}-pipeline-num-layers"
        value = cfg.megatron_flag(flag)
        try:
            uneven[key] = None if value is None else int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{flag}: expected an integer, got {value!r}") from None
    return layer_split_problems(
        num_layers,
        experts if isinstance(experts, int) else None,
        pipeline=cfg.pipeline_model_parallel_size,
        expert=cfg.expert_model_parallel_size,
        **uneven,
    )


def hardware_refusal(cfg: SlimeArgs) -> str | None:
    """Why a run of `cfg` started on this machine would be refused for its hardware (`_check_hardware`), or None.

    `--dry-run` checks a GPU launch script on a machine without GPUs and says the configuration is valid; without
    this, "valid" was the last word before the same flags were refused at once on that machine
    (`--train-backend megatron needs CUDA GPUs`).
    """
    try:
        _check_hardware(cfg)
    except ValueError as e:
        return str(e)
    return None


def _check_hardware(cfg: SlimeArgs) -> None:
    """A local run: Megatron needs CUDA, and without CUDA every trainer rank is a CPU process of this machine."""
    import torch

    if torch.cuda.is_available():
        return
    selected = [("--train-backend", cfg.train_backend, train_backend_spec(cfg), TRAIN_BACKENDS)]
    if cfg.rollout_engine and not cfg.rollout_engine_urls:  # engines it starts itself, on this machine
        selected.append(("--rollout-engine", cfg.rollout_engine, engine_spec(cfg), ROLLOUT_ENGINES))
    for flag, name, spec, instead in selected:
        if spec.needs_gpu:  # its capability record says so (slime_core.extensions)
            cpu = [n for n in instead.names() if _runs_on_cpu(instead, n)]
            raise ValueError(f"{flag} {name} needs CUDA GPUs; on this machine use {flag} {' or '.join(cpu)}")
    ranks = cfg.actor_num_nodes * cfg.actor_num_gpus_per_node
    cores = os.cpu_count() or 1
    if cfg.actor_num_nodes > 1 or ranks > cores:
        raise ValueError(
            f"no CUDA GPU here: --actor-num-nodes {cfg.actor_num_nodes} × --actor-num-gpus-per-node "
            f"{cfg.actor_num_gpus_per_node} would start {ranks} CPU trainer ranks on one machine with {cores} cores; "
            "on CPU use --actor-num-nodes 1 --actor-num-gpus-per-node 1 (or up to the core count)"
        )


def _check_metric_sinks(cfg: SlimeArgs) -> list[str]:
    """`--use-wandb` needs the `wandb` package in the driver's environment (where `slime_app.tracking` imports it).

    Returns:
        A note naming the `--wandb-*` flags set without `--use-wandb` (they have no effect then, as in the original).

    Raises:
        ValueError: naming the flag and the install command.
    """
    if not cfg.use_wandb:
        fields = type(cfg).model_fields
        unused = [
            field_to_flag(name)
            for name in fields
            if name.startswith(("wandb_", "disable_wandb_"))
            and name != "wandb_always_use_train_step"  # the TensorBoard x-axis too
            and getattr(cfg, name) != fields[name].default
        ]
        return [f"{', '.join(unused)}: no effect without --use-wandb (nothing goes to W&B)"] if unused else []
    try:
        import wandb  # noqa: F401  # the driver's own import, done before anything starts
    except ImportError:
        raise ValueError(
            "--use-wandb: the `wandb` package is not installed in this environment (`uv pip install wandb`, or drop "
            "--use-wandb; TensorBoard logs are written without it)"
        ) from None
    return []


def _check_engine_launch(cfg: SlimeArgs) -> None:
    """Checks the engine's record against the run.

    `--colocate` needs `supports_colocate`; without `launchable` the servers must be started elsewhere
    (`--rollout-engine-urls`).

    Raises:
        ValueError: naming the flag and the engine.
    """
    if not cfg.rollout_engine:
        return
    if cfg.colocate and not engine_spec(cfg).supports_colocate:
        raise ValueError(f"--colocate: --rollout-engine {cfg.rollout_engine} cannot release its memory; drop it")
    if not cfg.rollout_engine_urls and not engine_spec(cfg).launchable:
        raise ValueError(
            f"--rollout-engine {cfg.rollout_engine}: slime does not start this engine's servers; start them and "
            "give their addresses with --rollout-engine-urls"
        )


def _check_model_given(cfg: SlimeArgs) -> None:
    """Without `--hf-checkpoint` a run that starts engines or a trainer cannot begin.

    The run failed only after Ray and the trainer had started, with the engine host's traceback; `--dry-run` passed.

    Raises:
        ValueError: no `--hf-checkpoint` while slime starts engines or runs a trainer.
    """
    if cfg.hf_checkpoint:
        return
    users = []
    if not cfg.rollout_engine_urls and not cfg.debug_train_only:
        users.append("the engines slime starts serve it")
    if not cfg.debug_rollout_only:
        users.append("the trainer builds the model and tokenizer from it")
    if users:
        raise ValueError(f"--hf-checkpoint is required ({' and '.join(users)}): a local Hugging Face model directory")


def _runs_on_cpu(registry: Registry, name: str) -> bool:
    try:
        return not registry.get(name).needs_gpu
    except ImportError:  # its package is not installed here: not a choice to offer
        return False


def _run_owned_checks(cfg: SlimeArgs) -> list[str]:
    """Runs the checks each package owns (`slime.preflight`) and those of the selected registry entries.

    Returns:
        The notes they report.

    Raises:
        FileNotFoundError / ValueError: every error they report, in one message; the class is the first error's.
    """
    problems = run_preflight_hooks(cfg)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise errors[0].exception("; ".join(p.message for p in errors))
    return [p.message for p in problems]


def preflight(cfg: SlimeArgs, *, hardware: bool = True) -> list[str]:
    """Validates paths, data files, plugins, architecture flags and checkpoints named by the config.

    Args:
        cfg: the validated config.
        hardware: check this machine can run it (local runs only: a remote cluster's GPUs are not visible from
            here); False for `--dry-run`.

    Returns:
        Notes for the log (checkpoints found, flags checked).

    Raises:
        FileNotFoundError: a model directory, data file or `--ref-load` does not exist, or `--hf-checkpoint` holds no
            weights that the engines or the trainer would load (message names the flag).
        ValueError: a data file is malformed (message names the flag, file and line/row; with `--multimodal-keys` also a
            missing, unreadable or surplus image), an architecture flag contradicts config.json, an HF OPD teacher
            of another architecture, a `--sglang-*`/`--router-*` flag the installed SGLang/router does not have, a
            checkpoint the backend cannot read, a damaged data cursor of the rollout `--load` resumes at, or hardware
            this run cannot use.
        slime_core.plugins.PluginError: a plugin path does not resolve (message names the flag).
    """
    if hardware and not ray_address(cfg):
        _check_hardware(cfg)
    _check_plugins(cfg)
    sink_notes = _check_metric_sinks(cfg)
    _check_engine_launch(cfg)
    _check_model_given(cfg)
    if cfg.hf_checkpoint and not os.path.isdir(cfg.hf_checkpoint):
        hint = ""
        if cfg.hf_checkpoint.count("/") == 1 and not cfg.hf_checkpoint.startswith((".", "/", "~")):
            hint = (
                f" (a Hugging Face Hub id? models are not downloaded: `huggingface-cli download {cfg.hf_checkpoint} "
                "--local-dir DIR`, then pass DIR)"
            )
        raise FileNotFoundError(f"--hf-checkpoint: not a directory: {cfg.hf_checkpoint}{hint}")
    if cfg.hf_checkpoint and not os.path.exists(os.path.join(cfg.hf_checkpoint, "config.json")):
        raise FileNotFoundError(f"--hf-checkpoint {cfg.hf_checkpoint}: no config.json (not a Hugging Face model dir)")
    if cfg.hf_checkpoint:
        check_json_files(cfg.hf_checkpoint)
        if weight_readers(cfg):  # only those who build the model need its type
            check_model_type(cfg.hf_checkpoint)
    check_opd_teacher(cfg)
    notes = sink_notes + check_fp8_rollout(cfg)
    # The packages' and entries' own checks (data, engine flags, Megatron's model type): architecture flag
    # mismatches do not matter if the model cannot be built.
    notes += _run_owned_checks(cfg)
    notes += _check_architecture(cfg, dry_run=not hardware) if cfg.hf_checkpoint else []
    notes += check_checkpoints(cfg)
    notes += check_data_cursor(cfg)  # the loop restores it only after the engines and the model load
    notes += check_replay_dumps(cfg)
    if cfg.hf_checkpoint:  # last: a config-only folder is enough for every check above, and their errors say more
        check_hf_weights(cfg)
    return notes
