"""Engine health monitor (`--use-fault-tolerance`, `--rollout-health-check-*`): finds dead and hung engines.

Runs as a task on the rollout's event loop, active while a rollout or an eval generates (the original's
monitor likewise runs only while engines are loaded). After `--rollout-health-check-first-wait` seconds it
checks every serving engine each `--rollout-health-check-interval` seconds, and at once when a request found an
engine unreachable:

* **dead**: the engine's process exited (`kill -9`, OOM, crash): its host says so, or `GET /health_generate`'s
  connection is refused or reset (which decides when the host's answer is not known);
* **hung**: `GET /health_generate` gives no reply within `--rollout-health-check-timeout` (a stopped or wedged
  engine accepts connections but never answers);
* **unhealthy**: it answers, but not 200 (SGLang answers 503 when its test generation fails).

No check starts, and no verdict counts, while a weight push that pauses the engines runs
(`EnginePool.begin_weight_move`): SGLang holds `/health_generate` while paused and answers 503 after 20 s.

A failed engine is recovered in one task: `EnginePool.mark_failed` cancels its in-flight requests, which go to
the healthy engines; the process group is killed and a new engine started (same port when possible, so its URL
stays valid); `restore` gives it the run's current weights (in the trainer app, the driver pushes them; without
training the initial weights are current); then it serves again. A restart that fails is retried at the next
check. Counters go to `EnginePool.stats`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from slime_rollout.engines.pool import EnginePool, EngineState
from slime_rollout.engines.probe import Probe

__all__ = ["HealthMonitor"]

logger = logging.getLogger(__name__)


class HealthMonitor:
    """Checks the engines of `pool` and recovers the failed ones.

    Args:
        pool: the engines' serving state (`slime_rollout.engines.pool.EnginePool`).
        interval_s: seconds between checks (`--rollout-health-check-interval`).
        timeout_s: seconds one `/health_generate` may take (`--rollout-health-check-timeout`).
        first_wait_s: seconds to wait after each `resume` before the first check (`--rollout-health-check-first-wait`).
        is_alive: `is_alive(index)`: whether engine `index`'s process runs, a bool or an awaitable of one (an
            engine on another node is asked through its host); None: not known, HTTP checks only.
        restart: blocking `restart(index) -> url`: kills engine `index` and starts a new one (run in a thread).
        make_client: `make_client(url)`: an `EngineClient` for a restarted engine whose URL changed.
        restore: `await restore(index, url)`: gives a restarted engine the current weights (None: the initial
            weights are current).
    """

    def __init__(
        self,
        pool: EnginePool,
        *,
        interval_s: float,
        timeout_s: float,
        first_wait_s: float = 0.0,
        is_alive: Callable[[int], bool | Awaitable[bool]] | None,
        restart: Callable[[int], str],
        make_client: Callable[[str], Any],
        restore: Callable[[int, str], Awaitable[None]] | None = None,
    ):
        self.pool = pool
        self.interval_s, self.timeout_s, self.first_wait_s = interval_s, timeout_s, first_wait_s
        self.is_alive, self.restart, self.make_client, self.restore = is_alive, restart, make_client, restore
        self.recovery_s = 0.0  # seconds engines spent out of service (failure detected -> serving again)
        self._active = asyncio.Event()
        self._wake = asyncio.Event()
        self._first_wait = True
        self._pauses = 0  # `pause` calls so far: a check that a pause overlapped gives no verdict
        self._recovering: dict[int, asyncio.Task] = {}
        self._task: asyncio.Task | None = None
        pool.on_suspect = self.report_suspect

    # ---- life cycle (call on the monitor's event loop) ------------------------------------------

    def start(self) -> None:
        """Starts the monitor task (paused until `resume`)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="slime-health-monitor")

    def resume(self) -> None:
        """Checks from now on (after the first wait)."""
        self._first_wait = True
        self._active.set()
        self._wake.set()

    def pause(self) -> None:
        """Stops checking (engines offloaded or idle); recoveries already started go on.

        A check in progress gives no verdict: between generations an engine may be busy being offloaded or idle
        under another phase's load, and a slow answer then says nothing about a generation.
        """
        self._active.clear()
        self._pauses += 1

    async def stop(self) -> None:
        """Cancels the monitor and any recovery in progress."""
        tasks = [t for t in (self._task, *self._recovering.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    def report_suspect(self, index: int) -> None:
        """A request found engine `index` unreachable: check now instead of at the next interval."""
        self._wake.set()

    @property
    def recovering(self) -> list[int]:
        """Engines being recovered now."""
        return sorted(self._recovering)

    # ---- checks ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._active.wait()
            if self._first_wait and self.first_wait_s > 0:
                await asyncio.sleep(self.first_wait_s)
            self._first_wait = False
            if not self._active.is_set():
                continue
            self._wake.clear()
            await self.check_all()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval_s)
            except TimeoutError:
                pass

    async def check_all(self) -> None:
        """Checks every engine not already being recovered; starts the recovery of the failed ones."""
        if self.pool.weights_moving:
            return  # paused engines answer /health_generate 503 after 20 s: no verdict while weights move
        moves, pauses = self.pool.weight_moves, self._pauses
        todo = [s.index for s in self.pool.slots if s.index not in self._recovering]
        verdicts = await asyncio.gather(*(self._check(i) for i in todo))
        if self.pool.judged_during_push(moves):
            logger.info("health checks overlapped a weight push; their verdicts are dropped")
            return
        if self._pauses != pauses:
            logger.info("the generation ended during a health check; its verdicts are dropped")
            return
        for index, reason in zip(todo, verdicts, strict=True):
            if reason is not None:
                self.recover(index, reason)

    def recover(self, index: int, reason: str) -> None:
        """Starts the recovery of engine `index` (unless one runs): out of service, restart, restore, serve."""
        if index not in self._recovering:
            self._recovering[index] = asyncio.get_running_loop().create_task(self._recover(index, reason))

    async def _check(self, index: int) -> str | None:
        """None when engine `index` is healthy, else why not.

        `is_alive` answers True when it does not know (an engine host's call timed out), so the probe's own
        failure decides: a refused or reset connection is a dead engine; only a timeout makes it hung.
        """
        slot = self.pool.slots[index]
        if slot.state is EngineState.FAILED:
            return slot.reason or "failed"  # an earlier restart failed: try again
        if not await self._alive(index):
            return "process exited"
        result = await slot.client.probe_health_generate(timeout=self.timeout_s)
        if result.ok:
            return None
        if result.verdict is Probe.DOWN:
            return f"process gone: /health_generate {result.detail}"
        if not await self._alive(index):
            return "process exited"
        if result.verdict is Probe.TIMEOUT:
            return f"no answer to /health_generate within {self.timeout_s:g} s (hung)"
        return f"/health_generate answered {result.detail} (unhealthy)"

    async def _alive(self, index: int) -> bool:
        if self.is_alive is None:
            return True
        alive = self.is_alive(index)
        return bool(await alive) if inspect.isawaitable(alive) else bool(alive)

    async def _recover(self, index: int, reason: str) -> None:
        start = time.monotonic()
        slot = self.pool.slots[index]
        try:
            await self.pool.mark_failed(index, reason)
            self.pool.set_state(index, EngineState.RESTARTING)
            old_url = slot.url
            url = await asyncio.to_thread(self.restart, index)
            client = self.make_client(url) if url != old_url else None
            if client is not None:
                logger.warning("engine %d moved from %s to %s", index, old_url, url)
                slot.client = client
            self.pool.set_state(index, EngineState.AWAITING_WEIGHTS)
            if self.restore is not None:
                await self.restore(index, url)
            self.pool.stats.engine_restarts += 1
            await self.pool.mark_serving(index)
            self.recovery_s += time.monotonic() - start
            logger.info("engine %d recovered in %.1fs (%s)", index, time.monotonic() - start, reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed restart is retried at the next check
            slot.state, slot.reason = EngineState.FAILED, f"restart failed: {exc}"
            logger.exception("engine %d: restart failed; retrying at the next health check", index)
        finally:
            self._recovering.pop(index, None)
