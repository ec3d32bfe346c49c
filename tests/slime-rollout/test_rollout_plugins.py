"""Plugins the rollout loop calls (filters, hooks, data sources, generate functions): deadlines, verdicts and errors
that name the plugin (issue 27)."""

import asyncio
import gc
import re
import threading

import pytest
from slime_rollout_fakes import FakeClient, ListDataSource
from slime_rollout_fakes import rollout_args as _args

from slime_core.protocols import DynamicFilterOutput
from slime_core.sample import Sample, Status
from slime_rollout.generation.rollout import generate_rollout, generate_rollout_async
from slime_rollout.runtime.deadlines import DeadlineExceeded

A, B = ord("A"), ord("B")


# Issue 27 #12, fifth hostile pass: the dynamic-sampling filter, --rollout-sample-filter-path and
# --rollout-all-samples-process-path were called on the event loop with no deadline, so one that never returned
# froze the rollout with no word; a filter verdict's __bool__ is the plugin's code too. The slow plugins block until the
# test releases them (30 s at most): a deadline that fired says so while they still block, where the old code (the
# plugin on the event loop) returned from the plugin first. No wall-clock bound, so a loaded machine cannot fail it.
# Each test's own (release, returned) pair: a plugin thread of an earlier test, released at its teardown, must not
# mark this test's plugin as returned.
_EVENTS = (threading.Event(), threading.Event())


def _hang() -> None:
    release, returned = _EVENTS
    release.wait(30)
    returned.set()


@pytest.fixture(autouse=True)
def _hanging_plugins():
    global _EVENTS
    _EVENTS = (threading.Event(), threading.Event())
    yield
    _EVENTS[0].set()


def _raised_while_the_plugin_blocked() -> bool:
    return not _EVENTS[1].is_set()


class SlowTruth:
    def __bool__(self):
        _hang()
        return True


def slow_filter(args, samples):
    _hang()
    return True


def slow_verdict_filter(args, samples):
    return DynamicFilterOutput(keep=SlowTruth())


def truthy_verdict_filter(args, samples):
    return DynamicFilterOutput(keep=1, reason=None)


def slow_sample_filter(args, data):
    _hang()


def slow_all_samples_process(args, all_groups, data_source):
    _hang()


def _bounded(**kw):
    return _args(plugin_timeout_secs=0.6, slow_call_warning_secs=0.2, **kw)


@pytest.mark.parametrize(
    ("flag", "fn"),
    [
        ("dynamic_sampling_filter_path", "slow_filter"),
        ("dynamic_sampling_filter_path", "slow_verdict_filter"),
        ("rollout_sample_filter_path", "slow_sample_filter"),
        ("rollout_all_samples_process_path", "slow_all_samples_process"),
    ],
)
async def test_a_rollout_plugin_that_never_returns_fails_at_its_deadline_naming_it(use_client, flag, fn):
    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    path = f"{__name__}.{fn}"
    with pytest.raises(DeadlineExceeded) as e:  # was: the loop blocked 5 s, then the rollout went on
        await generate_rollout_async(_bounded(**{flag: path}), 0, ListDataSource(n=2))
    assert _raised_while_the_plugin_blocked()
    message = str(e.value)
    assert message.startswith(f"--{flag.replace('_', '-')} {path} ") and "(--plugin-timeout-secs)" in message


async def test_a_filter_verdict_is_read_into_a_plain_bool(use_client):
    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    path = f"{__name__}.truthy_verdict_filter"
    out, _ = await generate_rollout_async(_bounded(dynamic_sampling_filter_path=path), 0, ListDataSource(n=2))
    assert len(out.samples) == 2


class SlowFloat(float):
    def __float__(self):
        _hang()
        return 1.0


async def generate_with_slow_reward(args, sample, sampling_params):
    sample.response, sample.status, sample.reward = "x", Status.COMPLETED, SlowFloat(1.0)
    return sample


