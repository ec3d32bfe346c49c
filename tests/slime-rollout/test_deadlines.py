"""Bounded, logged waits (issue 27 #12): a reward function that never returns and a frozen engine end the rollout
with one line naming them, after warnings while they run; short deadlines here, the flags' defaults in production."""

import asyncio
import logging
import time

import pytest
from aiohttp import web

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_rollout.engines.client import RolloutClient
from slime_rollout.engines.transport import EngineError
from slime_rollout.rewards import async_rm, batched_async_rm
from slime_rollout.rewards.checks import RewardFunctionError
from slime_rollout.runtime import loop_watchdog
from slime_rollout.runtime.deadlines import DeadlineExceeded, await_with_deadline, call_plugin_with_deadline

STUCK_REWARDS = """
import asyncio
import time


async def never_returns(args, sample):
    await asyncio.Event().wait()


def never_returns_sync(args, sample):
    time.sleep(3600)  # blocks its thread, not the event loop


async def never_returns_group(args, samples):
    await asyncio.Event().wait()


async def quick(args, sample):
    return 1.0


async def blocks_the_loop(args, sample):
    time.sleep(1.5)  # synchronous: holds the event loop itself
    return 1.0


async def blocks_briefly(args, sample):
    time.sleep(0.05)  # far below --slow-call-warning-secs
    return 1.0
"""


