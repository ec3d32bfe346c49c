"""EngineClient / RolloutClient against mock transports (retries, errors, dispatch, abort, caching)."""

import asyncio
import json
import types

import httpx
import pytest

from slime_rollout.client import (
    EngineClient,
    EngineError,
    RolloutClient,
    _count_requests,
    get_client,
    reset_client_cache,
)


async def test_retries_connection_errors_then_succeeds():
    attempts = []

    def handler(request):
        attempts.append(request.url.path)
        if len(attempts) < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"weight_version": "5"})

    c = EngineClient("http://e:1", transport=httpx.MockTransport(handler), backoff_s=0.001)
    assert await c.get_weight_version() == "5"
    assert attempts == ["/model_info"] * 3


async def test_gives_up_with_url_in_message():
    def handler(request):
        raise httpx.ConnectError("refused", request=request)

    c = EngineClient("e:7", transport=httpx.MockTransport(handler), max_retries=2, backoff_s=0.001)
    with pytest.raises(EngineError, match=r"engine http://e:7/flush_cache failed: unreachable after 3 attempts"):
        await c.flush_cache()


async def test_unreachable_real_port_names_url():
    from slime_rollout.engines.process import find_free_port

    port = find_free_port(start=41000)  # nothing listens there
    c = EngineClient(f"http://127.0.0.1:{port}", max_retries=1, backoff_s=0.001)
    with pytest.raises(EngineError) as e:
        await c.generate({"input_ids": [1]})
    assert f"127.0.0.1:{port}/generate" in str(e.value) and e.value.status_code is None
    assert await c.health() is False


async def test_http_error_and_success_false_raise_engine_error():
    def handler(request):
        if request.url.path == "/generate":
            return httpx.Response(400, json={"error": {"message": "bad top_p"}})
        return httpx.Response(200, json={"success": False, "message": "unknown parameter 'x'"})

    c = EngineClient("http://e:1", transport=httpx.MockTransport(handler))
    with pytest.raises(EngineError) as e:
        await c.generate({})
    assert e.value.status_code == 400 and e.value.endpoint == "/generate" and "bad top_p" in str(e.value)
    with pytest.raises(EngineError, match="unknown parameter 'x'"):
        await c.update_weights_from_disk("/m")


async def test_request_bodies_use_sglang_field_names():
    bodies = {}

    def handler(request):
        bodies[request.url.path] = json.loads(request.content) if request.content else None
        return httpx.Response(200, json={"success": True})

    c = EngineClient("http://e:1", transport=httpx.MockTransport(handler))
    await c.update_weights_from_tensor(["abc"], load_format="flattened_bucket", weight_version="3")
    await c.init_weights_update_group(master_address="h", master_port=9, rank_offset=1, world_size=3, group_name="g")
    await c.update_weights_from_distributed(names=["w"], dtypes=["bfloat16"], shapes=[[2]], group_name="g")
    await c.abort_request(abort_all=True)
    await c.pause_generation()
    await c.resume_memory_occupation(tags=["weights"])
    assert bodies["/update_weights_from_tensor"] == {
        "serialized_named_tensors": ["abc"],
        "load_format": "flattened_bucket",
        "flush_cache": False,
        "weight_version": "3",
    }
    assert bodies["/init_weights_update_group"] == {
        "master_address": "h",
        "master_port": 9,
        "rank_offset": 1,
        "world_size": 3,
        "group_name": "g",
        "backend": "nccl",
    }
    assert bodies["/update_weights_from_distributed"]["names"] == ["w"]
    assert bodies["/update_weights_from_distributed"]["dtypes"] == ["bfloat16"]
    assert bodies["/abort_request"] == {"rid": "", "abort_all": True}
    assert bodies["/pause_generation"] == {"mode": "abort"}
    assert bodies["/resume_memory_occupation"] == {"tags": ["weights"]}


async def test_least_outstanding_dispatch():
    release = {"e0": asyncio.Event(), "e1": asyncio.Event()}
    hits = []

    async def handler(request):
        host = request.url.host
        hits.append(host)
        if host == "e0":
            await release["e0"].wait()
        return httpx.Response(200, json={"text": host})

    rc = RolloutClient(["http://e0:1", "http://e1:1"], transport=httpx.MockTransport(handler))
    slow = [asyncio.create_task(rc.generate({})) for _ in range(2)]  # ties alternate: one each
    await asyncio.sleep(0.05)
    assert sorted(hits) == ["e0", "e1"]
    # e0 holds one request, e1 none: everything sequential goes to e1
    outs = [await rc.generate({}) for _ in range(3)]
    assert [o["text"] for o in outs] == ["e1"] * 3
    release["e0"].set()
    await asyncio.gather(*slow)
    assert rc._outstanding == [0, 0]