async def test_a_reward_set_by_a_generate_function_is_read_under_the_reward_deadline(use_client):
    from slime_rollout.rewards.checks import RewardFunctionError

    use_client(FakeClient({}))
    path = f"{__name__}.generate_with_slow_reward"
    args = _args(custom_generate_function_path=path, rollout_batch_size=1, rm_timeout_secs=0.6)
    with pytest.raises(RewardFunctionError) as e:  # was: the metrics' float() froze the loop for 5 s
        await generate_rollout_async(args, 0, ListDataSource(n=2))
    assert _raised_while_the_plugin_blocked()
    assert str(e.value).startswith(f"reading the reward that generate function {path} (or a sample hook) set on")
    assert "did not finish within 0.6 s (--rm-timeout-secs)" in str(e.value)


class SlowDataSource(ListDataSource):
    def get_samples(self, num_groups):
        _hang()
        return super().get_samples(num_groups)


async def test_a_data_source_that_never_returns_fails_at_the_plugin_deadline(use_client):
    # Fifth hostile pass on issue 27 (item 12): get_samples (a --data-source-path class, a --buffer-filter-path)
    # ran on the event loop with no deadline.
    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    with pytest.raises(DeadlineExceeded, match=r"^SlowDataSource\.get_samples\(2\) \(rollout 0\) did not finish within "
                       r"0\.6 s \(--plugin-timeout-secs\)"):  # fmt: skip
        await generate_rollout_async(_bounded(), 0, SlowDataSource(n=2))
    assert _raised_while_the_plugin_blocked()


class FlatSource(ListDataSource):
    def get_samples(self, num_groups):
        return [s for group in super().get_samples(num_groups) for s in group]  # samples, not groups


class HangingSource(ListDataSource):
    def get_samples(self, num_groups):
        _hang()
        return super().get_samples(num_groups)


async def test_a_data_source_returning_samples_or_wrong_groups_is_named_before_generating(use_client):
    # Issue 27, item 12: a flat list failed as "'Sample' object is not iterable" inside a generate task; a group
    # of another size was generated first and refused after.
    client = use_client(FakeClient({}))
    with pytest.raises(TypeError, match=r"^FlatSource\.get_samples\(1\) \(rollout 0\): group 0 is Sample .*not a list"):
        await generate_rollout_async(_args(rollout_batch_size=1), 0, FlatSource(n=2))
    with pytest.raises(ValueError, match=r"ListDataSource\.get_samples\(1\) \(rollout 0\): group 0 has 3 samples, "
                       r"expected 2 \(--n-samples-per-prompt\)"):  # fmt: skip
        await generate_rollout_async(_args(rollout_batch_size=1), 0, ListDataSource(n=3))
    assert client.payloads == []


async def test_the_fully_async_producer_bounds_a_hanging_data_source(use_client):
    from slime_rollout.generation.fully_async_producer import FullyAsyncProducer

    # It called get_samples on the event loop: a data source that hung froze the producer with no word.
    use_client(FakeClient({}))
    producer = FullyAsyncProducer(_bounded(rollout_batch_size=1), HangingSource(n=2), restored=[], version=0)
    producer.start()
    with pytest.raises(RuntimeError, match=r"HangingSource\.get_samples\(1\) \(fully-async producer\) did not finish "
                       r"within 0\.6 s \(--plugin-timeout-secs\)") as e:  # fmt: skip
        await producer.take(0, 1, None)
    assert isinstance(e.value.__cause__, DeadlineExceeded)
    assert _raised_while_the_plugin_blocked()
    await producer.stop()


# ---- an engine that dies mid-rollout (fault injection) ---------------------------------------------------------------

from slime_rollout.engines.transport import EngineError  # noqa: E402


