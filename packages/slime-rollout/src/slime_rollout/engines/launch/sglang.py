"""SGLang engines: the command line and environment of one `sglang.launch_server` process, and their `EngineKind`.

Command line (flag names of SGLang 0.5.16 `ServerArgs`)::

    <engine python> -m sglang.launch_server --model-path <hf_checkpoint> --host H --port P --tp-size G
        --nccl-port N --base-gpu-id B --random-seed S --trust-remote-code --skip-server-warmup
        [--mem-fraction-static F] [--enable-memory-saver] [LoRA flags: `lora_server_args`]
        [--enable-weights-cpu-backup: `needs_weights_backup`] [--enable-draft-weights-cpu-backup: with the saver]
        <every --sglang-* flag> <$SLIME_SGLANG_ARGS>

The SGLang interpreter is `--engine-python`, else `$SLIME_SGLANG_PYTHON`, else this one (`engine_python`).
Environment: `SLIME_SGLANG_PYTHONPATH` becomes the engine's PYTHONPATH, `SLIME_SGLANG_ARGS` is appended (shell-split).
`slime_rollout.engines.launch.launcher` starts the processes these describe.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slime_core.config.sglang_flags import (
    MANAGED_SGLANG_FIELDS,
    check_managed_sglang_flags,
    sglang_field,
    sglang_fields,
)
from slime_core.config.true_on_policy import true_on_policy_server_args
from slime_core.registry import Problem
from slime_rollout.engines.launch.common import needs_weights_backup
from slime_rollout.engines.process import find_free_port
from slime_rollout.engines.wire import nccl_cumem_enable

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs
    from slime_rollout.engines.process import EngineProcess

__all__ = [
    "MANAGED_SGLANG_FIELDS",
    "SGLangKind",
    "build_sglang_command",
    "engine_python",
    "lora_problems",
    "lora_server_args",
    "preflight",
    "sglang_env",
    "sglang_passthrough",
]

# Environment defaults slime gives SGLang (see slime's rollout.py); the user's environment wins.
_SGLANG_ENV_DEFAULTS = {
    "SGLANG_JIT_DEEPGEMM_PRECOMPILE": "false",
    "SGLANG_MEMORY_SAVER_CUDA_GRAPH": "true",
    "SGLANG_DISABLE_TP_MEMORY_INBALANCE_CHECK": "true",
    "SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK": "true",
}


def sglang_passthrough(sglang_args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """Renders `cfg.sglang_args` (the `--sglang-*` flags) as SGLang CLI tokens.

    Args:
        sglang_args: either a mapping `{field: value}` (field with or without the `sglang_` prefix, dashes or
            underscores; True -> bare flag, False/None -> omitted, list -> several values) or a list of CLI
            tokens (`--sglang-` prefixes are stripped).

    Raises:
        ValueError: a flag slime sets itself, by name, alias or abbreviation (`--sglang-port`, `--sglang-tp`;
            `slime_core.config.sglang_flags`), naming the flag.
    """
    if not sglang_args:
        return []
    if isinstance(sglang_args, str):
        sglang_args = shlex.split(sglang_args)
    if not isinstance(sglang_args, Mapping):
        tokens = [("--" + t.removeprefix("--sglang-")) if t.startswith("--sglang-") else t for t in sglang_args]
        check_managed_sglang_flags(t for t in tokens if t.startswith("--"))
        return tokens
    check_managed_sglang_flags(sglang_args)
    out: list[str] = []
    for key, value in sglang_args.items():
        field = sglang_field(key)
        if value is None or value is False:
            continue
        flag = "--" + field.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            out += [flag, *map(str, value)]
        elif isinstance(value, dict):
            import json

            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


def engine_python(cfg: SlimeArgs) -> str:
    """The interpreter that runs `sglang.launch_server`: `--engine-python`, else `$SLIME_SGLANG_PYTHON`, else this one.

    Config validation fills an unset `--engine-python` with the current interpreter, so that value counts as
    unset here and the environment variable still applies.
    """
    flag = cfg.engine_python
    if flag and flag != sys.executable:
        return str(flag)
    return os.environ.get("SLIME_SGLANG_PYTHON") or sys.executable


def build_sglang_command(
    cfg: SlimeArgs,
    *,
    host: str,
    port: int,
    nccl_port: int,
    tp_size: int,
    base_gpu_id: int,
    random_seed: int,
    memory_saver: bool,
    mem_fraction_static: float | None = None,
    python: str | None = None,
) -> list[str]:
    """Command line of one SGLang server (see the module docstring).

    Args:
        cfg: run config; reads `hf_checkpoint`, `engine_python` (see `engine_python`), `sglang_args` and
            `use_rollout_routing_replay` (adds `--enable-return-routed-experts`).
        host: interface the server binds.
        port: its HTTP port.
        nccl_port: its NCCL port (TP > 1).
        tp_size: GPUs of the engine.
        base_gpu_id: its first GPU.
        random_seed: its sampling seed.
        memory_saver: `--enable-memory-saver` (colocated engines release memory while the trainer runs), with
            `--enable-draft-weights-cpu-backup` (a speculative draft model, never synced, keeps its weights).
        mem_fraction_static: `--mem-fraction-static` computed by the caller; a `--sglang-mem-fraction-static`
            pass-through flag wins.
        python: overrides the interpreter.
    """
    cmd = [
        python or engine_python(cfg),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(cfg.hf_checkpoint),
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(tp_size),
        "--nccl-port",
        str(nccl_port),
        "--base-gpu-id",
        str(base_gpu_id),
        "--random-seed",
        str(random_seed),
        "--trust-remote-code",
        "--skip-server-warmup",
    ]
    passthrough = sglang_passthrough(cfg.sglang_args)
    if mem_fraction_static is not None and "--mem-fraction-static" not in passthrough:
        cmd += ["--mem-fraction-static", str(mem_fraction_static)]
    if memory_saver:
        cmd.append("--enable-memory-saver")
    cmd += lora_server_args(cfg, passthrough)
    cmd += true_on_policy_server_args(cfg)
    if needs_weights_backup(cfg, memory_saver=memory_saver) and "--enable-weights-cpu-backup" not in passthrough:
        cmd.append("--enable-weights-cpu-backup")
    if memory_saver and "--enable-draft-weights-cpu-backup" not in passthrough:
        # As the original (sglang_engine.py): no sync sends a speculative draft model's weights (EAGLE/MTP), so a
        # release would leave the draft on fresh memory for the rest of the run. Inert without a draft model.
        cmd.append("--enable-draft-weights-cpu-backup")
    if cfg.use_rollout_routing_replay and "--enable-return-routed-experts" not in passthrough:
        cmd.append("--enable-return-routed-experts")  # R3: replies carry meta_info.routed_experts
    cmd += passthrough
    cmd += shlex.split(os.environ.get("SLIME_SGLANG_ARGS", ""))
    return cmd


def lora_server_args(cfg: SlimeArgs, passthrough: Sequence[str] = ()) -> list[str]:
    """SGLang flags that let an engine serve the run's LoRA adapter (`--lora-rank`); empty without LoRA.

    `--enable-lora` with room for an adapter of rank `--lora-rank` on `--lora-target-modules` (the adapter itself
    is loaded by the first weight sync, `slime_rollout.weight_sync.lora`); a pass-through `--sglang-<same flag>` wins.

    Args:
        cfg: reads `lora_rank`, `lora_target_modules`.
        passthrough: the `--sglang-*` flags as SGLang tokens (`sglang_passthrough`).
    """
    if not cfg.lora_rank:
        return []
    wanted: dict[str, list[str]] = {
        "--enable-lora": [],
        "--max-lora-rank": [str(cfg.lora_rank)],
        "--lora-target-modules": list(cfg.lora_target_modules),
        "--max-loras-per-batch": ["1"],
    }
    given = {t.split("=")[0] for t in passthrough if t.startswith("--")}
    return [token for flag, values in wanted.items() if flag not in given for token in (flag, *values)]


#: SGLang stacks a layer's q/k/v adapters into `qkv_proj` from q_proj (needing v_proj: a missing k is zeros) and
#: gate/up into `gate_up_proj` from gate_proj (`srt/lora/lora.py`, `normalize_qkv_proj` / `normalize_gate_up_proj`);
#: `(module, what it needs, what SGLang does without it)`.
_STACKING = (
    ("q_proj", "v_proj", "fails to load the adapter (a KeyError on v_proj)"),
    ("k_proj", "q_proj", "skips the k_proj tensors: the engine serves the base k_proj"),
    ("v_proj", "q_proj", "skips the v_proj tensors: the engine serves the base v_proj"),
    ("up_proj", "gate_proj", "skips the up_proj tensors: the engine serves the base up_proj"),
)


def lora_problems(cfg: SlimeArgs) -> list[str]:
    """Why SGLang would not serve the run's adapter as the trainer computes it; empty when it would.

    `--lora-target-modules` must stack as SGLang stacks them (`_STACKING`); a pass-through `--sglang-max-lora-rank`
    or `--sglang-lora-target-modules` (which win over `lora_server_args`) must leave room for the adapter. Either
    fault surfaced at the first weight sync, after the engines started, or (a skipped tensor) never.

    Args:
        cfg: reads `lora_rank`, `lora_target_modules`, `sglang_args`, `rollout_engine_urls`.

    Returns:
        One line per fault, naming the flags.
    """
    if not cfg.lora_rank:
        return []
    targets = set(cfg.lora_target_modules)
    problems = [
        f"--lora-target-modules {module} without {needs}: SGLang {effect}; add {needs}"
        for module, needs, effect in _STACKING
        if module in targets and needs not in targets
    ]
    if cfg.rollout_engine_urls:
        return problems  # servers started elsewhere: their flags are not ours to check
    given = sglang_fields(cfg.sglang_args)
    rank = given.get("max_lora_rank")
    if rank is not None and not isinstance(rank, bool) and str(rank).isdigit() and int(rank) < cfg.lora_rank:
        problems.append(f"--sglang-max-lora-rank {rank} < --lora-rank {cfg.lora_rank}: SGLang refuses the adapter")
    served = given.get("lora_target_modules")
    if isinstance(served, str | list) and served:
        served = [served] if isinstance(served, str) else [str(v) for v in served]
        if "all" not in served and not set(map(_stacked, targets)) <= set(map(_stacked, served)):
            problems.append(
                f"--sglang-lora-target-modules {' '.join(served)} lacks some of --lora-target-modules "
                f"{' '.join(cfg.lora_target_modules)}: SGLang refuses the adapter"
            )
    return problems


def _stacked(module: str) -> str:
    """SGLang's name of the layer a module's adapter goes to (`get_normalized_target_modules`)."""
    return {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
            "up_proj": "gate_up_proj"}.get(module, module)  # fmt: skip


def preflight(cfg: SlimeArgs) -> list[Problem]:
    """`--rollout-engine sglang`'s checks before anything starts: the LoRA adapter it must serve (`lora_problems`)."""
    return [Problem(message=m) for m in lora_problems(cfg)]


