"""One weight push to a set of engines: per-engine serialization, the version fence, and per-engine failure.

A push (pause → flush → buckets → version → continue, `slime_rollout.weight_sync.updaters`) spans many HTTP calls. These
rules keep an engine from serving mixed weights under a version that claims otherwise:

* **Serialized per engine, within a process.** A push holds a lock per engine URL (process-wide) from pause to
  continue, so two pushes that overlap in time (a restore of a restarted engine and a regular sync, or two threads)
  run one after the other on each engine. The locks are taken in URL order, so pushes to overlapping sets cannot
  deadlock. A lock cannot see another process.
* **Every bucket carries the push's version** (`weight_version`, a field of SGLang's three update requests), and
  one `POST /update_weight_version` ends the push (the fence). Generation is paused throughout, so no sample is
  generated from a partly pushed model.
* **A failed engine is dropped, not the push.** An engine whose call fails is taken out of the rest of the push
  and stays paused; the others receive everything. If it may have taken some buckets (an update it did not refuse
  with an error reply), its reported version is then set to `"<version>-incomplete"` (best effort) rather than
  left at the version of the buckets it got.
* **Every failure is a `WeightPushError`.** Where one engine cannot be dropped (a collective broadcast: the others
  stop with it) or an error comes from this side, the push ends on every engine in it, each named with the cause;
  a wrong version after the fence fails that engine. The caller marks the named engines unhealthy (restart +
  restore under `--use-fault-tolerance`, else the run stops).

What the engines guard. Real SGLang (0.5.16) guards nothing across requests: it applies each bucket as it comes
and, after each successful request that carries `weight_version`, reports that version. Two writers (two
processes pushing to one engine) would interleave their buckets and leave the engine with a mix, tagged with
whichever version came last. Our side prevents that by having one writer: only the trainer's rank 0 pushes, and
within its process the locks above serialize pushes. The CPU reference engine also checks on its side
(`slime_rollout.engines.reference.push_guard`): while a push is open, a bucket of another version or none, a bucket
bringing other bytes for a tensor that already landed in it (a second writer of the same version), and any
whole-model load are refused, so a second writer fails at its first overlapping update with one error instead of
mixing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any

from slime_rollout.engines.client import RolloutClient
from slime_rollout.engines.transport import EngineError
from slime_rollout.engines.wire import UpdateWeightVersionReq
from slime_rollout.runtime.deadlines import DeadlineExceeded, await_with_deadline

__all__ = ["PushSession", "WeightPushError", "alongside_engines", "engine_locks", "push_client"]

logger = logging.getLogger(__name__)

# The flag that bounds a push's quick control calls (`PushSession.each(..., quick=True)`).
QUICK_CALL_FLAG = "--rollout-health-check-timeout"
# The flag that bounds its other calls: pause_generation and the weight updates, which wait on generation or load.
SLOW_CALL_FLAG = "--update-weight-timeout"

# How long a failed broadcast of this end waits for an engine's HTTP call to fail unreachable (the peer that died).
PEER_GRACE_S = 5.0

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


def push_client(cfg: Any, engine_urls: Sequence[str]) -> RolloutClient:
    """The engine client of the trainer's weight pushes, with the run's bounds on its calls.

    Args:
        cfg: the run config: `rollout_health_check_timeout` (quick calls), `update_weight_timeout` (pause and the
            weight updates), `slow_call_warning_secs` (warnings while a call runs).
        engine_urls: the engines' base URLs.
    """
    return RolloutClient(
        list(engine_urls),
        probe_timeout_s=cfg.rollout_health_check_timeout,
        slow_warning_s=cfg.slow_call_warning_secs,
        update_weight_timeout_s=cfg.update_weight_timeout,
    )


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
        engines: `slime_rollout.engines.engine_client.EngineClient`s to push to.
        tolerant: drop a failing engine and go on with the others (False: raise at once, as a collective
            transport must, since its other members wait on the failed one).
        quick_call_s: seconds an engine has to answer a quick control call (`QUICK_CALL_FLAG`; None: the
            client's read timeout, `slime_rollout.engines.transport.DEFAULT_TIMEOUT_S`).
        slow_call_s: seconds an engine has to answer any other call of the push (`SLOW_CALL_FLAG`: pause_generation
            and the weight updates, which wait behind in-flight requests, then load); None: the client's read timeout.
        warn_every_s: seconds between "still running" warnings of a call (`--slow-call-warning-secs`).
    """

    def __init__(
        self,
        engines: Sequence[Any],
        *,
        tolerant: bool = True,
        quick_call_s: float | None = None,
        slow_call_s: float | None = None,
        warn_every_s: float = 60.0,
    ):
        self.engines = list(engines)
        self.tolerant = tolerant
        self.quick_call_s, self.slow_call_s, self.warn_every_s = quick_call_s, slow_call_s, warn_every_s
        self.failed: dict[str, str] = {}
        # engine URL -> weight-update calls that may have landed there: answered, or unanswered (a timeout or a lost
        # connection may come after the engine applied it); a refusal (an HTTP error reply) did not land.
        self.buckets_landed: dict[str, int] = {}

    @property
    def live(self) -> list[Any]:
        """Engines that have not failed in this push."""
        return [e for e in self.engines if e.url not in self.failed]

    async def track(self, url: str, call: Awaitable[Any]) -> Any:
        """Awaits one weight-update `call` to engine `url`, counting it in `buckets_landed` unless refused."""
        refused = False
        try:
            return await call
        except EngineError as exc:
            refused = not exc.unreachable
            raise
        finally:
            if not refused:
                self.buckets_landed[url] = self.buckets_landed.get(url, 0) + 1

    async def each(self, method: str, /, *, tracked: bool = False, quick: bool = False, **kw: Any) -> list[Any]:
        """`engine.<method>(**kw)` on every live engine concurrently; returns the live engines' results in order.

        `tracked`: a weight-update call, counted per engine in `buckets_landed` (`track`). `quick`: a call the engine
        answers without waiting on generation or on weights, bounded by `quick_call_s`; any other call is bounded by
        `slow_call_s` (an engine that does not answer in time fails with an unreachable `EngineError` naming
        `QUICK_CALL_FLAG` or `SLOW_CALL_FLAG`).

        Raises:
            EngineError: an engine failed and the session is not tolerant.
        """
        return await self.apply(
            method,
            lambda engine: self.bounded(engine, method, getattr(engine, method)(**kw), quick=quick),
            tracked=tracked,
        )

    async def bounded(self, engine: Any, method: str, call: Awaitable[Any], *, quick: bool = False) -> Any:
        """`call` to `engine` within `quick_call_s` (`quick`) or `slow_call_s`; unbounded here when that is None.

        Raises:
            EngineError: unreachable, past the bound (the message names the flag that sets it); or the call's own.
        """
        deadline_s, flag = (self.quick_call_s, QUICK_CALL_FLAG) if quick else (self.slow_call_s, SLOW_CALL_FLAG)
        if deadline_s is None:
            return await call
        try:
            return await await_with_deadline(
                call,
                what=f"weight push: {method} on engine {engine.url}",
                deadline_s=deadline_s,
                flag=flag,
                warn_every_s=self.warn_every_s,
            )
        except DeadlineExceeded as exc:
            raise EngineError(engine.url, f"/{method}", str(exc), unreachable=True) from None

    async def apply(self, step: str, call: Callable[[Any], Awaitable[Any]], *, tracked: bool = False) -> list[Any]:
        """`call(engine)` on every live engine concurrently, as `each` does (`step` names it in the failure).

        Raises:
            EngineError: an engine failed and the session is not tolerant.
        """
        engines = self.live
        calls = [call(e) for e in engines]
        if tracked:
            calls = [self.track(e.url, c) for e, c in zip(engines, calls, strict=True)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        out = []
        for engine, result in zip(engines, results, strict=True):
            if isinstance(result, BaseException):
                if not (self.tolerant and isinstance(result, EngineError | TimeoutError)):
                    raise result
                logger.error("weight push: engine %s failed at %s: %s", engine.url, step, result)
                self.failed[engine.url] = f"{step}: {result}"
            else:
                out.append(result)
        return out

    def end_for_all(self, error: BaseException) -> None:
        """Ends the push on every engine still in it: `error` escaped the session, so none got the whole push.

        That is an engine's failure on a transport that cannot drop one engine (a collective: the others' buckets
        stop too), or an error on this side. The engine `error` names gets its own message, the others a pointer.
        """
        culprit = getattr(error, "url", None)
        text = f"{type(error).__name__}: {error}"
        for engine in self.live:
            here = culprit is None or engine.url == culprit
            self.failed[engine.url] = text if here else f"push stopped when {culprit} failed: {text}"

    async def mark_incomplete(self, weight_version: str, *, timeout_s: float = 10.0) -> None:
        """Sets the reported version of every failed engine that took some buckets to `"<weight_version>-incomplete"`.

        Buckets carry the push's version and SGLang reports it after each one, so such an engine would otherwise
        claim the new version with part of its weights. An engine that took none keeps its version. Best effort: a
        dead engine does not answer (logged, not raised).
        """
        failed = [e for e in self.engines if e.url in self.failed and self.buckets_landed.get(e.url)]
        body = UpdateWeightVersionReq(new_version=f"{weight_version}-incomplete").to_json()
        results = await asyncio.gather(
            *(e.request("POST", "/update_weight_version", body, timeout=timeout_s, max_retries=0) for e in failed),
            return_exceptions=True,
        )
        for engine, result in zip(failed, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("weight push: could not mark %s's weights incomplete: %s", engine.url, result)


async def _engine_lost(tasks: list[asyncio.Future], timeout_s: float) -> asyncio.Future | None:
    """The first of `tasks` (engine calls) that fails unreachable within `timeout_s`, or None."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = {t for t in tasks if not t.done()}
    while True:
        for t in tasks:
            if t.done() and not t.cancelled():
                exc = t.exception()
                if isinstance(exc, EngineError) and exc.unreachable:
                    return t
        left = deadline - loop.time()
        if not pending or left <= 0:
            return None
        _, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)


async def alongside_engines(own: asyncio.Future, calls: list[Coroutine], engines: list[Any], endpoint: str) -> Any:
    """Awaits this end of a collective and each engine's HTTP call of it; the first failure is raised at once.

    An engine that refuses its part (`/init_weights_update_group`, `/update_weights_from_distributed` answering an
    error) never joins the collective, so this end would wait for it until the group's timeout.

    Args:
        own: this end's collective (`slime_rollout.runtime.deadlines.in_daemon_thread`: a daemon thread, abandoned on
            a refusal, since `asyncio.run` would join an executor's).
        calls: one HTTP call per engine, in `engines` order.
        engines: the engines (for the log line).
        endpoint: the route, for the log line.

    Returns:
        What `own` returned.

    Raises:
        EngineError: an engine refused or failed its call (this end's collective is abandoned), also after this end's
            collective failed, when an engine call fails unreachable within `PEER_GRACE_S` (its `__cause__` is that
            failure).
        Exception: this end's collective failed, and no engine was lost.
    """
    tasks = [asyncio.ensure_future(c) for c in calls]
    pending: set[asyncio.Future] = {own, *tasks}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in tasks if t in done and t.exception() is not None]
            if failed:
                engine = engines[tasks.index(failed[0])]
                logger.error(
                    "weight push: engine %s refused %s; the trainer stops its side of the broadcast group",
                    engine.url, endpoint,
                )  # fmt: skip
                raise failed[0].exception()  # type: ignore[misc]
            if own in done and own.exception() is not None:
                # An engine that died breaks this end's collective about when its HTTP call loses the connection; it
                # is then the cause (named in a WeightPushError, restarted) rather than an error of this side.
                lost = await _engine_lost(tasks, PEER_GRACE_S)
                if lost is not None:
                    logger.error(
                        "weight push: the broadcast failed and engine %s stopped answering %s",
                        engines[tasks.index(lost)].url, endpoint,
                    )  # fmt: skip
                    raise lost.exception() from own.exception()  # type: ignore[misc]
                raise own.exception()  # type: ignore[misc]
    finally:
        for t in [own, *tasks]:
            if not t.done():
                t.cancel()  # the HTTP calls stop; the thread is abandoned (a daemon)
            t.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved" warnings
    return own.result()