class DyingEngineClient(FakeClient):
    """Prompt 1's requests fail as a killed engine's do; the others hang until cancelled; the abort cannot reach it."""

    def __init__(self):
        super().__init__({0: [A], 1: [A]})
        self.cancelled = 0

    async def generate(self, payload):
        if payload["input_ids"][0] == 1:
            await asyncio.sleep(0)
            raise EngineError("http://e:1", "/generate", "unreachable after 9 attempts: ClientConnectorError",
                              unreachable=True)  # fmt: skip
        try:
            await asyncio.Event().wait()  # on the engine that died: no answer ever comes
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def abort_all(self):
        self.abort_calls += 1
        raise EngineError("http://e:1", "/abort_request", "unreachable after 9 attempts", unreachable=True)


async def test_an_engine_dying_mid_rollout_raises_its_own_error_and_leaves_nothing_running(use_client, caplog):
    client = use_client(DyingEngineClient())
    # The engine's error names the sample it served (was: the abort's error)
    with pytest.raises(EngineError, match=r"^engine http://e:1/generate failed for sample \d+: unreachable"):
        await generate_rollout_async(_args(), 0, ListDataSource(n=2))
    # The failed abort cancelled the requests still waiting on the dead engine (was: they ran on, never drained).
    assert client.abort_calls == 1 and client.cancelled == 2
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    warnings = [r.getMessage() for r in caplog.records if "clean-up" in r.getMessage()]
    assert warnings == ["rollout 0: the clean-up after EngineError failed too: engine http://e:1/abort_request "
                        "failed: unreachable after 9 attempts"]  # fmt: skip


def generate_that_raises(args, sample, sampling_params):
    raise KeyError("tool_result")  # a bug in the user's generate function


async def test_a_plugin_error_keeps_its_type_and_names_the_plugin_and_sample(use_client, caplog):
    use_client(FakeClient({0: [A], 1: [A]}))
    args = _args(custom_generate_function_path=f"{__name__}.generate_that_raises")
    with pytest.raises(KeyError) as e:  # was: a bare KeyError('tool_result'), no word of which plugin or sample
        await generate_rollout_async(args, 0, ListDataSource(n=2))
    (note,) = e.value.__notes__
    assert re.fullmatch(rf"\(raised by generate function {__name__}\.generate_that_raises on sample \d\)", note)
    # The other groups failed alike; their errors were read, not left for asyncio to log at garbage collection.
    del e  # its traceback holds the rollout's frame, and with it the failed tasks
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def generate_nothing(args, sample, sampling_params):
    return []


def generate_one_sample_twice(args, sample, sampling_params):
    sample.tokens, sample.response, sample.response_length = [*sample.tokens, A], "A", 1
    sample.status = Status.COMPLETED
    return [sample, sample]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        # Was a bare IndexError in the rollout's sort, naming neither the plugin nor the sample.
        ("generate_nothing", r"returned an empty list: a generate function returns its Sample, or a non-empty list"),
        # Was accepted: the one sample trained twice, its two entries one object.
        ("generate_one_sample_twice", r"returned the same Sample object more than once in its list"),
    ],
)
async def test_a_fan_out_of_no_sample_or_one_sample_twice_is_one_error_naming_the_plugin(use_client, fn, message):
    use_client(FakeClient({0: [A], 1: [A]}))
    args = _args(custom_generate_function_path=f"{__name__}.{fn}")
    with pytest.raises(ValueError, match=rf"^generate function {__name__}\.{fn} on sample \d {message}"):
        await generate_rollout_async(args, 0, ListDataSource(n=2))


HOOK_CALLS = []


def plain_hook(args, sample):
    HOOK_CALLS.append(("plain", sample.index))


def rollout_id_hook(args, sample, rollout_id):
    HOOK_CALLS.append(("rollout_id", sample.index, rollout_id))


async def any_kwargs_hook(args, sample, **kwargs):
    HOOK_CALLS.append(("kwargs", sample.index, sorted(kwargs.items())))