async def test_router_mode_sends_generate_to_router_and_discovers_workers():
    seen = []

    def handler(request):
        seen.append((request.url.host, request.url.path))
        if request.url.path == "/workers":
            return httpx.Response(200, json={"workers": [{"url": "http://w0:1", "id": "a"}, {"url": "http://w1:1"}]})
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"weight_version": "1"})
        return httpx.Response(200, json={"text": "ok"})

    rc = RolloutClient([], router_url="http://r:9", transport=httpx.MockTransport(handler))
    assert (await rc.generate({"text": "x"}))["text"] == "ok"
    assert seen == [("r", "/generate")]
    assert await rc.get_weight_versions() == ["1", "1"]  # discovered from GET /workers
    assert rc.urls == ["http://w0:1", "http://w1:1"]


async def test_abort_all_waits_until_idle():
    loads = {"e0": [2, 1, 0], "e1": [0]}
    aborted = []

    def handler(request):
        host = request.url.host
        if request.url.path == "/abort_request":
            aborted.append((host, json.loads(request.content)))
            return httpx.Response(200)
        n = loads[host].pop(0) if len(loads[host]) > 1 else loads[host][0]
        return httpx.Response(200, json={"loads": [{"num_running_reqs": n, "num_waiting_reqs": 0}]})

    rc = RolloutClient(["http://e0:1", "http://e1:1"], transport=httpx.MockTransport(handler))
    await rc.abort_all(poll_s=0.001)
    assert sorted(h for h, _ in aborted) == ["e0", "e1"] and all(b["abort_all"] for _, b in aborted)
    assert loads["e0"] == [0]


async def test_abort_all_times_out_naming_busy_engine():
    def handler(request):
        if request.url.path == "/abort_request":
            return httpx.Response(200)
        return httpx.Response(200, json={"num_total_reqs": 4})

    rc = RolloutClient(["http://e0:1"], transport=httpx.MockTransport(handler))
    with pytest.raises(TimeoutError, match=r"http://e0:1 \(4\)"):
        await rc.abort_all(poll_s=0.001, timeout_s=0.01)


async def test_broadcast_unknown_method():
    rc = RolloutClient(["http://e0:1"])
    with pytest.raises(AttributeError, match="no_such"):
        await rc.broadcast("no_such")


def test_count_requests_shapes():
    assert _count_requests({"loads": [{"num_running_reqs": 2, "num_waiting_reqs": 3}, {"num_total_reqs": 1}]}) == 6
    assert _count_requests([{"num_reqs": 2}, {"total_reqs": 1}]) == 3
    with pytest.raises(ValueError, match="/v1/loads"):
        _count_requests("busy")


def test_get_client_is_cached_per_engine_set():
    reset_client_cache()
    a = get_client(types.SimpleNamespace(rollout_engine_urls=["http://e0:1"], sglang_router_ip=None))
    assert get_client(types.SimpleNamespace(rollout_engine_urls="http://e0:1")) is a
    routed = get_client(types.SimpleNamespace(sglang_router_ip="r", sglang_router_port=3, rollout_engine_urls=None))
    assert routed is not a and routed.router.url == "http://r:3"
    with pytest.raises(ValueError, match="--rollout-engine-urls"):
        get_client(types.SimpleNamespace())
    reset_client_cache()


def test_client_works_across_event_loops():
    def handler(request):
        return httpx.Response(200, json={"weight_version": "v"})

    c = EngineClient("http://e:1", transport=httpx.MockTransport(handler))
    assert asyncio.run(c.get_weight_version()) == "v"
    assert asyncio.run(c.get_weight_version()) == "v"  # a fresh loop gets a fresh httpx client


async def test_weight_version_falls_back_to_the_old_route():
    seen = []

    def handler(request):
        seen.append(request.url.path)
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"model_path": "m"})  # an engine without the field
        return httpx.Response(200, json={"weight_version": "9"})

    c = EngineClient("http://e:1", transport=httpx.MockTransport(handler))
    assert await c.get_weight_version() == "9"
    assert seen == ["/model_info", "/get_weight_version"]


async def test_dropped_keepalive_connection_is_retried():
    attempts = []

    def handler(request):
        attempts.append(request.url.path)
        if len(attempts) == 1:
            raise httpx.ReadError("", request=request)  # server closed a pooled connection
        return httpx.Response(200, json={"text": "ok", "meta_info": {}})

    c = EngineClient("http://e:1", transport=httpx.MockTransport(handler), backoff_s=0.001)
    assert (await c.generate({"input_ids": [1]}))["text"] == "ok"
    assert attempts == ["/generate", "/generate"]
