"""The rollout manager starts its own engines, or uses external ones (`--rollout-external-engine-addrs`).

Engine and router addresses come back as values; plugins see them on the one `PluginArgs` view built from them.
"""

import logging
import os
import threading
import types

import pytest

from slime_app.cluster import Placement
from slime_app.engine_hosts import EngineSite, HostedEngines, engine_sites
from slime_app.rollout_manager import EngineAddresses, launch_or_attach_engines, plugin_args
from slime_core.config import parse_args

BASE = ["--train-backend", "fsdp", "--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl", "--num-rollout", "1",
        "--rollout-batch-size", "1", "--rollout-max-response-len", "8", "--rollout-num-gpus", "2"]  # fmt: skip


@pytest.fixture
def launches(monkeypatch):
    """Engine hosts are not started: each launch records its sites and group, and gets two made-up URLs."""
    calls = []

    def fake_start(self):
        calls.append((self.sites, self.placement_group))
        self.urls = ["http://10.0.0.1:15000", "http://10.0.0.2:15010"]
        return self

    monkeypatch.setattr(HostedEngines, "start", fake_start)
    return calls


def _placement(rollout_bundles, gpu_ids):
    return Placement(group="pg", actor_bundles=[0, 1], rollout_bundles=rollout_bundles, rollout_gpu_ids=gpu_ids,
                     use_gpu=bool(gpu_ids))  # fmt: skip


def _view(cfg):
    """The plugin view the manager builds once the engines run."""
    return plugin_args(cfg, launch_or_attach_engines(cfg, None)[1])


def test_external_engine_addrs_are_used_and_nothing_is_started(launches):
    cfg = parse_args([*BASE, "--rollout-external-engine-addrs", "10.0.0.5:30000", "10.0.0.6:30000"])
    engines, addresses = launch_or_attach_engines(cfg, _placement([2, 3], [4, 5]))
    assert engines is None
    assert launches == []
    assert addresses.urls == ["http://10.0.0.5:30000", "http://10.0.0.6:30000"]


def test_without_external_engines_each_engine_starts_on_its_rollout_bundle(launches, tmp_path):
    cfg = parse_args([*BASE, "--output-dir", str(tmp_path)])
    engines, addresses = launch_or_attach_engines(cfg, _placement([3, 2], [4, 5]))
    assert engines is not None and len(launches) == 1
    sites, group = launches[0]
    assert group == "pg"
    assert sites == [EngineSite(index=0, bundle=3, base_gpu_id=4), EngineSite(index=1, bundle=2, base_gpu_id=5)]
    assert addresses.urls == ["http://10.0.0.1:15000", "http://10.0.0.2:15010"]
    assert plugin_args(cfg, addresses).rollout_engine_urls == addresses.urls  # what plugins read
    assert cfg.rollout_engine_urls is None  # the config is never written


def test_engine_sites_take_the_first_bundle_of_each_engine_and_fall_back_to_the_manager_node():
    cfg = parse_args([*BASE[:-2], "--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2"])
    sites = engine_sites(cfg, [5, 4, 7, 6], [0, 1, 2, 3])
    assert [(s.index, s.bundle, s.base_gpu_id) for s in sites] == [(0, 5, 0), (1, 7, 2)]
    # A CPU run without --rollout-num-gpus: one engine, no bundle (the manager's node), no GPU.
    cpu = parse_args([*BASE[:-2]])
    assert engine_sites(cpu, [], []) == [EngineSite(index=0, bundle=None, base_gpu_id=None)]


def test_an_engine_spanning_two_nodes_is_rejected_naming_the_flag():
    from slime_app.cluster import PlacementError, check_engines_within_nodes

    check_engines_within_nodes(["a", "a", "b", "b"], 2)  # two engines, one per node
    # A PlacementError: the command line's one line with exit 2 (a plain ValueError from the run was a traceback).
    with pytest.raises(PlacementError, match=r"engine 1 would span 2 nodes: --rollout-num-gpus-per-engine 2"):
        check_engines_within_nodes(["a", "a", "a", "b"], 2)


