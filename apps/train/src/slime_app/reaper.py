"""The run dies with its driver: a watchdog process that kills the run's process tree when the driver is gone.

A local Ray instance (no `--ray-address`) is a tree of processes under the driver (GCS, raylet, dashboard agents,
the workers: trainer ranks and the rollout manager, and the manager's engine subprocesses), spread over several
process groups. When the driver is killed (`kill -9`, its terminal's process group killed, OOM), nothing tears
that tree down: `ray.shutdown()` never runs, and trainer ranks went on to write a checkpoint.

`start_reaper()` starts `python -m slime_app.reaper <driver pid>` in its own session (so a kill of the driver's
process group does not reach it), connected to the driver by a pipe. Every `SNAPSHOT_S` it records the driver's
descendants (pid and start time, from /proc). When the pipe closes without the word "done" (the driver died:
the kernel closes its end), it SIGKILLs every recorded process still alive with the same start time. A driver
that exits normally writes "done" first (`Reaper.release`). A driver whose Ray start failed or was interrupted
writes "sweep" (`Reaper.sweep`): a Ctrl-C during `ray.init` reaches the raylet and the GCS (the terminal's process
group) but not Ray's dashboard and runtime-env agents, which were left running as orphans (ppid 1, 60 s and more)
while `ray.shutdown()` had no node to stop; the watchdog kills what the run started and is still alive.
Linux only (elsewhere `start_reaper` returns None).

With `--ray-address` the cluster's raylets own the actors; Ray kills a job's actors when its driver dies, and the
engines follow their manager (`PR_SET_PDEATHSIG`), so no reaper is needed.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys

__all__ = ["Reaper", "descendants", "start_reaper"]

logger = logging.getLogger(__name__)

SNAPSHOT_S = 1.0


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of `pid` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may contain spaces and parentheses
    return int(fields[1]), int(fields[19])  # ppid (field 4), starttime (field 22)


def descendants(root: int) -> dict[int, int]:
    """Every process below `root` (children, grandchildren, ...): pid -> start time (clock ticks since boot)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                children.setdefault(st[0], []).append(int(name))
                starts[int(name)] = st[1]
    out: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in starts and pid not in out:
            out[pid] = starts[pid]
            todo.extend(children.get(pid, []))
    return out


def _kill(snapshot: dict[int, int]) -> int:
    """SIGKILLs the processes of `snapshot` that still run with the recorded start time; returns how many."""
    killed = 0
    for pid, start in snapshot.items():
        st = _stat(pid)
        if st is not None and st[1] == start:  # not a new process that reused the pid
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def watch(driver_pid: int, stdin_fd: int = 0) -> int:
    """The reaper's loop: snapshots the driver's tree until its pipe closes; kills the tree unless told "done".

    "sweep" kills the processes of the tree that started after the watchdog (the run's, not those the driver
    process had before the run, e.g. a test's), then leaves.
    """
    snapshot: dict[int, int] = {}
    buffer = b""
    own_start = _stat(os.getpid())
    while True:
        ready, _, _ = select.select([stdin_fd], [], [], SNAPSHOT_S)
        if not ready:
            snapshot.update(descendants(driver_pid))  # keep the dead ones too: verified by start time at kill
            continue
        chunk = os.read(stdin_fd, 4096)
        buffer += chunk
        if b"done" in buffer:
            return 0
        if b"sweep" in buffer:
            snapshot.update(descendants(driver_pid))
            snapshot.pop(os.getpid(), None)
            since = own_start[1] if own_start is not None else 0
            killed = _kill({pid: start for pid, start in snapshot.items() if start >= since})
            if killed:
                print(f"slime reaper: killed {killed} process(es) the run's start left behind", file=sys.stderr)
            return 0
        if not chunk:  # EOF without "done": the driver is gone
            snapshot.update(descendants(driver_pid))
            snapshot.pop(os.getpid(), None)  # the reaper was the driver's child too
            killed = _kill(snapshot)
            print(f"slime reaper: driver {driver_pid} died; killed {killed} process(es) of its run", file=sys.stderr)
            return 0


class Reaper:
    """Driver-side handle of the watchdog process.

    Args:
        proc: the watchdog (`python -m slime_app.reaper <pid>`), its stdin the driver's end of the pipe.
    """

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def release(self) -> None:
        """Normal exit: the watchdog leaves without killing anything."""
        self._tell(b"done\n")

    def sweep(self) -> None:
        """The run did not start (Ray's start failed or was interrupted): the watchdog kills what the run started."""
        self._tell(b"sweep\n")

    def _tell(self, word: bytes) -> None:
        try:
            self.proc.stdin.write(word)
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def start_reaper() -> Reaper | None:
    """Starts the watchdog of this driver process (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        logger.warning("the run's processes are not tied to the driver on %s (no /proc)", sys.platform)
        return None
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime_app.reaper", str(os.getpid())],
        stdin=subprocess.PIPE,
        start_new_session=True,  # survives a kill of the driver's process group
    )
    return Reaper(proc)


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1])))
