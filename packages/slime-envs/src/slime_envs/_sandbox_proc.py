"""Owning bubblewrap's process tree from the moment it is spawned: every exit path kills and reaps all of it.

`run_python` can be cancelled at any await (a rollout aborted, a caller's timeout). A cancel inside
`asyncio.create_subprocess_exec` made asyncio kill bubblewrap alone: its child, still setting up the sandbox
(waiting on bubblewrap's eventfd, before `--die-with-parent` and outside the cgroup), outlived the host, and a
child that died after its parent became a zombie no one reaps. So `owned_bwrap` spawns in a task of its own
(shielded: a cancel cannot interrupt it half-way) and its exit, on any path, runs `_stop` to completion
(shielded again: a second cancel waits for it):

1. SIGKILL the sandbox's init (its pidfd, once known) and every child bubblewrap has (found in `/proc`, a
   pidfd opened and the parent checked again, so a reused pid is never hit);
2. give bubblewrap `_GRACE_S` to reap its child and exit (so no child is left for pid 1 to reap), killing any
   child it forks meanwhile (a cancel can come before bubblewrap has forked);
3. SIGKILL bubblewrap's process group if it is still there, and reap bubblewrap.

Finally the init's pidfd is polled until the kernel has torn down its PID namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import AsyncIterator, Coroutine
from typing import Any

__all__ = ["Owned", "children_of", "owned_bwrap", "parent_pid", "uncancellable"]

logger = logging.getLogger(__name__)

_GRACE_S = 2.0  # bubblewrap exits as soon as its child is gone; this only bounds a stuck one
_INIT_EXIT_S = 5.0
_POLL_S = 0.05


@dataclasses.dataclass
class Owned:
    """The spawned bubblewrap and, once `_release` has it, a pidfd of the sandbox's init (-1 until then)."""

    proc: asyncio.subprocess.Process | None = None
    init_pidfd: int = -1


def parent_pid(pid: int) -> int:
    """The parent pid of `pid` from `/proc/<pid>/stat`.

    Raises:
        FileNotFoundError: no such process (ProcessLookupError is not what /proc raises).
    """
    with open(f"/proc/{pid}/stat", "rb") as f:
        # The command name (2nd field, in parentheses) may hold spaces: the parent pid follows its ")".
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def children_of(pid: int) -> list[int]:
    """The pids whose parent is `pid` now (a scan of `/proc`: `/proc/<pid>/task/*/children` is not everywhere)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if parent_pid(int(name)) == pid:
                    out.append(int(name))
    return out


def _kill_child(parent: int, pid: int) -> None:
    """SIGKILLs `pid` if it is still `parent`'s child (the pidfd pins the process the check looked at)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if parent_pid(pid) == parent:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


async def uncancellable(coro: Coroutine[Any, Any, None]) -> None:
    """Runs `coro` to its end even if the caller is cancelled meanwhile; re-raises that cancel afterwards.

    Raises:
        asyncio.CancelledError: the caller was cancelled while `coro` ran (after `coro` finished).
        Exception: whatever `coro` raised.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the loop itself is shutting down
                raise
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError


async def _until_exited(pidfd: int, timeout_s: float) -> None:
    """Waits (at most `timeout_s`) until the process behind `pidfd` has exited (the pidfd polls readable)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(pidfd, lambda: ready.done() or ready.set_result(None))
    try:
        async with asyncio.timeout(timeout_s):
            await ready
    except TimeoutError:
        logger.warning("the sandbox's init did not exit %.0f s after SIGKILL", timeout_s)
    finally:
        loop.remove_reader(pidfd)


async def _stop(spawn: asyncio.Future[asyncio.subprocess.Process], owned: Owned) -> None:
    """Kills and reaps everything `spawn` started (see the module doc); a no-op if the spawn itself failed."""
    try:
        proc = await spawn
    except Exception:  # noqa: BLE001 - nothing was started; the spawn's error reaches the caller through its await
        return
    if owned.init_pidfd >= 0:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(owned.init_pidfd, signal.SIGKILL)
    deadline = asyncio.get_running_loop().time() + _GRACE_S
    while proc.returncode is None and asyncio.get_running_loop().time() < deadline:
        # Again and again: bubblewrap may still be about to fork its child (prlimit and the launcher exec first).
        for child in children_of(proc.pid):
            _kill_child(proc.pid, child)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_POLL_S):
                await proc.wait()
    if proc.returncode is None:  # not reaped yet, so its pid (the group's id) cannot have been reused
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    if owned.init_pidfd >= 0:
        # The init exits only after the kernel has killed and reaped every process of its namespace.
        await _until_exited(owned.init_pidfd, _INIT_EXIT_S)


@contextlib.asynccontextmanager
async def owned_bwrap(argv: list[str], **kwargs: Any) -> AsyncIterator[Owned]:
    """Spawns `argv` (bubblewrap behind its launcher) and kills and reaps its whole tree on every exit path.

    Args:
        argv: the command (`slime_envs._bwrap.bwrap_argv`).
        **kwargs: `asyncio.create_subprocess_exec` options (`start_new_session=True` is expected: step 3 of the
            module doc kills bubblewrap's process group).

    Yields:
        `Owned` with the started process; the caller sets `init_pidfd` once it has one (it stays the caller's
        to close, after this context has exited).

    Raises:
        asyncio.CancelledError: cancelled at any point, after everything spawned is gone.
        OSError: the spawn failed (nothing to clean up).
    """
    spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(*argv, **kwargs))
    owned = Owned()
    try:
        owned.proc = await asyncio.shield(spawn)
        yield owned
    finally:
        await uncancellable(_stop(spawn, owned))