def test_one_engine_without_router_is_the_router_address_original_plugins_use():
    args = _view(parse_args([*BASE, "--rollout-engine-urls", "http://10.0.0.5:30000"]))
    assert f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate" == "http://10.0.0.5:30000/generate"


def test_router_fields_untouched_with_a_router_or_several_engines(caplog):
    with caplog.at_level("WARNING"):
        args = _view(
            parse_args(
                [*BASE, "--rollout-engine-urls", "http://a:1", "http://b:2", "--custom-generate-function-path", "m.gen"]
            )  # fmt: skip
        )
    assert args.sglang_router_ip is None and args.sglang_router_port is None
    assert "2 engines and no router" in caplog.text
    args = _view(parse_args([*BASE, "--rollout-engine-urls", "http://a:1",
                             "--sglang-router-ip", "r", "--sglang-router-port", "9"]))  # fmt: skip
    assert (args.sglang_router_ip, args.sglang_router_port) == ("r", 9)


def test_a_launched_router_is_the_plugins_router():
    urls = ["http://h:1", "http://h:2"]
    args = plugin_args(parse_args(BASE), EngineAddresses(urls=urls, router_url="http://h:3"))
    assert (args.sglang_router_ip, args.sglang_router_port) == ("h", 3)
    assert args.rollout_engine_urls == urls


def test_chat_template_checks_stop_after_the_budget_or_on_single_turn_runs(monkeypatch):
    from slime_app.rollout_manager import check_chat_template
    from slime_core.sample import Sample
    from slime_rollout.generation import template_check

    cfg = parse_args([*BASE, "--check-chat-template-samples", "3"])
    assert cfg.check_chat_template_samples == 3
    monkeypatch.setattr("slime_rollout.data.source.get_tokenizer", lambda path: "tok")
    checked = []

    def fake_check_sample(tokenizer, sample):
        checked.append(sample.index)
        return types.SimpleNamespace(consistent=True, first_mismatch=None, message="ok")

    monkeypatch.setattr(template_check, "check_sample", fake_check_sample)
    recorded = [Sample(index=i, metadata={template_check.CONVERSATION_KEY: {"segments": []}}) for i in range(4)]
    metrics, left = check_chat_template(cfg, recorded[:2], 3)
    assert (metrics["rollout/chat_template/checked"], left, checked) == (2.0, 1, [0, 1])
    metrics, left = check_chat_template(cfg, recorded[2:], left)
    assert (metrics["rollout/chat_template/checked"], left, checked) == (1.0, 0, [0, 1, 2])  # the budget is spent
    assert check_chat_template(cfg, [Sample(index=9)], 3) == ({}, 0)  # single-turn: nothing recorded, stop


RELEASE = threading.Event()


def hung_post_process(args, samples):
    RELEASE.wait()  # e.g. a reward service that never answers


def test_a_reward_post_process_that_never_returns_fails_naming_it():
    from slime_app.rollout_manager import rollout_batches
    from slime_core.config import PluginArgs
    from slime_core.sample import Sample
    from slime_rollout.runtime.deadlines import DeadlineExceeded

    path = f"{__name__}.hung_post_process"
    cfg = parse_args([*BASE, "--custom-reward-post-process-path", path, "--plugin-timeout-secs", "0.3",
                      "--slow-call-warning-secs", "0.1"])  # fmt: skip
    samples = [Sample(index=0, tokens=[1, 2], response_length=1, reward=1.0, loss_mask=[1])]
    try:
        with pytest.raises(DeadlineExceeded) as e:  # was: the run stalled after the rollout with no word
            rollout_batches(PluginArgs.from_config(cfg), samples, dp_size=1, rollout_id=4)
    finally:
        RELEASE.set()
    assert str(e.value) == (
        f"--custom-reward-post-process-path {path} (rollout 4) did not finish within 0.3 s (--plugin-timeout-secs); "
        "cancelled"
    )


