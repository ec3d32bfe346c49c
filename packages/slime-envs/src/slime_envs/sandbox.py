r"""Run model-written Python in a separate, limited process (the ReTool code interpreter).

What is enforced (each layer is reported in `SandboxResult.enforcement`):

* **Wall clock**: the process group is killed with SIGKILL after `timeout_s`; RLIMIT_CPU is a
  backstop for a parent that stops waiting.
* **Memory**: RLIMIT_AS (`memory_mb` of address space); allocations past it raise MemoryError.
* **Output**: stdout/stderr go to files capped by RLIMIT_FSIZE (`max_output_bytes`; writes past
  it fail with EFBIG) and are truncated to `max_output_chars` for the observation.
* **Processes**: a `pids` cgroup with `pids.max = max_processes` when this process may create one
  (v1 or v2 hierarchy), RLIMIT_NPROC (effective for non-root users only: root bypasses it), and the
  whole session/cgroup is killed when the run ends, so stray children do not survive it. Process
  creation is also refused by the audit hook unless `allow_subprocess`.
* **Network**: a fresh network namespace (`unshare(CLONE_NEWNET)`, no interfaces up) when permitted;
  in any case the child's audit hook refuses socket creation/connection.
* **Files**: cwd is a private temp directory removed afterwards; the audit hook refuses writes outside
  it and reads outside it and the Python installation. For root this hook is the only file barrier,
  and audit hooks can be bypassed by native code: for untrusted models in production, run the
  environment inside a container as well.

Example:
    >>> result = asyncio.run(run_python("print(6 * 7)"))
    >>> result.stdout, result.ok
    ('42\n', True)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import uuid
import weakref

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SandboxConfig", "SandboxResult", "hard_process_limit_available", "run_python"]

logger = logging.getLogger(__name__)

_CHILD = pathlib.Path(__file__).with_name("_sandbox_child.py")
_DEFAULT_PRELOAD = [
    "math",
    "cmath",
    "fractions",
    "decimal",
    "itertools",
    "functools",
    "collections",
    "statistics",
    "random",
    "re",
    "json",
    "string",
    "heapq",
    "bisect",
    # numpy imports ctypes, which dlopen()s at import time; later dlopen/dlsym calls stay blocked.
    "ctypes",
]


class SandboxConfig(BaseModel):
    """Limits of one sandboxed run."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(10.0, gt=0, description="Wall-clock limit in seconds.")
    memory_mb: int = Field(1024, gt=0, description="Address-space limit (RLIMIT_AS) in MiB.")
    max_processes: int = Field(16, ge=1, description="Max processes/threads of the run (pids cgroup, RLIMIT_NPROC).")
    max_output_bytes: int = Field(1 << 20, gt=0, description="Max bytes the child may write per file (RLIMIT_FSIZE).")
    max_output_chars: int = Field(2000, gt=0, description="Characters of stdout/stderr kept in the result.")
    max_concurrent_runs: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        description="Sandboxed processes running at once in this process (others wait); the first run's value wins.",
    )
    allow_subprocess: bool = Field(False, description="Let the code start processes (still capped by the limits).")
    preload: list[str] = Field(
        default_factory=lambda: list(_DEFAULT_PRELOAD),
        description="Modules imported before the policy hook is installed (missing ones are skipped); others "
        "(numpy, sympy) are imported on demand and count against the time limit.",
    )


