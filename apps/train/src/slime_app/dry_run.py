"""`--dry-run`: everything that can be checked without the hardware, then the resolved config; nothing starts.

Checked: the flags and their cross-field rules (already by `parse_args`), the batch arithmetic, the data files
and their rows, the tokenizer and its chat template on the first prompt (for SFT, the loss mask of the first
conversation), the plugins' import paths, the Megatron architecture flags against config.json (MoE flags on a
dense model included), `--load` / `--ref-load` / `--critic-load` against `--hf-checkpoint`'s architecture, and the
rollout GPUs against `--rollout-num-gpus-per-engine`, and that the output folders can be made (none is created;
not with a remote cluster, whose ranks write from other hosts). Not touched: Ray, engines, GPUs; what the run would
need is printed instead, as a GPU run would use it (SGLang, its weight sync) also on a machine without CUDA.

`uv run apps/train --dry-run <flags>` exits 0 with the report on stdout, or 2 with one error line.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from slime_app.bundle_layout import bundle_layout, layout_text
from slime_app.disk_space import check_free_space
from slime_app.outputs import check_creatable, check_places
from slime_app.preflight import hardware_refusal, preflight
from slime_app.ray_start import ray_address
from slime_app.resolve import resolve_config
from slime_core.config import PluginArgs, SlimeArgs
from slime_core.config.base import field_to_flag
from slime_core.config.megatron_checks import megatron_flag_values
from slime_core.config.megatron_flags import MEGATRON_FLAG_RULES
from slime_core.config.validation import colocated_gpu_split
from slime_core.extensions import ROLLOUT_ENGINES
from slime_core.secrets import is_secret_name

if TYPE_CHECKING:
    from slime_rollout.data.prompt_rows import PromptRows

__all__ = ["dry_run", "gpu_plan", "render_config"]

_PASS_THROUGH = ("sglang_args", "router_args", "megatron_args", "custom_config")
_MEGATRON_KINDS = {
    "read": "read by the backend",
    "check": "checked against config.json",
    "same": "the backend always does this",
    "neutral": "at the backend's only value",
    "recompute": "as --gradient-checkpointing",
    "noop": "no effect here (kernel/logging)",
}


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def render_config(cfg: SlimeArgs) -> list[str]:
    """The config grouped like `--help`: per group the flags that differ from their defaults, then pass-through."""
    lines: list[str] = []
    public = cfg.to_public_dict()  # --wandb-key and other credentials are not printed
    for group in reversed(SlimeArgs.__bases__):
        changed = []
        for name, field in group.model_fields.items():
            if name in _PASS_THROUGH:
                continue
            value = getattr(cfg, name)
            if value != field.get_default(call_default_factory=True):
                shown = public[name] if is_secret_name(name) else value  # the rule to_public_dict redacts by
                changed.append(f"  {field_to_flag(name):<42} {_shown(shown)}")
        summary = (group.__doc__ or "").strip().splitlines()[0]
        lines.append(
            f"{group.__name__} ({summary}) {len(changed)} differ from the default, "
            f"{len(group.model_fields) - len(changed)} at the default (given or not)"
        )
        lines += changed
    lines.append("pass-through flags:")
    for key, prefix in (("sglang_args", "--sglang-"), ("router_args", "--router-")):
        for name, value in public[key].items():
            shown = "" if value is True else f" {_shown(value)}"
            lines.append(f"  {prefix}{name.replace('_', '-')}{shown}")
    values = megatron_flag_values(list(cfg.megatron_args))
    for kind, label in _MEGATRON_KINDS.items():
        flags = [
            f for f in values if f in MEGATRON_FLAG_RULES and getattr(MEGATRON_FLAG_RULES[f], cfg.train_backend) == kind
        ]
        if flags:
            lines.append(f"  Megatron flags, {label}: {' '.join(flags)}")
    return lines


def _arithmetic(cfg: SlimeArgs, plan: SlimeArgs) -> list[str]:
    world = cfg.actor_num_nodes * cfg.actor_num_gpus_per_node
    model_parallel = cfg.tensor_model_parallel_size * cfg.pipeline_model_parallel_size * cfg.context_parallel_size
    samples = cfg.rollout_batch_size * cfg.n_samples_per_prompt
    lines = [
        f"rollout: {cfg.rollout_batch_size} prompts × {cfg.n_samples_per_prompt} samples = {samples} samples = "
        f"{cfg.num_steps_per_rollout} optimizer step(s) × --global-batch-size {cfg.global_batch_size}",
        f"run: {cfg.num_rollout} rollouts, {cfg.num_rollout * cfg.num_steps_per_rollout} optimizer steps",
    ]
    if not cfg.debug_rollout_only:
        lines.append(
            f"trainer: {world} rank(s) ({cfg.actor_num_nodes} node(s) × {cfg.actor_num_gpus_per_node}), data-parallel "
            f"{world // model_parallel if world % model_parallel == 0 else '?'} (TP×PP×CP = {model_parallel}), "
            f"--train-backend {cfg.train_backend}"
        )
    if not ray_address(cfg) and (refusal := hardware_refusal(cfg)):  # on a cluster the workers have the GPUs
        lines.append(f"this machine: a run here is refused ({refusal}); the plan above is for GPU machines")
    if not cfg.debug_train_only and cfg.rollout_engine_urls:
        lines.append(f"engines: {len(cfg.rollout_engine_urls)} outside engine(s) (--rollout-engine-urls), none started")
    elif not cfg.debug_train_only:
        per_engine = plan.rollout_num_gpus_per_engine
        engines = max(1, (plan.rollout_num_gpus or per_engine) // per_engine)
        shared, own = colocated_gpu_split(plan)
        if not cfg.colocate:
            placement = "on their own GPUs"
        elif not own:
            placement = "colocated with the trainer"
        else:  # the placement adds rollout-only bundles after the trainer's (slime_app.cluster)
            placement = f"{shared} colocated with the trainer, {own} rollout-only"
        engine, weight_sync, cpu_note = gpu_plan(cfg)
        lines.append(
            f"engines: {engines} × {per_engine} GPU(s) = {engines * per_engine} rollout GPU(s) ({engine}), "
            f"{placement}; weights via {weight_sync}{cpu_note}"
        )
    layout = bundle_layout(plan)
    critic = ""
    if plan.use_critic and not plan.debug_rollout_only:
        own = layout.critic_gpus
        critic = f", the critic's {own} of its own" if own else ", the critic on the actor's"
    lines.append(f"placement: {layout.num_bundles} GPU(s) = {layout_text(plan)}{critic}")
    return lines


def gpu_plan(cfg: SlimeArgs, *, cuda: bool | None = None) -> tuple[str, str, str]:
    """The engine and weight sync a GPU run of `cfg` uses, also when this machine has no CUDA.

    Validation resolves `--rollout-engine` and `--weight-sync auto` for the machine it runs on (reference engine,
    disk sync on CPU); a dry run on a laptop should show what the GPU run will do. Flags the user gave are kept.

    Args:
        cfg: the validated config.
        cuda: whether this machine has CUDA (default: asks torch).

    Returns:
        (engine, weight sync, a note naming this machine's fallback; empty on a CUDA machine or when no default
        changes).
    """
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    engine, weight_sync = cfg.rollout_engine, cfg.weight_sync
    if cuda:
        return engine, weight_sync, ""
    given = cfg.model_fields_set
    if "rollout_engine" not in given:
        engine = "sglang"
    if "weight_sync" not in given and weight_sync == "disk" and cfg.update_weight_transport != "disk":
        # The rule of --weight-sync auto on GPUs: a GPU engine gets NCCL broadcasts.
        weight_sync = "distributed" if ROLLOUT_ENGINES.get(engine).needs_gpu else weight_sync
    if (engine, weight_sync) == (cfg.rollout_engine, cfg.weight_sync):
        return engine, weight_sync, ""
    note = (
        f" (planned for GPUs; this machine has no CUDA, so a run here uses --rollout-engine {cfg.rollout_engine} "
        f"and --weight-sync {cfg.weight_sync})"
    )
    return engine, weight_sync, note


def _gpu_run_config(cfg: SlimeArgs, argv: list[str] | None) -> SlimeArgs:
    """`cfg` as a CUDA machine validates it: the engine GPUs a GPU run gets (`--rollout-num-gpus`'s defaults).

    Validation here resolved `--rollout-engine` to the CPU reference engine, for which some defaults reserve no GPU
    (`--debug-rollout-only --colocate` keeps one CPU engine; on GPUs the engines get the actor's GPUs). The flags
    are parsed again with the GPU plan's engine (`gpu_plan`), unless the user named one or no flags are known.
    """
    engine, _, _ = gpu_plan(cfg)
    if argv is None or engine == cfg.rollout_engine:
        return cfg
    from slime_core.config import parse_args

    return parse_args(["--rollout-engine", engine, *argv])


def _prompt_rows(cfg: SlimeArgs) -> PromptRows | None:
    """The rows of `--prompt-data`, read once for the checks below (None: no prompt file is read by this run)."""
    if not cfg.prompt_data or cfg.load_debug_rollout_data:
        return None
    from slime_rollout.data.source import load_prompt_rows

    return load_prompt_rows(cfg.prompt_data)


def _first_prompt(cfg: SlimeArgs, rows: PromptRows | None) -> list[str]:
    """Loads the tokenizer and renders the first training prompt (of `rows`) as the data source / SFT rollout will."""
    if not cfg.hf_checkpoint or rows is None:
        return []
    from slime_rollout.data.sft import ChatLossMask, generate_sft_rollout
    from slime_rollout.data.source import encode_prompt, get_tokenizer, rows_to_samples
    from slime_rollout.plugins import load_function

    tokenizer = get_tokenizer(cfg.hf_checkpoint)
    sft = load_function(cfg.rollout_function_path, flag="--rollout-function-path") is generate_sft_rollout
    (sample,) = rows_to_samples(
        rows.head(1), source=str(cfg.prompt_data), input_key=cfg.input_key, label_key=cfg.label_key,
        metadata_key=cfg.metadata_key, tool_key=cfg.tool_key, tokenizer=tokenizer,
        apply_chat_template=cfg.apply_chat_template, apply_chat_template_kwargs=dict(cfg.apply_chat_template_kwargs),
        number_prompts=cfg.custom_generate_function_path is not None, conversations=sft,
    )  # fmt: skip
    if sft:
        ids, mask = ChatLossMask(tokenizer, cfg.loss_mask_type).get_loss_mask(
            sample.prompt, sample.metadata.get("tools")
        )
        trained = f"{sum(mask)} trained on (--loss-mask-type {cfg.loss_mask_type})"
        return [f"SFT, first conversation: {len(ids)} tokens, {trained}"]
    # Measured as the default generate function sends it (`encode_prompt`): a message list goes through the chat
    # template there, with or without --apply-chat-template.
    count = len(encode_prompt(tokenizer, sample.prompt, sample.metadata.get("tools")))
    templated = cfg.apply_chat_template or not isinstance(sample.prompt, str)
    return [f"tokenizer of --hf-checkpoint: first prompt {count} tokens" + (" (chat template applied)" if templated
            else "")]  # fmt: skip


def _prompt_filter(cfg: SlimeArgs, rows: PromptRows | None) -> list[str]:
    """How many training prompts the default data source keeps under its prompt-length limit.

    The run builds the data source at start-up and stops there when no prompt fits (`--rollout-max-prompt-len 2`,
    a tiny `--rollout-max-context-len`); the first prompt alone said nothing of it. A custom data source, SFT data
    and a run without a limit are not measured here.

    Raises:
        ValueError: no prompt is left (the data source's own message).
    """
    from slime_rollout.data.prompt_length import default_max_prompt_len
    from slime_rollout.data.source import RolloutDataSource, RolloutDataSourceWithBuffer
    from slime_rollout.plugins import load_function

    if rows is None or cfg.disable_rollout_global_dataset:
        return []
    source_cls = load_function(cfg.data_source_path, flag="--data-source-path")
    limit = default_max_prompt_len(cfg)
    if source_cls not in (RolloutDataSource, RolloutDataSourceWithBuffer) or limit is None:
        return []
    kept, total = len(source_cls(PluginArgs.from_config(cfg), rows=rows)), len(rows)  # raises when none is left
    return [f"prompt length: {kept} of {total} prompts within {limit} tokens ({total - kept} longer are dropped)"]


def dry_run(cfg: SlimeArgs, argv: list[str] | None = None) -> list[str]:
    """Runs every check that needs no hardware and returns the report (the resolved config and what was checked).

    Args:
        cfg: the validated config.
        argv: the command line it came from; the GPU plan's engine counts are validated from it as on a CUDA
            machine (without it, this machine's values are shown).

    Raises:
        The errors of `preflight`, `resolve_config` and the tokenizer (one line each): the caller prints them.
    """
    notes = preflight(cfg, hardware=False)
    cfg, resolved = resolve_config(cfg, convert=False)
    report = ["slime --dry-run: the configuration is valid; nothing was started", ""]
    engine, weight_sync, _ = gpu_plan(cfg)  # the GPU run's values, not this machine's CPU fallback
    shown = {"rollout_engine": engine, "weight_sync": weight_sync}
    if weight_sync != cfg.weight_sync and "update_weight_disk_dir" not in cfg.model_fields_set:
        shown["update_weight_disk_dir"] = None  # only the CPU fallback's disk sync sets it
    report += render_config(cfg.model_copy(update=shown))
    plan = _gpu_run_config(cfg, argv)
    report += ["", "arithmetic:"] + [f"  {line}" for line in _arithmetic(cfg, plan)]
    rows = _prompt_rows(cfg)  # read once: the first prompt and the length filter both use them
    checks = resolved + notes + _first_prompt(cfg, rows) + _prompt_filter(cfg, rows)
    if not ray_address(cfg):  # as the run: other hosts write on a cluster
        checks += check_creatable(cfg)
        check_free_space(cfg)
    else:
        check_places(cfg, filesystems=False)
    report += ["", "checked:"] + [f"  {line}" for line in checks]
    report.append("  not checked here: GPUs, engines, Ray (the run checks them when it starts)")
    return report
