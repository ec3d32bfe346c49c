"""Starts engines one index at a time (`EngineLauncher`): command line by engine kind, port, log file, health wait.

The kinds (`--rollout-engine`) are `ENGINE_KINDS`: `sglang.SGLangKind` and `reference.ReferenceKind`, each an
`EngineKind` (`common.py`); another package's engine that slime starts is a `slime.rollout_engines` record with
`launchable=True` whose `factory` builds its `EngineKind` (`engine_kind`). A port probed free can be taken before
the engine binds it (another engine host on this machine): the launcher then restarts the engine on another port,
`_PORT_RETRIES` times at most.
"""

from __future__ import annotations

import logging
import os
import pathlib
import time
import urllib.parse
from typing import TYPE_CHECKING

from slime_core.extensions import ROLLOUT_ENGINES
from slime_rollout.engines.launch.common import EngineKind, PortTaken
from slime_rollout.engines.launch.reference import ReferenceKind
from slime_rollout.engines.launch.sglang import SGLangKind
from slime_rollout.engines.listeners import serves_port
from slime_rollout.engines.process import EngineProcess, find_free_port, port_reusable, start_engine_process

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["ENGINE_KINDS", "EngineLauncher", "engine_env", "engine_kind"]

logger = logging.getLogger(__name__)

ENGINE_KINDS: dict[str, EngineKind] = {"sglang": SGLangKind(), "reference": ReferenceKind()}


def engine_kind(name: str) -> EngineKind:
    """How engines of `--rollout-engine NAME` start: a built-in kind, else the registered record's `factory()`.

    Raises:
        slime_core.registry.UnknownNameError: no `slime.rollout_engines` entry has the name (a KeyError).
        ValueError: the record is not `launchable` or names no factory (give `--rollout-engine-urls`), or its
            factory built something without `command`, `env` and `check_own`.
    """
    if name in ENGINE_KINDS:
        return ENGINE_KINDS[name]
    spec = ROLLOUT_ENGINES.get(name)
    if not spec.launchable or spec.factory is None:
        why = "its record is not launchable" if not spec.launchable else "its launchable record names no factory"
        raise ValueError(
            f"--rollout-engine {name!r}: slime does not start this engine's servers ({why}); give their addresses "
            "with --rollout-engine-urls"
        )
    kind = spec.load()()
    missing = [m for m in ("command", "env", "check_own") if not callable(getattr(kind, m, None))]
    if missing:
        raise ValueError(
            f"--rollout-engine {name!r}: its factory built {type(kind).__name__}, which lacks {', '.join(missing)} "
            "(see slime_rollout.engines.launch.common.EngineKind)"
        )
    return kind


def engine_env(kind: str) -> dict[str, str]:
    """Environment of an engine process of kind `kind` (`--rollout-engine`).

    Raises:
        KeyError / ValueError: as `engine_kind`.
    """
    return engine_kind(kind).env()


