"""Per-call overhead of the Python sandbox: `uv run python benchmarks/bench_sandbox.py [--runs 30]`.

Times, one call at a time (median of `--runs` pairs after 3 warm-up pairs):

* `sandbox_ms`: `run_python("pass")` with the default config: bubblewrap namespaces, seccomp, cgroup,
  the runner's rlimits, preloads and audit hook, the teardown of the PID namespace and the cgroup;
* `bare_ms`: the same interpreter with the same preloaded modules as a plain subprocess (no isolation),
  what the code interpreter costs anyway;
* `overhead_ms`: median of the per-pair differences (sandboxed - bare, run back to back): what the OS
  boundary adds to each tool call;
* `bwrap_true_ms` / `unshare_true_ms`: namespaces alone around `/usr/bin/true`, bubblewrap (the chosen
  launcher, with the sandbox's namespace set) against util-linux `unshare` (user, PID, network, mount, IPC,
  UTS), which is why building our own launcher on `unshare` would not be faster.

Prints one JSON line `{"bench": "sandbox", ...}`. CPU only; budget < 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time

import _common  # noqa: E402

from slime_envs.sandbox import SandboxConfig, check_sandbox, run_python  # noqa: E402


async def _time_pairs(runs: int, warmup: int = 3) -> tuple[list[float], list[float]]:
    """Sandboxed and bare calls alternated, so that a shared machine's load drift hits both alike."""
    for _ in range(warmup):
        await _sandbox_call()
        await _bare_call()
    sandbox, bare = [], []
    for _ in range(runs):
        for fn, times in ((_sandbox_call, sandbox), (_bare_call, bare)):
            start = time.perf_counter()
            await fn()
            times.append((time.perf_counter() - start) * 1000)
    return sandbox, bare


async def _sandbox_call() -> None:
    result = await run_python("pass")
    assert result.ok, result.to_observation()


async def _bare_call() -> None:
    preload = ",".join(SandboxConfig().preload)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-I", "-B", "-c", f"import {preload}", env={})
    assert await proc.wait() == 0


def _time_command(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    """Times the calls and emits the JSON line."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=30)
    a = p.parse_args(argv)
    _common.setup_logging()
    enforcement = check_sandbox()
    sandbox, bare = asyncio.run(_time_pairs(a.runs))
    namespaces = ["--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/usr", "/usr"]
    links = ["--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev"]
    bwrap = [shutil.which("bwrap") or "bwrap", *namespaces, *links, "/usr/bin/true"]
    unshare = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--net", "--mount", "--ipc", "--uts"]
    result = {
        "runs": a.runs,
        "sandbox_ms": round(statistics.median(sandbox), 1),
        "sandbox_p90_ms": round(statistics.quantiles(sandbox, n=10)[-1], 1),
        "bare_ms": round(statistics.median(bare), 1),
        "overhead_ms": round(statistics.median(s - b for s, b in zip(sandbox, bare, strict=True)), 1),
        "bwrap_true_ms": round(_time_command(bwrap, a.runs), 1),
        "unshare_true_ms": round(_time_command([*unshare, "/usr/bin/true"], a.runs), 1),
        "cpus": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
        "enforcement": enforcement,
    }
    return _common.emit("sandbox", result)


if __name__ == "__main__":
    main()
