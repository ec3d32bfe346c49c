"""CPU reference engines (`--rollout-engine reference`): the command line of one, and their `EngineKind`.

The server itself is `slime_rollout.engines.reference` (`python -m slime_rollout.engines.reference`).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from slime_core.config.sglang_flags import sglang_fields
from slime_rollout.engines.launch.common import PortTaken, needs_weights_backup

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs
    from slime_core.registry import Problem
    from slime_rollout.engines.process import EngineProcess

__all__ = ["ReferenceKind", "build_reference_command", "preflight"]

# The --sglang-* flags a reference engine reads (`build_reference_command`); it ignores the others.
_READ_SGLANG_FLAGS = frozenset(
    {"context_length", "dtype", "enable_deterministic_inference", "max_running_requests", "num_threads"}
)


def build_reference_command(
    cfg: SlimeArgs, *, host: str, port: int, random_seed: int, memory_saver: bool = False
) -> list[str]:
    """Command line of one CPU reference engine.

    Args:
        cfg: run config; reads `hf_checkpoint`, `lora_rank`, `use_rollout_routing_replay` and, from `sglang_args`,
            `max_running_requests` (64), `dtype` ("float32"), and `context_length`, `num_threads` and
            `enable_deterministic_inference` (a switch: the engine then runs one request at a time) when given.
        host: interface the server binds.
        port: its HTTP port.
        random_seed: its sampling seed.
        memory_saver: `--enable-memory-saver`, as an SGLang engine of the run gets it (the reference engine then
            loses its weights on a release as SGLang does, unless `--enable-weights-cpu-backup`: LoRA runs).
    """
    extra = sglang_fields(cfg.sglang_args)
    cmd = [
        sys.executable,
        "-m",
        "slime_rollout.engines.reference",
        "--model-path",
        str(cfg.hf_checkpoint),
        "--host",
        host,
        "--port",
        str(port),
        "--random-seed",
        str(random_seed),
        "--dtype",
        str(extra.get("dtype", "float32")),
        "--max-running-requests",
        str(extra.get("max_running_requests", 64)),
    ]
    if extra.get("context_length") is not None:  # the engine's context, as SGLang's (preflight checks the number)
        cmd += ["--context-length", str(extra["context_length"])]
    if extra.get("num_threads"):
        cmd += ["--num-threads", str(extra["num_threads"])]
    if _switch(extra.get("enable_deterministic_inference")):
        cmd.append("--enable-deterministic-inference")  # bit-identical runs, as SGLang's deterministic mode
    if memory_saver:
        cmd.append("--enable-memory-saver")
    if needs_weights_backup(cfg, memory_saver=memory_saver):
        cmd.append("--enable-weights-cpu-backup")
    if cfg.use_rollout_routing_replay:
        cmd.append("--enable-return-routed-experts")  # as SGLang's engines of the run
    return cmd


def _switch(value: object) -> bool:
    """A pass-through switch's value as given (`True`, or text from a YAML config) read as a boolean."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)


def preflight(cfg: SlimeArgs) -> list[Problem]:
    """A note naming the `--sglang-*` flags the reference engines of this run do not read (they passed silently).

    Returns:
        One note, or none when every flag is read or the engines are not started here (`--rollout-engine-urls`).
    """
    from slime_core.registry import Problem

    if cfg.rollout_engine_urls or cfg.debug_train_only:
        return []
    ignored = sorted(name for name in sglang_fields(cfg.sglang_args) if name not in _READ_SGLANG_FLAGS)
    if not ignored:
        return []
    flags = " ".join(f"--sglang-{name.replace('_', '-')}" for name in ignored)
    return [Problem(
        message="the CPU reference engines read only --sglang-context-length, --sglang-dtype, "
        "--sglang-enable-deterministic-inference, --sglang-max-running-requests and --sglang-num-threads; these "
        f"have no effect in this run (SGLang engines read them): {flags}",
        severity="note",
    )]  # fmt: skip


class ReferenceKind:
    """`--rollout-engine reference`: one transformers-backed CPU server per engine (GPU counts do not apply)."""

    name = "reference"

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
        """Command line of engine `index` and the one port it binds (GPU arguments do not apply)."""
        cmd = build_reference_command(cfg, host=host, port=port, random_seed=random_seed, memory_saver=memory_saver)
        return cmd, port

    def env(self) -> dict[str, str]:
        """This process's environment."""
        return dict(os.environ)

    def check_own(self, proc: EngineProcess) -> None:
        """Asks `/server_info` for the server's pid: another process on the port answers health checks too.

        Raises:
            PortTaken: the pid is not `proc`'s.
        """
        import httpx

        pid = httpx.get(proc.url + "/server_info", timeout=30, trust_env=False).json().get("pid")
        if pid != proc.pid:
            raise PortTaken(f"{proc.url} is served by pid {pid}, not by engine pid {proc.pid}")
