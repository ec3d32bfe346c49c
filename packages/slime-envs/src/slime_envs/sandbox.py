r"""Run model-written Python behind an OS boundary (the ReTool code interpreter).

The code of a policy under RL pressure is hostile: anything it can reach, it will eventually use to hack
its reward. So the boundary is built by the kernel, not by Python (an audit hook can be switched off by
pure Python through `gc`). Each call starts, through bubblewrap:

* an **unprivileged uid**: uid 1000 inside its own user namespace, mapped to the uid that runs bubblewrap,
  which is `nobody` (65534) when the host process is root: the code never holds a host capability;
* its own **mount, PID, network, IPC, UTS and cgroup namespaces**: it sees only a read-only view of the
  Python runtime (see `slime_envs._bwrap`), a private size-capped tmpfs `/tmp` as the only writable place,
  its own `/proc`, no network interface but a loopback of its own (and no socket to use it), no host process,
  no host environment variable;
* a **seccomp filter** for what namespaces do not isolate (ptrace, mount, keyctl, bpf, perf_event_open,
  io_uring, inotify, kexec, modules, System V IPC, sockets, fallocate, ...; see `slime_envs._seccomp`) and, unless
  `allow_subprocess`, a second one refusing fork/exec to every API, `_posixsubprocess.fork_exec` and
  `os.posix_spawn` included;
* **limits**: RLIMIT_AS/CPU/FSIZE/CORE/RTPRIO/NICE per process, set on bubblewrap itself (util-linux `prlimit`), so that
  every process of the sandbox, its init included, inherits them; RLIMIT_NPROC (and SIGPENDING, MSGQUEUE)
  counted in the run's own user namespace, set by the init before it forks the code (set before bubblewrap,
  it would become the namespace's ceiling at the level of the host uid, one budget shared by every concurrent
  run); a cgroup
  capping the run's total memory, tasks and CPU share where this machine gives this process one
  (`slime_envs._cgroups`; `SandboxResult.enforcement` says which);
* a **trusted init**: bubblewrap runs `--as-pid-1`, so no bubblewrap process lives inside; pid 1 is the
  runner (`slime_envs._sandbox_child`), which makes itself non-dumpable before the code exists (no
  `/proc/1/mem`, ptrace or `/proc/1/fd` for the code; no signal from inside reaches an init), loads the
  no-process filter on itself once it has forked the code, and reports the code's wait status through a
  pipe only it holds: exit codes and signals come from the kernel, not from a number the code chose;
* a **wall clock**: `timeout_s` after the code starts (`STARTUP_TIMEOUT_S` bounds the start-up) the PID
  namespace's init is killed, and the kernel kills every process in the namespace with it (no daemonized,
  `setsid` grandchild survives). The same happens when the code's process exits (the init exits with it), at
  the end of every run, and if the host itself dies (`--die-with-parent`).

Every limit above is enforced by the kernel alone. The runner's audit hook only turns the common forbidden
actions into readable `PermissionError: sandbox: ...` messages; nothing counts on it: pure Python switches
it off (through `gc`) and its path checks lose symlink and rename races.

The sandbox needs `bwrap` (Debian: `apt-get install -y bubblewrap`), libseccomp (`libseccomp2`, present on
every Debian) and unprivileged user namespaces; `check_sandbox()` says what is missing in one error.

Example:
    >>> result = asyncio.run(run_python("print(6 * 7)"))
    >>> result.stdout, result.ok
    ('42\n', True)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import select
import signal
import subprocess
import tempfile
import threading
import weakref
from typing import IO

from slime_core.config.base import warn_once
from slime_envs._bwrap import WORKDIR, BwrapMissingError, RuntimeView, bwrap_argv, bwrap_path, runtime_view
from slime_envs._cgroups import CgroupLimits
from slime_envs._sandbox_config import SandboxConfig, SandboxUnavailableError
from slime_envs._sandbox_policy import INIT_RLIMITS, enforcement, rlimits, runner_policy
from slime_envs._sandbox_proc import Owned, owned_bwrap, parent_pid, uncancellable
from slime_envs._sandbox_result import SandboxResult, read_capped
from slime_envs._seccomp import SeccompUnavailableError, base_filter

__all__ = [
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailableError",
    "check_sandbox",
    "code_too_large",
    "run_python",
]

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
# Bound of a sandbox's start-up (bubblewrap's namespaces, the runner, the preload imports), before the code's own
# `timeout_s` starts: counted in `timeout_s`, a loaded host ate a short limit and `print(1)` "timed out".
STARTUP_TIMEOUT_S = 60.0


# ---- helpers ------------------------------------------------------------------------------------


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding `data`, positioned at its start (bubblewrap reads it once)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _writer(f: IO[bytes]) -> int:
    """A write-only descriptor of `f`'s file with an open file description of its own, for the sandbox.

    The status flags (`O_DIRECT`, `O_APPEND`, `O_NONBLOCK`) and the offset belong to a description, not to a
    descriptor: had the sandbox written through the host's own, `fcntl(1, F_SETFL, O_DIRECT)` by the code made the
    host's read of the output fail (EINVAL), a `SandboxUnavailableError` the code chose (its sample was dropped as an
    infrastructure failure instead of scored). Opened through `/proc/self/fd` before the code exists, so a non-root
    host's code (the file's owner) cannot `chmod` it shut first.
    """
    return os.open(f"/proc/self/fd/{f.fileno()}", os.O_WRONLY | os.O_CLOEXEC)


async def _read_to_eof(fd: int, *, first: bool = False) -> bytes:
    """Reads a pipe until its writers close it (`first`: or until one byte came), cancellable, loop not blocked."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    chunks = []

    def on_readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        if chunk:
            chunks.append(chunk)
        if (first or not chunk) and not done.done():
            done.set_result(None)

    os.set_blocking(fd, False)
    loop.add_reader(fd, on_readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
    return b"".join(chunks)


# Per event loop: its semaphore and the limit it was sized with.
_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[asyncio.Semaphore, int]] = (
    weakref.WeakKeyDictionary()
)