def one_list_post_process(args, samples):
    return [s.reward for s in samples]


def nan_post_process(args, samples):
    return [1.0], [float("nan")]


@pytest.mark.parametrize(("fn", "message"), [
    ("one_list_post_process", "must return (raw_rewards, rewards), got list [1.0]"),
    ("nan_post_process", "rewards of sample 0 is nan, not finite"),
])  # fmt: skip
def test_a_reward_post_process_returning_the_wrong_values_is_one_error_naming_it_and_the_rollout(fn, message):
    # It runs in a worker thread: its "must return ..." error named the plugin but not the rollout (the deadline's
    # and the other hooks' errors do).
    from slime_app.rollout_manager import rollout_batches
    from slime_core.config import PluginArgs
    from slime_core.sample import Sample

    path = f"{__name__}.{fn}"
    cfg = parse_args([*BASE, "--custom-reward-post-process-path", path])
    samples = [Sample(index=0, tokens=[1, 2], response_length=1, reward=1.0, loss_mask=[1])]
    with pytest.raises(ValueError) as e:
        rollout_batches(PluginArgs.from_config(cfg), samples, dp_size=1, rollout_id=4)
    assert str(e.value) == f"--custom-reward-post-process-path {path} (rollout 4): {message}"


POST_PROCESS_CALLS = []


def counting_post_process(args, samples):
    """A stateful plugin: rewards are 10x the raw ones plus the number of earlier calls."""
    POST_PROCESS_CALLS.append([s.index for s in samples])
    raw = [s.reward for s in samples]
    return raw, [10.0 * r + len(POST_PROCESS_CALLS) - 1 for r in raw]


@pytest.mark.parametrize("debug_rollout_only", [False, True])
def test_the_reward_post_process_runs_once_per_rollout_and_its_output_is_the_metric(debug_rollout_only):
    from slime_app.rollout_manager import rollout_batches
    from slime_core.config import PluginArgs
    from slime_core.sample import Sample
    from slime_rollout.runtime.metrics import compute_rollout_metrics

    POST_PROCESS_CALLS.clear()
    plugin = f"{__name__}.counting_post_process"
    sizes = ["--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--global-batch-size", "2"]
    cfg = parse_args([*BASE, "--custom-reward-post-process-path", plugin, *sizes])
    group = [
        Sample(index=i, group_index=0, tokens=[1, 2], response_length=1, reward=r, loss_mask=[1])
        for i, r in ((1, 0.0), (0, 1.0))
    ]
    # The rollout function's metrics, then the batches: was two calls (the metric's bounded only by the rollout's
    # deadline), a stateful plugin saw a different rollout each time.
    metrics = compute_rollout_metrics(cfg, [group], rollout_time=1.0)
    assert not {"rollout/rewards", "rollout/raw_reward"} & set(metrics)  # logged from the plugin's output
    batches, reward_metrics = rollout_batches(
        PluginArgs.from_config(cfg), list(group), dp_size=1, rollout_id=0, build=not debug_rollout_only
    )
    if debug_rollout_only:
        # Before: the plugin still ran (and logged its metric); the original's generate returns before it.
        assert POST_PROCESS_CALLS == [] and reward_metrics == {} and batches == []
    else:
        assert POST_PROCESS_CALLS == [[0, 1]]  # once, in the training order
        # rewards [10.0, 0.0] (mean 5.0), raw [1.0, 0.0] (mean 0.5): one group with a spread, no zero-std count.
        assert reward_metrics == {"rollout/rewards": 5.0, "rollout/raw_reward": 0.5}
        assert batches[0].rewards == [10.0, 0.0] and batches[0].raw_rewards == [1.0, 0.0]


