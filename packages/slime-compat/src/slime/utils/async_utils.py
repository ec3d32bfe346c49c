"""`slime.utils.async_utils`: `run(coro)` on the rollout's background event loop (original module path).

`get_async_loop()` gives that loop as the original's `AsyncLoopThread` shape (`.loop`, `.run(coro)`), so a plugin
that schedules onto `get_async_loop().loop` shares the loop the rollout's clients live on. `AsyncLoopThread()`
starts a loop thread of its own, as in the original.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

from slime_rollout.runtime.async_utils import get_loop, run

__all__ = ["AsyncLoopThread", "get_async_loop", "run"]


class AsyncLoopThread:
    """An asyncio loop running in a daemon thread.

    Args:
        loop: an already running loop to wrap (`get_async_loop` passes the rollout's); None starts a new one.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        if loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="slime-compat-loop", daemon=True).start()
        self.loop = loop

    def run[T](self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on the loop and blocks until it finishes; exceptions propagate."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


def get_async_loop() -> AsyncLoopThread:
    """The rollout's background loop (`slime_rollout.runtime.async_utils`), started on first use."""
    return AsyncLoopThread(get_loop())
