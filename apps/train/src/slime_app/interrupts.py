"""SIGTERM and SIGINT (Ctrl-C) end the driver cleanly: one line, teardown, exit status 128 + the signal's number.

Left to Ray, a SIGTERM to the driver printed a C++ stack: `ray.init` replaces the driver's SIGTERM handler with one
raising `SystemExit(15)`, and its core worker then installs Abseil's failure-signal handler on top, which prints
"*** SIGTERM received ***" and a stack trace before calling it (exit 15, or 134 when the interpreter was torn down
meanwhile). `install()` puts one Python handler on both signals, and `reclaim()` puts it back after `ray.init`.

The first signal raises `KeyboardInterrupt` in the main thread (a subclass would be lost: Ray's `ray.get`, polling
for signals, re-raises a plain `KeyboardInterrupt` of its own), and records which signal it was (`received()`), so
the driver's `except KeyboardInterrupt` tears the run down (engines, actors, Ray, the metrics sinks' flush) and
exits with `exit_status()`. One Ctrl-C in a terminal reaches the driver twice (from the terminal, and forwarded by
`uv run`), so a second copy of the first signal is ignored; any further signal (a second Ctrl-C) ends the process at
once (`os._exit`, same status) and the run's reaper (`slime_app.reaper`) kills what the teardown had not stopped.
A signal during `ray.init` itself still meets Ray's handlers (`reclaim()` runs once it returns).
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["HANDLED", "exit_status", "install", "interrupted_line", "reclaim", "received", "restore"]

#: The signals that end the run cleanly.
HANDLED = (signal.SIGTERM, signal.SIGINT)

# Reentrant: the handler runs in the main thread between two bytecodes, possibly while that thread holds the lock
# in `received()`; a plain Lock would deadlock there.
_lock = threading.RLock()
_received: list[int] = []  # signal numbers, in order of arrival
_installed = False  # install() ran: only then does reclaim() take the signals back (init_ray is also a library call)


def _handler(signum: int, frame: FrameType | None) -> None:
    """The first signal interrupts the main thread; a copy of it is ignored; any other one exits at once."""
    with _lock:
        _received.append(signum)
        count = len(_received)
        first = _received[0]
    name = signal.Signals(signum).name
    if count == 1:
        raise KeyboardInterrupt(name)
    if count == 2 and signum == first:  # `uv run` forwards the signal its child got from the terminal: one Ctrl-C
        return
    # os.write: a signal handler must not re-enter a buffered stream that the main thread may be writing.
    os.write(2, f"slime: {name} during the shutdown: exiting at once (the reaper stops what is left)\n".encode())
    os._exit(128 + first)


def install() -> dict[int, Any]:
    """Installs the handler on SIGTERM and SIGINT and forgets earlier signals (call from the main thread).

    Returns:
        The handlers it replaced, for `restore`.

    Raises:
        ValueError: called from another thread than the main one (Python's rule for `signal.signal`).
    """
    global _installed
    with _lock:
        _received.clear()
    previous = {sig: signal.getsignal(sig) for sig in HANDLED}
    _installed = True
    reclaim()
    return previous


def restore(previous: dict[int, Any]) -> None:
    """Puts back the handlers `install` replaced, and stops `reclaim` (a driver run inside another program, a test)."""
    global _installed
    _installed = False
    if threading.current_thread() is threading.main_thread():
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def reclaim() -> None:
    """Puts the handler back on SIGTERM and SIGINT after a library replaced it (`ray.init` does).

    Does nothing unless `install()` ran (a test or another program calling `init_ray` keeps its handlers), or off
    the main thread (only it may set handlers; `ray.init` leaves them alone there too).
    """
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in HANDLED:
        signal.signal(sig, _handler)


def received() -> int | None:
    """The number of the first signal handled since `install()`, or None."""
    with _lock:
        return _received[0] if _received else None


def exit_status() -> int:
    """128 + the first signal's number (143 for SIGTERM, 130 for SIGINT); 130 when the interrupt came from elsewhere.

    A `KeyboardInterrupt` with no signal recorded is Python's own Ctrl-C handling (before `install()`).
    """
    signum = received()
    return 128 + (signum if signum is not None else signal.SIGINT)


def interrupted_line() -> str:
    """The one line the driver prints when a signal stops it, e.g. `slime: interrupted by SIGTERM, shutting down`."""
    signum = received()
    name = signal.Signals(signum).name if signum is not None else "SIGINT"
    return f"slime: interrupted by {name}, shutting down"
