"""The fully-async rollout against the CPU reference engine (tiny random Qwen3).

A test stands in for the trainer: it takes rollouts with `generate_rollout_fully_async` and pushes weight versions
the way a weight sync does (pause with abort → `/update_weight_version` → continue), waiting in between where a slow
trainer would. Checks the staleness bound and its counts, the engine version tags, partial-rollout recycling at a
push, that a dead producer's exception reaches the waiting consumer, and that a resumed producer continues the
prompt stream (`save_state` / `load_state`).
"""

import asyncio
import json
import time

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_rollout.data.source import RolloutDataSourceWithBuffer
from slime_rollout.engines.client import EngineClient
from slime_rollout.generation import fully_async
from slime_rollout.generation.fully_async import generate_rollout_fully_async, load_state, save_state, stop_producer
from slime_rollout.generation.staleness import group_version

pytestmark = [pytest.mark.timeout(600)]

CAPACITY = 2  # --sglang-server-concurrency 2 × one engine: groups in flight, and finished groups waiting


def _args(engine, model_dir, fixtures_dir, **kw):
    fields = dict(
        hf_checkpoint=str(model_dir),
        prompt_data=f"{fixtures_dir / 'gsm8k' / 'test-50.jsonl'}@[:12]",
        input_key="question",
        label_key="answer",
        apply_chat_template=True,
        rollout_batch_size=1,
        n_samples_per_prompt=2,
        num_rollout=8,
        rm_type="math",
        rollout_max_response_len=8,
        sglang_server_concurrency=CAPACITY,
        rollout_function_path="slime.rollout.fully_async_rollout.generate_rollout_fully_async",
    )
    fields.update(kw)
    return PluginArgs.from_config(SlimeArgs.from_dict(fields), engine_urls=engine.urls)


async def _push(url: str, version: str) -> None:
    """What a weight sync does to an engine around its buckets (`slime_rollout.weight_sync.updaters`).

    The running requests' abort replies go out before the version changes, as in a real push (SGLang answers an
    abort within a scheduler step; the buckets take longer). Requests that arrive while paused wait for the new
    version.
    """
    engine = EngineClient(url, timeout=60)
    await engine.pause_generation(mode="abort")
    while (await engine.get_loads())["loads"][0]["num_running_reqs"]:
        await asyncio.sleep(0.01)
    await engine.update_weight_version(version)
    await engine.continue_generation()


def push(engine, version: int) -> None:
    asyncio.run(_push(engine.urls[0], str(version)))


def _wait_quiet(ready: int = CAPACITY, timeout_s: float = 120.0) -> fully_async.FullyAsyncProducer:
    """Waits until the producer is idle: nothing in flight, `ready` groups waiting (a trainer slower than it)."""
    producer = fully_async.active_producer()
    deadline = time.monotonic() + timeout_s
    while producer.num_in_flight or producer.num_ready < ready:
        assert time.monotonic() < deadline, (producer.num_in_flight, producer.num_ready)
        time.sleep(0.05)
    return producer


@pytest.fixture
def engine(reference_engine):
    """The session's engine; the producer is stopped and the engine's version reset afterwards."""
    yield reference_engine
    stop_producer()
    asyncio.run(EngineClient(reference_engine.urls[0], timeout=60).update_weight_version("default"))


def _versions(groups):
    return [s.weight_versions for g in groups for s in g]