async def test_sample_hooks_get_only_the_keywords_they_take_as_the_original_passes_them(use_client):
    # The original's apply_rollout_sample_hooks passes evaluation= / rollout_id= only where the hook's signature takes
    # them (or **kwargs): `hook(args, sample)` failed here with "got an unexpected keyword argument 'evaluation'".
    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    HOOK_CALLS.clear()
    hooks = [f"{__name__}.plain_hook", f"{__name__}.rollout_id_hook", f"{__name__}.any_kwargs_hook"]
    out, _ = await generate_rollout_async(_args(rollout_sample_hook_path=hooks), 3, ListDataSource(n=2))
    assert len(out.samples) == 2
    assert sorted(HOOK_CALLS, key=str) == sorted(
        [("plain", i) for i in range(4)] + [("rollout_id", i, 3) for i in range(4)]
        + [("kwargs", i, [("evaluation", False), ("rollout_id", 3)]) for i in range(4)],
        key=str,
    )  # fmt: skip


def drop_prompt_0_as_bool(args, samples):
    return samples[0].group_index != 0


def drop_prompt_1_without_reason(args, samples):
    return DynamicFilterOutput(keep=samples[0].group_index != 1)


def drop_prompts_0_and_1(args, samples):
    return drop_prompt_0_as_bool(args, samples) and drop_prompt_1_without_reason(args, samples).keep


@pytest.mark.parametrize("path", ["drop_prompt_0_as_bool", "drop_prompt_1_without_reason", "drop_prompts_0_and_1"])
async def test_a_drop_without_a_reason_is_counted_as_filtered(use_client, path):
    # The original's MetricGatherer counts only drops with a reason; here a bare False (or no reason) is
    # rollout/dynamic_filter/drop_filtered (MIGRATION, metrics table).
    use_client(FakeClient({i: [A, B] for i in range(6)}))
    args = _args(dynamic_sampling_filter_path=f"{__name__}.{path}", over_sampling_batch_size=4)
    out, _ = await generate_rollout_async(args, 0, ListDataSource(n=2))
    dropped = {"drop_prompts_0_and_1": 2}.get(path, 1)
    assert {k: v for k, v in out.metrics.items() if k.startswith("rollout/dynamic_filter/")} == {
        "rollout/dynamic_filter/drop_filtered": float(dropped)
    }
    assert len(out.samples) == 2


def forgot_return_filter(args, samples):
    statistics_of_rewards = [s.reward for s in samples]  # noqa: F841 - the `return` the user forgot


async def test_a_filter_returning_none_is_one_error_naming_it_and_the_samples(use_client):
    # The original reads None as "drop" (and with every group dropped samples forever); refused here, and the
    # message itself names the filter (it said only "dynamic sampling filter must return ...", the path in a note).
    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    path = f"{__name__}.forgot_return_filter"
    with pytest.raises(TypeError) as e:
        await generate_rollout_async(_args(dynamic_sampling_filter_path=path), 0, ListDataSource(n=2))
    assert re.match(rf"--dynamic-sampling-filter-path {re.escape(path)} on samples \[\d, \d\] must return "
                    r"DynamicFilterOutput or bool, got NoneType None$", str(e.value))  # fmt: skip


def record_all_groups(args, all_groups, data_source):
    data_source.__self__.seen = [[s.index for s in group] for group in all_groups]  # the original's bound get_samples


async def test_the_all_samples_process_plugin_gets_the_groups_sorted_by_sample_index():
    # The fully-async rollout passes [*kept, *filtered, *stale] (each in its own order): the plugin got them so,
    # while the docstring (and the original) promise them sorted by sample index.
    from slime_core.sample import Sample
    from slime_rollout.generation.rollout import run_end_of_rollout_plugins

    def group(first):
        return [Sample(prompt="p", index=first), Sample(prompt="p", index=first + 1)]

    kept, filtered, stale = [group(4), group(0)], [group(6)], [group(2)]
    args = _args(rollout_all_samples_process_path=f"{__name__}.record_all_groups")
    source = ListDataSource([])
    await run_end_of_rollout_plugins(args, 0, kept, [*kept, *filtered, *stale], source)
    assert source.seen == [[0, 1], [2, 3], [4, 5], [6, 7]]


def seen_by_all_samples_process(args, all_groups, data_source):
    args.seen_data_source = data_source  # the plugin view is writable, as the original's args


