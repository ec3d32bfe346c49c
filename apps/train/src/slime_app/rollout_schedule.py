"""Where each training step's samples come from: the sync and async (`--async`) rollout schedules.

Sync (default): each step generates its rollout when it asks for it, with the weights the previous step pushed.
Async: rollout N+1 is generated while rollout N trains (one step off-policy), and the engines get new weights only
between generations, every `--update-weights-interval` rollouts. `slime_app.loop.Run.step` is the same for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

__all__ = ["Rollouts"]


class Rollouts:
    """Where a step's samples come from: generated when asked (sync), or one rollout ahead (async).

    Args:
        manager: the `RolloutManager` actor.
        num_rollout: number of rollouts of the run (`--num-rollout`).
        ahead: the async schedule: rollout N+1 starts as soon as rollout N is handed out.
        update_weights_interval: async only: the engines get new weights every this many rollouts.
        get: how a generation is waited on: `get(ref, what) -> value`, serving engine restores meanwhile
            (`slime_app.restore`) and ending when the manager's process stays stopped (`slime_app.actor_watch`);
            None: a plain `ray.get`.
        before_next: async only: called with `rollout_id` once its generation is done and before the next one
            starts drawing prompts (the data cursor of a save: `Run._save_cursor_early`).
    """

    def __init__(
        self,
        manager: Any,
        num_rollout: int,
        *,
        ahead: bool,
        update_weights_interval: int,
        get: Callable[[ray.ObjectRef, str], Any] | None = None,
        before_next: Callable[[int], None] | None = None,
    ):
        self.manager = manager
        self.num_rollout = num_rollout
        self.ahead = ahead
        self.update_weights_interval = update_weights_interval
        self.before_next = before_next
        self.get = get
        self._pending: ray.ObjectRef | None = None  # async: the generation in flight

    @property
    def in_flight(self) -> bool:
        """Whether a generation runs ahead (async) that a default-group call of the manager queues behind."""
        return self._pending is not None

    def take(self, rollout_id: int) -> tuple[list[ray.ObjectRef], dict[str, float]]:
        """Rollout `rollout_id`: per-DP-rank batch refs and its `rollout/*`, `perf/*` metrics.

        Async, the generation of `rollout_id + 1` (if any) is started once `rollout_id`'s is done.
        """
        current = self._pending if self._pending is not None else self.manager.generate.remote(rollout_id)
        generated = self._get(current, rollout_id)
        if not self.ahead:
            return generated
        batch_refs, metrics = generated
        self._pending, next_id = None, rollout_id + 1  # taken: nothing in flight until the next one starts
        if self.before_next is not None:
            self.before_next(rollout_id)
        self._pending = self.manager.generate.remote(next_id) if next_id < self.num_rollout else None
        return batch_refs, metrics

    def _get(self, ref: ray.ObjectRef, rollout_id: int) -> Any:
        if self.get is None:
            return ray.get(ref)
        return self.get(ref, f"the rollout manager's generation of rollout {rollout_id}")

    def weights_due(self, rollout_id: int) -> bool:
        """Whether the engines get the weights trained on `rollout_id`.

        Sync: after every step (the next rollout is generated with them; as in the original's train.py the
        interval does not apply). Async: every `--update-weights-interval` rollouts, and only while another
        generation follows (the last rollout has none to update weights for).
        """
        if not self.ahead:
            return True
        return self._pending is not None and (rollout_id + 1) % self.update_weights_interval == 0

    def settle(self) -> None:
        """Waits for the generation in flight (async), so that a weight update or an eval never interleaves it.

        The generation keeps its data (one step stale); its result is taken by the next `take`.
        """
        if self._pending is None:
            return
        if self.get is not None:
            self.get(self._pending, "the rollout manager's generation ahead")
        else:
            ray.wait([self._pending], num_returns=1)
