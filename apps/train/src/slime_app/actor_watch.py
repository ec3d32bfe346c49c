"""Waiting on Ray refs while watching the processes that must produce them: a stopped actor ends the wait.

A trainer rank or the rollout manager stopped by `SIGSTOP` (a `kill -STOP`, a debugger, a terminal's job control)
keeps its sockets open, so Ray sees it alive and the driver's `ray.get` on its call waited for ever. `wait_watched`
waits in slices of `SLICE_S`, reads the state of each watched process between slices, and raises `ActorStopped`
(one line naming the actor, its pid and host, and how to resume) once one has stayed stopped for
`--actor-stopped-timeout-secs` (0: never). A process that is continued (`SIGCONT`) before then goes on as if nothing
happened; the driver logs the stop and the resume.

Where a process's state comes from: the actor's pid and node are read from Ray's actor table (GCS: no call to the
actor, which a stopped actor would never answer). On the driver's node `/proc/<pid>/stat` gives the state (`T`
stopped by a signal, `t` stopped by a tracer); on another node a small Ray task pinned to that node reads it there.
What cannot be seen is not counted as stopped: an actor whose pid Ray has not published yet, a pid from another PID
namespace (no such `/proc` entry), a node that runs no task (its reads stay pending).

Usage (the driver): `wait_watched(ref, [Watched("trainer rank 0", actor)], what="its train call",
stopped_timeout_s=120)`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

__all__ = [
    "ActorStopped",
    "ActorWatch",
    "ProcState",
    "SLICE_S",
    "Watched",
    "kill_stopped",
    "parse_proc_stat",
    "read_proc_state",
    "wait_watched",
]

logger = logging.getLogger(__name__)

SLICE_S = 1.0  # seconds between two reads of the watched processes' states
STOPPED_STATES = frozenset("Tt")  # /proc/<pid>/stat: T = stopped by a signal, t = stopped by a tracer (ptrace)


class ActorStopped(RuntimeError):
    """A watched process stayed stopped past `--actor-stopped-timeout-secs`; the message is the one line to show."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProcState:
    """One process's state as `/proc/<pid>/stat` gives it.

    Attributes:
        state: the state letter (`R`, `S`, `D`, `T`, `t`, `Z`, ...; proc(5), field 3).
        start_ticks: when the process started, in clock ticks after boot (proc(5), field 22): with the pid, it
            tells the process from a later one that got the same pid.
    """

    state: str
    start_ticks: int

    @property
    def stopped(self) -> bool:
        """Whether the process is stopped (`T` or `t`)."""
        return self.state in STOPPED_STATES


def parse_proc_stat(text: str) -> ProcState:
    """Parses the text of `/proc/<pid>/stat`.

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses (`(a) (b)`), so the
    fields after it are read from after its last `)`.

    Args:
        text: the file's content, e.g. `"4242 (ray::TrainActor) S 1 ..."`.

    Returns:
        The state letter and the start time.

    Raises:
        ValueError: not the format proc(5) describes.
    """
    close = text.rfind(")")
    rest = text[close + 1 :].split() if close >= 0 else []
    if "(" not in text[:close] or len(rest) < 20 or not rest[19].isdigit():
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:120]!r}")
    return ProcState(state=rest[0], start_ticks=int(rest[19]))  # rest[0] is field 3, rest[19] field 22


