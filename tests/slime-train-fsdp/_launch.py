"""Runs a worker module's `run(scenario, out, ckpt)` on several local ranks (gloo) and collects their results.

Shared by the FSDP backend, critic and vision-language tests. A worker module writes `out/rank{r}.pt`; forked
ranks write `out/rank{r}.err` on failure, subprocess ranks return their output.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import pathlib
import socket
import subprocess
import sys
import traceback
from types import ModuleType

import torch


def load_module(path: pathlib.Path) -> ModuleType:
    """Imports a sibling helper file by path (the tests directory is not a package)."""
    spec = importlib.util.spec_from_file_location(f"slime_fsdp_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    return dict(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port))  # fmt: skip


class RankLauncher:
    """Launches the scenarios of one worker file.

    Args:
        worker: path of the worker module (`run(scenario, out, ckpt)`; runnable as a script for subprocesses).
        timeout_s: how long every rank may take.
    """

    def __init__(self, worker: pathlib.Path, timeout_s: float = 600) -> None:
        self.worker, self.timeout_s = worker, timeout_s
        self._module: ModuleType | None = None

    def workers(self) -> ModuleType:
        """The worker module, imported once (so forked ranks inherit the imports)."""
        if self._module is None:
            self._module = load_module(self.worker)
        return self._module

    def _entry(self, scenario: str, rank: int, world: int, port: int, out: pathlib.Path, ckpt: pathlib.Path) -> None:
        os.environ.update(_rank_env(rank, world, port))
        try:
            # A fresh copy of the module per rank: a scenario starts from the module's initial state.
            load_module(self.worker).run(scenario, out, str(ckpt))
        except BaseException:
            (out / f"rank{rank}.err").write_text(traceback.format_exc())
            raise

    def forked(self, scenario: str, world: int, work: pathlib.Path, ckpt: pathlib.Path) -> list[dict]:
        """Runs `scenario` on `world` ranks forked from this process (imports are shared); each rank's results."""
        out = work / f"out_{scenario}_{world}"
        out.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=self._entry, args=(scenario, r, world, port, out, ckpt)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=self.timeout_s)
        torch.set_num_threads(threads)
        for rank, p in enumerate(procs):
            if p.is_alive():
                p.kill()
            err = out / f"rank{rank}.err"
            assert p.exitcode == 0, f"{scenario} rank {rank} failed:\n{err.read_text() if err.exists() else p.exitcode}"
        return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]

    def subprocesses(self, scenario: str, world: int, work: pathlib.Path, ckpt: pathlib.Path) -> list[dict]:
        """Like `forked` with fresh interpreters (needed for CUDA: no fork after the driver is initialized)."""
        out = work / f"out_{scenario}_{world}"
        out.mkdir(parents=True, exist_ok=True)
        port, procs = _free_port(), []
        for rank in range(world):
            cmd = [sys.executable, str(self.worker), scenario, str(out), str(ckpt)]
            env = dict(os.environ, **_rank_env(rank, world, port))
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=self.timeout_s)[0] for p in procs]
        for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
            assert p.returncode == 0, f"{scenario} rank {rank} failed:\n{log[-4000:]}"
        return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
