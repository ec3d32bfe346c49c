"""Which engines serve generation requests, and the re-queue of requests whose engine failed.

`EnginePool` holds one `EngineSlot` per engine. A slot is SERVING, or out of service while its engine is
restarted (FAILED → RESTARTING → AWAITING_WEIGHTS → SERVING, driven by `slime_rollout.engines.health`).
`EnginePool.generate` sends a request to the serving engine with the fewest requests in flight; with
`failover` on (`--use-fault-tolerance`) a request whose engine dies or hangs is sent again to a healthy
engine:

* the engine stops answering (connection refused/reset, read timeout) or answers 502/503/504 (out of capacity,
  shutting down): the call raises an unreachable or unavailable `EngineError`; the pool reports the engine as
  suspect (the health monitor checks it at once) and the request waits for a serving engine;
* the health monitor declares the engine failed while requests are in flight on it (a hung engine never
  answers): `mark_failed` cancels exactly those calls, and each goes again to a serving engine.

A re-queued request is sent again from its original payload: the partial output of the failed engine is
discarded (a `/generate` reply is all or nothing), so each sample is generated exactly once in the result.
With per-sample sampling seeds (`slime_rollout.generation.seeds`) the new engine draws the same tokens the failed one
would have. When no engine serves, a request waits up to `recovery_timeout_s`, then fails with
`NoHealthyEngineError`.

Without `failover`, a request still running after `slow_warning_s` is logged and its engine probed
(`/health_generate`): a frozen engine fails the request at once, naming the engine, instead of at the request
deadline (`--sglang-router-request-timeout-secs`, 4 h by default), which bounds every request either way.

Counters for the run's metrics: `stats` (restarts, re-queued requests, generation seconds lost).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from slime_rollout.engines.transport import EngineError
from slime_rollout.runtime.deadlines import DeadlineExceeded, await_with_deadline, backstop_timeout_s

__all__ = [
    "EnginePool",
    "EngineSlot",
    "EngineState",
    "FaultStats",
    "NoHealthyEngineError",
    "answering_engine",
    "note_answering_engine",
]

logger = logging.getLogger(__name__)

# The engine (or router) whose `/generate` reply the running task received last. A reply is a plain dict: the
# generate function that finds it malformed knows the sample but not which engine the pool picked, and its error
# named only the sample. A context variable: set in the task that awaits the reply, so it is that request's engine.
_ANSWERED_BY: contextvars.ContextVar[str | None] = contextvars.ContextVar("slime_generate_answered_by", default=None)


def answering_engine() -> str | None:
    """Base URL of the engine (or router) that gave the running task's last `/generate` reply; None if unknown.

    Set by `EnginePool.generate` and `RolloutClient.generate`; a client of a test or plugin that sets nothing leaves
    None (or the previous request's engine: call `note_answering_engine(None)` before a request).
    """
    return _ANSWERED_BY.get()


def note_answering_engine(url: str | None) -> None:
    """Records `url` as the engine of the running task's `/generate` reply (`answering_engine`)."""
    _ANSWERED_BY.set(url)


class NoHealthyEngineError(RuntimeError):
    """No engine served within the recovery timeout (every engine failed and none came back)."""


class EngineState(enum.Enum):
    """Life cycle of one engine slot."""

    SERVING = "serving"
    FAILED = "failed"
    RESTARTING = "restarting"
    AWAITING_WEIGHTS = "awaiting_weights"


@dataclasses.dataclass(kw_only=True, eq=False)
class EngineSlot:
    """One engine of the pool.

    Attributes:
        index: position of the engine in the run's engine list.
        client: the engine's `slime_rollout.engines.engine_client.EngineClient` (replaced when a restart changes its
            URL).
        state: where the engine is in its life cycle.
        outstanding: generation requests in flight on it.
        calls: the in-flight `/generate` calls (tasks), cancelled by `EnginePool.mark_failed`.
        reason: why it last failed.
        probing: the frozen-engine probe (`/health_generate`) running for its slow requests, shared by them.
    """

    index: int
    client: Any
    state: EngineState = EngineState.SERVING
    outstanding: int = 0
    calls: dict[asyncio.Task, float] = dataclasses.field(default_factory=dict)  # call -> start (monotonic s)
    reason: str = ""
    probing: asyncio.Task | None = dataclasses.field(default=None, repr=False)
    warned_at: float = dataclasses.field(default=-float("inf"), repr=False)  # its last slow-request warning
    unwarned: int = dataclasses.field(default=0, repr=False)  # slow-request warnings folded into the next one

    @property
    def url(self) -> str:
        """The engine's base URL."""
        return self.client.url

    async def shared_probe(self, timeout_s: float) -> bool:
        """Whether `/health_generate` answered 200 within `timeout_s`: one probe at a time, awaited by every caller.

        The requests of a frozen (or slow) engine reach their warning together: a probe each was hundreds of
        generations sent at once into an engine already behind. Shielded: a caller cancelled (its request done or
        failed over) leaves the probe to the others.
        """
        probe = self.probing
        # A new one when none runs, or the running one is of another loop (a rollout's loop ended with it pending).
        if probe is None or probe.done() or probe.get_loop() is not asyncio.get_running_loop():
            probe = self.probing = asyncio.ensure_future(self.client.health_generate(timeout=timeout_s))
        return await asyncio.shield(probe)


@dataclasses.dataclass(kw_only=True)
class FaultStats:
    """Fault counters since the pool was made (monotonic; the rollout reports per-rollout differences).

    Attributes:
        engine_failures: engines declared failed (dead or hung).
        engine_restarts: engines restarted and back in service.
        requeued_requests: generation requests sent again to another engine after their engine failed.
        time_lost_s: generation seconds spent on requests that were re-queued (work thrown away).
    """

    engine_failures: int = 0
    engine_restarts: int = 0
    requeued_requests: int = 0
    time_lost_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        """The counters as plain numbers."""
        return dataclasses.asdict(self)


class _Requeue(Exception):
    """Internal: the call's engine failed; send the request again."""


class EnginePool:
    """Serving state of a set of engines and failover-aware dispatch.

    Args:
        clients: one `EngineClient` per engine.
        failover: re-queue requests of failed engines (else an engine error propagates to the caller).
        recovery_timeout_s: how long a request waits for a serving engine when none serves.
        generate_timeout_s: deadline of one `/generate` call in seconds (`--sglang-router-request-timeout-secs`);
            None: none.
        on_suspect: called with a slot index when a call to it found the engine unreachable (the health
            monitor checks it at once).
        slow_warning_s: seconds between warnings while a `/generate` call runs (`--slow-call-warning-secs`).
        probe_timeout_s: without `failover`, at each such warning the engine must answer `/health_generate` within
            this many seconds (`--rollout-health-check-timeout`), else it is frozen and the call fails at once.
    """

    def __init__(
        self,
        clients: Sequence[Any],
        *,
        failover: bool = False,
        recovery_timeout_s: float = 600.0,
        generate_timeout_s: float | None = None,
        on_suspect: Callable[[int], None] | None = None,
        slow_warning_s: float = 60.0,
        probe_timeout_s: float = 30.0,
    ):
        self.slots = [EngineSlot(index=i, client=c) for i, c in enumerate(clients)]
        self.failover = failover
        self.recovery_timeout_s = recovery_timeout_s
        self.generate_timeout_s = generate_timeout_s
        self.on_suspect = on_suspect
        self.slow_warning_s = slow_warning_s
        self.probe_timeout_s = probe_timeout_s
        self.stats = FaultStats()
        self._rr = 0
        self._serving_changed: asyncio.Condition | None = None  # made lazily on the running loop
        # Weight pushes that may overlap generation (fully async): SGLang holds `/health_generate` while paused
        # and answers 503 after its SGLANG_HEALTH_CHECK_TIMEOUT (20 s), and requests sent meanwhile wait; neither
        # says anything about the engine's health, so probes neither start nor judge during a push.
        self.weight_moves = 0  # pushes begun so far
        self.weights_moving = False

    def begin_weight_move(self) -> None:
        """A weight push that pauses the engines begins: health probes wait until `end_weight_move`."""
        self.weight_moves += 1
        self.weights_moving = True

    def end_weight_move(self) -> None:
        """The weight push ended (or failed): health probes judge again."""
        self.weights_moving = False

    def judged_during_push(self, moves_before: int) -> bool:
        """Whether a probe begun when `weight_moves` was `moves_before` overlapped a weight push."""
        return self.weights_moving or self.weight_moves != moves_before

    # ---- state ---------------------------------------------------------------------------------

    def serving(self) -> list[EngineSlot]:
        """Slots that take generation requests now."""
        return [s for s in self.slots if s.state is EngineState.SERVING]

    def _condition(self) -> asyncio.Condition:
        if self._serving_changed is None:
            self._serving_changed = asyncio.Condition()
        return self._serving_changed

    async def _notify(self) -> None:
        cond = self._condition()
        async with cond:
            cond.notify_all()

    async def mark_failed(self, index: int, reason: str) -> int:
        """Takes engine `index` out of service and cancels its in-flight calls (they are re-queued).

        Returns:
            How many in-flight calls were cancelled.
        """
        slot = self.slots[index]
        if slot.state is not EngineState.SERVING:
            return 0
        slot.state, slot.reason = EngineState.FAILED, reason
        self.stats.engine_failures += 1
        calls = list(slot.calls)
        for call in calls:
            call.cancel()
        logger.error(
            "engine %d (%s) failed: %s; %d request(s) in flight re-queued", index, slot.url, reason, len(calls)
        )
        await self._notify()
        return len(calls)

    def set_state(self, index: int, state: EngineState) -> None:
        """Moves a slot that is out of service along its recovery (RESTARTING, AWAITING_WEIGHTS, FAILED)."""
        if state is EngineState.SERVING:
            raise ValueError("use mark_serving to put an engine back in service")
        self.slots[index].state = state

    async def mark_serving(self, index: int, client: Any | None = None) -> None:
        """Puts engine `index` (back) in service, with a new client when its URL changed."""
        slot = self.slots[index]
        if client is not None:
            slot.client = client
        if slot.state is not EngineState.SERVING:
            slot.state, slot.reason = EngineState.SERVING, ""
            logger.info("engine %d (%s) serving", index, slot.url)
        await self._notify()

    # ---- dispatch ------------------------------------------------------------------------------

    async def _acquire(self) -> EngineSlot:
        """The serving slot with the fewest requests in flight (ties round-robin); waits when none serves."""
        serving = self.serving()
        if not serving:
            serving = await self._wait_serving()
        self._rr += 1
        n = len(serving)
        return min((serving[(self._rr + k) % n] for k in range(n)), key=lambda s: s.outstanding)

    async def _wait_serving(self) -> list[EngineSlot]:
        if not self.failover:
            states = ", ".join(f"{s.url} {s.state.value}" for s in self.slots)
            raise NoHealthyEngineError(f"no engine is serving ({states})")
        cond = self._condition()
        deadline = time.monotonic() + self.recovery_timeout_s
        async with cond:
            while not self.serving():
                left = deadline - time.monotonic()
                if left <= 0:
                    states = ", ".join(
                        f"{s.url} {s.state.value}" + (f" ({s.reason})" if s.reason else "") for s in self.slots
                    )
                    raise NoHealthyEngineError(
                        f"no healthy engine for {self.recovery_timeout_s:.0f}s (--rollout-engine-recovery-timeout): "
                        f"{states}"
                    )
                try:
                    await asyncio.wait_for(cond.wait(), timeout=left)
                except TimeoutError:
                    pass
        return self.serving()

    async def generate(self, payload: dict[str, Any]) -> Any:
        """POST /generate on a serving engine; with `failover`, again on another one if that engine fails.

        Raises:
            EngineError: the engine answered with an error (always), or failed without `failover`.
            NoHealthyEngineError: no engine served within `recovery_timeout_s`, or the request failed on every
                engine it was sent to for that long (names the flag and each engine's last failure; the last
                `EngineError` is the `__cause__`).
        """
        first_failure: float | None = None
        tried: dict[str, str] = {}  # engine URL -> its last failure of this request
        while True:
            slot = await self._acquire()
            try:
                return await self._call(slot, payload)
            except _Requeue as requeue:
                # A request that fails on every engine for the whole recovery window is not a fault of one engine.
                now = time.monotonic()
                first_failure = now if first_failure is None else first_failure
                cause = requeue.__cause__
                # One line: an engine's error body may span several.
                said = str(cause) if cause is not None else "cancelled (engine marked failed)"
                tried[slot.url] = " ".join(said.split())
                if now - first_failure > self.recovery_timeout_s and isinstance(cause, EngineError):
                    raise NoHealthyEngineError(
                        f"request failed on every engine for {self.recovery_timeout_s:g}s "
                        f"(--rollout-engine-recovery-timeout); engines tried: "
                        + "; ".join(f"{url}: {why}" for url, why in tried.items())
                    ) from cause

    async def _call(self, slot: EngineSlot, payload: dict[str, Any]) -> Any:
        # One connection retry when failing over: a dead engine's requests move on within seconds.
        retries = 1 if self.failover else None
        call = asyncio.ensure_future(
            slot.client.generate(payload, timeout=backstop_timeout_s(self.generate_timeout_s), max_retries=retries)
        )
        start = time.monotonic()
        slot.calls[call] = start
        slot.outstanding += 1
        try:
            reply = await self._bounded(slot, call, payload)
            note_answering_engine(slot.url)
            return reply
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller itself is being cancelled
            self._count_requeue(start)  # mark_failed cancelled this call
            raise _Requeue from None
        except EngineError as exc:
            if not (self.failover and exc.unavailable):  # 502/503/504 too, as through the router
                raise
            # Said (once per half warning interval per engine): a request re-queued again and again until the
            # recovery timeout was silent for those 10 minutes.
            said = " ".join(str(exc).split())
            self._warn_slow(slot, f"{said}; the request goes to a serving engine (--use-fault-tolerance)")
            self._count_requeue(start)
            if slot.state is EngineState.SERVING and self.on_suspect is not None:
                self.on_suspect(slot.index)
            # Let the health monitor judge the engine before this request picks it again.
            await asyncio.sleep(0.5)
            raise _Requeue from exc
        finally:
            slot.calls.pop(call, None)
            slot.outstanding -= 1

    def _warn_slow(self, slot: EngineSlot, message: str) -> None:
        """Logs a slow request of `slot`, at most one line per half warning interval per engine, with a count.

        The requests of a stalled engine reach their warning together: one line each was hundreds of lines at once.
        """
        now = time.monotonic()
        if now - slot.warned_at < self.slow_warning_s / 2:
            slot.unwarned += 1
            return
        more = f"; {slot.unwarned} more such warning(s) on this engine since the last" if slot.unwarned else ""
        slot.warned_at, slot.unwarned = now, 0
        logger.warning("%s (%d request(s) in flight on it%s)", message, slot.outstanding, more)

    async def _bounded(self, slot: EngineSlot, call: asyncio.Future, payload: dict[str, Any]) -> Any:
        """Awaits `call` with warnings, a frozen-engine probe (without failover) and the request deadline.

        Raises:
            EngineError: the deadline passed, or the engine failed its probe (unreachable: failover re-queues).
        """
        rid = payload.get("rid")
        what = f"/generate on engine {slot.url}" + (f" (rid {rid})" if rid else "")

        async def probe(elapsed_s: float) -> None:
            moves = self.weight_moves
            if self.weights_moving:
                return  # a paused engine holds the request and the probe alike
            healthy = await slot.shared_probe(self.probe_timeout_s)
            if not healthy and not self.judged_during_push(moves):
                raise EngineError(
                    slot.url,
                    "/generate",
                    f"no reply after {elapsed_s:.0f} s, and /health_generate gave no 200 within "
                    f"{self.probe_timeout_s:g} s (--rollout-health-check-timeout): the engine is frozen "
                    "(--use-fault-tolerance restarts such engines)",
                    unreachable=True,
                )

        try:
            return await await_with_deadline(
                call,
                what=what,
                deadline_s=self.generate_timeout_s,
                flag="--sglang-router-request-timeout-secs",
                warn_every_s=self.slow_warning_s,
                on_slow=None if self.failover else probe,  # with failover the health monitor judges engines
                warn=functools.partial(self._warn_slow, slot),
            )
        except DeadlineExceeded as exc:
            raise EngineError(slot.url, "/generate", str(exc), unreachable=True) from None

    def _count_requeue(self, start: float) -> None:
        self.stats.requeued_requests += 1
        self.stats.time_lost_s += time.monotonic() - start
