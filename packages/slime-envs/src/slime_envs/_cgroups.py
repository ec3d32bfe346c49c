"""Throwaway cgroups that cap one sandboxed run's total memory, task count and CPU share.

Rlimits are per process (RLIMIT_AS) or per user namespace (RLIMIT_NPROC): eight processes of 1 GiB each
stay under both. A cgroup caps the sum, and counts the private tmpfs's pages as memory too. Each
controller is taken from where this machine has it:

* cgroup v2, when this process's cgroup delegates the controller (`cgroup.subtree_control`);
* cgroup v1, when the controller has its own hierarchy mounted and this process may write to it
  (a Debian "hybrid" machine run as root; the machine this project runs on is one);
* neither (no delegation, a container with a read-only `/sys/fs/cgroup`): no cgroup, the rlimits and
  the wall clock remain. `CgroupLimits.create` then returns None and the sandbox reports it.

A run's cgroup is a child of this process's own cgroup (so the machine's limits on this process still
hold), named `slime-sandbox-<host pid>-<random>`; leftovers of a host process that died are removed
when the next one creates its first cgroup.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pathlib
import re
import signal
import time
import uuid

__all__ = ["CgroupLimits"]

logger = logging.getLogger(__name__)

_CONTROLLERS = ("memory", "pids", "cpu")
_PREFIX = "slime-sandbox-"
_CPU_PERIOD_US = 100_000


@functools.cache
def _controller_dirs() -> dict[str, tuple[int, pathlib.Path]]:
    """Controller -> (cgroup version, directory under which this process may create cgroups)."""
    own_v1: dict[str, str] = {}
    own_v2 = None
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if names == "":
            own_v2 = path
        for name in names.split(","):
            own_v1[name] = path
    found: dict[str, tuple[int, pathlib.Path]] = {}
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        root, mount_point = fields.split()[3:5]
        fstype, _source, options = tail.split()
        if fstype == "cgroup2" and own_v2 is not None:
            base = pathlib.Path(mount_point) / _relative(own_v2, root)
            with contextlib.suppress(OSError):
                for name in (base / "cgroup.subtree_control").read_text().split():
                    if name in _CONTROLLERS:
                        found[name] = (2, base)
        elif fstype == "cgroup":
            for name in options.split(","):
                if name in _CONTROLLERS and name in own_v1 and name not in found:
                    found[name] = (1, pathlib.Path(mount_point) / _relative(own_v1[name], root))
    return {name: where for name, where in found.items() if os.access(where[1], os.W_OK)}


def _relative(own: str, mount_root: str) -> str:
    """`own` (a /proc/self/cgroup path) below the mount's root (not "/" inside some containers)."""
    return os.path.relpath(own, mount_root) if own.startswith(mount_root) else own.lstrip("/")


def _sweep_leftovers(parents: set[pathlib.Path]) -> None:
    """Removes cgroups of dead host processes (a host killed mid-run cannot clean up after itself)."""
    pattern = re.compile(rf"{_PREFIX}(\d+)-[0-9a-f]+$")
    for parent in parents:
        with contextlib.suppress(OSError):
            for child in parent.iterdir():
                m = pattern.match(child.name)
                if m and not pathlib.Path(f"/proc/{m.group(1)}").exists():
                    with contextlib.suppress(OSError):  # still populated: its tasks are being killed
                        child.rmdir()


class CgroupLimits:
    """The cgroup(s) of one run: one directory per hierarchy that holds one of its controllers.

    Attributes:
        dirs: cgroup directories of this run (one for v2, one per controller for v1).
        enforced: `"memory (v1)"`-style names of the limits that are in place.
    """

    _swept = False

    def __init__(self, dirs: dict[str, tuple[int, pathlib.Path]]) -> None:
        self.controllers = dirs
        self.dirs = sorted({path for _, path in dirs.values()})
        self.enforced = [f"{name} (v{version})" for name, (version, _) in sorted(dirs.items())]

    @classmethod
    def create(cls, *, memory_bytes: int, max_tasks: int, cpus: float) -> CgroupLimits | None:
        """Creates the run's cgroup(s) with the limits written, or returns None where no controller is writable.

        Args:
            memory_bytes: total memory of all the run's processes, tmpfs pages included.
            max_tasks: processes plus threads of the run.
            cpus: CPU share (1.0 = one core's worth of time per period).

        Returns:
            The cgroups, or None when this machine gives this process no cgroup controller.

        Raises:
            OSError: a cgroup was created but its limit could not be written.
        """
        available = _controller_dirs()
        if not available:
            return None
        if not cls._swept:
            cls._swept = True
            _sweep_leftovers({parent for _, parent in available.values()})
        name = f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        created: dict[pathlib.Path, pathlib.Path] = {}
        dirs: dict[str, tuple[int, pathlib.Path]] = {}
        for controller, (version, parent) in available.items():
            if parent not in created:
                try:
                    (parent / name).mkdir()
                except OSError as e:
                    logger.warning("cannot create cgroup under %s (%s); %s is not capped", parent, e, controller)
                    continue
                created[parent] = parent / name
            dirs[controller] = (version, created[parent])
        limits = cls(dirs)
        try:
            limits._write_limits(memory_bytes, max_tasks, cpus)
        except OSError:
            limits.kill_and_remove()
            raise
        return limits

    def _write_limits(self, memory_bytes: int, max_tasks: int, cpus: float) -> None:
        quota = max(1000, int(cpus * _CPU_PERIOD_US))
        for controller, (version, path) in self.controllers.items():
            if controller == "memory" and version == 2:
                (path / "memory.max").write_text(str(memory_bytes))
                if (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")
            elif controller == "memory":
                (path / "memory.limit_in_bytes").write_text(str(memory_bytes))
                if (path / "memory.memsw.limit_in_bytes").exists():  # only with swap accounting on
                    (path / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            elif controller == "pids":
                (path / "pids.max").write_text(str(max_tasks))
            elif version == 2:
                (path / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")
            else:
                (path / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
                (path / "cpu.cfs_quota_us").write_text(str(quota))

    def join(self, pid: int) -> None:
        """Moves process `pid` into the run's cgroup(s); its later children are born there.

        Raises:
            OSError: the kernel refused the move.
        """
        for path in self.dirs:
            (path / "cgroup.procs").write_text(str(pid))

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this run for going over the memory limit."""
        if "memory" not in self.controllers:
            return False
        version, path = self.controllers["memory"]
        name = "memory.events" if version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError):
            for line in (path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        return False

    def kill_and_remove(self, timeout_s: float = 5.0) -> None:
        """SIGKILLs whatever is still in the cgroup(s), waits for them to leave, removes the directories.

        The PID namespace normally took every process down already; this is the backstop.
        """
        deadline = time.monotonic() + timeout_s
        for path in self.dirs:
            if (path / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (path / "cgroup.kill").write_text("1")
            while True:
                try:
                    pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                if time.monotonic() > deadline:
                    logger.warning("cgroup %s still holds %s after %.0f s; leaving it", path, pids, timeout_s)
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.005)  # killed tasks leave once their parent (or the namespace's init) reaps them
            try:
                path.rmdir()
            except OSError as e:
                logger.warning("could not remove sandbox cgroup %s: %s", path, e)
