"""The fully-async producer's pacing under `--max-weight-staleness 1`: no group is generated only to be dropped.

Issue 30 item 1. On one H200 (qwen3-0.6b, 32 prompts x 8, trainer and engine on one GPU, sync loop, bound 1) the
takes dropped 0, 0, 20, 0 groups: one take in two found ~a batch two versions old. Two causes, each reproduced
here with an engine whose requests finish only when the test lets them (no timing):

- While a take waited, the producer topped up to (K + 1) batches *outstanding*, not counting the groups the take had
  already accepted: each group the take accepted was replaced, so a take that received its groups one by one left
  up to (K + 1) batches of its own version behind. The next take used one batch; the rest was two versions old at
  the take after (`test_fast_generation_...`: the H200 pattern).
- A take accepted groups in completion order: fresh groups drawn while it waited, finishing before the groups a
  weight push had sent back for continuation (`--partial-rollout`), took their places; the continued groups, one
  version old, were two versions old at the next take (`test_groups_continued_after_a_push_...`).

`test_fully_async.py` holds the drop-counting tests against the reference engine.
"""

import asyncio
import logging
import threading

import pytest
from slime_rollout_fakes import ListDataSource
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Status
from slime_rollout.generation import fully_async_producer
from slime_rollout.generation.fully_async_producer import FullyAsyncProducer

A = ord("A")
BATCH = 4  # --rollout-batch-size
WAIT_S = 30.0  # bounds every wait of a broken test (nothing here is timed: the test decides when requests finish)
FULLY_ASYNC = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"


class GateEngine:
    """A scripted engine (the `RolloutClient` subset generate uses) whose requests finish when the test lets them.

    A request for prompt `p` (`input_ids[0]`) emits one token "A", then waits until `finishes(p)` is true, then
    emits the rest of its `length` tokens and stops; a weight push or `abort_all` ends it first with finish reason
    abort and the tokens so far (a continuation sends prompt + those tokens back). Replies carry the engine's weight
    version (`meta_info.weight_version`, an integer string as the trainer's pushes set).
    """

    def __init__(self, finishes, length: int = 3):
        self.finishes = finishes
        self.length = length
        self.version = 0
        self.finished: set[int] = set()  # prompts with a request that stopped (not aborted)
        self.running = 0
        self.blocked = 0  # requests waiting for `finishes`
        self._paused = False
        self._epoch = 0  # bumped by an abort: requests started before it end
        self._event = asyncio.Event()

    def changed(self) -> None:
        """Wakes waiting requests to re-read `finishes`, the pause and the abort epoch."""
        self._event.set()
        self._event = asyncio.Event()

    async def _wait_change(self) -> None:
        await self._event.wait()

    async def generate(self, payload):
        ids = payload["input_ids"]
        prompt, already = ids[0], len(ids) - 1
        budget = payload["sampling_params"]["max_new_tokens"]
        while self._paused:  # a push in progress: the request waits for the new weights, as SGLang's paused engine
            await self._wait_change()
        version, epoch = self.version, self._epoch
        self.running += 1
        out, finish = [], None
        try:
            while finish is None:
                await asyncio.sleep(0)
                if self._epoch != epoch:
                    finish = {"type": "abort"}
                elif already + len(out) >= 1 and not self.finishes(prompt):
                    self.blocked += 1
                    try:
                        await self._wait_change()
                    finally:
                        self.blocked -= 1
                else:
                    out.append(A)
                    if already + len(out) >= self.length:
                        finish = {"type": "stop", "matched": A}
                    elif len(out) >= budget:
                        finish = {"type": "length", "length": budget}
        finally:
            self.running -= 1
            self.changed()
        if finish["type"] != "abort":
            self.finished.add(prompt)
        meta = {"output_token_logprobs": [[-0.1, t, None] for t in out], "finish_reason": finish,
                "weight_version": str(version), "prompt_tokens": len(ids), "completion_tokens": len(out)}  # fmt: skip
        return {"text": "A" * len(out), "output_ids": out, "meta_info": meta}

    async def get_weight_versions(self):
        """`weight_version` of every engine (one here): the latest push's, as the rollout client answers."""
        return [str(self.version)]

    async def abort_all(self):
        self._epoch += 1
        self.changed()
        while self.running:
            await self._wait_change()

    async def push(self, version: int) -> None:
        """A weight sync: pause, abort the running requests (they reply with their tokens), new version, continue."""
        self._paused = True
        await self.abort_all()
        self.version = version
        self._paused = False
        self.changed()


