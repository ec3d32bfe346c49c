"""One long-lived asyncio loop in a background thread for the synchronous rollout entry points.

The rollout is asyncio inside, but `generate_rollout` is called synchronously by the trainer. Reusing
one loop across rollouts keeps loop-bound clients (HTTP connection pools) alive; calling from inside
a running loop (e.g. a Ray async actor) works because the work runs on the other thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["call_soon", "get_loop", "run"]

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="slime-rollout-loop", daemon=True).start()
        return _loop


def get_loop() -> asyncio.AbstractEventLoop:
    """The background loop (started on first use): the one `run` and `call_soon` use."""
    return _get_loop()


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    """Runs `coro` on the background loop and blocks until it finishes; exceptions propagate.

    Raises:
        RuntimeError: when called from a coroutine already running on that loop (it would deadlock);
            await the `*_async` variant there instead.
    """
    loop = _get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("called a synchronous rollout entry point from the rollout loop; await the *_async variant")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def call_soon(fn: Callable[[], Any]) -> None:
    """Schedules `fn()` on the background loop from any thread (returns at once)."""
    _get_loop().call_soon_threadsafe(fn)
