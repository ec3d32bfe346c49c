"""Runs a worker module's `run(scenario, out, ckpt)` on several local ranks (gloo) and collects their results.

Shared by the FSDP backend, critic and vision-language tests. A worker module writes `out/rank{r}.pt`; forked
ranks write `out/rank{r}.err` on failure, subprocess ranks return their output.

Forked ranks come from multiprocessing's forkserver, not from the test process: a pytest worker is multi-threaded
(xdist's I/O thread, gloo and torch threads of earlier tests) and holds the state of the distributed tests it already
ran, and ranks forked from it crashed natively now and then (SIGSEGV in a gloo `full_tensor` of the resume scenario;
SIGABRT in a critic backward, about 1 run in 4 after the FSDP files ran in the same process). The forkserver is a
fresh single-threaded interpreter that imports torch, transformers and the FSDP backend once (`PRELOAD`), so a rank
still starts without paying those imports.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import pathlib
import runpy
import socket
import subprocess
import sys
from types import ModuleType

import torch

#: Imported once by the forkserver, inherited by every forked rank (an import that fails there is skipped).
PRELOAD = ["torch", "torch.distributed", "transformers", "slime_train_fsdp.backend", "slime_train_fsdp.critic_backend"]
_RANK_ENTRY = pathlib.Path(__file__).with_name("_rank_entry.py")


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
        """The worker module, imported once in this process (its import errors show here, not in a rank)."""
        if self._module is None:
            self._module = load_module(self.worker)
        return self._module

    def forked(self, scenario: str, world: int, work: pathlib.Path, ckpt: pathlib.Path) -> list[dict]:
        """Runs `scenario` on `world` ranks forked from the forkserver (imports preloaded); each rank's results."""
        out = work / f"out_{scenario}_{world}"
        out.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # no effect once this process's forkserver runs (it already has them)
        procs = []
        for r in range(world):
            given = dict(WORKER=str(self.worker), SCENARIO=scenario, RANK=r, OUT=str(out), CKPT=str(ckpt),
                         ENV=dict(os.environ, **_rank_env(r, world, port)), CWD=os.getcwd())  # fmt: skip
            procs.append(ctx.Process(target=runpy.run_path, args=(str(_RANK_ENTRY),), kwargs={"init_globals": given}))
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=self.timeout_s)
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
