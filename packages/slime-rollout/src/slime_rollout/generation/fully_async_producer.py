"""The fully-async rollout's producer: prompt groups generated continuously on the rollout loop.

`FullyAsyncProducer` keeps up to `--sglang-server-concurrency` × engines groups in flight while fewer than that many
finished groups wait (the original's `AsyncRolloutWorker` pool and back-pressure), recycles groups a weight push
aborted (continued with `--partial-rollout`, else restarted), applies the dynamic-sampling filter, and hands finished
groups to `take`, which enforces `--max-weight-staleness`. The rollout function and the checkpointing around it are
`slime_rollout.generation.fully_async`.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

from slime_core.protocols import DataSource
from slime_core.sample import Sample, Status
from slime_rollout.generation.filters import call_dynamic_filter
from slime_rollout.generation.generate import abort_all
from slime_rollout.generation.group_rollout import RolloutState, checked_groups, generate_and_rm_group, num_engines
from slime_rollout.generation.staleness import group_version, staleness_metrics
from slime_rollout.plugins import load_function
from slime_rollout.runtime.deadlines import call_plugin_with_deadline, plugin_bounds
from slime_rollout.runtime.metrics import flatten_groups

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["FullyAsyncProducer"]

_STOP_TIMEOUT_S = 60.0  # abort + drain of the in-flight requests when the producer stops


@dataclasses.dataclass(kw_only=True)
class _Held:
    """One prompt group while the producer holds it.

    Attributes:
        group: the group's samples as generated so far (`n_samples_per_prompt` entries).
        prompt: a copy of the group as drawn from the data source (what a restart or a resume regenerates).
        order: draw order, the group's place in the prompt stream.
        submitted_version: the rollout id the consumer last asked for when the group was (re)submitted; the
            version a group counts as when its samples carry no engine version.
    """

    group: list[Any]
    prompt: list[Sample]
    order: int
    submitted_version: int = 0


class FullyAsyncProducer:
    """Generates prompt groups continuously on the rollout loop; the training rollouts take finished ones.

    Create and use it on the rollout loop (`slime_rollout.runtime.async_utils`); `generate_rollout_fully_async` does.

    Args:
        args: the plugin view; reads `sglang_server_concurrency` (× engines: groups in flight and the most finished
            groups waiting, as the original), `n_samples_per_prompt`, `partial_rollout`,
            `mask_offpolicy_in_partial_rollout`, `dynamic_sampling_filter_path`, `max_weight_staleness` and
            `rollout_batch_size` (`outstanding_limit` with a bound) (+ what generate and rewards read).
        data_source: the prompt source (`get_samples(1)` per new group).
        restored: groups held at the checkpoint this run resumed from (`load_state`), generated first.
        version: the rollout id the first training rollout asks for (the trainer's weight version then).
    """

    def __init__(self, args: SlimeArgs, data_source: DataSource, *, restored: list[list[Sample]], version: int):
        self.args = args
        self.data_source = data_source
        self.capacity = args.sglang_server_concurrency * num_engines(args)
        self.version = version
        self.state = RolloutState.create(args, rollout_id=version)
        self._bound = args.max_weight_staleness
        self._consumer_waiting = True  # the first take's groups come from the weights it is trained with
        path = args.dynamic_sampling_filter_path
        self._filter = load_function(path, flag="--dynamic-sampling-filter-path") if path else None
        self._order = itertools.count()
        self._restored = collections.deque(self._hold(g) for g in restored)
        self._recycled: collections.deque[_Held] = collections.deque()
        self._ready: collections.deque[_Held] = collections.deque()
        self._in_flight: dict[asyncio.Task[list[Any]], _Held] = {}
        self._taken = asyncio.Event()  # the consumer took a group: there may be room to top up
        self._arrived = asyncio.Event()  # a group became ready
        self.counts: collections.Counter[str] = collections.Counter()  # totals since start, see `_drain_counts`
        self._reported: collections.Counter[str] = collections.Counter()
        self._discarded: dict[str, list[list[Any]]] = {"filtered": [], "stale": []}  # since the last take
        self._drops: collections.Counter[str] = collections.Counter()  # dynamic-filter drops since the last take
        self._reward_seconds_reported = 0.0
        self._last_take = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    # ---- producer ------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the producer task on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._produce(), name="fully-async-producer")

    @property
    def outstanding_limit(self) -> int | None:
        """The most groups held (in flight, ready, recycled) before no new prompt is drawn; None without a bound.

        A group is trained at most `--max-weight-staleness` (k) versions after the weights it came from. One drawn
        while a take waits comes from the weights that take is trained with: usable by it and the next k takes,
        (k + 1) batches. One drawn between takes comes from the weights being trained on, already one version
        behind the next take: k batches (none with k = 0: a strictly on-policy producer idles while the trainer
        trains). Drawing more only generates groups that are dropped (one H100 at (k+1) batches between takes:
        a whole batch dropped every other rollout). Recycled groups go regardless.
        """
        if self._bound is None:
            return None
        return (self._bound + int(self._consumer_waiting)) * self.args.rollout_batch_size

    @property
    def num_ready(self) -> int:
        """Finished groups waiting for a training rollout."""
        return len(self._ready)

    @property
    def num_in_flight(self) -> int:
        """Groups being generated."""
        return len(self._in_flight)

    def _hold(self, group: list[Sample]) -> _Held:
        return _Held(group=group, prompt=copy.deepcopy(group), order=next(self._order))

    async def _next(self) -> _Held | None:
        if self._recycled:
            return self._recycled.popleft()
        if self._restored:
            return self._restored.popleft()
        # A custom data source is the user's sync code: bounded by --plugin-timeout-secs, off the loop (called on
        # the loop, one that hung froze the producer and every group in flight with no word).
        what = f"{type(self.data_source).__name__}.get_samples(1) (fully-async producer)"
        groups = await call_plugin_with_deadline(self.data_source.get_samples, 1, what=what, **plugin_bounds(self.args))
        if not groups:
            return None
        groups = checked_groups(groups, what, self.args.n_samples_per_prompt)
        if len(groups) != 1:
            raise ValueError(f"{what} returned {len(groups)} groups, expected 1")
        return self._hold(groups[0])

    async def _top_up(self) -> bool:
        """Submits groups while there is room; returns False when the data source gave none."""
        while len(self._in_flight) < self.capacity and len(self._ready) < self.capacity:
            outstanding = len(self._in_flight) + len(self._ready) + len(self._recycled)
            if not self._recycled and self.outstanding_limit is not None and outstanding >= self.outstanding_limit:
                break
            held = await self._next()
            if held is None:
                return False
            held.submitted_version = self.version
            task = asyncio.get_running_loop().create_task(
                generate_and_rm_group(self.args, held.group, self.state, prompt_position=held.order)
            )
            self._in_flight[task] = held
        return True

    async def _produce(self) -> None:
        try:
            while True:
                if not await self._top_up() and not self._in_flight and not self._ready:
                    raise RuntimeError("fully-async rollout: the data source returned no samples and none is in flight")
                woken = asyncio.ensure_future(self._taken.wait())
                done, _ = await asyncio.wait({*self._in_flight, woken}, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                self._taken.clear()  # the next `_top_up` sees whatever room the consumer made
                for task in sorted(done - {woken}, key=lambda t: self._in_flight[t].order):
                    await self._finish(task, self._in_flight.pop(task))
        finally:
            self._arrived.set()  # a consumer waiting for a group wakes up and sees the failure
            await self._cancel_in_flight()

    async def _finish(self, task: asyncio.Task[list[Any]], held: _Held) -> None:
        held.group = task.result()  # a failed group ends the producer: the next take raises it
        n = self.args.n_samples_per_prompt
        if len(held.group) != n:
            raise ValueError(f"fully-async rollout: group of {len(held.group)} samples, expected {n}")
        if any(s.status is Status.ABORTED for s in flatten_groups([held.group])):
            self._recycle(held)
            return
        if self._filter is not None:
            verdict = await call_dynamic_filter(self.args, self._filter, held.group)
            if not verdict.keep:
                self._drops[verdict.reason or "filtered"] += 1
                self._discarded["filtered"].append(held.group)
                return
        self._ready.append(held)
        self._arrived.set()

    def _recycle(self, held: _Held) -> None:
        """An aborted group goes back to the front: continued (`--partial-rollout`) or restarted from its prompt."""
        fan_out = any(isinstance(item, list) for item in held.group)
        if self.args.partial_rollout and not fan_out:
            for sample in held.group:
                if sample.status is Status.ABORTED and sample.response_length > 0:
                    # The tokens so far came from the weights before the push (masked from the loss with
                    # --mask-offpolicy-in-partial-rollout when the sample continues).
                    sample.metadata["off_policy_tokens"] = sample.response_length
                    sample.metadata.setdefault("start_rollout_id", self.version)
            self.counts["recycled_partial_groups"] += 1
        else:
            held.group = copy.deepcopy(held.prompt)
            self.counts["restarted_groups"] += 1
        self._recycled.append(held)

    async def _cancel_in_flight(self) -> None:
        tasks = list(self._in_flight)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_TIMEOUT_S)

    # ---- consumer ------------------------------------------------------------------------------

    def _raise_if_dead(self) -> None:
        task = self._task
        if task is None or not task.done():
            return
        error = None if task.cancelled() else task.exception()
        raise RuntimeError(f"fully-async rollout: the producer stopped ({error!r})") from error

    async def take(self, rollout_id: int, target: int, bound: int | None) -> tuple[list[list[Any]], dict[str, float]]:
        """Waits for `target` groups at most `bound` versions behind `rollout_id`; returns them and their metrics.

        Args:
            rollout_id: the rollout being generated; the trainer holds weight version `rollout_id` when it trains it.
            target: groups to return (`--rollout-batch-size`).
            bound: `--max-weight-staleness` (None: any staleness is accepted).

        Returns:
            The groups in completion order and `rollout/staleness_*`, `rollout/stale_groups_dropped`
            (this rollout) and `rollout/fully_async/*` counts.

        Raises:
            RuntimeError: the producer died (its exception chained), before or while waiting.
        """
        self._raise_if_dead()
        self.version = self.state.rollout_id = rollout_id
        self._consumer_waiting = True
        self._taken.set()  # the producer may draw for this take now (`outstanding_limit`)
        try:
            return await self._take(rollout_id, target, bound)
        finally:
            self._consumer_waiting = False

    async def _take(self, rollout_id: int, target: int, bound: int | None) -> tuple[list[list[Any]], dict[str, float]]:
        mask_offpolicy = self.args.partial_rollout and self.args.mask_offpolicy_in_partial_rollout
        accepted: list[list[Any]] = []
        staleness: list[int] = []
        while len(accepted) < target:
            while self._ready and len(accepted) < target:
                held = self._ready.popleft()
                self._taken.set()
                version = group_version(held.group, mask_offpolicy=mask_offpolicy)
                if version is None:
                    version = held.submitted_version
                    self.counts["unversioned_groups"] += 1
                behind = rollout_id - version
                if bound is not None and behind > bound:
                    self.counts["stale_groups_dropped"] += 1
                    self._discarded["stale"].append(held.group)
                    logger.info(
                        "rollout %d: dropped prompt group %s of version %d (%d behind > --max-weight-staleness %d)",
                        rollout_id, flatten_groups([held.group])[0].group_index, version, behind, bound,
                    )  # fmt: skip
                    continue
                accepted.append(held.group)
                staleness.extend([behind] * len(flatten_groups([held.group])))
            if len(accepted) < target:
                self._raise_if_dead()
                self._arrived.clear()
                await self._arrival_or_death()
                self._raise_if_dead()
        metrics = staleness_metrics(staleness)
        metrics.update(self._drain_counts())
        return accepted, metrics

    async def _arrival_or_death(self) -> None:
        assert self._task is not None
        waiter = asyncio.ensure_future(self._arrived.wait())
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()

    def _drain_counts(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key in ("stale_groups_dropped", "recycled_partial_groups", "restarted_groups", "unversioned_groups"):
            out[f"rollout/fully_async/{key}"] = float(self.counts[key] - self._reported[key])
            out[f"rollout/fully_async/{key}_total"] = float(self.counts[key])
        self._reported = collections.Counter(self.counts)
        out["rollout/stale_groups_dropped"] = out["rollout/fully_async/stale_groups_dropped"]
        out["rollout/fully_async/ready_groups"] = float(len(self._ready))
        out["rollout/fully_async/in_flight_groups"] = float(len(self._in_flight))
        return out

    def take_discarded(self) -> tuple[dict[str, list[list[Any]]], collections.Counter[str], float, float]:
        """Groups discarded, filter drops, reward seconds and wall seconds since the previous call (one per rollout)."""
        discarded, self._discarded = self._discarded, {"filtered": [], "stale": []}
        drops, self._drops = self._drops, collections.Counter()
        reward = self.state.reward_seconds - self._reward_seconds_reported
        self._reward_seconds_reported = self.state.reward_seconds
        now = time.perf_counter()
        wall, self._last_take = now - self._last_take, now
        return discarded, drops, reward, wall

    # ---- checkpoint and shutdown ---------------------------------------------------------------

    def held_prompts(self) -> list[list[Sample]]:
        """Every group the producer holds (recycled, restored, in flight, ready) as drawn, in draw order."""
        held = [*self._recycled, *self._restored, *self._in_flight.values(), *self._ready]
        return [copy.deepcopy(h.prompt) for h in sorted(held, key=lambda h: h.order)]

    async def stop(self) -> None:
        """Stops the producer, aborts its requests on the engines and waits for its tasks (bounded)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=_STOP_TIMEOUT_S)
        try:
            await asyncio.wait_for(abort_all(self.args), timeout=_STOP_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - engines may be gone at teardown; the run is over either way
            logger.warning("fully-async rollout: aborting the engines' requests at stop failed: %r", e)
