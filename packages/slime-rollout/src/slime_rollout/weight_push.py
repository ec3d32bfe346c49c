"""One weight push to a set of engines: per-engine serialization, the version fence, and per-engine failure.

A push (pause → flush → buckets → version → continue, `slime_rollout.weight_sync`) spans many HTTP calls. Three
rules keep an engine from serving mixed weights under a version that claims otherwise:

* **Serialized per engine.** A push holds a lock per engine URL (process-wide) from pause to continue, so two
  pushes that overlap in time (a restore of a restarted engine and a regular sync, or two threads) run one after
  the other on each engine. The locks are taken in URL order, so pushes to overlapping sets cannot deadlock.
* **Version fence.** Buckets are sent without `weight_version`; once every bucket has landed, one
  `POST /update_weight_version` sets it. Until then the engine reports (and stamps its replies with) the
  previous version.
* **A failed engine is dropped, not the push.** An engine whose call fails is taken out of the rest of the push
  (it keeps its old version and stays paused); the others receive everything and switch version. The push then
  raises `WeightPushError` naming the failed engines, which the caller marks unhealthy (restart + restore under
  `--use-fault-tolerance`, else the run stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

from slime_rollout.transport import EngineError

__all__ = ["PushSession", "WeightPushError", "engine_locks"]

logger = logging.getLogger(__name__)

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


class WeightPushError(RuntimeError):
    """Some engines did not receive a whole weight push (they still hold their previous version label).

    Attributes:
        failed: engine URL -> what failed there.
        weight_version: the version the push was meant to set.
    """

    def __init__(self, failed: dict[str, str], weight_version: str):
        detail = "; ".join(f"{url}: {reason}" for url, reason in failed.items())
        super().__init__(f"weight push {weight_version!r} failed on {len(failed)} engine(s): {detail}")
        self.failed, self.weight_version = dict(failed), weight_version

    def __reduce__(self) -> tuple:
        return (WeightPushError, (self.failed, self.weight_version))


def _lock(url: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(url, threading.Lock())


@contextlib.asynccontextmanager
async def engine_locks(urls: Sequence[str]) -> AsyncIterator[None]:
    """Holds the push lock of every engine in `urls` (taken in sorted order; waits in a thread)."""
    held: list[threading.Lock] = []
    try:
        for url in sorted(set(urls)):
            lock = _lock(url)
            if not lock.acquire(blocking=False):
                logger.info("weight push to %s waits for the push in progress", url)
                await asyncio.to_thread(lock.acquire)
            held.append(lock)
        yield
    finally:
        for lock in reversed(held):
            lock.release()


class PushSession:
    """Calls on the engines of one push, dropping an engine at its first failure.

    Args:
        engines: `slime_rollout.client.EngineClient`s to push to.
        tolerant: drop a failing engine and go on with the others (False: raise at once, as a collective
            transport must, since its other members wait on the failed one).
    """

    def __init__(self, engines: Sequence[Any], *, tolerant: bool = True):
        self.engines = list(engines)
        self.tolerant = tolerant
        self.failed: dict[str, str] = {}

    @property
    def live(self) -> list[Any]:
        """Engines that have not failed in this push."""
        return [e for e in self.engines if e.url not in self.failed]

    async def each(self, method: str, **kw: Any) -> list[Any]:
        """`engine.<method>(**kw)` on every live engine concurrently; returns the live engines' results in order.

        Raises:
            EngineError: an engine failed and the session is not tolerant.
            WeightPushError: no engine is left.
        """
        engines = self.live
        results = await asyncio.gather(*(getattr(e, method)(**kw) for e in engines), return_exceptions=True)
        out = []
        for engine, result in zip(engines, results, strict=True):
            if isinstance(result, BaseException):
                if not (self.tolerant and isinstance(result, EngineError | TimeoutError)):
                    raise result
                logger.error("weight push: engine %s failed at %s: %s", engine.url, method, result)
                self.failed[engine.url] = f"{method}: {result}"
            else:
                out.append(result)
        return out