@pytest.mark.parametrize(
    ("flags", "saver"),
    [
        ([], False),
        (["--colocate"], True),  # released while the trainer trains
        (["--colocate", "--no-offload-train", "--no-offload-rollout"], False),  # resident: never released
    ],
)
def test_engines_get_the_memory_saver_only_where_the_loop_releases_their_memory(monkeypatch, tmp_path, flags, saver):
    """SGLang's memory saver (and, for partial syncs, a host copy of the weights) costs memory and time on every
    engine; colocated engines that stay resident share the GPU without ever releasing anything."""
    from slime_app import engine_hosts

    monkeypatch.setattr(engine_hosts.ray.util, "get_node_ip_address", lambda: "10.0.0.1")
    cfg = parse_args([*BASE[:-2], "--actor-num-gpus-per-node", "2", *flags])
    host = engine_hosts.EngineHost(cfg, EngineSite(index=0, bundle=None, base_gpu_id=None), log_dir=str(tmp_path),
                                   base_port=15000)  # fmt: skip
    assert host.launcher.memory_saver is saver


class _StuckSource:
    """A `--data-source-path` whose save never returns (a network filesystem that hung)."""

    def __init__(self, args):
        self.args = args

    def save(self, rollout_id):
        threading.Event().wait()

    def load(self, rollout_id):
        raise OSError(f"no state for rollout {rollout_id}")


def test_the_data_source_save_and_load_are_bounded(monkeypatch, caplog):
    # Issue 27 leftover: the data source's construction and its save/load ran with no deadline; a save that never
    # returned hung the run after the checkpoint, with no log.
    from slime_app.rollout_manager import RolloutManager
    from slime_rollout.runtime.deadlines import DeadlineExceeded

    module = types.ModuleType("rm_stuck_source")
    module.Source = _StuckSource
    monkeypatch.setitem(__import__("sys").modules, "rm_stuck_source", module)
    cfg = parse_args([*BASE, "--data-source-path", "rm_stuck_source.Source", "--plugin-timeout-secs", "0.5",
                      "--slow-call-warning-secs", "0.2"])  # fmt: skip
    manager = RolloutManager.__ray_metadata__.modified_class.__new__(RolloutManager.__ray_metadata__.modified_class)
    manager.cfg, manager.args = cfg, plugin_args(cfg, EngineAddresses(urls=[]))
    manager.data_source = _StuckSource(manager.args)
    with pytest.raises(DeadlineExceeded) as e, caplog.at_level(logging.WARNING):
        manager.save(3)
    assert str(e.value) == (
        "the data source's save (--data-source-path rm_stuck_source.Source) did not finish within 0.5 s "
        "(--plugin-timeout-secs)"
    )
    assert any("the data source's save" in r.getMessage() and "still running" in r.getMessage() for r in caplog.records)
    with pytest.raises(OSError, match="no state for rollout 3") as e:
        manager.load(3)
    assert e.value.__notes__ == ["(raised by the data source's load (--data-source-path rm_stuck_source.Source))"]


def test_a_sync_resume_of_a_fully_async_checkpoint_serves_its_held_groups(tmp_path, monkeypatch):
    # Issue 27 pass 27: the manager's load read the held groups only for the fully-async rollout function; another
    # one resumed the cursor, which is past them, and their prompts were never trained.
    import json

    from slime_app.rollout_manager import RolloutManager
    from slime_rollout.data.source import RolloutDataSourceWithBuffer
    from slime_rollout.generation import fully_async

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}", "label": str(i)}) + "\n" for i in range(4)))
    ckpt = str(tmp_path / "ckpt")
    saved = plugin_args(parse_args([*BASE, "--prompt-data", str(data), "--save", ckpt]), EngineAddresses(urls=[]))
    source = RolloutDataSourceWithBuffer(saved)
    monkeypatch.setattr(fully_async, "_restored", source.get_samples(1))  # q0: drawn and held by the producer
    fully_async.save_state(saved, source, 0)
    monkeypatch.setattr(fully_async, "_restored", [])
    cfg = parse_args([*BASE, "--prompt-data", str(data), "--load", ckpt])  # the default (sync) rollout function
    manager = RolloutManager.__ray_metadata__.modified_class.__new__(RolloutManager.__ray_metadata__.modified_class)
    manager.cfg, manager.args = cfg, plugin_args(cfg, EngineAddresses(urls=[]))
    manager.data_source = RolloutDataSourceWithBuffer(manager.args)
    manager.load(0)
    assert [group[0].prompt for group in manager.data_source.get_samples(2)] == ["q0", "q1"]  # was q1, q2


