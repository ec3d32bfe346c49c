"""Detects an event loop blocked by synchronous code in an `async def` plugin (`watching`).

Nothing on an event loop can preempt a coroutine that blocks it (`time.sleep`, CPU-bound work, blocking I/O inside
an `async def` reward): while it runs no timer fires, so neither the deadline of `slime_rollout.runtime.deadlines` nor
its "still running" warnings can. A thread outside the loop still can see it: it posts a no-op callback to the loop
every `_PERIOD_S` and waits; a callback that has not run after the watched call's `warn_after_s` means the loop is
blocked, and the task the loop is running is the one that blocks it.

What it does, per blocked stretch: one warning naming the watched call that blocks the loop (or the task, if it is
not a watched call); one error when the stretch outlasts that call's deadline (it cannot be stopped: the run stays
stuck until the code returns); and it records on the call's `Watched` that it blocked the loop (and on every other
watched call that it was delayed by it), so that `call_plugin_with_deadline` fails a call that comes back past its
deadline after blocking (its result discarded) rather than accepting it late, and names the culprit in the error of
a call whose deadline passed while another held the loop.

What it cannot do: interrupt the blocking code (raising into the loop's thread from outside could stop it in the
middle of any library call and leave state half-updated); see a block shorter than `warn_after_s`; or run at all
while C code holds the GIL (pure-Python code lets the watchdog thread in every few milliseconds).

One daemon thread per event loop, running only while at least one watched call is in flight on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Watched", "watching"]

logger = logging.getLogger(__name__)

_PERIOD_S = 1.0  # longest pause between probes of the loop (shorter when a watched call warns sooner)


@dataclass(kw_only=True, slots=True)
class Watched:
    """One call in flight on a watched event loop.

    Example:
        `Watched(what="reward fn my.rm for sample 3", warn_after_s=60.0, deadline_s=600.0, flag="--rm-timeout-secs")`
    """

    what: str  # names the call in messages
    warn_after_s: float  # seconds the loop may stay blocked by this call before the warning
    deadline_s: float | None  # the call's deadline in seconds (None: none), for the error
    flag: str  # the flag that sets the deadline
    start: float = field(default_factory=time.monotonic)  # time.monotonic() seconds when the call started
    blocked_s: float = 0.0  # longest stretch, in seconds, this call was seen blocking the loop (0: never seen)
    delayed_by: set[str] = field(default_factory=set)  # the calls seen blocking the loop while this one was in flight


class _Watchdog:
    """The thread watching one event loop while watched calls are in flight on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: dict[asyncio.Task, Watched] = {}
        self.thread = threading.Thread(target=self._run, name="event-loop-watchdog", daemon=True)

    def _run(self) -> None:
        while True:
            with _lock:
                if not self.calls or self.loop.is_closed():
                    _watchdogs.pop(self.loop, None)
                    return
                warn_after = min(w.warn_after_s for w in self.calls.values())
            ran = threading.Event()
            posted = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(ran.set)
            except RuntimeError:  # the loop closed meanwhile
                continue
            if ran.wait(warn_after):
                time.sleep(min(_PERIOD_S, warn_after / 2))
                continue
            self._blocked(ran, posted)

    def _blocked(self, ran: threading.Event, posted: float) -> None:
        """Reports one blocked stretch of the loop and follows it until the loop runs again."""
        task = asyncio.current_task(self.loop)  # the task whose step is running now, i.e. the one blocking
        with _lock:
            watched = self.calls.get(task) if task is not None else None
        if watched is not None:
            name = watched.what
        elif task is not None:
            name = f"task {task.get_name()!r} ({getattr(task.get_coro(), '__qualname__', '?')})"
        else:
            name = "a callback outside any task"
        with _lock:
            for other in self.calls.values():
                if other is not watched:
                    other.delayed_by.add(name)
        lag = time.monotonic() - posted
        logger.warning(
            "the event loop has been blocked for %.1f s by %s: synchronous code (time.sleep, CPU-bound work, "
            "blocking I/O) in an async def plugin; nothing can interrupt it, so its deadline and the slow-call "
            "warnings cannot fire until it returns (await instead, e.g. asyncio.sleep or asyncio.to_thread, or "
            "make it a plain def: those run in a thread under the deadline)",
            lag,
            name,
        )
        past_deadline_logged = False
        while True:
            blocked = time.monotonic() - posted
            if watched is not None:
                watched.blocked_s = max(watched.blocked_s, blocked)
                overdue = watched.deadline_s is not None and time.monotonic() - watched.start >= watched.deadline_s
                if overdue and not past_deadline_logged:
                    past_deadline_logged = True
                    logger.error(
                        "%s is past its %g s deadline (%s) but blocks the event loop, so it cannot be cancelled; "
                        "the rollout is stuck until it returns, then fails",
                        name,
                        watched.deadline_s,
                        watched.flag,
                    )
            if ran.wait(min(_PERIOD_S, 0.1 + blocked / 10)) or self.loop.is_closed():
                break
        if watched is not None:
            watched.blocked_s = max(watched.blocked_s, time.monotonic() - posted)


_lock = threading.Lock()
_watchdogs: dict[asyncio.AbstractEventLoop, _Watchdog] = {}


@contextmanager
def watching(
    task: asyncio.Task, *, what: str, warn_after_s: float, deadline_s: float | None, flag: str
) -> Iterator[Watched]:
    """Watches the event loop of `task` while the block runs, blaming `task` for any stretch it blocks the loop.

    Args:
        task: the task running the call (on the running loop).
        what: names the call in messages, e.g. `"reward fn my.rm for sample 3"`.
        warn_after_s: seconds the loop may stay blocked by `task` before one warning is logged (> 0).
        deadline_s: the call's deadline in seconds (None: none); a stretch outlasting it logs one error.
        flag: the flag that sets the deadline, named in the error.

    Yields:
        The call's `Watched` record; its `blocked_s` > 0 once the call was seen blocking the loop.

    Raises:
        ValueError: `warn_after_s` <= 0.
    """
    if not warn_after_s > 0:
        raise ValueError(f"warn_after_s must be > 0, got {warn_after_s}")
    loop = task.get_loop()
    watched = Watched(what=what, warn_after_s=warn_after_s, deadline_s=deadline_s, flag=flag)
    with _lock:
        watchdog = _watchdogs.get(loop)
        start = watchdog is None
        if start:
            watchdog = _watchdogs[loop] = _Watchdog(loop)
        watchdog.calls[task] = watched
    if start:
        watchdog.thread.start()
    try:
        yield watched
    finally:
        with _lock:
            watchdog.calls.pop(task, None)