def sglang_env() -> dict[str, str]:
    """Environment of an SGLang process: this one's, plus SGLang defaults and `SLIME_SGLANG_PYTHONPATH`."""
    env = dict(os.environ)
    for k, v in _SGLANG_ENV_DEFAULTS.items():
        env.setdefault(k, v)
    # The trainer's allocator settings (e.g. expandable segments) break SGLang's memory saver.
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env["NCCL_CUMEM_ENABLE"] = nccl_cumem_enable()  # the trainer side pins the same value
    if os.environ.get("SLIME_SGLANG_PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["SLIME_SGLANG_PYTHONPATH"]
    return env


class SGLangKind:
    """`--rollout-engine sglang`: one `sglang.launch_server` per engine, TP over `gpus_per_engine` GPUs."""

    name = "sglang"

    def command(
        self,
        cfg: SlimeArgs,
        *,
        host: str,
        port: int,
        index: int,
        gpus_per_engine: int,
        base_gpu_id: int | None,
        random_seed: int,
        memory_saver: bool,
        mem_fraction_static: float | None,
    ) -> tuple[list[str], int]:
        """Command line of engine `index` and the highest port it binds (its NCCL port: the next free one)."""
        nccl_port = find_free_port(host, port + 1)
        # The engine's GPUs are TP × PP (the original's `tp_size = rollout_num_gpus_per_engine // sglang_pp_size`):
        # `--tp-size` of all of them with `--pp-size` passed through asked SGLang for PP times as many GPUs.
        pipeline = int(cfg.sglang_args.get("pp_size", 1))
        cmd = build_sglang_command(
            cfg,
            host=host,
            port=port,
            nccl_port=nccl_port,
            tp_size=gpus_per_engine // pipeline,
            base_gpu_id=base_gpu_id if base_gpu_id is not None else index * gpus_per_engine,
            random_seed=random_seed,
            memory_saver=memory_saver,
            mem_fraction_static=mem_fraction_static,
        )
        return cmd, nccl_port

    def env(self) -> dict[str, str]:
        """See `sglang_env`."""
        return sglang_env()

    def check_own(self, proc: EngineProcess) -> None:
        """Nothing SGLang-specific: the launcher's liveness check after the health wait catches a lost bind race."""