def test_the_tokenizer_loads_while_the_engines_start(monkeypatch, tmp_path):
    # Issue 26: the manager loaded the tokenizer (and imported transformers) only once the engines were up, inside
    # the data source's construction: 7 s on one H100 host between "engine ready" and "engines up", which the
    # trainer's model load and gated compile warm-up waited for. Now its load overlaps the engines' start.
    import slime_rollout.data.tokenizer as tokenizer_module
    import slime_rollout.engines.client as client_module
    import slime_rollout.generation.rollout as rollout_module
    from slime_app.rollout_manager import RolloutManager

    loaded, order = threading.Event(), []

    def fake_get_tokenizer(path):
        order.append(("tokenizer", path, threading.current_thread().name))
        loaded.set()
        return object()

    def fake_start(self):
        # The engines' start takes long on a real machine: the prefetch must have run before it ends.
        order.append(("engines ready", loaded.wait(timeout=30)))
        self.urls = ["http://10.0.0.1:15000"]
        return self

    monkeypatch.setattr(tokenizer_module, "get_tokenizer", fake_get_tokenizer)
    monkeypatch.setattr(HostedEngines, "start", fake_start)
    monkeypatch.setattr(rollout_module, "create_data_source", lambda args: order.append(("data source",)) or None)
    monkeypatch.setattr(client_module, "get_client", lambda args: object())
    cfg = parse_args([*BASE, "--output-dir", str(tmp_path), "--rollout-num-gpus", "1"])
    manager = RolloutManager.__ray_metadata__.modified_class(cfg, None)
    assert manager.start() == ["http://10.0.0.1:15000"]
    assert order == [("tokenizer", "/m", "tokenizer-prefetch"), ("engines ready", True), ("data source",)]


def test_the_tokenizer_loaded_while_the_engines_start_is_the_one_the_data_source_gets(tmp_path, qwen3_tokenizer_dir):
    """`prefetch_tokenizer` fills `get_tokenizer`'s cache (the data source then loads nothing); a checkpoint whose
    tokenizer cannot load is left to the data source's own call, which raises its one-line error."""
    import json
    import shutil

    from slime_rollout.data.tokenizer import get_tokenizer, prefetch_tokenizer

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen3_tokenizer_dir / name, model / name)
    before = get_tokenizer.cache_info()
    prefetch_tokenizer(str(model)).join()
    loaded = get_tokenizer.cache_info()
    assert (loaded.misses, loaded.currsize) == (before.misses + 1, before.currsize + 1)
    assert len(get_tokenizer(str(model))) > 100_000  # the real Qwen3 vocabulary, from the cache
    assert get_tokenizer.cache_info().hits == loaded.hits + 1

    empty = tmp_path / "empty"  # config.json only: transformers builds an empty tokenizer, which is refused
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    prefetch_tokenizer(str(empty)).join()  # the thread's failure is not cached
    with pytest.raises(ValueError, match=r"its tokenizer is empty \(1 token\)"):
        get_tokenizer(str(empty))


def _grading_pool_semaphores() -> list[str]:
    """/dev/shm paths of the named semaphores of this process's grading pool (its call and result queues)."""
    from slime_rollout.rewards import pool as pool_module

    executor = pool_module._pool
    locks = [executor._call_queue._rlock, executor._call_queue._wlock, executor._call_queue._sem,
             executor._result_queue._rlock, executor._result_queue._wlock]  # fmt: skip
    return [f"/dev/shm/sem.{lock._semlock.name.lstrip('/')}" for lock in locks]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX named semaphores live in /dev/shm on Linux")
