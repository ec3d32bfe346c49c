"""Engine fault tolerance inside the rollout manager (`--use-fault-tolerance`).

`EngineSupervisor` runs `slime_rollout.engines.health.HealthMonitor` on the rollout's event loop while the
manager generates, and turns "a restarted engine needs the current weights" into a handshake with the driver,
the only process that may call the trainer ranks (their collectives must run in the same order on every rank):

1. the monitor restarts a failed engine and awaits `restore(index, url)`, which parks the URL in `awaiting`;
2. the driver, while it waits on a manager call, asks `awaiting_weights()`, has the trainer push its current
   weights to those URLs, and calls `restored(urls)`;
3. the monitor puts the engine back in service.

A run without a trainer (`--debug-rollout-only`) serves the initial weights, which are then the current ones:
restarted engines serve at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slime_core.config import SlimeArgs
from slime_rollout.engines.client import EngineClient
from slime_rollout.engines.health import HealthMonitor
from slime_rollout.engines.pool import EngineState
from slime_rollout.runtime import async_utils

logger = logging.getLogger(__name__)

__all__ = ["EngineSupervisor"]


class EngineSupervisor:
    """The health monitor of the manager's engines and the weight-restore handshake with the driver.

    Args:
        cfg: the run config; reads `rollout_health_check_interval`, `rollout_health_check_timeout`,
            `rollout_health_check_first_wait`.
        engines: the engines the manager launched (`slime_app.engine_hosts.HostedEngines`; restarts go through it).
        client: the manager's `RolloutClient` (its pool is what the monitor watches).
        needs_weights: restarted engines wait for the driver's push (False: initial weights are current).
    """

    def __init__(self, cfg: SlimeArgs, engines: Any, client: Any, *, needs_weights: bool):
        self.engines, self.client = engines, client
        # URL -> the restore waiter of a restarted engine: resolved once the driver pushed it the weights, failed when
        # that push failed (its recovery then ends failed, so the monitor restarts it again).
        self._awaiting: dict[str, asyncio.Future[None]] = {}
        self._reported = client.pool.stats.as_dict()
        self.monitor = async_utils.run(self._make(cfg, needs_weights))

    async def _make(self, cfg: SlimeArgs, needs_weights: bool) -> HealthMonitor:
        monitor = HealthMonitor(
            self.client.pool,
            interval_s=cfg.rollout_health_check_interval,
            timeout_s=cfg.rollout_health_check_timeout,
            first_wait_s=cfg.rollout_health_check_first_wait,
            is_alive=self.engines.alive,
            restart=self.engines.restart,
            make_client=lambda url: EngineClient(url, max_connections=self.client.concurrency),
            restore=self._restore if needs_weights else None,
        )
        monitor.start()
        return monitor

    async def _restore(self, index: int, url: str) -> None:
        waiter = self._awaiting[url] = asyncio.get_running_loop().create_future()
        logger.info("engine %d (%s) restarted; waiting for the driver to push the current weights", index, url)
        await waiter  # raises when the push to it failed (`_fail`)

    # ---- called from the manager's threads ---------------------------------------------------

    def resume(self) -> None:
        """Checks engines while a generation runs."""
        async_utils.call_soon(self.monitor.resume)

    def pause(self) -> None:
        """Stops checking (engines idle or offloaded)."""
        async_utils.call_soon(self.monitor.pause)

    def awaiting_weights(self) -> list[str]:
        """URLs of restarted engines that wait for the current weights."""
        return async_utils.run(self._list())

    async def _list(self) -> list[str]:
        return sorted(self._awaiting)

    def restored(self, urls: list[str]) -> None:
        """The driver pushed the current weights to `urls`: those waiting go back in service."""
        async_utils.run(self._release(urls))

    async def _release(self, urls: list[str]) -> None:
        for url in urls:
            waiter = self._awaiting.pop(url, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def live_urls(self) -> list[str]:
        """Engines whose process runs (serving or waiting for weights): the targets of a regular weight push."""
        down = (EngineState.FAILED, EngineState.RESTARTING)
        return [s.url for s in self.client.pool.slots if s.state not in down]

    def fail(self, urls: list[str], reason: str) -> None:
        """Engines a weight push could not complete: take them out of service and recover them."""
        async_utils.run(self._fail(urls, reason))

    async def _fail(self, urls: list[str], reason: str) -> None:
        for url in urls:
            waiter = self._awaiting.pop(url, None)
            if waiter is not None and not waiter.done():
                # A restarted engine the restore push could not reach: its recovery, still waiting, ends failed (a
                # `recover` meanwhile is a no-op), so the next health check restarts it rather than the driver
                # retrying the push every poll.
                waiter.set_exception(RuntimeError(f"the current weights could not be pushed to it: {reason}"))
        for slot in self.client.pool.slots:
            if slot.url in urls:
                self.monitor.recover(slot.index, reason)

    def metrics(self) -> dict[str, float]:
        """`rollout/fault/*` since the last call: engine failures and restarts, re-queued requests, seconds lost."""
        now = self.client.pool.stats.as_dict()
        out = {f"rollout/fault/{k}": now[k] - self._reported[k] for k in now}
        self._reported = now
        out["rollout/fault/serving_engines"] = float(len(self.client.pool.serving()))
        return out

    def stop(self) -> None:
        """Stops the monitor and any recovery in progress."""
        async_utils.run(self.monitor.stop())
