"""A wall-clock budget for Python work on any thread (`run_with_deadline`).

Symbolic grading (math-verify, sympy) is Python code for all but its big-integer arithmetic. SIGALRM, the usual
timeout, only works on a process's main thread, and the rollout grades on a background event loop
(`--rm-num-workers 0`); trace and profile hooks cost 1.6x CPU time on math-verify comparisons and still miss a
loop that makes no Python calls. Instead a timer thread, at the deadline, schedules `GradingTimeout` in the
grading thread with CPython's `PyThreadState_SetAsyncExc` (the mechanism behind `KeyboardInterrupt` delivery):
the interpreter raises it at its next check between bytecodes, on whatever thread the work runs, and nothing
runs in the meantime (no per-call cost).

C code may swallow the exception: code that clears errors (a failed attribute or cache lookup inside
sympy's cache wrapper) drops it, and the work goes on. So the timer fires again every `REFIRE_S` while the
work is still running: only while `fn`'s frames are on the grading thread's stack (checked with
`sys._current_frames`), never once `run_with_deadline` is finishing or has returned.

What it cannot stop is a single long C call (a huge integer power inside sympy): the exception is raised only
when that call returns. Callers screen their input for those first (`slime_rollout.rewards.costly`), and the
worker pool adds a parent-side deadline that kills the process
(`slime_rollout.rewards.pool`).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["GradingTimeout", "run_with_deadline"]

# int PyThreadState_SetAsyncExc(unsigned long id, PyObject *exc): exc = an exception class, or NULL to clear.
_RAISE_IN = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)
_CLEAR_IN = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)
_RUNNING, _FINISHED, _FIRED = 0, 1, 2
# Seconds between repeated firings after the deadline, while the work has swallowed the previous ones.
REFIRE_S = 0.1


class GradingTimeout(BaseException):  # noqa: N818 (named like the builtin TimeoutError it stands for)
    """The budget of `run_with_deadline` ran out.

    A `BaseException`, so that the graders' own `except Exception` cannot turn it into a verdict.
    """


class _Watchdog:
    """Schedules `GradingTimeout` in one thread at the deadline, and again while the work goes on, until `finish`.

    `frame` is `run_with_deadline`'s frame: a repeated firing happens only while the frame it calls (its callee on
    the grading thread's stack) is the work's, not `finish`'s; once that frame has left the stack, the timer stops.
    """

    def __init__(self, budget_s: float, frame: Any) -> None:
        self._target = threading.get_ident()
        self._frame = frame
        self._lock = threading.Lock()
        self._state = _RUNNING
        self._timer = self._new_timer(budget_s)

    def _new_timer(self, delay_s: float) -> threading.Timer:
        timer = threading.Timer(delay_s, self._fire)
        timer.daemon = True
        return timer

    def _inside_work(self) -> bool:
        frame, callee = sys._current_frames().get(self._target), None
        while frame is not None:
            if frame is self._frame:
                return callee is not None and callee.f_code is not _FINISH_CODE
            frame, callee = frame.f_back, frame
        return False

    def _fire(self) -> None:
        with self._lock:
            if self._state == _FINISHED or (self._state == _FIRED and not self._inside_work()):
                return
            self._state = _FIRED
            _RAISE_IN(self._target, GradingTimeout)
            self._timer = self._new_timer(REFIRE_S)
            self._timer.start()

    def start(self) -> None:
        self._timer.start()

    def finish(self) -> None:
        with self._lock:
            fired, self._state, self._frame = self._state == _FIRED, _FINISHED, None
            self._timer.cancel()
        if fired:
            # Fired just as the work ended: drop the exception if it is still pending, so it cannot surface
            # later in unrelated code.
            _CLEAR_IN(self._target, None)


_FINISH_CODE = _Watchdog.finish.__code__


def run_with_deadline[T](fn: Callable[..., T], *args: Any, budget_s: float) -> T:
    """Runs `fn(*args)` on this thread and stops it after `budget_s` seconds of wall-clock time.

    Args:
        fn: the work (stopped at its next bytecode after the deadline; a running C call finishes first).
        *args: its arguments.
        budget_s: seconds, > 0.

    Returns:
        `fn(*args)`.

    Raises:
        GradingTimeout: the budget ran out.
        ValueError: a non-positive budget.
    """
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s}")
    watchdog = _Watchdog(budget_s, sys._getframe())
    watchdog.start()
    try:
        return fn(*args)
    finally:
        watchdog.finish()