def test_dispose_stops_the_grading_pool_and_its_semaphores_go(tmp_path):
    # Issue 27: every run left 8 files /dev/shm/sem.mp-* behind (seen in a private /dev/shm after a normal demo run):
    # the grading pool's queues (spawn context) keep named semaphores until collected or until the resource tracker
    # unlinks them at exit, and Ray kills the rollout manager with its children, the tracker included.
    import asyncio
    import operator

    from slime_app.rollout_manager import RolloutManager
    from slime_rollout.rewards import pool as pool_module

    assert asyncio.run(pool_module.run_in_pool(operator.add, 2, 3, num_workers=1)) == 5
    semaphores = _grading_pool_semaphores()
    assert all(os.path.exists(path) for path in semaphores)
    cfg = parse_args([*BASE, "--output-dir", str(tmp_path), "--rollout-num-gpus", "1"])
    manager = RolloutManager.__ray_metadata__.modified_class(cfg, None)
    manager.dispose()
    assert pool_module._pool is None
    assert [path for path in semaphores if os.path.exists(path)] == []


class _Supervisor:
    def __init__(self):
        self.failed = []

    def fail(self, urls, reason):
        self.failed.append((urls, reason))


def test_a_dead_engine_under_fault_tolerance_is_restarted_when_the_engines_release_memory():
    # Was: the colocated offload/onload broadcast raised the dead engine's EngineError, so an engine that died while
    # the trainer trained ended a --use-fault-tolerance run at the next memory swap instead of being restarted.
    import asyncio

    from aiohttp import web

    from slime_app.rollout_manager import RolloutManager
    from slime_rollout.engines.client import RolloutClient
    from slime_rollout.engines.process import find_free_port
    from slime_rollout.engines.transport import EngineError
    from slime_rollout.runtime.async_utils import run

    calls = []

    async def handler(request):
        calls.append(request.path)
        return web.Response(status=200)

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def start():
        runner = web.AppRunner(web.Application())
        runner.app.router.add_route("*", "/{tail:.*}", handler)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"

    runner, live = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    dead = f"http://127.0.0.1:{find_free_port(start=29700)}"  # nothing listens: connection refused
    try:
        cls = RolloutManager.__ray_metadata__.modified_class
        for supervisor in (_Supervisor(), None):
            manager = cls.__new__(cls)
            manager.engines, manager.offloaded, manager.supervisor = object(), False, supervisor
            manager.client = RolloutClient([live, dead], max_retries=0)
            try:
                if supervisor is None:  # without fault tolerance the dead engine ends the run, naming it
                    with pytest.raises(EngineError, match=dead.replace(".", r"\.")):
                        manager.offload()
                    continue
                calls.clear()
                manager.offload()
            finally:
                run(manager.client.aclose())
            assert calls == ["/flush_cache", "/release_memory_occupation"]  # the live engine released its memory
            assert manager.offloaded
            assert [urls for urls, _ in supervisor.failed] == [[dead], [dead]]
            assert supervisor.failed[0][1] == "/flush_cache failed: engine unreachable"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)


def slow_to_return_rollout(args, rollout_id, data_source, evaluation=False):
    """Two samples of 3 and 5 response tokens; 0.3 s go by after its own metrics (as a dump or a plugin takes)."""
    import time

    from slime_core.sample import Sample, Status
    from slime_rollout.base_types import RolloutFnTrainOutput
    from slime_rollout.runtime.metrics import compute_rollout_metrics

    group = [Sample(index=i, group_index=0, tokens=[1] * (2 + n), response_length=n, loss_mask=[1] * n, reward=1.0,
                    status=Status.COMPLETED) for i, n in enumerate((3, 5))]  # fmt: skip
    metrics = compute_rollout_metrics(args, [group], rollout_time=0.01)
    time.sleep(0.3)
    return RolloutFnTrainOutput(samples=[group], metrics=metrics)


slow_to_return_rollout.computes_metrics = True  # its metrics are kept as they are, as the built-ins' are


