"""Deadlines for user hooks that run inside a trainer step (`call_hook_with_deadline`).

The trainer-side plugins (`--custom-loss-function-path`, `--custom-advantage-function-path`,
`--custom-tis-function-path`, `--custom-pg-loss-reducer-function-path`) are called in the middle of a training step,
in the trainer's own thread. The rollout runs its plugins in a thread it can abandon at the deadline
(`slime_rollout.runtime.deadlines`); a trainer hook cannot move to another thread: autograd's grad mode, autocast
and the current CUDA stream are per thread, so the hook would compute other math, and the step's collectives
wait for this rank anyway.

So the hook runs where it is and a watchdog thread watches it under `--plugin-timeout-secs`, as the rollout's
plugins are: a warning every `--slow-call-warning-secs` while it runs, and at the deadline an error log naming it
and an exception raised in the hook's thread (`PyThreadState_SetAsyncExc`). That exception stops a hook running
Python code (a `while True` loop, a retry loop) at its next bytecode; one blocked inside a C call
(`time.sleep(1e9)`, a socket read, a collective) sees it only when the call returns, and meanwhile the watchdog
logs an error naming it every `--slow-call-warning-secs`. A hook that returns past its deadline fails too (its
result is discarded). Either way the step fails with `HookDeadlineExceeded` naming the hook and the flag.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "HookDeadlineExceeded",
    "call_hook_with_deadline",
    "hook_bounds",
    "hook_label",
    "hooks_of_rollout",
    "note_raised_by",
]

# The rollout whose data the trainer is working on, named in every trainer-side hook's messages. A context variable,
# not an argument: the hooks are called deep inside pure loss/advantage functions that take no rollout id.
_ROLLOUT_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar("slime_hook_rollout_id", default=None)


@contextlib.contextmanager
def hooks_of_rollout(rollout_id: int) -> Iterator[None]:
    """Within it, `hook_label` (and so every trainer-side hook's error) names rollout `rollout_id`."""
    token = _ROLLOUT_ID.set(rollout_id)
    try:
        yield
    finally:
        _ROLLOUT_ID.reset(token)


def hook_label(what: str) -> str:
    """`what` (a hook's flag and path) with ` (rollout N)` when called within `hooks_of_rollout(N)`, else `what`."""
    rollout_id = _ROLLOUT_ID.get()
    suffix = f" (rollout {rollout_id})"
    if rollout_id is None or what.endswith(suffix):
        return what
    return what + suffix


logger = logging.getLogger(__name__)


class HookDeadlineExceeded(TimeoutError):
    """A trainer-side hook ran past `--plugin-timeout-secs`; the message names it and the flag."""


class _Stop(BaseException):  # noqa: N818 - raised into the hook; a BaseException so `except Exception` keeps out
    """Raised in the hook's thread at its deadline (never seen outside `call_hook_with_deadline`)."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Sets (or with None clears) an exception to be raised in thread `thread_id` at its next bytecode."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class _Watchdog:
    """Watches one hook call from a daemon thread: warns while it runs, stops it at the deadline."""

    def __init__(self, what: str, deadline_s: float, flag: str, warn_every_s: float) -> None:
        self.what, self.deadline_s, self.flag, self.warn_every_s = what, deadline_s, flag, warn_every_s
        self.target = threading.get_ident()
        self.start = time.monotonic()
        self.lock = threading.Lock()  # `stop` and the injection exclude each other
        self.done = threading.Event()
        self.injected = False
        threading.Thread(target=self._watch, name=f"hook watchdog: {what}"[:60], daemon=True).start()

    def _watch(self) -> None:
        next_warning = self.warn_every_s
        while True:
            elapsed = time.monotonic() - self.start
            wake = next_warning if self.injected else min(next_warning, self.deadline_s)
            if self.done.wait(max(0.0, wake - elapsed)):
                return
            elapsed = time.monotonic() - self.start
            if not self.injected and elapsed >= self.deadline_s:
                with self.lock:
                    if self.done.is_set():
                        return
                    logger.error(
                        "%s is still running after %.1f s, past its deadline of %g s (%s): stopping it",
                        self.what, elapsed, self.deadline_s, self.flag,
                    )  # fmt: skip
                    _raise_in(self.target, _Stop)
                    self.injected = True
            elif elapsed >= next_warning:
                if self.injected:
                    logger.error(
                        "%s is still running after %.0f s, past its deadline of %g s (%s): it is blocked in a call "
                        "that cannot be interrupted (sleep, I/O, a collective); the step fails when it returns",
                        self.what, elapsed, self.deadline_s, self.flag,
                    )  # fmt: skip
                else:
                    logger.warning(
                        "%s is still running after %.1f s (deadline %g s, %s)",
                        self.what, elapsed, self.deadline_s, self.flag,
                    )  # fmt: skip
                next_warning += self.warn_every_s

    def stop(self) -> None:
        with self.lock:
            self.done.set()
            if self.injected:  # not delivered yet (the hook returned first): it must not fire in the caller
                _raise_in(self.target, None)


def note_raised_by(error: BaseException, what: str) -> None:
    """Adds the note `(raised by <what>)` to a plugin's error, unless an inner call named its plugin already."""
    if not any(str(n).startswith("(raised by ") for n in getattr(error, "__notes__", ())):
        error.add_note(f"(raised by {what})")


def call_hook_with_deadline(
    fn: Callable[..., Any], *args: Any, what: str, deadline_s: float, flag: str, warn_every_s: float, **kwargs: Any
) -> Any:
    """Calls a trainer-side hook in this thread under a watchdog (see the module docstring).

    Args:
        fn: the hook.
        *args: its positional arguments.
        what: names the hook (its flag and import path) in messages; `hook_label` adds the rollout.
        deadline_s: seconds the call may take.
        flag: the flag that sets the deadline.
        warn_every_s: seconds between "still running" log lines.
        **kwargs: its keyword arguments.

    Returns:
        What the hook returned.

    Raises:
        HookDeadlineExceeded: it was stopped at its deadline, or it returned past it.
        Exception: what the hook raised, with a note `(raised by <what>)`.
    """
    what = hook_label(what)
    watchdog = _Watchdog(what, deadline_s, flag, warn_every_s)
    try:
        try:
            result = fn(*args, **kwargs)
        except Exception as e:
            note_raised_by(e, what)
            raise
        finally:
            watchdog.stop()
    except _Stop:
        raise HookDeadlineExceeded(
            f"{what} did not finish within {deadline_s:g} s ({flag}): stopped after "
            f"{time.monotonic() - watchdog.start:.1f} s"
        ) from None
    elapsed = time.monotonic() - watchdog.start
    if elapsed > deadline_s:
        raise HookDeadlineExceeded(
            f"{what} did not finish within {deadline_s:g} s ({flag}): it returned after {elapsed:.1f} s, blocked "
            "where it could not be interrupted; its result is discarded"
        )
    return result


def hook_bounds(cfg: Any) -> dict[str, Any]:
    """A trainer-side hook's deadline: `--plugin-timeout-secs`, warned about every `--slow-call-warning-secs`.

    Args:
        cfg: the run config; reads `plugin_timeout_secs`, `slow_call_warning_secs`.

    Returns:
        `call_hook_with_deadline`'s `deadline_s`, `flag` and `warn_every_s`.
    """
    return {
        "deadline_s": cfg.plugin_timeout_secs,
        "flag": "--plugin-timeout-secs",
        "warn_every_s": cfg.slow_call_warning_secs,
    }