def read_proc_state(pid: int) -> ProcState | None:
    """The state of process `pid` on this host; None when it is gone (or in another PID namespace)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return parse_proc_stat(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return None


@ray.remote(num_cpus=0, max_retries=0)
def _read_proc_state_there(pid: int) -> ProcState | None:
    """`read_proc_state` run as a task on the node of the process (pinned there by the caller)."""
    return read_proc_state(pid)


@dataclasses.dataclass(eq=False)
class Watched:
    """A process a wait watches: a Ray actor (its pid and node read from Ray) or a bare pid on this host.

    The record keeps what the waits learnt (the pid, when the process was first seen stopped) from one wait to the
    next, so a process stopped across several short waits is timed from when it stopped.

    Args:
        name: what the messages call it, e.g. `"trainer rank 1"`, `"the rollout manager"`.
        actor: the Ray actor handle (None for a bare pid).
        pid: the process id (found from Ray's actor table when None).
    """

    name: str
    actor: Any = None
    pid: int | None = None
    node_id: str | None = None  # hex; None: this host (a bare pid) or not known yet
    host: str | None = None  # the node's IP address, for the messages
    stopped_since: float | None = None  # time.monotonic() when first seen stopped; None while running
    local: bool | None = None  # on the driver's node (None: not known yet)
    _start_ticks: int | None = None
    _probe: Any = None  # another node: the read in flight (an ObjectRef)

    def resolve(self) -> bool:
        """Finds the actor's pid and node from Ray's actor table; returns whether the pid is known."""
        if self.pid is not None:
            if self.local is None:
                self.local, self.host = True, self.host or "this host"
            return True
        if self.actor is None:
            return False
        # Ray's GCS table, not a call to the actor: a stopped actor answers no call. (No public API reads it
        # without the dashboard, which the local run does not start.)
        info = ray._private.state.actors(actor_id=self.actor._actor_id.hex())
        if not info or info.get("State") != "ALIVE" or not info.get("Pid"):
            return False
        self.pid = int(info["Pid"])
        self.node_id = info["Address"]["NodeID"]
        self.host = info["Address"]["IPAddress"]
        self.local = self.node_id == ray.get_runtime_context().get_node_id()
        return True

    def state(self) -> ProcState | None:
        """The process's current state; None when it cannot be seen now (see the module docstring)."""
        if not self.resolve():
            return None
        assert self.pid is not None
        if self.local:
            return read_proc_state(self.pid)
        return self._remote_state()

    def _remote_state(self) -> ProcState | None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._probe is None:
            strategy = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
            self._probe = _read_proc_state_there.options(scheduling_strategy=strategy).remote(self.pid)
        ready, _ = ray.wait([self._probe], timeout=0)
        if not ready:
            return None  # not known yet; a node that never runs it leaves the process unjudged
        probe, self._probe = self._probe, None
        try:
            return ray.get(probe)
        except ray.exceptions.RayError:
            logger.debug("reading the state of %s on %s failed", self.describe(), self.host, exc_info=True)
            return None

    def describe(self) -> str:
        """`"trainer rank 1 (pid 4242 on 10.0.0.7)"`."""
        return f"{self.name} (pid {self.pid} on {self.host})" if self.pid is not None else self.name

    def observe(self, now: float) -> float:
        """Reads the state, logs a stop or a resume; returns for how many seconds it has been stopped (0: running)."""
        state = self.state()
        if state is None:
            return 0.0 if self.stopped_since is None else now - self.stopped_since
        if self._start_ticks is not None and state.start_ticks != self._start_ticks:
            self.stopped_since = None  # another process holds the pid now: the watched one is gone
        self._start_ticks = state.start_ticks
        if state.stopped and self.stopped_since is None:
            self.stopped_since = now
            logger.warning("%s is stopped (process state %s); the driver waits for it", self.describe(), state.state)
        elif not state.stopped and self.stopped_since is not None:
            logger.warning("%s resumed after %.0f s stopped", self.describe(), now - self.stopped_since)
            self.stopped_since = None
        return 0.0 if self.stopped_since is None else now - self.stopped_since


def _stopped_error(
    watched: Watched, seconds: float, what: str, stopped_timeout_s: float, resume_hint: str | None
) -> ActorStopped:
    line = (
        f"{watched.describe()} has been stopped for {seconds:.0f} s (SIGSTOP, a debugger or job control) while the "
        f"driver waited on {what}; the run ends after --actor-stopped-timeout-secs {stopped_timeout_s:g} "
        f"(`kill -CONT {watched.pid}` resumes a process stopped by mistake; 0 waits for ever)"
    )
    return ActorStopped(line + (f"; {resume_hint}" if resume_hint else ""))


def wait_watched(
    refs: ray.ObjectRef | Sequence[ray.ObjectRef],
    actors_or_pids: Sequence[Watched | int],
    *,
    what: str,
    stopped_timeout_s: float,
    resume_hint: str | None = None,
    timeout: float | None = None,
    every_slice: Callable[[], None] | None = None,
) -> Any:
    """`ray.get(refs)` that ends when one of the watched processes stays stopped past `stopped_timeout_s`.

    Waits in slices of `SLICE_S`; after each it reads every watched process's state (`Watched.observe`). The
    results are checked as they arrive, so a failed call raises at once (a plain `ray.get` of a list waits on the
    first ref, which may be blocked in a collective with the failed one).

    Args:
        refs: one ref (its value is returned) or a list (the list of values).
        actors_or_pids: the processes the refs depend on: `Watched` records (kept by the caller from one wait to
            the next) or bare pids on this host.
        what: what is waited on, for the error (e.g. `"the train call of rollout 3"`).
        stopped_timeout_s: seconds a process may stay stopped (`--actor-stopped-timeout-secs`); 0: never ends.
        resume_hint: appended to the error (e.g. `"resume from the last checkpoint with --load /ckpt"`).
        timeout: seconds to wait at most (None: no limit but the stop's).
        every_slice: called after each slice that did not finish the wait (the driver's own work meanwhile).

    Returns:
        The value(s), as `ray.get` returns them.

    Raises:
        ActorStopped: a watched process stayed stopped for `stopped_timeout_s` seconds.
        ray.exceptions.GetTimeoutError: `timeout` passed.
        Exception: what the call raised (Ray's task error, `RayActorError` for a dead process).
    """
    single = isinstance(refs, ray.ObjectRef)
    all_refs = [refs] if single else list(refs)
    watched = [w if isinstance(w, Watched) else Watched(f"process {w}", pid=w) for w in actors_or_pids]
    begun = time.monotonic()
    pending = list(all_refs)
    while pending:
        left = None if timeout is None else timeout - (time.monotonic() - begun)
        if left is not None and left <= 0:
            raise GetTimeoutError(f"{what}: not done within {timeout:g} s")
        step = SLICE_S if left is None else min(SLICE_S, left)
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=step)
        if not pending:
            break
        if ready:
            ray.get(ready)  # raises a call's error as soon as it arrives, while the others still run
        if stopped_timeout_s > 0:
            now = time.monotonic()
            for w in watched:
                if w.observe(now) >= stopped_timeout_s:
                    raise _stopped_error(w, now - (w.stopped_since or now), what, stopped_timeout_s, resume_hint)
        if every_slice is not None:
            every_slice()
    for w in watched:  # a stopped one that answered was continued: say so now, not at the next wait's first slice
        if w.stopped_since is not None and stopped_timeout_s > 0:
            w.observe(time.monotonic())
    values = ray.get(all_refs)
    return values[0] if single else values


