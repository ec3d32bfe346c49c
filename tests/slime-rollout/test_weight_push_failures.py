"""Every way a weight push can fail ends the same way: named engines in a `WeightPushError`, none serving a mix.

The driver's restorer (`slime_app.restore`) restarts the engines a `WeightPushError` names; any other error ends a
fault-tolerant run. Engines here are small aiohttp fakes that keep a weight version the way SGLang does (each bucket's
`weight_version`, then `/update_weight_version`).
"""

import asyncio

import pytest
import torch
from aiohttp import web

from slime_core.config import SlimeArgs
from slime_rollout.engines.client import RolloutClient
from slime_rollout.engines.transport import EngineError
from slime_rollout.weight_sync.updaters import TensorWeightUpdater, WeightPushError


def _cfg():
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _engine(log, name, *, report=None, hang_on_bucket=None, hang_on=None):
    """A fake engine: `report` overrides the version it reports after the fence (a stale or lying engine; "error":
    its `/model_info` fails); `hang_on_bucket` (1-based) applies that bucket, then never answers (the client times
    out); `hang_on` (a route) answers it only after 3 s."""
    state = {"version": "0", "buckets": 0}

    async def handler(request):
        body = await request.json() if request.method == "POST" and request.can_read_body else {}
        if request.path == "/model_info" and report == "error":
            return web.json_response({"success": False, "message": "scheduler died"}, status=500)
        if request.path == "/model_info":
            return web.json_response({"weight_version": report or state["version"]})
        if request.path == "/update_weights_from_tensor":
            state["buckets"] += 1
            state["version"] = body["weight_version"]  # SGLang reports a bucket's version once it is applied
            if state["buckets"] == hang_on_bucket:
                await asyncio.sleep(30)
        elif request.path == "/update_weight_version":
            state["version"] = body["new_version"]
        if request.path == hang_on:
            await asyncio.sleep(3)
        log.append((name, request.path))
        return web.json_response({"success": True})

    return handler


def _buckets(n, *, fail_after=None):
    for i in range(n):
        if i == fail_after:
            raise ValueError("bucket 1 could not be gathered")
        yield [(f"w{i}", torch.full((2,), float(i)))]


async def test_an_engine_reporting_another_version_after_the_fence_is_a_named_push_failure(http_server):
    # Was: RuntimeError("weight update to '5' not applied"), which the restorer does not handle (the run ended), and
    # the push had already continued every engine, the stale one too.
    log = []
    good = await http_server(_engine(log, "good"))
    stale = await http_server(_engine(log, "stale", report="4"))
    with pytest.raises(WeightPushError) as e:
        await TensorWeightUpdater(_cfg(), RolloutClient([good, stale]), load_format=None).aupdate(_buckets(2), "5")
    assert e.value.failed == {stale: "reports weight version '4' after the push"}
    assert ("good", "/continue_generation") in log and ("stale", "/continue_generation") not in log
    assert await RolloutClient([good, stale]).get_weight_versions() == ["5", "4"]


async def test_an_engine_failing_the_version_check_is_named_and_the_others_complete(http_server):
    log = []
    good = await http_server(_engine(log, "good"))
    broken = await http_server(_engine(log, "broken", report="error"))
    client = RolloutClient([broken, good], max_retries=0)
    with pytest.raises(WeightPushError) as e:
        await TensorWeightUpdater(_cfg(), client, load_format=None).aupdate(_buckets(2), "5")
    assert list(e.value.failed) == [broken] and "scheduler died" in e.value.failed[broken]
    assert ("good", "/continue_generation") in log and ("broken", "/continue_generation") not in log


async def test_a_bucket_that_fails_on_this_side_leaves_no_engine_serving_a_mix_under_the_new_version(http_server):
    # Was: the ValueError skipped the relabel and the `finally` continued the engine, which then served one bucket
    # of the new weights and the rest of the old ones while reporting version "5".
    log = []
    url = await http_server(_engine(log, "e0"))
    with pytest.raises(ValueError, match="could not be gathered"):  # this side's error stays itself: no restart
        await TensorWeightUpdater(_cfg(), RolloutClient([url]), load_format=None).aupdate(
            _buckets(3, fail_after=1), "5"
        )
    assert ("e0", "/continue_generation") not in log
    assert await RolloutClient([url]).get_weight_versions() == ["5-incomplete"]