@dataclasses.dataclass(kw_only=True, slots=True)
class SandboxResult:
    """Outcome of one run.

    Attributes:
        stdout: captured standard output, truncated to `max_output_chars`.
        stderr: captured standard error (tracebacks), truncated likewise.
        exit_code: the process's return code (negative: killed by that signal).
        timed_out: the wall-clock limit was hit.
        output_limited: the output file limit was hit.
        enforcement: which mechanism enforced each limit (`network`, `processes`, `files`, ...).
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    output_limited: bool = False
    enforcement: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The code ran to completion with exit code 0."""
        return self.exit_code == 0 and not self.timed_out

    def to_observation(self) -> str:
        """The text shown to the model: output, then errors and which limit was hit."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append(self.stderr.rstrip("\n"))
        if self.timed_out:
            parts.append("Error: execution timed out (wall-clock limit reached); the process was killed.")
        elif self.output_limited:
            parts.append("Error: output limit exceeded; further writes failed.")
        elif self.exit_code < 0:
            parts.append(f"Error: the process was killed by signal {signal.Signals(-self.exit_code).name}.")
        if not parts:
            parts.append("(no output)" if self.exit_code == 0 else f"(no output, exit code {self.exit_code})")
        return "\n".join(parts)


# ---- capability probes (cached) -----------------------------------------------------------------


@functools.cache
def _netns_available() -> bool:
    """Whether a child may `unshare(CLONE_NEWNET)` here (root or user namespaces)."""
    probe = "import os; os.unshare(os.CLONE_NEWNET)"
    try:
        return subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _own_cgroup_path(controller: str | None) -> str:
    """This process's cgroup path for `controller` (None: the v2 unified entry)."""
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or (controller in controllers.split(",")):
            return path
    raise FileNotFoundError(f"no {controller or 'v2'} entry in /proc/self/cgroup")


class _PidsCgroup:
    """A throwaway `pids` cgroup capping the number of tasks of one run."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    @classmethod
    def create(cls, max_pids: int) -> _PidsCgroup | None:
        """Creates the cgroup, or returns None where this process may not (no delegation, no cgroupfs)."""
        name = f"slime-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        candidates = []
        with contextlib.suppress(OSError, FileNotFoundError, ValueError):
            candidates.append(pathlib.Path("/sys/fs/cgroup/pids") / _own_cgroup_path("pids").lstrip("/"))
        with contextlib.suppress(OSError, FileNotFoundError, ValueError):
            v2 = pathlib.Path("/sys/fs/cgroup") / _own_cgroup_path(None).lstrip("/")
            if "pids" in (v2 / "cgroup.subtree_control").read_text().split():
                candidates.append(v2)
        for base in candidates:
            path = base / name
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                (path / "pids.max").write_text(str(max_pids))
                return cls(path)
            except OSError:
                with contextlib.suppress(OSError):
                    path.rmdir()
        return None

    def join(self) -> None:
        """Moves the calling process into the cgroup (called in the child before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def kill_all_and_remove(self) -> None:
        """SIGKILLs every task still in the cgroup, then removes it."""
        kill_file = self.path / "cgroup.kill"
        for _ in range(200):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                return
            if not pids:
                break
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            # Killed tasks leave the cgroup once reaped by their parent (or init); give them a moment.
            import time

            time.sleep(0.01)
        try:
            self.path.rmdir()
        except OSError as e:
            logger.warning("could not remove sandbox cgroup %s: %s", self.path, e)


def hard_process_limit_available() -> bool:
    """Whether a kernel-enforced process limit applies to sandboxed code here (pids cgroup or non-root NPROC)."""
    if os.geteuid() != 0:
        return True
    cgroup = _PidsCgroup.create(4)
    if cgroup is None:
        return False
    cgroup.kill_all_and_remove()
    return True


# ---- running ------------------------------------------------------------------------------------


def _read_capped(path: pathlib.Path, max_chars: int, *, keep_tail: bool = False) -> str:
    """Reads at most `max_chars` characters: the head (stdout) or the tail (stderr, where the error is)."""
    size = path.stat().st_size
    budget = max_chars * 4 + 4  # enough bytes for max_chars UTF-8 characters
    with path.open("rb") as f:
        if keep_tail and size > budget:
            f.seek(size - budget)
        data = f.read(budget)
    text = data.decode("utf-8", errors="replace")
    if len(text) <= max_chars and size <= len(data):
        return text
    if keep_tail:
        return f"(output truncated to the last {max_chars} characters) ...\n" + text[-max_chars:]
    return text[:max_chars] + f"\n... (output truncated to {max_chars} characters)"


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _read_roots() -> list[str]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots.update(p for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "purelib", "platlib")) if p)
    roots.update(p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p)
    return sorted(roots)