async def until(condition, what: str, timeout_s: float = WAIT_S) -> None:
    """Polls `condition()` on the loop until it holds (the bound only stops a broken test from hanging)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.002)


def idle(producer: FullyAsyncProducer):
    """Nothing in flight and as many groups held as the bound lets it hold: it draws nothing more until a take."""
    return lambda: producer.num_in_flight == 0 and producer.num_ready >= producer.outstanding_limit


def _producer(engine, use_client, **kw) -> FullyAsyncProducer:
    use_client(engine)
    args = _args(rollout_batch_size=BATCH, n_samples_per_prompt=2, max_weight_staleness=1, partial_rollout=True,
                 rollout_function_path=FULLY_ASYNC, **kw)  # fmt: skip
    producer = FullyAsyncProducer(args, ListDataSource(n=2), restored=[], version=0)
    producer.start()
    return producer


async def test_fast_generation_with_a_take_that_receives_groups_one_by_one_drops_nothing(use_client):
    released: set[int] = set()
    everything = [False]  # generation faster than training: every request finishes at once
    engine = GateEngine(lambda p: everything[0] or p in released)
    producer = _producer(engine, use_client)
    dropped, staleness = [], []
    try:
        # Rollout 0: the groups finish one at a time while the take waits (the first rollout on a GPU: the engine
        # warms up while the first groups come back).
        take = asyncio.ensure_future(producer.take(0, BATCH, 1))
        await until(lambda: producer.num_in_flight == 2 * BATCH, "the first draws")  # this take's and the next's
        for prompt in range(BATCH):
            released.add(prompt)
            engine.changed()
            await until(lambda n=prompt + 1: take.done() or len(engine.finished) == n and producer.num_ready == 0,
                        f"group {prompt} taken")  # fmt: skip
        groups, m = await asyncio.wait_for(take, WAIT_S)
        assert sorted(g[0].group_index for g in groups) == list(range(BATCH))
        held_after_first_take = producer.num_in_flight
        dropped.append(m["rollout/stale_groups_dropped"])
        staleness.append((m["rollout/staleness_min"], m["rollout/staleness_max"]))
        everything[0] = True
        engine.changed()
        for rollout_id in range(1, 5):
            await until(idle(producer), f"the producer idle before push {rollout_id}")  # the trainer is slower
            await engine.push(rollout_id)
            groups, m = await asyncio.wait_for(producer.take(rollout_id, BATCH, 1), WAIT_S)
            assert len(groups) == BATCH
            dropped.append(m["rollout/stale_groups_dropped"])
            staleness.append((m["rollout/staleness_min"], m["rollout/staleness_max"]))
        assert dropped == [0.0] * 5, dropped  # was [0, 0, 3, 0, 1]: the H200's 0, 0, 20, 0 at 4 groups a batch
        # Each take trains the batch drawn while the previous one trained (one behind).
        assert staleness == [(0.0, 0.0)] + [(1.0, 1.0)] * 4
        assert m["rollout/fully_async/stale_groups_dropped_total"] == 0.0
        # The first take left the next take's batch in flight, no more (it was 7 of (K + 1) x 4 = 8: each group
        # the waiting take accepted was replaced at once).
        assert held_after_first_take == BATCH
    finally:
        await producer.stop()


async def test_groups_continued_after_a_push_go_before_fresher_ones(use_client):
    # Even prompts answer at once; odd ones are long: they wait for the test, until `long_done` passes them.
    long_done = [-1]
    engine = GateEngine(lambda p: p % 2 == 0 or p <= long_done[0])
    producer = _producer(engine, use_client)

    def settled():  # every group still in flight is a long one waiting at the engine; no draw is due
        held = producer.num_in_flight + producer.num_ready
        return engine.blocked == engine.running == 2 * producer.num_in_flight and held >= producer.outstanding_limit

    per_take = []
    try:
        groups, m = await asyncio.wait_for(producer.take(0, BATCH, 1), WAIT_S)
        assert len(groups) == BATCH
        per_take.append((m["rollout/stale_groups_dropped"], m["rollout/staleness_min"], m["rollout/staleness_max"]))
        for rollout_id in range(1, 5):
            # The trainer pushes while the long groups are mid-answer: they come back aborted and continue under
            # the new weights, tagged with both versions (the group counts by the older one, one behind now).
            await until(settled, f"the long groups waiting before push {rollout_id}")
            drawn = producer.data_source.next_prompt  # prompts 0 .. drawn - 1 came before the push
            await engine.push(rollout_id)
            take = asyncio.ensure_future(producer.take(rollout_id, BATCH, 1))

            # Groups drawn while the take waits answer first: their even prompts.
            def fresh_answered(take=take, drawn=drawn):
                fresh_even = {p for p in engine.finished if p >= drawn and p % 2 == 0}
                return take.done() or len(fresh_even) >= 2 and settled()

            await until(fresh_answered, f"fresh groups answered before the continued ones (rollout {rollout_id})")
            long_done[0] = drawn - 1  # now the continued groups finish
            engine.changed()
            groups, m = await asyncio.wait_for(take, WAIT_S)
            per_take.append((m["rollout/stale_groups_dropped"], m["rollout/staleness_min"],
                             m["rollout/staleness_max"]))  # fmt: skip
            # The scenario is the one meant: this take trained groups continued across the push.
            assert any(len(s.weight_versions) == 2 for g in groups for s in g), rollout_id
        # Every take trained the groups one version behind first; nothing was left to become two behind. Was (drops,
        # min, max): (3, 0, 1), (3, 0, 0), (4, 0, 0) at rollouts 2-4 (fresh groups took the continued groups'
        # places, and the producer replaced each accepted group); with only the replacement fixed, 2, 1, 2 dropped.
        assert per_take == [(0.0, 0.0, 0.0)] + [(0.0, 1.0, 1.0)] * 4, per_take
        assert m["rollout/fully_async/recycled_partial_groups_total"] >= 2 * 4
    finally:
        await producer.stop()


async def test_bound_zero_generates_each_batch_under_the_weights_it_is_trained_with(use_client):
    engine = GateEngine(lambda p: True)
    use_client(engine)
    args = _args(rollout_batch_size=BATCH, n_samples_per_prompt=2, max_weight_staleness=0, partial_rollout=True,
                 rollout_function_path=FULLY_ASYNC)  # fmt: skip
    producer = FullyAsyncProducer(args, ListDataSource(n=2), restored=[], version=0)
    producer.start()
    try:
        for rollout_id in range(3):
            groups, m = await asyncio.wait_for(producer.take(rollout_id, BATCH, 0), WAIT_S)
            assert len(groups) == BATCH and m["rollout/staleness_max"] == 0.0
            assert m["rollout/stale_groups_dropped"] == 0.0
            # Between takes it draws nothing: a group drawn now would be one behind the next take.
            assert producer.outstanding_limit == 0
            assert (producer.num_in_flight, producer.num_ready) == (0, 0)
            await engine.push(rollout_id + 1)
        assert producer.data_source.next_prompt == 3 * BATCH  # not one prompt more than trained
    finally:
        await producer.stop()


_JUDGING, _VERDICT = threading.Event(), threading.Event()


def gated_filter(args, samples):
    """Test dynamic-sampling filter: keeps every group, once the test lets it answer."""
    _JUDGING.set()
    _VERDICT.wait(WAIT_S)
    return True


async def test_a_group_the_filter_is_judging_is_held_by_a_checkpoint(use_client):
    _JUDGING.clear()
    _VERDICT.clear()
    producer = _producer(
        GateEngine(lambda p: True), use_client, dynamic_sampling_filter_path=f"{__name__}.gated_filter"
    )
    take = asyncio.ensure_future(producer.take(0, BATCH, 1))
    try:
        await until(_JUDGING.is_set, "the filter judging a group")
        # A checkpoint now (`save_state`) holds every prompt drawn: none is trained yet. The group being judged was
        # in none of the producer's queues (finished, not ready yet): a resume lost its prompt.
        held = sorted(g[0].group_index for g in producer.held_prompts())
        assert held == list(range(producer.data_source.next_prompt))
        _VERDICT.set()
        groups, m = await asyncio.wait_for(take, WAIT_S)
        assert len(groups) == BATCH and m["rollout/stale_groups_dropped"] == 0.0
    finally:
        _VERDICT.set()
        await producer.stop()


async def _one_step_async_takes(producer, engine, num_rollout: int) -> list[tuple[float, float, float]]:
    """Takes rollouts 0 .. num_rollout - 1 in `--async`'s order (`slime_app.rollout_schedule.Rollouts`, `ahead`).

    Rollout r + 1 is generated while rollout r trains, on the weights the engines hold then (version r); the push of
    version r + 1 waits for that generation. So: take 0 and take 1 on version 0, push 1, take 2 on version 1, push 2,
    ... The trainer is slower than generation: before each push the producer has drawn all it would.
    Returns (groups dropped, staleness min, staleness max) per take.
    """
    per_take = []
    for rollout_id in range(num_rollout):
        groups, m = await asyncio.wait_for(producer.take(rollout_id, BATCH, 1), WAIT_S)
        assert len(groups) == BATCH
        per_take.append((m["rollout/stale_groups_dropped"], m["rollout/staleness_min"], m["rollout/staleness_max"]))
        if rollout_id >= 1:
            await until(idle(producer), f"the producer idle before push {rollout_id}")
            await engine.push(rollout_id)
    return per_take


async def test_one_step_async_loop_at_bound_one_drops_nothing(use_client):
    engine = GateEngine(lambda p: True)
    producer = _producer(engine, use_client)
    try:
        per_take = await _one_step_async_takes(producer, engine, 6)
        # Was [0, 0, 4, 4, 4, 4] drops: the producer counted a group drawn during (or after) take r as version r,
        # drew K batches beyond the take for later takes, and each was two versions old at the next take.
        # Every group is trained one version behind (the engines' version while it was generated), never more.
        assert per_take == [(0.0, 0.0, 0.0)] + [(0.0, 1.0, 1.0)] * 5, per_take
        # Nothing drawn that was not trained: 6 batches, the last take leaves nothing behind.
        assert producer.data_source.next_prompt == 6 * BATCH
    finally:
        await producer.stop()


class MuteEngine(GateEngine):
    """A `GateEngine` whose weight version cannot be read: it never answers, or reports no integer version."""

    def __init__(self, finishes, reply: str | None):
        super().__init__(finishes)
        self.reply = reply

    async def get_weight_versions(self):
        if self.reply is None:
            await asyncio.Event().wait()  # never answers: the producer's bounded wait gives up
        return [self.reply]


@pytest.mark.parametrize("reply", [None, "default"])
async def test_an_engine_version_that_cannot_be_read_falls_back_to_the_last_known_one(
    use_client, monkeypatch, caplog, reply
):
    monkeypatch.setattr(fully_async_producer, "_VERSION_TIMEOUT_S", 0.01)
    engine = MuteEngine(lambda p: True, reply)
    producer = _producer(engine, use_client)
    try:
        with caplog.at_level(logging.WARNING, logger=fully_async_producer.__name__):
            per_take = await _one_step_async_takes(producer, engine, 5)
        # The fallback (the version at start, 0, a lower bound: pushes only raise it) paces as if the engines were
        # never pushed: the producer draws only what the take needs, so nothing is dropped.
        assert [drops for drops, _, _ in per_take] == [0.0] * 5
        warnings = [r for r in caplog.records if "weight version" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert producer.counts["engine_version_fallbacks"] == 5
    finally:
        await producer.stop()


class UntaggedEngine(GateEngine):
    """A `GateEngine` whose replies carry no weight version (a custom engine or generate function that drops it)."""

    async def generate(self, payload):
        reply = await super().generate(payload)
        del reply["meta_info"]["weight_version"]
        return reply


async def test_untagged_groups_count_by_the_engines_version_when_drawn(use_client):
    engine = UntaggedEngine(lambda p: True)
    producer = _producer(engine, use_client)
    try:
        per_take = await _one_step_async_takes(producer, engine, 4)
        # With --async a group drawn for take r is generated on version r - 1: one behind as the trainer sees it.
        # It counted as the latest take's rollout id: the batch drawn after take r (on version r - 1) counted as r,
        # reported one behind at take r + 1 while two behind, over the bound and not dropped (20 groups drawn).
        assert per_take == [(0.0, 0.0, 0.0)] + [(0.0, 1.0, 1.0)] * 3, per_take
        assert producer.counts["unversioned_groups"] == 4 * BATCH  # none drawn that the takes did not train
    finally:
        await producer.stop()


def test_a_recycled_partial_sample_is_stamped_with_the_version_its_tokens_came_from():
    from slime_core.sample import Sample, Status

    args = _args(rollout_batch_size=BATCH, n_samples_per_prompt=2, max_weight_staleness=2, partial_rollout=True,
                 rollout_function_path=FULLY_ASYNC)  # fmt: skip
    producer = FullyAsyncProducer(args, ListDataSource(n=2), restored=[], version=0)
    producer.version = 5  # the latest take's rollout id
    tagged = Sample(index=0, prompt="p", tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1],
                    weight_versions=["3"], status=Status.ABORTED)  # fmt: skip
    untagged = Sample(index=1, prompt="p", tokens=[1, 2], response_length=1, loss_mask=[1], status=Status.ABORTED)
    held = fully_async_producer._Held(group=[tagged, untagged], prompt=[], order=0, submitted_version=4)
    producer._recycle(held)
    # The first tokens came from version 3 (drawn two takes ahead); the untagged one counts by the version read at
    # its submission, as staleness counts it. Both were stamped 5, the take id.
    assert [s.metadata["start_rollout_id"] for s in held.group] == [3, 4]


async def test_stop_leaves_no_task_of_the_producer_pending(use_client):
    engine = GateEngine(lambda p: True)
    producer = _producer(engine, use_client)
    await asyncio.wait_for(producer.take(0, BATCH, 1), WAIT_S)
    # A take cancelled while it waits (a run stopping mid-rollout) must not leave its waiter behind either.
    waiting = asyncio.ensure_future(producer.take(1, 100 * BATCH, None))
    await until(lambda: producer.num_ready == 0 and producer.num_in_flight > 0, "the second take waiting")
    waiting.cancel()
    await asyncio.wait({waiting})
    await producer.stop()
    # The producer's `_taken.wait()` waiter was left pending when `stop` cancelled it mid-wait: "Task was destroyed
    # but it is pending!" when the loop closed.
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert left == [], left


def _held(producer, prompt: int, *, version: int, aborted: bool) -> "fully_async_producer._Held":
    """A group of `prompt`: finished under `version` (ready), or aborted by a push after one token of `version`."""
    from slime_core.sample import Sample, Status

    samples = [Sample(prompt=f"p{prompt}", tokens=[prompt], group_index=prompt, index=2 * prompt + j, label="A")
               for j in range(2)]  # fmt: skip
    held = producer._hold(samples)
    for s in held.group:
        s.append_response_tokens([A], log_probs=[-0.1], text="A", meta_info={"weight_version": str(version)})
        s.status = Status.ABORTED if aborted else Status.COMPLETED
    held.submitted_version = held.version = version
    return held


async def test_a_take_does_not_wait_for_a_recycled_group_already_too_stale(use_client):
    # A group a push sent back twice (first tokens under version 0) can count at most as version 0: at take 2 with
    # bound 1 it is dropped whenever it finishes. The take waited for it (its place "had to be kept"), here forever:
    # its prompt never finishes.
    engine = GateEngine(lambda p: p != 7)
    engine.version = 2
    use_client(engine)
    args = _args(rollout_batch_size=1, n_samples_per_prompt=2, max_weight_staleness=1, partial_rollout=True,
                 rollout_function_path=FULLY_ASYNC)  # fmt: skip
    producer = FullyAsyncProducer(args, ListDataSource(n=2, num_prompts=0), restored=[], version=2)
    producer._ready.append(_held(producer, 0, version=2, aborted=False))
    producer._recycled.append(_held(producer, 7, version=0, aborted=True))
    producer.start()
    try:
        groups, m = await asyncio.wait_for(producer.take(2, 1, 1), WAIT_S)
        assert [g[0].group_index for g in groups] == [0] and m["rollout/staleness_max"] == 0.0
    finally:
        await producer.stop()


async def test_a_recycled_group_is_resubmitted_while_the_ready_queue_is_full(use_client):
    # One group in flight at a time (--sglang-server-concurrency 1) and one ready: the take needs the recycled older
    # group first (one behind: its last chance), but the producer resubmitted recycled groups only while fewer than
    # that many groups were ready, so neither moved again.
    engine = GateEngine(lambda p: True)
    engine.version = 1
    use_client(engine)
    args = _args(rollout_batch_size=1, n_samples_per_prompt=2, max_weight_staleness=1, partial_rollout=True,
                 rollout_function_path=FULLY_ASYNC, sglang_server_concurrency=1)  # fmt: skip
    producer = FullyAsyncProducer(args, ListDataSource(n=2, num_prompts=0), restored=[], version=1)
    producer._ready.append(_held(producer, 0, version=1, aborted=False))
    producer._recycled.append(_held(producer, 7, version=0, aborted=True))
    producer.start()
    try:
        groups, m = await asyncio.wait_for(producer.take(1, 1, 1), WAIT_S)
        assert [g[0].group_index for g in groups] == [7] and m["rollout/staleness_max"] == 1.0
        assert m["rollout/stale_groups_dropped"] == 0.0
    finally:
        await producer.stop()


async def _take_error(producer):
    """The message of the RuntimeError the first take ends in (the producer's own, not the take's wrapper)."""
    with pytest.raises(RuntimeError) as raised:
        await asyncio.wait_for(producer.take(0, BATCH, 1), WAIT_S)
    return str(raised.value.__cause__ or raised.value)


def drop_every_group(args, samples):
    """Test dynamic-sampling filter: every group has the same reward (a broken reward function)."""
    return False


async def test_a_filter_that_drops_every_group_ends_the_producer_as_the_sync_rollout_does(use_client):
    # --dynamic-sampling-max-empty-rounds was read by the sync rollout only: here the producer drew prompt after
    # prompt while the take waited up to --rollout-timeout-secs (4 h by default), with no word.
    flags = dict(dynamic_sampling_filter_path=f"{__name__}.drop_every_group", dynamic_sampling_max_empty_rounds=2,
                 over_sampling_batch_size=5)  # fmt: skip
    producer = _producer(GateEngine(lambda p: True), use_client, **flags)
    try:
        assert await _take_error(producer) == (
            f"fully-async rollout: 10 groups in a row were dropped by --dynamic-sampling-filter-path {__name__}."
            "drop_every_group and none kept (filtered: 10): check the reward function and the filter; or raise "
            "--dynamic-sampling-max-empty-rounds (2 rounds of --over-sampling-batch-size 5 groups)"
        )
    finally:
        await producer.stop()


def always_aborted(args, sample, sampling_params):
    """Test generate function: gives up on every sample (retool's 'no output_token_logprobs' path, or a broken tool)."""
    sample.status = Status.ABORTED
    return sample


async def test_a_generate_function_that_aborts_every_group_ends_the_producer(use_client):
    # An aborted group is restarted from its prompt: a generate function that always returns ABORTED had the producer
    # restart the same groups forever while the take waited up to --rollout-timeout-secs (4 h), with no word (the sync
    # rollout stops after --dynamic-sampling-max-empty-rounds rounds). A weight push aborts at most the groups in
    # flight (--sglang-server-concurrency x engines), so those are not counted against the bound.
    flags = dict(custom_generate_function_path=f"{__name__}.always_aborted", dynamic_sampling_max_empty_rounds=2,
                 over_sampling_batch_size=5, sglang_server_concurrency=3)  # fmt: skip
    producer = _producer(GateEngine(lambda p: True), use_client, **flags)
    try:
        assert await _take_error(producer) == (
            f"fully-async rollout: 13 groups in a row came back with ABORTED samples and none finished (from "
            f"{__name__}.always_aborted, or the engines abort its requests); an aborted group is restarted, not "
            "trained on: check the generate function; or raise --dynamic-sampling-max-empty-rounds (2 rounds of "
            "--over-sampling-batch-size 5 groups, beyond the 3 groups in flight a weight push can abort)"
        )
    finally:
        await producer.stop()