def _limiter(limit: int) -> asyncio.Semaphore:
    """One semaphore per event loop, so hundreds of concurrent rollouts do not start hundreds of sandboxes.

    The first run's `max_concurrent_runs` sizes it; a later run asking for another value is told so, once per
    process and value (envs of one process share the limit: another value had no effect, without a word).
    """
    loop = asyncio.get_running_loop()
    if loop not in _LIMITERS:
        _LIMITERS[loop] = (asyncio.Semaphore(limit), limit)
    semaphore, first = _LIMITERS[loop]
    if limit != first:
        warn_once(
            f"sandbox-max-concurrent-{limit}",
            f"sandbox: max_concurrent_runs={limit} has no effect: this process's runs share the limit of its first "
            f"run ({first})",
        )
    return semaphore


# ---- running ------------------------------------------------------------------------------------


async def run_python(code: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Runs `code` as `/tmp/main.py` in a fresh sandbox.

    Args:
        code: Python source written by the model.
        config: limits (defaults: 10 s, 1 GiB, 16 processes, 64 MiB of /tmp, 2000 output characters);
            the wall clock starts when the sandbox is started, not while waiting for a free slot.

    Returns:
        The captured output and how the run ended. Errors of the code (exceptions, limits hit, escape
        attempts, a program larger than `/tmp` or a file may be: `code_too_large`) are part of the result, never
        raised.

    Raises:
        SandboxUnavailableError: the sandbox itself cannot run here (the message says what is missing), or the
            host failed its side of this run (an `OSError`: no space for the output files, no descriptor left).
    """
    config = config or SandboxConfig()
    source = code.encode("utf-8", errors="surrogatepass")
    too_large = code_too_large(len(source), config)
    if too_large is not None:
        return too_large
    async with _limiter(config.max_concurrent_runs):
        try:
            return await _run_python(source, config)
        except OSError as e:
            # The host's side of a run (its pipes, memfds, output files, cgroup): a full /tmp or a descriptor limit
            # of the host, not an error of the code, which only ever reaches the result. It was raised bare, and
            # the python env showed it to the model as its code's output.
            raise SandboxUnavailableError(f"the sandbox could not run on this host: {e!r}") from e


def code_too_large(num_bytes: int, config: SandboxConfig) -> SandboxResult | None:
    """The result of a program too large to run, or None when it fits.

    The program is written to `/tmp/main.py` under the run's limits: past `max_output_bytes` (RLIMIT_FSIZE) or
    the size of `/tmp`, bubblewrap's copy failed ("File too large", "No space left on device") and the model's
    tool call raised `SandboxUnavailableError`, as if the machine could not run a sandbox at all.

    Args:
        num_bytes: size of the program, UTF-8.
        config: the run's limits.

    Returns:
        None, or a result with exit code 1 whose stderr says how large the program is and what the limit is.
    """
    limit = min(config.max_output_bytes, config.tmpfs_mb * _MIB)
    if num_bytes <= limit:
        return None
    which = "max_output_bytes" if limit == config.max_output_bytes else "tmpfs_mb"
    message = f"Error: the program is {num_bytes} bytes; the sandbox runs programs of at most {limit} bytes ({which})."
    return SandboxResult(stdout="", stderr=message + "\n", exit_code=1)  # nothing ran: nothing was enforced


async def _run_python(source: bytes, config: SandboxConfig) -> SandboxResult:
    """`run_python` without the size check and the concurrency limit; `source` is the program, UTF-8."""
    try:
        view = runtime_view()
        seccomp = base_filter()
        bwrap_path()  # again at every run: the view is built once, and bubblewrap may be gone since (an upgrade)
    except (BwrapMissingError, SeccompUnavailableError, OSError) as e:
        raise SandboxUnavailableError(str(e)) from e
    fds = _Fds()
    cgroup = None
    try:
        ready_r, ready_w = fds.pipe()  # the runner writes one byte once the code is about to run
        status_r, status_w = fds.pipe()  # the sandbox's init writes the code's wait status here
        info_r, info_w = fds.pipe()  # bubblewrap writes the init's pid here
        block_r, block_w = fds.pipe()  # bubblewrap waits on it until the init is in the cgroup
        code_fd = fds.add(_memfd("main.py", source))
        seccomp_fd = fds.add(_memfd("seccomp", seccomp))
        env = {"HOME": WORKDIR, "TMPDIR": WORKDIR, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        # One thread per BLAS pool: threads count against the task limit.
        env.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
        argv = bwrap_argv(
            view,
            tmpfs_bytes=config.tmpfs_mb * _MIB,
            max_files=config.max_files,
            code_fd=code_fd,
            seccomp_fd=seccomp_fd,
            info_fd=info_w,
            block_fd=block_r,
            env=env,
            rlimits={name: value for name, value in rlimits(config).items() if name not in INIT_RLIMITS},
            runner_args=[json.dumps(runner_policy(config, ready_w, status_w))],
        )
        cgroup = CgroupLimits.create(
            memory_bytes=(config.memory_mb + config.tmpfs_mb) * _MIB,
            max_tasks=config.max_processes + 1,
            cpus=config.cpus,
        )
        _warn_ineffective(config, has_cpu_cgroup=cgroup is not None and "cpu" in cgroup.controllers, view=view)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            out_w, err_w = fds.add(_writer(out)), fds.add(_writer(err))
            # From the spawn on, every exit (a cancel at any await included) kills and reaps bubblewrap's tree.
            async with owned_bwrap(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=(*view.fds, ready_w, status_w, info_w, block_r, code_fd, seccomp_fd),
                env={},
                cwd="/",
                start_new_session=True,
            ) as owned:
                # Our copies of the child's ends: the pipes must see EOF when the sandbox closes its own.
                fds.close(ready_w, status_w, info_w, block_r, code_fd, seccomp_fd, out_w, err_w)
                timed_out, ready = await _supervise(owned, info_r, ready_r, block_w, cgroup, config, fds)
            proc = owned.proc
            assert proc is not None
            if not ready and not timed_out:
                err.seek(0)
                message = err.read(4000).decode("utf-8", errors="replace").strip()
                raise SandboxUnavailableError(f"the sandbox failed to start (exit {proc.returncode}): {message}")
            exit_code = _exit_code(_read_nonblocking(status_r), timed_out)
            return _result(config, exit_code, timed_out, out, err, cgroup)
    finally:
        fds.close_all()
        if cgroup is not None:
            await uncancellable(asyncio.to_thread(cgroup.kill_and_remove))


def _warn_ineffective(config: SandboxConfig, *, has_cpu_cgroup: bool, view: RuntimeView) -> None:
    """Warns once per setting and value when a limit the config sets explicitly cannot be enforced on this host.

    `cpus` needs a cpu cgroup and `max_files` a root host (whose launcher mounts `/tmp` with a file count); without
    them each was accepted and ignored, said only in `SandboxResult.enforcement`, which nothing reads.
    """
    if "cpus" in config.model_fields_set and not has_cpu_cgroup:
        warn_once(
            f"sandbox-cpus-{config.cpus}",
            f"sandbox: cpus={config.cpus:g} has no effect here: this machine gives this process no cpu cgroup "
            "(a run's threads and processes may use as many cores as max_processes; see SandboxResult.enforcement)",
        )
    if "max_files" in config.model_fields_set and view.workdir_mount is None:
        warn_once(
            f"sandbox-max-files-{config.max_files}",
            f"sandbox: max_files={config.max_files} has no effect here: only a root host mounts /tmp with a file "
            "count (here /tmp holds the kernel's default, half the machine's RAM pages; tmpfs_mb still caps its size)",
        )


class _Fds:
    """Descriptors of one run, each closed exactly once (a double close could hit another run's descriptor)."""

    def __init__(self) -> None:
        self.open: set[int] = set()

    def add(self, fd: int) -> int:
        self.open.add(fd)
        return fd

    def pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        return self.add(r), self.add(w)

    def close(self, *fds: int) -> None:
        for fd in fds:
            if fd in self.open:
                self.open.discard(fd)
                os.close(fd)

    def close_all(self) -> None:
        self.close(*list(self.open))


async def _supervise(
    owned: Owned,
    info_r: int,
    ready_r: int,
    block_w: int,
    cgroup: CgroupLimits | None,
    config: SandboxConfig,
    fds: _Fds,
) -> tuple[bool, bool]:
    """Releases the sandbox and waits for it; `owned_bwrap` kills it. Returns (timed_out, ready).

    Two clocks, one after the other: the start-up (until the runner's ready byte, or its EOF when the sandbox
    failed to start) is bounded by `STARTUP_TIMEOUT_S`, the code by `config.timeout_s` from then on.
    """
    proc = owned.proc
    assert proc is not None
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT_S):
            pidfd = await _release(proc, info_r, block_w, cgroup)
            if pidfd >= 0:
                owned.init_pidfd = fds.add(pidfd)
            ready = await _read_to_eof(ready_r, first=True) == b"R"
            if not ready:  # it failed to start: the caller raises with bubblewrap's message
                await proc.wait()
                return False, False
    except TimeoutError:
        logger.warning("a sandbox did not start within %g s (an overloaded host?); killed", STARTUP_TIMEOUT_S)
        return True, False
    try:
        async with asyncio.timeout(config.timeout_s):
            await proc.wait()
    except TimeoutError:
        return True, True
    return False, True


def _read_nonblocking(fd: int) -> bytes:
    """What a pipe whose writers are gone holds (at most 64 bytes); b"" if nothing was written."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 64)
    except BlockingIOError:
        return b""


def _exit_code(status: bytes, timed_out: bool) -> int:
    """The code's exit code (negative: the signal that killed it) from the wait status its init reported.

    Args:
        status: what the sandbox's init wrote to the status pipe: the decimal wait status of the code's
            process and a newline, or nothing when the init itself was killed (wall clock, OOM killer).
        timed_out: the wall clock ran out (the whole namespace was killed with SIGKILL).

    Returns:
        `os.waitstatus_to_exitcode` of the status; `-SIGKILL` when there is none.
    """
    if status.endswith(b"\n") and status[:-1].isdigit():
        return os.waitstatus_to_exitcode(int(status))
    if not timed_out:
        # Only the kernel kills an init it cannot be signalled from inside: the memory cgroup's OOM killer.
        logger.warning("the sandbox's init was killed before it reported the code's exit status (%r)", status)
    return -signal.SIGKILL


def _result(
    config: SandboxConfig, exit_code: int, timed_out: bool, out: IO[bytes], err: IO[bytes], cgroup: CgroupLimits | None
) -> SandboxResult:
    if timed_out:
        exit_code = -signal.SIGKILL  # the status the code had reported before the deadline does not matter
    # Output past `max_output_bytes` (at most the one byte of headroom RLIMIT_FSIZE leaves) means a write was cut.
    output_limited = False
    for f in (out, err):
        if f.seek(0, os.SEEK_END) > config.max_output_bytes:
            output_limited = True
            f.truncate(config.max_output_bytes)
    return SandboxResult(
        stdout=read_capped(out, config.max_output_chars),
        stderr=read_capped(err, config.max_output_chars, keep_tail=True),
        exit_code=exit_code,
        timed_out=timed_out,
        # Python ignores SIGXFSZ, so a write past RLIMIT_FSIZE fails with EFBIG instead of killing it.
        output_limited=output_limited,
        memory_limited=cgroup is not None and cgroup.oom_killed(),
        enforcement=enforcement(config, cgroup),
    )


async def _release(proc: asyncio.subprocess.Process, info_r: int, block_w: int, cgroup: CgroupLimits | None) -> int:
    """Waits for the namespaces, puts their first process into the cgroup, lets it start the runner.

    That process (bubblewrap's child, about to become the init) is blocked on `--block-fd`: the cgroup it
    joins now holds every process of the sandbox, which all descend from it.

    Returns:
        A pidfd of the sandbox's init, or -1 when bubblewrap failed before or while setting it up (the
        caller then sees no ready byte and raises with bubblewrap's message).
    """
    info = await _read_to_eof(info_r)
    if not info:
        await proc.wait()
        return -1
    init_pid = json.loads(info)["child-pid"]
    try:
        # Until block_w is written the child can only exit if bubblewrap's set-up failed.
        pidfd = os.pidfd_open(init_pid)
    except ProcessLookupError:
        await proc.wait()
        return -1
    try:
        if cgroup is not None:
            cgroup.join(init_pid)
        # The pid named bubblewrap's child all along (not a process that took over its number) if the process
        # the pidfd holds is still alive now (a pid is not reused before its process is reaped) and is that child.
        if select.select([pidfd], [], [], 0)[0] or parent_pid(init_pid) != proc.pid:
            raise ProcessLookupError(init_pid)
        os.write(block_w, b"1")
    except (ProcessLookupError, FileNotFoundError):  # exited: bubblewrap's set-up failed
        os.close(pidfd)
        await proc.wait()
        return -1
    return pidfd


def _probe() -> dict[str, str]:
    result = asyncio.run(_run_python(b"pass", SandboxConfig(timeout_s=30, preload=[])))
    if not result.ok:
        raise SandboxUnavailableError(f"the sandbox probe failed: {result.to_observation()}")
    return result.enforcement


_PROBE: list[dict[str, str] | SandboxUnavailableError] = []
_PROBE_LOCK = threading.Lock()  # episodes' envs are built in worker threads at once: one probe, not one each


def check_sandbox() -> dict[str, str]:
    """Runs an empty program in the sandbox once per process and reports how limits are enforced.

    Concurrent first calls (the envs of a rollout's episodes, built in worker threads) wait for one probe; each
    ran its own.

    Returns:
        `SandboxResult.enforcement` of that run.

    Raises:
        SandboxUnavailableError: the sandbox cannot run here; the message names what is missing
            (bubblewrap, libseccomp, user namespaces).
    """
    with _PROBE_LOCK:
        if not _PROBE:
            # A thread of its own: the caller may be inside a running event loop.
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                try:
                    _PROBE.append(pool.submit(_probe).result())
                except SandboxUnavailableError as e:
                    _PROBE.append(e)
    if isinstance(_PROBE[0], SandboxUnavailableError):
        raise _PROBE[0]
    return _PROBE[0]