def test_the_rollout_rates_divide_by_the_logged_rollout_time():
    # The original's compute_perf_metrics_from_samples divides its rates by the rollout_time it logs. Here the manager
    # logged its own (whole) perf/rollout_time beside the function's rates over the function's shorter time: with
    # 2 GPUs, 8 tokens gave 400 tokens/s/GPU over 0.01 s next to a perf/rollout_time of 0.3 s.
    from slime_app.rollout_manager import RolloutManager

    path = f"{__name__}.slow_to_return_rollout"
    cfg = parse_args([*BASE, "--rollout-function-path", path, "--debug-rollout-only", "--n-samples-per-prompt", "2"])
    manager = RolloutManager.__ray_metadata__.modified_class.__new__(RolloutManager.__ray_metadata__.modified_class)
    manager.cfg, manager.args = cfg, plugin_args(cfg, EngineAddresses(urls=[]))
    manager.data_source, manager.supervisor, manager.template_checks_left = None, None, 0
    _, metrics = manager.generate(0)
    seconds = metrics["perf/rollout_time"]
    assert seconds >= 0.3
    assert metrics["perf/tokens_per_gpu_per_sec"] == pytest.approx(8 / seconds / 2, rel=1e-9)
    assert metrics["perf/longest_sample_tokens_per_sec"] == pytest.approx(5 / seconds, rel=1e-9)


def test_the_originals_opd_plugins_run_through_the_rollout_metrics_and_batches():
    """examples/on_policy_distillation/run-qwen3-8B-opd.sh, run unchanged: `--custom-rm-path
    slime.rollout.on_policy_distillation.reward_func` makes each sample's reward the teacher's reply (a dict) and
    `--custom-reward-post-process-path ...post_process_rewards` turns the replies into teacher log-probs and zero
    rewards. The rollout's metrics read the replies as scores and the run stopped after its first rollout
    ("reward is a dict with keys ['meta_info', 'output_ids', 'text']; set --reward-key"); the original logs the
    rewards the plugin returned."""
    from slime_app.rollout_manager import rollout_batches
    from slime_core.config import PluginArgs
    from slime_core.sample import Sample
    from slime_rollout.runtime.metrics import compute_rollout_metrics

    flags = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
             "--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func",
             "--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards",
             "--rm-url", "http://127.0.0.1:1/generate", "--use-opd", "--opd-type", "sglang"]  # fmt: skip
    cfg = parse_args([*BASE, *flags])

    def teacher_reply(tokens, last):  # SGLang's input_token_logprobs from position 0: the first entry has none
        logprobs = [[None, tokens[0], None]] + [[-0.5, t, None] for t in tokens[1:-1]] + [[last, tokens[-1], None]]
        return {"text": "", "output_ids": [], "meta_info": {"input_token_logprobs": logprobs}}

    groups = [
        [Sample(index=2 * g + i, group_index=g, tokens=[1, 2, 3 + i], response_length=1, loss_mask=[1],
                reward=teacher_reply([1, 2, 3 + i], -0.25 * (i + 1)), metadata={"raw_reward": 0.0})
         for i in range(2)]
        for g in range(2)
    ]  # fmt: skip
    metrics = compute_rollout_metrics(cfg, groups, rollout_time=1.0)
    assert not any(k.startswith(("rollout/raw_reward", "rollout/rewards", "rollout/zero_std/")) for k in metrics)
    samples = [s for g in groups for s in g]
    batches, reward_metrics = rollout_batches(PluginArgs.from_config(cfg), samples, dp_size=1, rollout_id=0)
    # Pure distillation: zero rewards, so both groups have no spread (count_0.0 = 2), as the advantages see them.
    assert reward_metrics == {"rollout/raw_reward": 0.0, "rollout/rewards": 0.0, "rollout/zero_std/count_0.0": 2.0}
    assert [s.teacher_log_probs for s in samples] == [[-0.25], [-0.5], [-0.25], [-0.5]]
    assert batches[0].rewards == [0.0] * 4