_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _limiter(limit: int) -> asyncio.Semaphore:
    """One semaphore per event loop, so hundreds of concurrent rollouts do not start hundreds of processes."""
    loop = asyncio.get_running_loop()
    if loop not in _LIMITERS:
        _LIMITERS[loop] = asyncio.Semaphore(limit)
    return _LIMITERS[loop]


async def run_python(code: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Runs `code` as `main.py` in a fresh sandboxed Python process.

    Args:
        code: Python source written by the model.
        config: limits (defaults: 10 s, 1 GiB, 16 processes, 2000 output characters); the wall clock
            starts when the process is started, not while waiting for a free slot.

    Returns:
        The captured output and how the run ended. Errors of the code (exceptions, limits hit) are
        part of the result, never raised.

    Raises:
        OSError: the sandbox itself could not be started (no temp dir, no interpreter).
    """
    config = config or SandboxConfig()
    async with _limiter(config.max_concurrent_runs):
        return await _run_python(code, config)


async def _run_python(code: str, config: SandboxConfig) -> SandboxResult:
    """`run_python` without the concurrency limit."""
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="slime-sandbox-"))
    cgroup = _PidsCgroup.create(config.max_processes) if os.geteuid() == 0 else None
    netns = await asyncio.to_thread(_netns_available)  # a one-time probe subprocess; keep the loop free
    enforcement = {
        "time": "killpg(SIGKILL) + RLIMIT_CPU",
        "memory": "RLIMIT_AS",
        "output": "RLIMIT_FSIZE + truncation",
        "network": "netns + audit hook" if netns else "audit hook",
        "processes": "+".join(
            x
            for x, on in (
                ("pids cgroup", cgroup is not None),
                ("RLIMIT_NPROC", os.geteuid() != 0),
                ("audit hook", not config.allow_subprocess),
                ("session kill", True),
            )
            if on
        ),
        "files": "private cwd + audit hook" + (" + unprivileged uid" if os.geteuid() != 0 else ""),
    }
    cpu = int(config.timeout_s) + 2
    policy = {
        "cgroup_procs": str(cgroup.path / "cgroup.procs") if cgroup is not None else None,
        "netns": netns,
        # (resource name, soft = hard limit) applied by the child before any user code runs.
        "rlimits": [
            ["RLIMIT_AS", config.memory_mb * 1024 * 1024],
            ["RLIMIT_CPU", cpu],
            ["RLIMIT_FSIZE", config.max_output_bytes],
            ["RLIMIT_CORE", 0],
            ["RLIMIT_NPROC", config.max_processes],
        ],
        "workdir": str(workdir),
        "read_roots": _read_roots(),
        "block_network": True,
        "block_subprocess": not config.allow_subprocess,
        "preload": config.preload,
    }
    (workdir / "main.py").write_text(code, encoding="utf-8")
    out_path, err_path = workdir / ".stdout", workdir / ".stderr"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8"}
    # One thread per BLAS pool: threads count against the process limit.
    env.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    timed_out = False
    try:
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                str(_CHILD),
                json.dumps(policy),
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                # Limits are applied by the child itself (no preexec_fn: unsafe in threaded processes
                # such as Ray actors); it runs trusted code only until they are in place.
                start_new_session=True,
            )
            try:
                await asyncio.wait_for(proc.wait(), timeout=config.timeout_s)
            except TimeoutError:
                timed_out = True
            finally:
                # Kill the whole session (and cgroup) so no child of the code outlives the run.
                _kill_group(proc.pid)
                if cgroup is not None:
                    await asyncio.to_thread(cgroup.kill_all_and_remove)
                await proc.wait()
        exit_code = proc.returncode
        return SandboxResult(
            stdout=_read_capped(out_path, config.max_output_chars),
            stderr=_read_capped(err_path, config.max_output_chars, keep_tail=True),
            exit_code=exit_code,
            timed_out=timed_out,
            # Python ignores SIGXFSZ, so a write past RLIMIT_FSIZE fails with EFBIG instead of killing it.
            output_limited=max(out_path.stat().st_size, err_path.stat().st_size) >= config.max_output_bytes,
            enforcement=enforcement,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