class EngineLauncher:
    """Starts engines of one group by index: command line, port, log file, and the wait until they serve.

    One launcher serves a whole local group (`launch_engines`) or a single engine started on its own node (the
    trainer app's engine hosts). Engine `i` samples with seed `seed + i * gpus_per_engine` wherever it runs.

    Args:
        cfg: run config; reads `rollout_engine` (a kind of `engine_kind`), `hf_checkpoint`, `seed`,
            `offload_rollout`, `engine_python`, `sglang_args`.
        gpus_per_engine: TP size of each SGLang engine (ignored by the reference engine).
        colocate: the engines release their memory while a trainer on their GPUs runs (colocated with
            `--offload-rollout`): enable SGLang's memory saver.
        startup_timeout_s: per-engine health wait in seconds (None: `--rollout-engine-startup-timeout`).
        log_dir: write each engine's output to `<log_dir>/engine_<i>.log` (None: inherit stdout).
        host: interface the engines bind; also the host of their URLs.
        base_port: ports are probed upwards from here (each engine takes the next free one).
        mem_fraction_static: SGLang `--mem-fraction-static` (see `build_sglang_command`).

    Raises:
        ValueError: bad engine kind or GPU count, or no `--hf-checkpoint` (naming the flag).
    """

    def __init__(
        self,
        cfg: SlimeArgs,
        *,
        gpus_per_engine: int,
        colocate: bool = False,
        startup_timeout_s: float | None = None,
        log_dir: str | os.PathLike | None = None,
        host: str = "127.0.0.1",
        base_port: int = 15000,
        mem_fraction_static: float | None = None,
    ):
        kind = engine_kind(cfg.rollout_engine)
        if not cfg.hf_checkpoint:
            raise ValueError("launching engines needs --hf-checkpoint (the model they serve)")
        if gpus_per_engine < 1:
            raise ValueError(f"need gpus_per_engine >= 1, got {gpus_per_engine}")
        self.cfg, self.kind, self.gpus_per_engine = cfg, kind, gpus_per_engine
        self.memory_saver = bool(colocate or cfg.offload_rollout)
        if startup_timeout_s is None:
            startup_timeout_s = cfg.rollout_engine_startup_timeout
        self.startup_timeout_s, self.host, self.mem_fraction_static = startup_timeout_s, host, mem_fraction_static
        self.log_dir = pathlib.Path(log_dir) if log_dir else None
        self._cursor = base_port

    def start(self, index: int, *, base_gpu_id: int | None = None, same_port: int | None = None) -> EngineProcess:
        """Starts engine `index` without waiting for it; `same_port` is taken back when it can be bound again.

        A restarted engine keeps its old port when it can, so its URL (known to the trainer, the router and the
        plugins' args) stays valid.

        Args:
            index: the engine's position in the run (seed, log file name, default first GPU `index * gpus`).
            base_gpu_id: its first GPU on this node (None: `index * gpus_per_engine`).
            same_port: the port it had before a restart, else None.
        """
        host = self.host
        reuse = same_port is not None and port_reusable(host, same_port)
        port = same_port if reuse else find_free_port(host, self._cursor)
        cmd, last_port = self.kind.command(
            self.cfg,
            host=host,
            port=port,
            index=index,
            gpus_per_engine=self.gpus_per_engine,
            base_gpu_id=base_gpu_id,
            random_seed=self.cfg.seed + index * self.gpus_per_engine,
            memory_saver=self.memory_saver,
            mem_fraction_static=self.mem_fraction_static,
        )
        self._cursor = max(self._cursor, last_port + 1)
        log_path = self.log_dir / f"engine_{index}.log" if self.log_dir else None
        return start_engine_process(cmd, url=f"http://{host}:{port}", env=self.kind.env(), log_path=log_path)

    def ready(self, index: int, proc: EngineProcess, *, base_gpu_id: int | None = None) -> EngineProcess:
        """Waits until `proc` (engine `index`) serves; returns the engine that does (another port after a bind race).

        Raises:
            RuntimeError: the engine exited, or found no usable port in `_PORT_RETRIES` attempts.
            TimeoutError: not healthy within `startup_timeout_s`.
        """
        for attempt in range(_PORT_RETRIES):
            try:
                _wait_own_engine(proc, self.kind, self.startup_timeout_s)
                return proc
            except PortTaken as exc:
                # Another process (e.g. an engine host on another node of this machine) won the port race.
                logger.warning("%s; restarting engine %d on another port", exc, index)
                proc.shutdown()
                if attempt == _PORT_RETRIES - 1:
                    raise RuntimeError(f"engine {index}: no usable port after {_PORT_RETRIES} attempts") from exc
                proc = self.start(index, base_gpu_id=base_gpu_id)
        raise AssertionError("unreachable")

    def launch(self, index: int, *, base_gpu_id: int | None = None, same_port: int | None = None) -> EngineProcess:
        """`start` then `ready`: engine `index` serving (shut down again when it fails to start)."""
        proc = self.start(index, base_gpu_id=base_gpu_id, same_port=same_port)
        try:
            return self.ready(index, proc, base_gpu_id=base_gpu_id)
        except BaseException:
            proc.shutdown()
            raise


_PORT_RETRIES = 3


def _wait_own_engine(proc: EngineProcess, kind: EngineKind, timeout_s: float) -> None:
    """Waits for health and checks that the server answering is `proc` itself, not a port squatter."""
    try:
        proc.wait_healthy(timeout_s, flag="--rollout-engine-startup-timeout")
    except RuntimeError as exc:
        if "address already in use" in proc.log_tail().lower():
            raise PortTaken(f"port of {proc.url} already in use") from exc
        raise
    url = urllib.parse.urlsplit(proc.url)
    if serves_port(proc.pid, url.hostname or "", url.port or 0) is False:
        # Another run's engine bound the port first (ours binds only once loaded): its answers are not ours.
        raise PortTaken(f"{proc.url} is served by another process, not by engine pid {proc.pid} or its children")
    kind.check_own(proc)
    time.sleep(0.2)
    if not proc.alive():  # e.g. SGLang lost the bind race and a foreign server answered the health check
        raise PortTaken(f"engine {proc.url} exited right after its health check\n{proc.log_tail()}")