@pytest.fixture
def stuck_rewards(tmp_path, monkeypatch):
    """A module of reward functions, importable by `--custom-rm-path` (written to a path on sys.path)."""
    (tmp_path / "stuck_rewards.py").write_text(STUCK_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "stuck_rewards"


def _args(**fields):
    base = {"rollout_batch_size": 1, "num_rollout": 1, "rm_timeout_secs": 0.6, "slow_call_warning_secs": 0.2}
    return PluginArgs.from_config(SlimeArgs.from_dict({**base, **fields}))


@pytest.mark.parametrize("fn", ["never_returns", "never_returns_sync"])
async def test_a_reward_function_that_never_returns_fails_naming_it_and_the_sample(stuck_rewards, fn, caplog):
    path = f"{stuck_rewards}.{fn}"
    caplog.set_level(logging.WARNING, logger="slime_rollout.runtime.deadlines")
    start = time.monotonic()
    # The loop keeps running meanwhile (a sync function runs in its own thread): this ticker must advance.
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.create_task(tick())
    with pytest.raises(RewardFunctionError) as e:
        await async_rm(_args(custom_rm_path=path), Sample(response="x", label="y", index=7))
    ticker.cancel()
    elapsed = time.monotonic() - start
    assert str(e.value) == (
        f"reward function --custom-rm-path {path} on sample 7 did not finish within 0.6 s (--rm-timeout-secs); "
        "cancelled"
    )
    assert 0.6 <= elapsed < 10.0, elapsed  # the deadline, plus the first import of the plugin module
    assert ticks >= 5
    # Only the deadline's own records: the config may warn too (once per process, so only when run alone).
    warnings = [r.getMessage() for r in caplog.records if r.name == "slime_rollout.runtime.deadlines"]
    assert len(warnings) >= 2 and all(
        w.startswith(f"reward function --custom-rm-path {path} on sample 7 still running after ") for w in warnings
    )
    assert warnings[0].endswith("(deadline 0.6 s, --rm-timeout-secs)")


async def test_a_group_reward_function_that_never_returns_names_the_samples(stuck_rewards):
    samples = [Sample(response="x", label="y", index=i) for i in (3, 4)]
    args = _args(custom_rm_path=f"{stuck_rewards}.never_returns_group", group_rm=True)
    with pytest.raises(RewardFunctionError, match=r"on samples \[3, 4\] did not finish within 0.6 s \(--rm-timeout"):
        await batched_async_rm(args, samples)


async def test_a_reward_within_its_deadline_is_unchanged(stuck_rewards):
    assert await async_rm(_args(custom_rm_path=f"{stuck_rewards}.quick"), Sample(response="x", index=1)) == 1.0


def test_the_flags_and_their_defaults():
    from slime_core.config import ConfigError, parse_args

    base = ["--rollout-batch-size", "4", "--num-rollout", "1"]
    cfg = parse_args(base)
    assert (cfg.rm_timeout_secs, cfg.plugin_timeout_secs, cfg.slow_call_warning_secs) == (600.0, 14400.0, 60.0)
    assert cfg.rollout_timeout_secs == 14400.0
    assert parse_args([*base, "--rollout-timeout-secs", "90"]).rollout_timeout_secs == 90.0
    with pytest.raises(ConfigError, match="--rollout-timeout-secs"):
        parse_args([*base, "--rollout-timeout-secs", "-1"])
    assert cfg.sglang_router_request_timeout_secs == 14400  # the original's default
    with pytest.raises(ConfigError, match="--rm-timeout-secs"):
        parse_args([*base, "--rm-timeout-secs", "0"])


def _engine(*, health_ok: bool, thaw: asyncio.Event, health_delay_s: float = 0.0):
    """A frozen engine: /generate answers only once `thaw` is set; /health_generate answers 200 (`health_ok`, after
    `health_delay_s`) or not before `thaw` either (set at the test's end, so the server shuts down at once)."""

    async def handler(request):
        if request.path == "/health_generate" and health_ok:
            await asyncio.sleep(health_delay_s)
            return web.Response()
        await thaw.wait()
        return web.Response(status=503)

    return handler


async def test_a_frozen_engine_fails_the_request_at_its_first_probe_naming_the_engine(http_server, caplog):
    thaw = asyncio.Event()
    url = await http_server(_engine(health_ok=False, thaw=thaw))
    client = RolloutClient([url], generate_timeout=30.0, slow_warning_s=0.3, probe_timeout_s=0.3)
    caplog.set_level(logging.WARNING, logger="slime_rollout.runtime.deadlines")
    start = time.monotonic()
    with pytest.raises(EngineError) as e:
        await client.generate({"input_ids": [1, 2], "sampling_params": {}, "rid": "r1"})
    elapsed = time.monotonic() - start
    assert elapsed < 3.0, elapsed  # not the 30 s deadline
    assert str(e.value) == (
        f"engine {url}/generate failed: no reply after 0 s, and /health_generate gave no 200 within 0.3 s "
        "(--rollout-health-check-timeout): the engine is frozen (--use-fault-tolerance restarts such engines)"
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"/generate on engine {url} (rid r1) still running after 0 s (deadline 30 s, "
        "--sglang-router-request-timeout-secs) (1 request(s) in flight on it)"
    ]
    thaw.set()
    await client.aclose()


async def test_the_slow_requests_of_one_engine_share_one_probe(http_server, caplog):
    """Issue 27: a frozen engine with 256 requests in flight got 256 /health_generate probes at once (one per slow
    request, each a generation of its own on a live but slow engine); the requests slow together share one probe."""
    thaw, probes = asyncio.Event(), []

    async def handler(request):
        if request.path == "/health_generate":
            probes.append(time.monotonic())
            await asyncio.sleep(0.2)  # answered: the engine is alive, only slow
            return web.Response()
        await thaw.wait()
        return web.json_response({"text": "", "output_ids": [], "meta_info": {"finish_reason": {"type": "stop"}}})

    url = await http_server(handler)
    client = RolloutClient([url], generate_timeout=30.0, slow_warning_s=0.5, probe_timeout_s=2.0)
    calls = [asyncio.ensure_future(client.generate({"input_ids": [1, 2], "sampling_params": {}})) for _ in range(16)]
    await asyncio.sleep(0.9)  # past the first warning of every request, with its probe answered
    thaw.set()
    await asyncio.gather(*calls)
    await client.aclose()
    assert len(probes) == 1, probes
    # And one warning line for them, not 16: it counts the requests on the engine.
    slow = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
    assert len(slow) == 1 and slow[0].endswith("(16 request(s) in flight on it)"), slow


async def test_an_engine_that_answers_health_but_not_the_request_fails_at_the_deadline(http_server, caplog):
    thaw = asyncio.Event()
    url = await http_server(_engine(health_ok=True, thaw=thaw))
    client = RolloutClient([url], generate_timeout=1.0, slow_warning_s=0.3, probe_timeout_s=0.3)
    caplog.set_level(logging.WARNING, logger="slime_rollout.runtime.deadlines")
    with pytest.raises(EngineError, match=rf"engine {url}/generate failed: /generate on engine {url} did not finish "
                       r"within 1 s \(--sglang-router-request-timeout-secs\); cancelled"):  # fmt: skip
        await client.generate({"input_ids": [1, 2], "sampling_params": {}})
    assert len(caplog.records) >= 2  # warned while it waited
    thaw.set()
    await client.aclose()


async def test_the_deadline_not_the_socket_timeout_ends_a_request_whose_probe_straddles_the_deadline(http_server):
    """The probe at the first warning runs past the deadline: a socket read timeout equal to the deadline fired
    meanwhile and the call failed with aiohttp's bare "Timeout on reading data from socket" (a CI failure); the
    transport's timeout is now a backstop past the deadline, so the error names the deadline and its flag."""
    thaw = asyncio.Event()
    url = await http_server(_engine(health_ok=True, thaw=thaw, health_delay_s=0.9))
    client = RolloutClient([url], generate_timeout=1.0, slow_warning_s=0.3, probe_timeout_s=5.0)
    with pytest.raises(EngineError, match=rf"^engine {url}/generate failed: /generate on engine {url} did not finish "
                       r"within 1 s \(--sglang-router-request-timeout-secs\); cancelled$"):  # fmt: skip
        await client.generate({"input_ids": [1, 2], "sampling_params": {}})
    thaw.set()
    await client.aclose()


def test_the_transport_backstop_lies_past_the_deadline():
    from slime_rollout.runtime.deadlines import backstop_timeout_s

    assert backstop_timeout_s(None) is None
    assert backstop_timeout_s(1.0) == 11.0
    assert backstop_timeout_s(14400.0) == 15120.0  # the 4 h default: 5 % more


async def test_await_with_deadline_cancels_the_work_and_passes_results_through():
    cancelled = asyncio.Event()

    async def forever():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(DeadlineExceeded, match=r"^work did not finish within 0.2 s \(--flag\); cancelled$"):
        await await_with_deadline(forever(), what="work", deadline_s=0.2, flag="--flag", warn_every_s=1.0)
    await asyncio.sleep(0)
    assert cancelled.is_set()
    assert await await_with_deadline(asyncio.sleep(0, result=5), what="w", deadline_s=1, flag="-f", warn_every_s=1) == 5


async def test_an_async_reward_that_blocks_the_loop_is_named_and_fails_once_it_returns(stuck_rewards, caplog):
    """Nothing can preempt a blocked loop: the watchdog thread warns naming the plugin, logs one error past the
    deadline, and the call fails with the deadline's one-line error when it comes back (issue 28 #12)."""
    path = f"{stuck_rewards}.blocks_the_loop"
    caplog.set_level(logging.WARNING, logger="slime_rollout.runtime.loop_watchdog")
    with pytest.raises(RewardFunctionError) as e:
        await async_rm(_args(custom_rm_path=path), Sample(response="x", label="y", index=7))
    what = f"reward function --custom-rm-path {path} on sample 7"
    assert str(e.value).startswith(f"{what} did not finish within 0.6 s (--rm-timeout-secs): it blocked the event loop")
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    warnings = [m for level, m in records if level == logging.WARNING]
    errors = [m for level, m in records if level == logging.ERROR]
    assert len(warnings) == 1 and "the event loop has been blocked for 0." in warnings[0] and what in warnings[0]
    assert errors == [
        f"{what} is past its 0.6 s deadline (--rm-timeout-secs) but blocks the event loop, so it cannot be "
        "cancelled; the rollout is stuck until it returns, then fails"
    ]


async def test_calls_delayed_by_a_blocked_loop_name_the_culprit(stuck_rewards, caplog):
    import stuck_rewards as mod

    async def innocent(args, sample):
        await asyncio.sleep(0.1)
        return 2.0

    caplog.set_level(logging.WARNING, logger="slime_rollout.runtime.loop_watchdog")
    bounds = {"deadline_s": 0.6, "flag": "--rm-timeout-secs", "warn_every_s": 0.2}
    blocker = asyncio.create_task(call_plugin_with_deadline(mod.blocks_the_loop, None, None, what="blocker", **bounds))
    others = [call_plugin_with_deadline(innocent, None, None, what=f"innocent {i}", **bounds) for i in range(2)]
    results = await asyncio.gather(blocker, *others, return_exceptions=True)
    assert str(results[0]).startswith("blocker did not finish within 0.6 s (--rm-timeout-secs): it blocked the event")
    # Their deadlines passed while the blocker held the loop: they fail too, naming it.
    assert [str(r) for r in results[1:]] == [
        f"innocent {i} did not finish within 0.6 s (--rm-timeout-secs); cancelled (the event loop was blocked "
        "meanwhile by blocker)"
        for i in range(2)
    ]
    assert [r.getMessage().split(" by ")[1].split(":")[0] for r in caplog.records if r.levelno == logging.WARNING] == [
        "blocker"
    ]
    # A short block (under the warning threshold) passes unnoticed and unchanged.
    assert await call_plugin_with_deadline(mod.blocks_briefly, None, None, what="brief", **bounds) == 1.0
    # The watchdog thread ends once no watched call is in flight.
    for _ in range(50):
        if not loop_watchdog._watchdogs:
            break
        await asyncio.sleep(0.1)
    assert not loop_watchdog._watchdogs


def _empty_next(args, sample):
    return next(iter([]))  # a stray next() on an empty iterator raises StopIteration


def _raises_keyboard_interrupt(args, sample):
    raise KeyboardInterrupt("plugin's own")


async def test_a_sync_plugin_raising_stop_iteration_or_keyboard_interrupt_fails_at_once():
    from slime_rollout.runtime.deadlines import PluginExit

    # StopIteration could not be set on the future (a TypeError in the loop's callback): the call waited out its
    # whole deadline (--plugin-timeout-secs: 4 h) and then blamed a hang.
    bounds = {"deadline_s": 30.0, "flag": "--plugin-timeout-secs", "warn_every_s": 30.0}
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^StopIteration raised\n\(raised by gen\)$") as raised:  # + the note
        await call_plugin_with_deadline(_empty_next, None, None, what="gen", **bounds)
    assert isinstance(raised.value.__cause__, StopIteration)
    # A KeyboardInterrupt from the plugin's thread is the plugin's, not the user's Ctrl-C: it propagated as one.
    with pytest.raises(PluginExit, match=r"^KeyboardInterrupt: plugin's own\n\(raised by gen\)$"):
        await call_plugin_with_deadline(_raises_keyboard_interrupt, None, None, what="gen", **bounds)
    assert time.monotonic() - start < 5.0


async def test_a_reward_function_raising_stop_iteration_is_named():
    sample = Sample(response="r", label="1", index=5)
    args = _args(custom_rm_path=f"{__name__}._empty_next", rm_timeout_secs=30.0)
    with pytest.raises(RewardFunctionError, match=r"_empty_next raised RuntimeError on sample 5: StopIteration raised"):
        await asyncio.wait_for(async_rm(args, sample), 10)


STORED = KeyError("the same object every call")


def _raises_stored(args, sample):
    raise STORED


async def test_a_plugin_error_is_noted_once_even_when_raised_again():
    bounds = {"deadline_s": 30.0, "flag": "--plugin-timeout-secs", "warn_every_s": 30.0}
    for index in range(3):
        with pytest.raises(KeyError):
            await call_plugin_with_deadline(_raises_stored, None, None, what=f"gen on sample {index}", **bounds)
    assert STORED.__notes__ == ["(raised by gen on sample 0)"]  # not one more per call


async def test_a_request_held_by_a_weight_push_is_not_called_frozen(http_server):
    """Fully async, a request sent while a weight push pauses the engine waits for the resume, and SGLang answers
    /health_generate 503 meanwhile. Was: the slow-call probe failed the run with "the engine is frozen"."""
    resumed = asyncio.Event()

    async def handler(request):
        if request.path == "/health_generate":
            # What a paused SGLang engine answers after its 20 s; healthy again once resumed. (A 503 after the resume
            # too made the test racy: a slow-call probe between the resume and the reply reaching the client failed it.)
            return web.Response(status=200 if resumed.is_set() else 503)
        await resumed.wait()
        return web.json_response({"text": "ok"})

    url = await http_server(handler)
    client = RolloutClient([url], generate_timeout=60.0, slow_warning_s=0.2, probe_timeout_s=0.3)
    client.pool.begin_weight_move()
    request = asyncio.ensure_future(client.generate({"input_ids": [1, 2], "sampling_params": {}}))
    await asyncio.sleep(1.0)  # several slow-call probes would have run
    assert not request.done()
    resumed.set()  # the engine resumes before the push is over, as SGLang's continue_generation comes first
    client.pool.end_weight_move()
    assert await asyncio.wait_for(request, 10) == {"text": "ok"}
    await client.aclose()