def use_all_samples_data_source(args, all_groups, data_source):
    # As a hook written for the original: its data_source is `data_source.get_samples`, a callable n -> groups.
    args.seen_data_source = data_source
    args.drawn = [[s.index for s in group] for group in data_source(1)]


async def test_the_all_samples_process_plugin_gets_get_samples_as_the_original(use_client):
    # The original's generate_rollout runs generate_rollout_async(args, rollout_id, data_source.get_samples), which
    # hands that callable to --rollout-all-samples-process-path; the default rollout here handed the data source
    # object, so a hook written for the original failed ("'ListDataSource' object is not callable").
    use_client(FakeClient({0: [A, B], 1: [A, B], 2: [A, B]}))
    source = ListDataSource(n=2)
    args = _args(rollout_all_samples_process_path=f"{__name__}.use_all_samples_data_source")
    out = await asyncio.to_thread(generate_rollout, args, 0, source)
    assert [[s.index for s in group] for group in out.samples] == [[0, 1], [2, 3]]
    assert args.seen_data_source == source.get_samples and args.drawn == [[4, 5]]


async def test_generate_rollout_async_takes_the_originals_get_samples_callable(use_client):
    # The original's signature is generate_rollout_async(args, rollout_id, data_source: Callable[[int], groups]) and
    # its generate_rollout passes `data_source.get_samples`; a custom rollout function doing the same (through
    # slime.rollout.sglang_rollout, which re-exports this function) failed here with "'method' object has no
    # attribute 'get_samples'".
    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    source = ListDataSource(n=2)
    args = _args(rollout_all_samples_process_path=f"{__name__}.seen_by_all_samples_process")
    out, leftovers = await generate_rollout_async(args, 0, source.get_samples)
    assert [[s.index for s in group] for group in out.samples] == [[0, 1], [2, 3]] and leftovers == []
    assert [s.response for group in out.samples for s in group] == ["AA", "BB", "AA", "BB"]
    assert args.seen_data_source == source.get_samples  # what it was given, as the original hands it on
    with pytest.raises(TypeError, match=r"data source must be a DataSource \(get_samples\(n\)\) or a callable n -> "):
        await generate_rollout_async(args, 1, "prompts.jsonl")


def filter_returning_a_list(args, data):
    return [group for group in data if group[0].index != 0]  # a common slip: the return value is not read


def filter_marking_in_place(args, data):
    data[0][0].remove_sample = True


@pytest.mark.parametrize("fn", ["filter_returning_a_list", "filter_marking_in_place"])
async def test_a_sample_filter_that_returns_its_result_is_warned_about(use_client, caplog, fn):
    # As in the original, --rollout-sample-filter-path filters by setting remove_sample in place and its return value
    # is not read; one that returned the filtered groups trained on everything, without a word.
    import logging

    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    path = f"{__name__}.{fn}"
    with caplog.at_level(logging.WARNING, logger="slime_rollout.generation.rollout"):
        out, _ = await generate_rollout_async(_args(rollout_sample_filter_path=path), 3, ListDataSource(n=2))
    lines = [r.getMessage() for r in caplog.records if "--rollout-sample-filter-path" in r.getMessage()]
    if fn == "filter_returning_a_list":
        assert lines == [
            f"rollout 3: --rollout-sample-filter-path {path} returned a list, which is not read (as in the original): "
            "it filters by setting sample.remove_sample = True in place (0 of 4 samples are marked)"
        ]
        assert not any(s.remove_sample for group in out.samples for s in group)
    else:
        assert lines == [] and out.samples[0][0].remove_sample


def _generate_without_evaluation(args, sample, sampling_params):
    sample.tokens, sample.response, sample.response_length = [*sample.tokens, A], "A", 1
    sample.status = Status.COMPLETED
    return sample


async def forwarding_generate(args, sample, sampling_params, **kwargs):
    GENERATE_KWARGS.append(sorted(kwargs))
    return _generate_without_evaluation(args, sample, sampling_params, **kwargs)