def test_between_takes_the_producer_draws_only_what_the_bound_lets_it_train(engine, tiny_qwen3_dir, fixtures_dir):
    args = _args(engine, tiny_qwen3_dir, fixtures_dir, max_weight_staleness=1)
    ds = RolloutDataSourceWithBuffer(args)
    push(engine, 0)
    out0 = generate_rollout_fully_async(args, 0, ds)
    assert _versions(out0.samples) == [["0"], ["0"]]
    assert out0.metrics["rollout/staleness_max"] == 0.0 and out0.metrics["rollout/stale_groups_dropped"] == 0.0
    assert out0.metrics["rollout/num_reward_undecided"] >= 0.0  # reported as by the default rollout
    for version in (1, 2, 3):
        # The trainer is slow. While it trains on version v-1 the producer draws bound x --rollout-batch-size = 1
        # group and idles: a second one, from those same weights, would be two versions behind at the take after
        # next and dropped (with (bound + 1) batches, one H100 dropped a whole batch every other rollout).
        producer = _wait_quiet(ready=1)
        time.sleep(0.3)
        assert (producer.num_ready, producer.num_in_flight) == (1, 0)
        assert group_version(producer._ready[0].group) == version - 1
        push(engine, version)
        out = generate_rollout_fully_async(args, version, ds)
        m = out.metrics
        assert m["rollout/stale_groups_dropped"] == 0.0 and m["rollout/staleness_max"] == 1.0  # one behind: kept
        assert _versions(out.samples) == [[str(version - 1)], [str(version - 1)]]
    assert m["rollout/fully_async/stale_groups_dropped_total"] == 0.0


def test_staleness_bound_drops_and_counts_groups_left_behind(engine, tiny_qwen3_dir, fixtures_dir):
    args = _args(engine, tiny_qwen3_dir, fixtures_dir, max_weight_staleness=1)
    ds = RolloutDataSourceWithBuffer(args)
    push(engine, 0)
    generate_rollout_fully_async(args, 0, ds)
    producer = _wait_quiet(ready=1)
    assert group_version(producer._ready[0].group) == 0
    # Two pushes before the next take (weights updated twice): the waiting group is two versions behind.
    push(engine, 1)
    push(engine, 2)
    out2 = generate_rollout_fully_async(args, 2, ds)
    m = out2.metrics
    assert m["rollout/stale_groups_dropped"] == 1.0 and m["rollout/fully_async/stale_groups_dropped_total"] == 1.0
    (group,) = out2.samples
    assert group_version(group) == 2 and m["rollout/staleness_max"] == 0.0
    assert {v for s in group for v in s.weight_versions} == {"2"}
    # The dropped group's tokens are accounted as thrown away (goodput), not trained on.
    assert m["goodput/tokens_stale"] > 0


def test_weight_push_recycles_in_flight_groups_as_partial_rollouts(engine, tiny_qwen3_dir, fixtures_dir):
    args = _args(
        engine, tiny_qwen3_dir, fixtures_dir,
        partial_rollout=True, mask_offpolicy_in_partial_rollout=True, rollout_max_response_len=64,
    )  # fmt: skip
    ds = RolloutDataSourceWithBuffer(args)
    push(engine, 0)
    continued: list[Sample] = []
    metrics = {}
    rollout_id = 0
    for _attempt in range(4):
        generate_rollout_fully_async(args, rollout_id, ds)
        rollout_id += 1
        # The trainer pushes the next version while the producer's next groups are mid-generation (64 tokens of a
        # random model rarely stop early).
        time.sleep(0.2)
        push(engine, rollout_id)
        for _ in range(2 * CAPACITY + 2):  # recycled groups finish after the ones that waited before the push
            out = generate_rollout_fully_async(args, rollout_id, ds)
            metrics = out.metrics
            continued += [s for g in out.samples for s in g if "off_policy_tokens" in s.metadata]
            if continued:
                break
            rollout_id += 1
        if continued:
            break
    assert metrics["rollout/fully_async/recycled_partial_groups_total"] >= 1
    assert continued, "no partial sample was continued after a push"
    for s in continued:
        k = s.metadata["off_policy_tokens"]
        assert 0 < k <= s.response_length
        # Generated under one version up to the push, then continued under the next.
        first, last = int(s.weight_versions[0]), int(s.weight_versions[-1])
        assert last == first + 1 <= rollout_id
        # --mask-offpolicy-in-partial-rollout: the tokens before the push are context, not trained on.
        assert s.loss_mask[:k] == [0] * k and s.rollout_log_probs[:k] == [0.0] * k
        assert all(s.loss_mask[k:]) and len(s.loss_mask) == s.response_length
        # Its staleness counts the trainable part only: the version after the push, not the one its prefix came from.
        assert group_version([s], mask_offpolicy=True) == last and group_version([s]) == first


