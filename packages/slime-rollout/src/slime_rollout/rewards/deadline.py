"""A wall-clock budget for Python work on any thread (`run_with_deadline`).

Symbolic grading (math-verify, sympy) is Python code for all but its big-integer arithmetic. SIGALRM, the usual
timeout, only works on a process's main thread, and the rollout grades on a background event loop
(`--rm-num-workers 0`); trace and profile hooks cost 1.6x CPU time on math-verify comparisons and still miss a
loop that makes no Python calls. Instead a timer thread, at the deadline, schedules `GradingTimeout` in the
grading thread with CPython's `PyThreadState_SetAsyncExc` (the mechanism behind `KeyboardInterrupt` delivery):
the interpreter raises it at its next check between bytecodes, on whatever thread the work runs, and nothing
runs in the meantime (no per-call cost).

What it cannot stop is a single long C call (a huge integer power inside sympy): the exception is raised only
when that call returns. Callers screen their input for those first (`slime_rollout.rewards.math_utils.
costly_reason`), and the worker pool adds a parent-side deadline that kills the process
(`slime_rollout.rewards.pool`).
"""

from __future__ import annotations

import ctypes
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


class GradingTimeout(BaseException):  # noqa: N818 (named like the builtin TimeoutError it stands for)
    """The budget of `run_with_deadline` ran out.

    A `BaseException`, so that the graders' own `except Exception` cannot turn it into a verdict.
    """


class _Watchdog:
    """Schedules `GradingTimeout` in one thread at the deadline, unless `finish` came first."""

    def __init__(self, budget_s: float) -> None:
        self._target = threading.get_ident()
        self._lock = threading.Lock()
        self._state = _RUNNING
        self._timer = threading.Timer(budget_s, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        with self._lock:
            if self._state == _RUNNING:
                self._state = _FIRED
                _RAISE_IN(self._target, GradingTimeout)

    def start(self) -> None:
        self._timer.start()

    def finish(self) -> None:
        self._timer.cancel()
        with self._lock:
            fired, self._state = self._state == _FIRED, _FINISHED
        if fired:
            # Fired just as the work ended: drop the exception if it is still pending, so it cannot surface
            # later in unrelated code.
            _CLEAR_IN(self._target, None)


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
    watchdog = _Watchdog(budget_s)
    watchdog.start()
    try:
        return fn(*args)
    finally:
        watchdog.finish()
