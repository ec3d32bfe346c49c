"""Driver side of engine fault tolerance: restarted engines get the current weights, pushes skip dead engines.

Only the driver calls the trainer ranks (every rank must run the same collectives in the same order), so the
driver serves the rollout manager's restore requests (`slime_app.engine_faults`) while it waits on a manager
call: `EngineRestorer.get(ref, what, serve_restores=True)` polls the manager every `POLL_S` and, when restarted
engines wait, has the trainer push the weights the engines serve to them. Every wait on the manager ends when its
process stays stopped (`slime_app.actor_watch`).

Regular syncs (`EngineRestorer.push`) go to the engines that are up; engines a push could not complete are
handed back to the manager for a restart (they get the weights once back) instead of failing the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray

from slime_core.config import SlimeArgs
from slime_core.config.validation_fully_async import is_fully_async
from slime_rollout.weight_sync.push import WeightPushError

logger = logging.getLogger(__name__)

__all__ = ["EngineRestorer"]

POLL_S = 1.0


def _push_error(exc: BaseException) -> WeightPushError | None:
    """The `WeightPushError` a trainer rank raised (Ray wraps it in a RayTaskError), else None."""
    cause = getattr(exc, "cause", exc)
    return cause if isinstance(cause, WeightPushError) else None


class EngineRestorer:
    """Weight pushes and restores of the run's engines, driven from the driver.

    Args:
        cfg: the run config; reads `use_fault_tolerance` and `colocate` (a sleeping trainer wakes up to push).
        manager: the `RolloutManager` actor.
        trainer: the `TrainGroup` (None: no trainer, nothing to push).
        get: how the driver waits on a manager call: `get(ref, what, every_slice=None) -> value`, ending when the
            manager's process stays stopped (`slime_app.loop.Run.manager_get`); None: a plain `ray.get` (polled
            every `POLL_S` while restores are served).
    """

    def __init__(self, cfg: SlimeArgs, manager: Any, trainer: Any | None, get: Callable[..., Any] | None = None):
        self.cfg, self.manager, self.trainer = cfg, manager, trainer
        self._watched_get = get
        self.enabled = cfg.use_fault_tolerance and trainer is not None
        # Fully async, generation goes on around a push: the manager's health probes hold while it runs.
        self.overlaps_generation = is_fully_async(cfg)
        self.weight_version: int | None = None  # what the engines serve (the last version pushed)
        # The version the trainer's weights are now: ahead of `weight_version` between a train step and its sync
        # (`--async`, or `--update-weights-interval` > 1), when a restore pushes these newer weights.
        self.trainer_version: int | None = None
        self.trainer_awake = True
        self.restore_seconds = 0.0

    def get(self, ref: ray.ObjectRef, what: str, *, serve_restores: bool = False) -> Any:
        """The value of the manager's call `ref` (`what` names it in the error of a stopped manager).

        Args:
            ref: the call's ref.
            what: e.g. `"the rollout manager's generate call"`.
            serve_restores: restarted engines get their weights while it waits (`restore_waiting`, with
                `--use-fault-tolerance`).
        """
        every = self.restore_waiting if serve_restores and self.enabled else None
        if self._watched_get is not None:
            return self._watched_get(ref, what, every_slice=every)
        while every is not None and not ray.wait([ref], timeout=POLL_S)[0]:
            every()
        return ray.get(ref)

    def trained(self, weight_version: int) -> None:
        """The trainer's weights changed: the next push (a regular sync or a restore) is `weight_version`."""
        self.trainer_version = weight_version

    def restore_waiting(self) -> None:
        """Pushes the trainer's weights to restarted engines that wait for them, then lets them serve.

        They are labelled with the version they are: the served one, or the trainer's newer one when it trained
        since the last sync (it holds no copy of the served weights), which the samples of those engines record.
        """
        if not self.enabled or self.weight_version is None:
            return
        urls = self.get(self.manager.engines_awaiting_weights.remote(), "the manager's engines_awaiting_weights")
        if not urls:
            return
        version = max(self.weight_version, self.trainer_version or 0)
        if version != self.weight_version:
            logger.warning(
                "restarted engine(s) %s get the trainer's weights v%s, the others serve v%s until the next sync: the "
                "trainer trained since that push and holds no copy of its weights",
                ", ".join(urls), version, self.weight_version,
            )  # fmt: skip
        t0 = time.perf_counter()
        wake = self.cfg.colocate and self.cfg.offload_train and not self.trainer_awake
        if wake:
            self.trainer.wake_up()  # named_hf_weights needs the trainer's weights on its device
        try:
            self._push(version, urls)
        finally:
            if wake:
                self.trainer.sleep()
        self.restore_seconds += time.perf_counter() - t0
        logger.info(
            "restored weights v%s to %d restarted engine(s) in %.1fs: %s",
            version,
            len(urls),
            time.perf_counter() - t0,
            ", ".join(urls),
        )

    def push(self, weight_version: int) -> dict[str, float]:
        """A regular weight sync to every engine that is up; returns the trainer's `perf/*` metrics.

        Fully async, generation goes on around the push: the manager's health probes hold while it runs
        (`RolloutManager.weights_moving`).
        """
        overlaps = self.overlaps_generation
        if overlaps:
            self.get(self.manager.weights_moving.remote(True), "the rollout manager's weights_moving")
        try:
            if not self.enabled:
                metrics = self.trainer.update_weights(weight_version)
            else:
                urls = self.get(self.manager.live_engine_urls.remote(), "the rollout manager's live_engine_urls")
                metrics = self._push(weight_version, urls)
        finally:
            if overlaps:
                self.get(self.manager.weights_moving.remote(False), "the rollout manager's weights_moving")
        self.weight_version = weight_version
        return metrics

    def _push(self, weight_version: int, urls: list[str]) -> dict[str, float]:
        try:
            metrics = self.trainer.update_weights(weight_version, urls)
            reached = urls
        except Exception as exc:  # noqa: BLE001 - only a WeightPushError is handled; the rest propagates
            error = _push_error(exc)
            if error is None:
                raise
            # The others completed the push; the failed ones are restarted and restored like a dead engine.
            logger.error("%s; restarting those engines", error)
            failed = self.manager.engines_failed.remote(list(error.failed), f"weight push failed: {error}")
            self.get(failed, "the rollout manager's engines_failed")
            reached = [u for u in urls if u not in error.failed]
            metrics = {}
        self.get(self.manager.engines_restored.remote(reached), "the rollout manager's engines_restored")
        return metrics