def failing_rm(args, sample):
    """Test reward: always fails."""
    raise ValueError(f"reward exploded on sample {sample.index}")


def test_producer_failure_wakes_the_waiting_consumer_with_its_exception(engine, tiny_qwen3_dir, fixtures_dir):
    args = _args(engine, tiny_qwen3_dir, fixtures_dir, custom_rm_path=f"{__name__}.failing_rm")
    ds = RolloutDataSourceWithBuffer(args)
    push(engine, 0)
    with pytest.raises(RuntimeError, match="the producer stopped") as info:
        generate_rollout_fully_async(args, 0, ds)
    assert "failing_rm raised ValueError on sample" in str(info.value.__cause__)  # the reward's error, chained
    # It stays dead: the next rollout raises too instead of waiting forever.
    with pytest.raises(RuntimeError, match="the producer stopped"):
        generate_rollout_fully_async(args, 1, ds)


def test_resume_continues_the_prompt_stream(engine, tiny_qwen3_dir, fixtures_dir, tmp_path):
    args = _args(engine, tiny_qwen3_dir, fixtures_dir, save=str(tmp_path))
    ds = RolloutDataSourceWithBuffer(args)
    push(engine, 0)
    trained_before = {g[0].group_index for g in generate_rollout_fully_async(args, 0, ds).samples}
    save_state(args, ds, 0)
    stop_producer()
    cursor = json.loads(ds.state_path(tmp_path, 0).read_text())
    held = json.loads(fully_async.state_path(tmp_path, 0).read_text())["held"]
    held_groups = [g[0]["group_index"] for g in held]
    drawn = cursor["sample_group_index"]
    # Everything drawn and not trained was held, in draw order, as prompts (nothing generated is kept).
    assert held_groups == sorted(set(range(drawn)) - trained_before) and held_groups
    assert all(s["response_length"] == 0 and s["tokens"] == [] for g in held for s in g)

    resumed = _args(engine, tiny_qwen3_dir, fixtures_dir, load=str(tmp_path))
    ds2 = RolloutDataSourceWithBuffer(resumed)
    ds2.load(0)
    assert load_state(resumed, 0) == len(held_groups)
    trained_after: list[int] = []
    for rollout_id in range(1, 1 + len(held_groups) + CAPACITY):
        trained_after += [g[0].group_index for g in generate_rollout_fully_async(resumed, rollout_id, ds2).samples]
    assert not trained_before & set(trained_after)  # nothing trained twice
    assert set(held_groups) <= set(trained_after)  # nothing held is lost
    fresh = [i for i in trained_after if i not in held_groups]
    # The stream continues where the checkpoint's cursor was: its next prompt is trained or still held.
    still_held = {g[0].group_index for g in fully_async.active_producer().held_prompts()}
    assert fresh and min(fresh) >= drawn and drawn in set(fresh) | still_held


def test_a_held_sample_with_a_value_json_cannot_store_is_one_error_naming_it(tmp_path, monkeypatch):
    # Held samples are written as to_dict() JSON, plugin attributes included; json's own error named only the type
    # ("Object of type set is not JSON serializable"), not the held sample or its attribute.
    class Cursor:
        def save(self, rollout_id):
            pass

    held = Sample(index=7, prompt="q")
    held.seen = {1, 2}
    monkeypatch.setattr(fully_async, "_producer", None)
    monkeypatch.setattr(fully_async, "_restored", [[Sample(index=6, prompt="q"), held]])
    args = SlimeArgs.from_dict({"save": str(tmp_path), "rollout_batch_size": 1, "num_rollout": 1})
    with pytest.raises(
        TypeError, match=r"^--save: the fully-async held groups: sample 7's plugin attribute 'seen' holds a value of"
    ):
        save_state(args, Cursor(), 0)
    assert not fully_async.state_path(tmp_path, 0).exists()
    held.seen = [1, 2]
    save_state(args, Cursor(), 0)
    saved = json.loads(fully_async.state_path(tmp_path, 0).read_text())["held"]
    assert [[s["index"] for s in g] for g in saved] == [[6, 7]] and saved[0][1]["seen"] == [1, 2]