class ActorWatch:
    """`wait_watched` with the run's settings bound: the stop timeout and the resume hint.

    Args:
        stopped_timeout_s: `--actor-stopped-timeout-secs` (0: a stopped process is waited for for ever).
        resume_hint: appended to the error, e.g. `"resume from the last checkpoint with --load /ckpt"`.
    """

    def __init__(self, stopped_timeout_s: float, resume_hint: str | None = None):
        if stopped_timeout_s < 0:
            raise ValueError(f"--actor-stopped-timeout-secs {stopped_timeout_s}: must be >= 0 (0: never)")
        self.stopped_timeout_s = stopped_timeout_s
        self.resume_hint = resume_hint

    @classmethod
    def of(cls, cfg: Any) -> ActorWatch:
        """The run's watch: reads `actor_stopped_timeout_secs` and `save` (the resume hint) of the run config."""
        hint = f"resume from the last checkpoint with --load {cfg.save}" if cfg.save else None
        return cls(cfg.actor_stopped_timeout_secs, hint)

    def get(
        self,
        refs: ray.ObjectRef | Sequence[ray.ObjectRef],
        watched: Sequence[Watched | int],
        what: str,
        *,
        timeout: float | None = None,
        every_slice: Callable[[], None] | None = None,
    ) -> Any:
        """`wait_watched(refs, watched, what=what, ...)` with this watch's settings."""
        return wait_watched(
            refs, watched, what=what, stopped_timeout_s=self.stopped_timeout_s, resume_hint=self.resume_hint,
            timeout=timeout, every_slice=every_slice,
        )  # fmt: skip


def kill_stopped(watched: Sequence[Watched]) -> list[Watched]:
    """SIGKILLs the watched processes on this host that are stopped now; returns those it killed.

    For the teardown: a stopped process answers no shutdown call and ignores SIGTERM until continued, so Ray's
    teardown would leave it behind (its node's raylet gone, it stays stopped for ever). Only a process still the one
    the watch saw (same pid and start time) is killed.
    """
    killed = []
    for w in watched:
        try:
            known = w.resolve()
        except Exception:  # noqa: BLE001 - teardown goes on; Ray's table may be gone already
            logger.debug("the pid of %s is not known", w.name, exc_info=True)
            continue
        if not known or not w.local:
            continue
        assert w.pid is not None
        state = read_proc_state(w.pid)
        if state is None or not state.stopped or (w._start_ticks is not None and state.start_ticks != w._start_ticks):
            continue
        try:
            os.kill(w.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        logger.warning("killed %s: stopped, it could not shut down", w.describe())
        killed.append(w)
    return killed