async def test_an_engine_that_applied_a_bucket_but_never_answered_is_relabelled_incomplete(http_server):
    # Was: only answered buckets counted, so an engine that timed out on its first bucket (applied, as SGLang does
    # before it replies) kept reporting the new version with one bucket of it.
    log = []
    good = await http_server(_engine(log, "good"))
    slow = await http_server(_engine(log, "slow", hang_on_bucket=1))
    client = RolloutClient([good, slow], timeout=1.0, max_retries=0)
    with pytest.raises(WeightPushError) as e:
        await TensorWeightUpdater(_cfg(), client, load_format=None).aupdate(_buckets(2), "5")
    assert list(e.value.failed) == [slow]
    assert isinstance(e.value.failed, dict) and "update_weights_from_tensor" in e.value.failed[slow]
    assert await RolloutClient([good, slow]).get_weight_versions() == ["5", "5-incomplete"]


@pytest.mark.parametrize("route", ["/flush_cache", "/update_weight_version", "/continue_generation"])
async def test_an_engine_hung_on_a_quick_control_call_is_cut_off_by_the_health_check_timeout(http_server, route):
    # Was: each of these waited up to the 1800 s control timeout, which no flag changed; SGLang answers them at once.
    log = []
    good = await http_server(_engine(log, "good"))
    hung = await http_server(_engine(log, "hung", hang_on=route))
    client = RolloutClient([good, hung], max_retries=0, probe_timeout_s=0.5)
    with pytest.raises(WeightPushError) as e:
        await TensorWeightUpdater(_cfg(), client, load_format=None).aupdate(_buckets(2), "5")
    assert list(e.value.failed) == [hung]
    assert route in e.value.failed[hung] and "(--rollout-health-check-timeout)" in e.value.failed[hung]
    assert ("good", "/continue_generation") in log


@pytest.mark.parametrize("route", ["/pause_generation", "/update_weights_from_tensor"])
async def test_an_engine_slow_on_pause_or_a_bucket_is_cut_off_by_update_weight_timeout(http_server, route):
    # Was: these waited up to the client's 1800 s read timeout, which no flag changed (SGLang answers them only once
    # in-flight requests have left, then loads), and the error named no flag.
    from slime_rollout.weight_sync.push import push_client

    log = []
    good = await http_server(_engine(log, "good"))
    slow = await http_server(_engine(log, "slow", hang_on=route))
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "update_weight_timeout": 0.5})
    client = push_client(cfg, [good, slow])
    with pytest.raises(WeightPushError) as e:
        await TensorWeightUpdater(cfg, client, load_format=None).aupdate(_buckets(2), "5")
    assert list(e.value.failed) == [slow]
    said = f"weight push: {route[1:]} on engine {slow} did not finish within 0.5 s (--update-weight-timeout)"
    assert said in e.value.failed[slow]
    assert ("good", "/continue_generation") in log
    assert await RolloutClient([good]).get_weight_versions() == ["5"]


def test_the_push_client_takes_the_runs_bounds():
    # Was: the trainer built its push client with the defaults, so --rollout-health-check-timeout and
    # --slow-call-warning-secs given to the run did not bound or report the push's calls.
    from slime_rollout.engines.transport import DEFAULT_TIMEOUT_S
    from slime_rollout.weight_sync.push import push_client

    flags = {"rollout_health_check_timeout": 7.0, "slow_call_warning_secs": 11.0, "update_weight_timeout": 3600.0}
    client = push_client(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **flags}), ["http://e:1"])
    assert (client.pool.probe_timeout_s, client.pool.slow_warning_s, client.update_weight_timeout_s) == (7, 11, 3600)
    # The socket's read timeout stays behind the push's deadline (+ 5 %), so the error naming the flag comes first.
    assert client.engines[0].timeout.sock_read == 3780.0
    assert push_client(_cfg(), ["http://e:1"]).engines[0].timeout.sock_read == 1890.0  # the 1800 s default
    short = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "update_weight_timeout": 5})
    assert push_client(short, ["http://e:1"]).engines[0].timeout.sock_read == DEFAULT_TIMEOUT_S  # never below it


