"""The fully-async rollout's producer: prompt groups generated continuously on the rollout loop.

`FullyAsyncProducer` keeps up to `--sglang-server-concurrency` × engines groups in flight while fewer than that many
finished groups wait (the original's `AsyncRolloutWorker` pool and back-pressure), recycles groups a weight push
aborted (continued with `--partial-rollout`, else restarted), applies the dynamic-sampling filter, and hands finished
groups to `take`, which enforces `--max-weight-staleness`. The rollout function and the checkpointing around it are
`slime_rollout.generation.fully_async`.

With a bound K the producer paces itself so that nothing it generates is dropped (issue 30 item 1): a group of
version v can be trained by takes v .. v + K (its *deadline* is take v + K). The producer holds at most K batches
that later takes can still use (`outstanding_limit`), and a take accepts ready groups earliest deadline first,
waiting for an older group still in flight (one a weight push sent back to be continued) rather than filling its
place with a fresher one that a later take could still use. A group drawn now is generated under the version the
engines hold, which each take reads from them (`_read_engine_version`): the sync loop pushes version r before take
r, while `--async` runs take r on version r - 1 (the push of r waits for that take), so there the producer draws no
batch ahead at K = 1 (one would be two versions old at the next take).
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
from slime_rollout.generation.generate import abort_all, weight_versions
from slime_rollout.generation.group_rollout import RolloutState, checked_groups, generate_and_rm_group, num_engines
from slime_rollout.generation.staleness import (
    fits_deadlines,
    group_version,
    parse_version,
    past_bound,
    sample_version,
    staleness_metrics,
    version_floor,
)
from slime_rollout.plugins import load_function
from slime_rollout.runtime.deadlines import call_plugin_with_deadline, plugin_bounds
from slime_rollout.runtime.metrics import flatten_groups

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["FullyAsyncProducer"]

_STOP_TIMEOUT_S = 60.0  # abort + drain of the in-flight requests when the producer stops
_VERSION_TIMEOUT_S = 10.0  # reading the engines' weight version at a take (`_read_engine_version`)


@dataclasses.dataclass(kw_only=True)
class _Held:
    """One prompt group while the producer holds it.

    Attributes:
        group: the group's samples as generated so far (`n_samples_per_prompt` entries).
        prompt: a copy of the group as drawn from the data source (what a restart or a resume regenerates).
        order: draw order, the group's place in the prompt stream.
        submitted_version: the engines' weight version read at the latest take when the group was (re)submitted
            (`FullyAsyncProducer.engine_version`): a lower bound on the version of every generate call from then on
            (pushes only raise it), and the version a group counts as when its samples carry no engine version.
        version: once ready, the version the group counts as (`staleness.group_version`, else `submitted_version`).
    """

    group: list[Any]
    prompt: list[Sample]
    order: int
    submitted_version: int = 0
    version: int = 0


class FullyAsyncProducer:
    """Generates prompt groups continuously on the rollout loop; the training rollouts take finished ones.

    Create and use it on the rollout loop (`slime_rollout.runtime.async_utils`); `generate_rollout_fully_async` does.

    Args:
        args: the plugin view; reads `sglang_server_concurrency` (× engines: groups in flight and the most finished
            groups waiting, as the original), `n_samples_per_prompt`, `partial_rollout`,
            `mask_offpolicy_in_partial_rollout`, `dynamic_sampling_filter_path`, `dynamic_sampling_max_empty_rounds`
            and `over_sampling_batch_size` (their product: the most groups in a row the filter may drop),
            `max_weight_staleness` and `rollout_batch_size` (`outstanding_limit` with a bound) (+ what generate and
            rewards read).
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
        self._mask_offpolicy = args.partial_rollout and args.mask_offpolicy_in_partial_rollout
        self._need = 0  # groups the waiting take still needs (0 between takes)
        self.engine_version = version  # the engines' version at the latest take; at start the trainer's first push
        self._version_warned = False
        path = args.dynamic_sampling_filter_path
        self._filter = load_function(path, flag="--dynamic-sampling-filter-path") if path else None
        # --dynamic-sampling-max-empty-rounds as the sync rollout counts it: that many draws of
        # --over-sampling-batch-size groups, here in a row, each dropped by the filter (`_count_drop`).
        self._max_dropped = args.dynamic_sampling_max_empty_rounds * args.over_sampling_batch_size
        self._dropped_in_a_row = 0
        self._aborted_in_a_row = 0  # groups restarted in a row (`_count_abort`)
        self._order = itertools.count()
        self._restored = collections.deque(self._hold(g) for g in restored)
        self._recycled: collections.deque[_Held] = collections.deque()
        self._ready: collections.deque[_Held] = collections.deque()
        self._in_flight: dict[asyncio.Task[list[Any]], _Held] = {}
        self._judged: list[_Held] = []  # finished groups the dynamic-sampling filter is judging
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

        What the waiting take still needs plus (e + K - r) batches, where r is the latest take's rollout id, e the
        engines' version read at it (`engine_version`, at most r) and K `--max-weight-staleness`: a group drawn now
        is at least version e, so it can be trained by takes up to e + K, which leaves the waiting take's remaining
        places and the e + K - r takes after r. The sync loop pushes version r before take r (e = r): K batches
        ahead, none at K = 0 (a strictly on-policy producer idles while the trainer trains). `--async` runs take r
        on version r - 1 (e = r - 1): K - 1 batches ahead; one more was two versions old at the next take and
        dropped, a whole batch every take at K = 1. Every group already held is at most as new and goes first.
        The take's accepted groups leave the count as they leave its need: a
        take that counted only the groups held replaced each one it accepted and left (K + 1) batches of its own
        version, one of which was two versions old at the take after next (one H200, K = 1: 20 of 32 dropped
        every other rollout). Recycled groups go regardless.
        """
        if self._bound is None:
            return None
        ahead = max(0, self.engine_version + self._bound - self.version)
        return ahead * self.args.rollout_batch_size + self._need

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
        """Submits groups while there is room; returns False when the data source gave none.

        Recycled groups go regardless of the ready count: a take may be waiting for one of them (older than the
        groups ready), and held back behind a full ready queue with nothing in flight, neither moved again.
        """
        while len(self._in_flight) < self.capacity and (self._recycled or len(self._ready) < self.capacity):
            outstanding = len(self._in_flight) + len(self._ready) + len(self._recycled)
            if not self._recycled and self.outstanding_limit is not None and outstanding >= self.outstanding_limit:
                break
            held = await self._next()
            if held is None:
                return False
            held.submitted_version = self.engine_version
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
                try:
                    done, _ = await asyncio.wait({*self._in_flight, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:  # also when `stop` cancels this task here: a waiter left pending leaked at loop close
                    await _cancelled(woken)
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
            self._count_abort()
            self._recycle(held)
            return
        self._aborted_in_a_row = 0
        if self._filter is not None:
            # Held while the filter runs (a worker thread): a take or a checkpoint in the meantime still sees it.
            self._judged.append(held)
            try:
                verdict = await call_dynamic_filter(self.args, self._filter, held.group)
            finally:
                self._judged.remove(held)
            if not verdict.keep:
                self._drops[verdict.reason or "filtered"] += 1
                self._discarded["filtered"].append(held.group)
                self._arrived.set()  # a take holding a place for it decides again
                self._count_drop()
                return
            self._dropped_in_a_row = 0
        version = group_version(held.group, mask_offpolicy=self._mask_offpolicy)
        if version is None:
            self.counts["unversioned_groups"] += 1
        held.version = held.submitted_version if version is None else version
        self._ready.append(held)
        self._arrived.set()

    def _count_drop(self) -> None:
        """Counts a group the filter dropped; too many in a row end the producer (the next take raises it).

        A filter that drops every group (every reward equal: a broken reward function) had the producer draw prompt
        after prompt, epoch after epoch, while the take waited up to --rollout-timeout-secs with no word; the sync
        rollout stops after --dynamic-sampling-max-empty-rounds rounds that keep nothing.

        Raises:
            RuntimeError: `_max_dropped` groups in a row dropped (names the filter, the reasons and the flag).
        """
        self._dropped_in_a_row += 1
        if self._dropped_in_a_row < self._max_dropped:
            return
        reasons = ", ".join(f"{reason}: {n}" for reason, n in self._drops.most_common())
        raise RuntimeError(
            f"fully-async rollout: {self._dropped_in_a_row} groups in a row were dropped by "
            f"--dynamic-sampling-filter-path {self.args.dynamic_sampling_filter_path} and none kept ({reasons}): "
            "check the reward function and the filter; or raise --dynamic-sampling-max-empty-rounds "
            f"({self.args.dynamic_sampling_max_empty_rounds} rounds of --over-sampling-batch-size "
            f"{self.args.over_sampling_batch_size} groups)"
        )

    def _count_abort(self) -> None:
        """Counts a group that came back ABORTED; too many in a row, none finishing, end the producer.

        Unbounded, a generate function that gives up on every sample (returns it ABORTED) would have its groups
        restarted forever while the take waits up to --rollout-timeout-secs, with no word. The count starts again at
        each take (one weight push at most in between, aborting at most the groups in flight, `capacity`), so the
        bound is that many beyond the filter's (`_max_dropped`).

        Raises:
            RuntimeError: `_max_dropped + capacity` groups in a row aborted (names the generate function and the flag).
        """
        self._aborted_in_a_row += 1
        if self._aborted_in_a_row < self._max_dropped + self.capacity:
            return
        source = self.args.custom_generate_function_path or "the default generate function"
        raise RuntimeError(
            f"fully-async rollout: {self._aborted_in_a_row} groups in a row came back with ABORTED samples and none "
            f"finished (from {source}, or the engines abort its requests); an aborted group is restarted, not "
            "trained on: check the generate function; or raise --dynamic-sampling-max-empty-rounds "
            f"({self.args.dynamic_sampling_max_empty_rounds} rounds of --over-sampling-batch-size "
            f"{self.args.over_sampling_batch_size} groups, beyond the {self.capacity} groups in flight a weight push "
            "can abort)"
        )

    def _recycle(self, held: _Held) -> None:
        """An aborted group goes back to the front: continued (`--partial-rollout`) or restarted from its prompt."""
        fan_out = any(isinstance(item, list) for item in held.group)
        if self.args.partial_rollout and not fan_out:
            for sample in held.group:
                if sample.status is Status.ABORTED and sample.response_length > 0:
                    # The tokens so far came from the weights before the push (masked from the loss with
                    # --mask-offpolicy-in-partial-rollout when the sample continues).
                    sample.metadata["off_policy_tokens"] = sample.response_length
                    sample.metadata.setdefault("start_rollout_id", _start_version(sample, held))
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

        Without a bound the groups are taken in completion order. With one, a ready group more than `bound` versions
        behind is dropped, and the others are taken earliest deadline first (`_pick`): the oldest, waiting for an
        older group still in flight rather than taking a fresher one in its place.

        Args:
            rollout_id: the rollout being generated; the trainer holds weight version `rollout_id` when it trains it.
            target: groups to return (`--rollout-batch-size`).
            bound: `--max-weight-staleness` (None: any staleness is accepted).

        Returns:
            The groups in the order taken, and these metrics:
            `rollout/staleness_{mean,min,max,p50,p90}`: over the returned samples, `rollout_id` minus the version of
            the sample's group (`staleness.group_version`: its oldest generate call, or with
            `--mask-offpolicy-in-partial-rollout` the oldest trainable one), so every sample of a group counts its
            group's value; `rollout/stale_groups_dropped`: groups this take dropped as more than `bound` versions
            behind (generated, scored, never trained; their tokens are `goodput/tokens_stale`), and
            `rollout/fully_async/*`: that count, recycled, restarted and unversioned groups and engine-version
            fallbacks (`_read_engine_version`) since the previous take (`*_total`: since the producer started), and
            the groups ready and in flight after this take.

        Raises:
            RuntimeError: the producer died (its exception chained), before or while waiting.
        """
        self._raise_if_dead()
        # Before the need is set: the producer draws for this take by the version read.
        self.engine_version = min(rollout_id, await self._read_engine_version())
        self.version = self.state.rollout_id = rollout_id
        self._aborted_in_a_row = 0  # a take follows at most one weight push, which aborts at most `capacity` groups
        self._need = target
        self._taken.set()  # the producer may draw for this take now (`outstanding_limit`)
        try:
            return await self._take(rollout_id, target, bound)
        finally:
            self._need = 0

    async def _read_engine_version(self) -> int:
        """The oldest weight version among the engines (what a group drawn now is generated under, at least).

        Falls back to the last version read (at start: the trainer's first push, the producer's `version`) when an
        engine does not answer within `_VERSION_TIMEOUT_S`, fails, or reports no integer version (SGLang's
        "default" before any push, a push's "<v>-incomplete"). That is a lower bound (pushes only raise the
        version), so the producer then draws no more than it should: fewer groups ahead of the trainer, none
        dropped for it. Warns once per producer; `rollout/fully_async/engine_version_fallbacks` counts each.
        """
        try:
            replies = await asyncio.wait_for(weight_versions(self.args), _VERSION_TIMEOUT_S)
            versions = [parse_version(v) for v in replies]
            if not versions or None in versions:
                raise ValueError(f"no integer weight version in {replies!r}")
            return min(v for v in versions if v is not None)
        except Exception as e:  # noqa: BLE001 - any failure has the same conservative answer, counted and logged
            self.counts["engine_version_fallbacks"] += 1
            if not self._version_warned:
                self._version_warned = True
                logger.warning(
                    "fully-async rollout: could not read the engines' weight version (%r, within %.0fs); pacing "
                    "--max-weight-staleness by the last version read, %d, until it can (fewer groups drawn ahead; "
                    "counted in rollout/fully_async/engine_version_fallbacks, warned once)",
                    e, _VERSION_TIMEOUT_S, self.engine_version,
                )  # fmt: skip
            return self.engine_version

    async def _take(self, rollout_id: int, target: int, bound: int | None) -> tuple[list[list[Any]], dict[str, float]]:
        accepted: list[list[Any]] = []
        staleness: list[int] = []
        while len(accepted) < target:
            self._drop_stale(rollout_id, bound)
            held = self._pick(rollout_id, target - len(accepted), bound)
            if held is not None:
                self._ready.remove(held)
                self._need -= 1  # leaves the held count and the need together: no replacement is drawn
                accepted.append(held.group)
                staleness.extend([rollout_id - held.version] * len(flatten_groups([held.group])))
                continue
            self._raise_if_dead()
            self._arrived.clear()
            await self._arrival_or_death()
            self._raise_if_dead()
        metrics = staleness_metrics(staleness)
        metrics.update(self._drain_counts())
        return accepted, metrics

    def _drop_stale(self, rollout_id: int, bound: int | None) -> None:
        """Drops (and counts, and logs) the ready groups more than `bound` versions behind `rollout_id`."""
        if bound is None:
            return
        for held in [h for h in self._ready if rollout_id - h.version > bound]:
            self._ready.remove(held)
            self.counts["stale_groups_dropped"] += 1
            self._discarded["stale"].append(held.group)
            self._taken.set()  # its place is free: the producer may draw a replacement
            logger.info(
                "rollout %d: dropped prompt group %s of version %d (%d behind > --max-weight-staleness %d)",
                rollout_id, flatten_groups([held.group])[0].group_index, held.version, rollout_id - held.version, bound,
            )  # fmt: skip

    def _pick(self, rollout_id: int, places: int, bound: int | None) -> _Held | None:
        """The ready group the take accepts next, or None to wait for a group in flight.

        A group of version v can go to takes v .. v + bound (its deadline). Earliest deadline first: the oldest
        ready group (ties: the first finished) is taken unless a group still being generated is older and would
        then find no place by its deadline (this take has `places` left, each later take `--rollout-batch-size`).
        Taking the fresher group instead left the older one, one version behind, to the next take, where it was
        two behind and dropped (groups a weight push sent back to be continued finish after fresh short ones). A group
        already too stale for this take (`staleness.past_bound`) holds no place: it is dropped when it finishes.
        """
        if not self._ready:
            return None
        if bound is None:
            return self._ready[0]
        best = min(self._ready, key=lambda h: h.version)
        held = (*self._in_flight.values(), *self._recycled, *self._judged)
        # A group that already counts as too stale for this take is dropped when it finishes: no place is kept for it.
        mask = self._mask_offpolicy
        pending = [
            version_floor(h.group, h.submitted_version, mask_offpolicy=mask)
            for h in held
            if not past_bound(h.group, rollout_id, bound, mask_offpolicy=mask)
        ]
        if not pending or best.version <= min(pending):
            return best
        deadlines = sorted(v + bound for v in [*(h.version for h in self._ready if h is not best), *pending])
        return best if fits_deadlines(deadlines, rollout_id, places - 1, self.args.rollout_batch_size) else None

    async def _arrival_or_death(self) -> None:
        assert self._task is not None
        waiter = asyncio.ensure_future(self._arrived.wait())
        try:
            await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # a cancelled take leaves no waiter behind
            await _cancelled(waiter)

    def _drain_counts(self) -> dict[str, float]:
        out: dict[str, float] = {}
        keys = ("stale_groups_dropped", "recycled_partial_groups", "restarted_groups", "unversioned_groups",
                "engine_version_fallbacks")  # fmt: skip
        for key in keys:
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
        """Every group the producer holds (recycled, restored, in flight, being filtered, ready) as drawn, in order."""
        held = [*self._recycled, *self._restored, *self._in_flight.values(), *self._judged, *self._ready]
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


def _start_version(sample: Sample, held: _Held) -> int:
    """`metadata["start_rollout_id"]` of a partial sample: the weight version its first tokens came from.

    The original stamps the rollout id the sample started in, which there is also the weight version it was
    generated under (rollout r generates on version r). Here a group may start under an older version than the
    latest take's id (drawn ahead, or with `--async`), so the stamp is the engines' version as staleness counts it
    (`staleness.sample_version`: the first generate call's), else the version read when the group was submitted.
    """
    version = sample_version(sample)
    return held.submitted_version if version is None else version


async def _cancelled(task: asyncio.Future[Any]) -> None:
    """Cancels a helper waiter (an `Event.wait()`) and waits until it is done.

    One left pending was reported as "Task was destroyed but it is pending!" when the loop closed.
    """
    task.cancel()
    await asyncio.wait({task})  # returns, not raises, when `task` ends cancelled