async def evaluation_generate(args, sample, sampling_params, evaluation=False):
    GENERATE_KWARGS.append([("evaluation", evaluation)])
    return _generate_without_evaluation(args, sample, sampling_params)


GENERATE_KWARGS = []


@pytest.mark.parametrize(
    ("fn", "kwargs"), [("forwarding_generate", []), ("evaluation_generate", [("evaluation", False)])]
)
async def test_a_generate_function_gets_evaluation_only_where_it_names_the_parameter(use_client, fn, kwargs):
    # The original passes evaluation= only when `"evaluation" in inspect.signature(fn).parameters`; a wrapper taking
    # **kwargs and forwarding them failed here with "got an unexpected keyword argument 'evaluation'".
    use_client(FakeClient({0: [A], 1: [A]}))
    GENERATE_KWARGS.clear()
    args = _args(custom_generate_function_path=f"{__name__}.{fn}")
    out, _ = await generate_rollout_async(args, 0, ListDataSource(n=2))
    assert [s.response for group in out.samples for s in group] == ["A"] * 4
    assert GENERATE_KWARGS == [kwargs] * 4


def generate_with_a_long_mask(args, sample, sampling_params):
    sample = _generate_without_evaluation(args, sample, sampling_params)
    sample.loss_mask = [1, 1, 1]  # the response has one token
    return sample


def generate_past_its_tokens(args, sample, sampling_params):
    sample.response, sample.response_length, sample.status = "AB", 2, Status.COMPLETED  # tokens not extended
    return sample


def hook_with_short_log_probs(args, sample):
    sample.rollout_log_probs = []  # in place, returning None


@pytest.mark.parametrize(
    ("fields", "who", "why"),
    [
        ({"custom_generate_function_path": f"{__name__}.generate_with_a_long_mask"},
         rf"generate function {__name__}\.generate_with_a_long_mask", r"len\(loss_mask\)=3 != response_length=1"),
        ({"custom_generate_function_path": f"{__name__}.generate_past_its_tokens"},
         rf"generate function {__name__}\.generate_past_its_tokens", r"response_length 2 outside \[0, 1\]"),
        ({"custom_generate_function_path": f"{__name__}.evaluation_generate",
          "rollout_sample_hook_path": [f"{__name__}.hook_with_short_log_probs"]},
         rf"--rollout-sample-hook-path {__name__}\.hook_with_short_log_probs",
         r"len\(rollout_log_probs\)=0 != response_length=1"),
    ],
)  # fmt: skip
async def test_a_plugin_s_sample_with_lengths_out_of_step_is_one_error_naming_it(use_client, fields, who, why):
    # These failed later, in the rollout's metrics or the trainer's batches ("sample 0: len(loss_mask)=3 != ..."),
    # naming the sample but not the plugin that built it; a response_length past the tokens got that far unchecked.
    use_client(FakeClient({0: [A], 1: [A]}))
    with pytest.raises(ValueError, match=rf"^{who} on sample (\d) returned a sample whose lengths disagree: sample \1: "
                                         rf"{why}$"):  # fmt: skip
        await generate_rollout_async(_args(**fields), 0, ListDataSource(n=2))


BUDGETS = []


def budget_spending_generate(args, sample, sampling_params):
    # The original's generate does this to its params: each sample's must be its own copy.
    sampling_params["max_new_tokens"] -= 3
    BUDGETS.append(sampling_params["max_new_tokens"])
    return _generate_without_evaluation(args, sample, sampling_params)


async def test_each_sample_of_a_group_gets_its_own_sampling_params_even_with_a_seed_set():
    # With a sampling_seed already in the params (an eval dataset's, a custom rollout's), the group handed every
    # sample the same dict: a generate function changing it in place changed its siblings' (budgets 5, 2, -1).
    from slime_core.sample import Sample
    from slime_rollout.generation.group_rollout import RolloutState, generate_and_rm_group

    BUDGETS.clear()
    args = _args(custom_generate_function_path=f"{__name__}.budget_spending_generate", n_samples_per_prompt=3)
    state = RolloutState.create(args, rollout_id=0)
    params = {"max_new_tokens": 8, "sampling_seed": 11}
    group = [Sample(prompt="p", tokens=[0], group_index=0, index=j) for j in range(3)]
    await generate_and_rm_group(args, group, state, params)
    assert BUDGETS == [5, 5, 5] and params == {"max_new_tokens": 8, "sampling_seed": 11}