def test_an_engine_error_escaping_a_collective_push_names_every_engine_in_it():
    from slime_rollout.weight_sync.push import PushSession

    class _Engine:
        def __init__(self, url):
            self.url = url

    a, b = _Engine("http://a:1"), _Engine("http://b:1")
    session = PushSession([a, b], tolerant=False)
    session.end_for_all(EngineError(b.url, "/update_weights_from_distributed", "unknown parameter 'x'", 400))
    said = "EngineError: engine http://b:1/update_weights_from_distributed failed (HTTP 400): unknown parameter 'x'"
    assert session.failed == {a.url: f"push stopped when http://b:1 failed: {said}", b.url: said}
    assert session.live == []


class _Url:
    def __init__(self, url):
        self.url = url


async def _fail_after(delay_s, error):
    await asyncio.sleep(delay_s)
    raise error


async def test_a_broadcast_broken_by_an_engine_that_died_is_that_engines_failure(monkeypatch):
    # Was: this end's broadcast failing first (the peer's socket closed) ended the push with gloo's RuntimeError, an
    # error of "this side" the restorer does not handle, although the engine's HTTP call failed unreachable a moment
    # later; which of the two came first was a race.
    from slime_rollout.weight_sync import push

    own = asyncio.ensure_future(_fail_after(0.0, RuntimeError("[gloo] Connection closed by peer")))
    dead = EngineError("http://e:1", "/update_weights_from_distributed", "ServerDisconnectedError", unreachable=True)
    calls = [asyncio.sleep(30), _fail_after(0.2, dead)]
    with pytest.raises(EngineError) as e:
        await push.alongside_engines(
            own, calls, [_Url("http://a:1"), _Url("http://e:1")], "/update_weights_from_distributed"
        )
    assert e.value is dead and "Connection closed by peer" in str(e.value.__cause__)


async def test_a_broadcast_failing_on_this_side_stays_this_sides_error(monkeypatch):
    from slime_rollout.weight_sync import push

    monkeypatch.setattr(push, "PEER_GRACE_S", 0.3)
    own = asyncio.ensure_future(_fail_after(0.0, TypeError("gloo cannot broadcast this dtype")))
    refused = EngineError("http://e:1", "/update_weights_from_distributed", "bad shape", 400)  # answered: not lost
    calls = [asyncio.sleep(30), _fail_after(0.05, refused)]
    with pytest.raises(TypeError, match="dtype"):
        await push.alongside_engines(
            own, calls, [_Url("http://a:1"), _Url("http://e:1")], "/update_weights_from_distributed"
        )


async def test_a_lora_engine_failing_to_unload_its_adapter_is_dropped_and_the_others_load(http_server, tmp_path):
    # Was: the unload ran in a bare gather outside the push session, so one engine's 500 (or a dead engine) escaped
    # as an EngineError: the push stopped for every engine and ended a --use-fault-tolerance run.
    from slime_rollout.weight_sync.lora import LoraWeightUpdater

    log = []

    def lora_engine(name, *, unload_status=200):
        async def handler(request):
            log.append((name, request.path))
            if request.path == "/model_info":
                return web.json_response({"weight_version": "7"})
            if request.path == "/unload_lora_adapter" and unload_status != 200:
                return web.json_response({"success": False, "message": "CUDA error"}, status=unload_status)
            return web.json_response({"success": True})

        return handler

    good = await http_server(lora_engine("good"))
    bad = await http_server(lora_engine("bad", unload_status=500))
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "fsdp", "lora_rank": 2,
                               "lora_alpha": 4.0, "update_weight_disk_dir": str(tmp_path / "sync")})  # fmt: skip
    buckets = [[("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", torch.zeros(2, 4))]]
    with pytest.raises(WeightPushError) as e:
        await LoraWeightUpdater(cfg, RolloutClient([good, bad], max_retries=0)).aupdate(buckets, "7")
    assert list(e.value.failed) == [bad] and "CUDA error" in e.value.failed[bad]
    assert ("good", "/load_lora_adapter") in log and ("bad", "/load_lora_adapter") not in log
    assert ("good", "/continue_generation") in log and ("bad", "/continue_generation") not in log