def self_rewarding_generate(args, sample, sampling_params):
    sample = _generate_without_evaluation(args, sample, sampling_params)
    sample.reward = 5.0  # e.g. a generate function that scores its own turns
    return sample


def rank_group_reward(args, samples):
    return [float(i) for i, _ in enumerate(samples)]


async def test_group_rm_scores_a_group_even_when_its_generate_function_set_rewards():
    # As the original's generate_and_rm_group: --group-rm scores the whole group after generation, whatever the
    # samples carry. A group whose samples all held a reward kept them here, so the group RM never ran.
    from slime_core.sample import Sample
    from slime_rollout.generation.group_rollout import RolloutState, generate_and_rm_group

    args = _args(custom_generate_function_path=f"{__name__}.self_rewarding_generate", n_samples_per_prompt=3,
                 custom_rm_path=f"{__name__}.rank_group_reward", group_rm=True)  # fmt: skip
    state = RolloutState.create(args, rollout_id=0)
    group = [Sample(prompt="p", tokens=[0], group_index=0, index=j) for j in range(3)]
    results = await generate_and_rm_group(args, group, state, {"max_new_tokens": 8})
    assert [s.reward for s in results] == [0.0, 1.0, 2.0]


SCORED = []


def fan_out_with_an_aborted_sibling(args, sample, sampling_params):
    done = _generate_without_evaluation(args, sample, sampling_params)
    aborted = Sample(prompt=sample.prompt, tokens=[*sample.tokens], index=sample.index, rollout_id=sample.index,
                     status=Status.ABORTED)  # fmt: skip
    done.rollout_id = sample.index
    return [done, aborted]


def recording_batch_reward(args, samples):
    SCORED.append([s.status.value for s in samples])
    return [1.0] * len(samples)


async def test_a_fan_out_holding_an_aborted_sample_is_not_scored_as_in_the_original():
    # The original's generate_and_rm returns such a list unscored (its group is not kept); a batch-mode reward got the
    # completed part of it here, a partial fan-out it was not written for.
    from slime_rollout.generation.group_rollout import RolloutState, generate_and_rm

    SCORED.clear()
    args = _args(custom_generate_function_path=f"{__name__}.fan_out_with_an_aborted_sibling",
                 custom_rm_path=f"{__name__}.recording_batch_reward")  # fmt: skip
    state = RolloutState.create(args, rollout_id=0)
    out = await generate_and_rm(args, Sample(prompt="p", tokens=[0], group_index=0, index=0), state)
    assert SCORED == [] and [s.reward for s in out] == [None, None]


class RepeatedSampleSource(ListDataSource):
    """A data source written with `[sample] * n`: one Sample object for the whole group."""

    def get_samples(self, num_groups):
        groups = super().get_samples(num_groups)
        return [[group[0]] * len(group) for group in groups]


async def test_a_data_source_handing_out_one_sample_object_twice_is_named_before_generating(use_client):
    # Its n generations wrote into one object at once (tokens, response and mask appended n times over), and the
    # group trained as n copies of that mix.
    client = use_client(FakeClient({0: [A]}))
    with pytest.raises(ValueError) as e:
        await generate_rollout_async(_args(rollout_batch_size=1), 0, RepeatedSampleSource(n=2))
    assert str(e.value) == (
        "RepeatedSampleSource.get_samples(1) (rollout 0): group 0 holds sample 0, the same Sample object as in group "
        "0: each sample must be its own object (copy.deepcopy the prompt's sample, as the original's data source "
        "does, not [sample] * n)"
    )
    assert client.payloads == []
