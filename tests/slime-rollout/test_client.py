"""EngineClient / RolloutClient against real local HTTP servers (retries, errors, dispatch, abort, caching).

Servers are aiohttp.web apps on 127.0.0.1 (the `http_server` fixtures in conftest.py) with handlers
written here, so requests travel the client's production path.
"""

import asyncio
import json
import os

import pytest
from aiohttp import web

from slime_core.config import PluginArgs, SlimeArgs
from slime_rollout.engines.client import (
    EngineClient,
    EngineError,
    EngineResponse,
    RolloutClient,
    get_client,
    reset_client_cache,
)
from slime_rollout.engines.engine_client import count_requests
from slime_rollout.engines.process import find_free_port


async def test_retries_connection_errors_then_succeeds(http_server):
    seen = []

    async def handler(request):
        seen.append(request.path)
        return web.json_response({"weight_version": "5"})

    port = find_free_port(start=41000)
    c = EngineClient(f"http://127.0.0.1:{port}", backoff_s=0.02, max_backoff_s=0.02, max_retries=1000)
    call = asyncio.create_task(c.get_weight_version())
    await asyncio.sleep(0.2)  # the first attempts are refused: nothing listens yet
    assert not call.done()
    await http_server(handler, port=port)
    assert await call == "5"
    assert seen == ["/model_info"]  # the refused attempts never reached a server


async def test_gives_up_with_url_in_message():
    port = find_free_port(start=41000)  # nothing listens there
    c = EngineClient(f"127.0.0.1:{port}", max_retries=2, backoff_s=0.001)  # "host:port" is accepted
    with pytest.raises(
        EngineError, match=rf"engine http://127\.0\.0\.1:{port}/flush_cache failed: unreachable after 3 attempts"
    ):
        await c.flush_cache()


async def test_a_server_that_answered_and_now_refuses_is_given_up_within_a_second():
    # A killed engine: nothing listens on its port any more. Each request spent the whole connection-retry budget
    # (8 retries, ~20 s) on it, and the rollout's abort to it another ~20 s, before the run saw the engine fail.
    async def handler(request):
        return web.json_response({"weight_version": "5"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    c = EngineClient(f"http://127.0.0.1:{runner.addresses[0][1]}")  # the default budget: 8 retries
    assert await c.get_weight_version() == "5"
    await runner.cleanup()  # the engine dies
    loop = asyncio.get_running_loop()
    for call in (c.generate({"input_ids": [1]}), c.abort_request(abort_all=True)):
        start = loop.time()
        with pytest.raises(EngineError, match=r"unreachable after 2 attempts: .*\(it answered before: its server is "):
            await call
        assert loop.time() - start < 5  # one retry after 0.25 s


async def test_unreachable_real_port_names_url():
    port = find_free_port(start=41000)  # nothing listens there
    c = EngineClient(f"http://127.0.0.1:{port}", max_retries=1, backoff_s=0.001)
    with pytest.raises(EngineError) as e:
        await c.generate({"input_ids": [1]})
    assert f"127.0.0.1:{port}/generate" in str(e.value) and e.value.status_code is None
    assert await c.health() is False


async def test_http_error_and_success_false_raise_engine_error(http_server):
    async def handler(request):
        if request.path == "/generate":
            return web.json_response({"error": {"message": "bad top_p"}}, status=400)
        return web.json_response({"success": False, "message": "unknown parameter 'x'"})

    url = await http_server(handler)
    c = EngineClient(url)
    with pytest.raises(EngineError) as e:
        await c.generate({})
    assert e.value.status_code == 400 and e.value.endpoint == "/generate" and "bad top_p" in str(e.value)
    assert e.value.url == url and f"{url}/generate" in str(e.value)
    with pytest.raises(EngineError, match="unknown parameter 'x'"):
        await c.update_weights_from_disk("/m")


async def test_flush_cache_waits_out_sglangs_busy_refusal(http_server):
    # SGLang 0.5.16 answers /flush_cache with HTTP 400 (same text) while requests run or wait (scheduler.py
    # flush_cache: is_fully_idle), as just after pause_generation aborted them; one 400 failed the weight push.
    text = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting " \
           "requests, the operation will not be performed.)\n"  # fmt: skip
    calls = {"busy": 0, "down": 0, "stuck": 0}

    async def handler(request):
        kind = request.path.strip("/").split("/")[0]
        calls[kind] += 1
        if kind == "busy":
            return web.Response(text=text, status=400 if calls["busy"] <= 2 else 200)
        return web.Response(text=text if kind == "stuck" else "oops", status=400 if kind == "stuck" else 500)

    url = await http_server(handler)
    await EngineClient(url + "/busy").flush_cache(poll_s=0.01)
    assert calls["busy"] == 3
    with pytest.raises(EngineError, match=r"/flush_cache failed \(HTTP 400\): requests still run or wait after 0.2 s"):
        await EngineClient(url + "/stuck").flush_cache(deadline_s=0.2, poll_s=0.05)
    assert calls["stuck"] >= 2
    with pytest.raises(EngineError, match="HTTP 500"):
        await EngineClient(url + "/down", max_retries=0).flush_cache(poll_s=0.01)
    assert calls["down"] == 1  # any other failure is not waited out


@pytest.mark.parametrize(
    ("body", "said"),
    [
        # SGLang 0.5.16 http_server.py: `_create_error_response` and the RequestValidationError handler's body.
        ('{"error": {"message": "top_p must be in (0, 1], got 0.0."}}', "top_p must be in (0, 1], got 0.0."),
        ('{"object": "error", "message": "1 validation error", "type": "Bad Request", "param": null, "code": 400}',
         "1 validation error"),
        ("Internal Server Error", "Internal Server Error"),  # not JSON: as it came
        ('["a list"]', '["a list"]'),
    ],
)  # fmt: skip
def test_engine_message_reads_sglangs_error_bodies(body, said):
    assert EngineError("http://e", "/generate", body, 400).engine_message == said


async def test_get_params_post_json_empty_body_text_and_raw(http_server):
    async def handler(request):
        if request.path == "/v1/loads":
            assert request.method == "GET" and not await request.read()
            return web.json_response({"num_total_reqs": int(request.query["include"] == "core")})
        if request.path == "/plain":
            return web.Response(text="not json")
        if request.path == "/echo":
            return web.json_response({"method": request.method, "body": await request.json()})
        return web.Response(status=200)  # empty body

    c = EngineClient(await http_server(handler))
    assert await c.num_unfinished_requests() == 1  # GET carried ?include=core
    assert await c.request("POST", "/echo", {"a": [1, 2]}) == {"method": "POST", "body": {"a": [1, 2]}}
    assert await c.request("POST", "/empty", {}) is None
    assert await c.request("GET", "/plain") == "not json"
    resp = await c.request("POST", "/echo", {"b": 1}, raw=True)
    assert isinstance(resp, EngineResponse) and resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json() == {"method": "POST", "body": {"b": 1}} and json.loads(resp.text) == resp.json()


async def test_per_request_timeout_raises_without_retry(http_server):
    hits = []

    async def handler(request):
        hits.append(request.path)
        await asyncio.sleep(5)
        return web.json_response({})

    c = EngineClient(await http_server(handler), backoff_s=0.001)
    with pytest.raises(EngineError, match=r"/generate failed: .*Timeout"):
        await c.request("POST", "/generate", {}, timeout=0.1)
    assert hits == ["/generate"]  # the engine got it: a read timeout is not retried


async def test_request_bodies_use_sglang_field_names(http_server):
    bodies = {}

    async def handler(request):
        raw = await request.read()
        bodies[request.path] = json.loads(raw) if raw else None
        return web.json_response({"success": True})

    c = EngineClient(await http_server(handler))
    await c.update_weights_from_tensor(["abc"], load_format="flattened_bucket", weight_version="3")
    await c.init_weights_update_group(master_address="h", master_port=9, rank_offset=1, world_size=3, group_name="g")
    await c.update_weights_from_distributed(names=["w"], dtypes=["bfloat16"], shapes=[[2]], group_name="g")
    await c.abort_request(abort_all=True)
    await c.pause_generation()
    await c.resume_memory_occupation(tags=["weights"])
    await c.load_lora_adapter("a", "/d")
    await c.unload_lora_adapter("a")
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
    # the wire records' bodies: SGLang 0.5.16 reads `lora_id` as Optional[str] and replaces it with its own id
    assert bodies["/load_lora_adapter"] == {"lora_name": "a", "lora_path": "/d", "pinned": False, "lora_id": None}
    assert bodies["/unload_lora_adapter"] == {"lora_name": "a", "lora_id": None}


async def test_destroy_weights_update_group_takes_its_own_timeout_and_retries(http_server):
    # The weight-sync teardown gives each engine a short deadline and no retries (a dead engine has no group).
    port = find_free_port(start=41000)  # nothing listens there
    c = EngineClient(f"http://127.0.0.1:{port}", backoff_s=0.01, max_backoff_s=0.01, max_retries=1000)
    with pytest.raises(EngineError, match=r"/destroy_weights_update_group failed: unreachable after 1 attempts"):
        await asyncio.wait_for(c.destroy_weights_update_group("g", max_retries=0), timeout=30)
    release = asyncio.Event()

    async def handler(request):
        await asyncio.wait_for(release.wait(), timeout=30)
        return web.json_response({"success": True})

    slow = EngineClient(await http_server(handler), timeout=600.0)
    try:
        with pytest.raises(EngineError, match="/destroy_weights_update_group"):
            await asyncio.wait_for(slow.destroy_weights_update_group("g", timeout=0.2), timeout=30)
    finally:
        release.set()
        await c.aclose()
        await slow.aclose()


async def test_least_outstanding_dispatch(http_server):
    release = asyncio.Event()
    hits = []

    def engine(name):
        async def handler(request):
            hits.append(name)
            if name == "e0":
                await release.wait()
            return web.json_response({"text": name})

        return handler

    rc = RolloutClient([await http_server(engine("e0")), await http_server(engine("e1"))])
    slow = [asyncio.create_task(rc.generate({})) for _ in range(2)]  # ties alternate: one each
    for _ in range(500):
        if len(hits) == 2:
            break
        await asyncio.sleep(0.01)
    assert sorted(hits) == ["e0", "e1"]
    # e0 holds one request, e1 none: everything sequential goes to e1
    outs = [await rc.generate({}) for _ in range(3)]
    assert [o["text"] for o in outs] == ["e1"] * 3
    release.set()
    await asyncio.gather(*slow)
    assert [slot.outstanding for slot in rc.pool.slots] == [0, 0]


async def test_router_mode_sends_generate_to_router_and_discovers_workers(http_server):
    seen = []

    def server(name):
        async def handler(request):
            seen.append((name, request.path))
            if request.path == "/workers":
                return web.json_response({"workers": [{"url": w0, "id": "a"}, {"url": w1}]})
            if request.path == "/model_info":
                return web.json_response({"weight_version": name})
            return web.json_response({"text": "ok"})

        return handler

    w0, w1 = await http_server(server("w0")), await http_server(server("w1"))
    rc = RolloutClient([], router_url=await http_server(server("r")))
    assert (await rc.generate({"text": "x"}))["text"] == "ok"
    assert seen == [("r", "/generate")]
    assert await rc.get_weight_versions() == ["w0", "w1"]  # discovered from GET /workers
    assert rc.urls == [w0, w1]


async def test_abort_all_waits_until_idle(http_server):
    loads = {"e0": [2, 1, 0], "e1": [0]}
    aborted = []

    def engine(name):
        async def handler(request):
            if request.path == "/abort_request":
                aborted.append((name, await request.json()))
                return web.Response()
            n = loads[name].pop(0) if len(loads[name]) > 1 else loads[name][0]
            return web.json_response({"loads": [{"num_running_reqs": n, "num_waiting_reqs": 0}]})

        return handler

    rc = RolloutClient([await http_server(engine("e0")), await http_server(engine("e1"))])
    await rc.abort_all(poll_s=0.001)
    assert sorted(h for h, _ in aborted) == ["e0", "e1"] and all(b["abort_all"] for _, b in aborted)
    assert loads["e0"] == [0]


async def test_abort_all_aborts_again_a_request_that_arrived_after_the_abort(http_server):
    # A generate request that reaches the engine just after /abort_request is not aborted by it: the original's
    # abort_servers_until_idle aborts again every 3 s while the engine is busy; this waited for the request to run
    # its full length (here: forever), then failed the rollout with a TimeoutError.
    aborts = []

    async def handler(request):
        if request.path == "/abort_request":
            aborts.append(await request.json())
            return web.Response()
        # The late request runs until a second abort reaches the engine.
        return web.json_response({"num_running_reqs": 1 if len(aborts) < 2 else 0, "num_waiting_reqs": 0})

    rc = RolloutClient([await http_server(handler)])
    await rc.abort_all(poll_s=0.001, retry_s=0.01, timeout_s=30)
    assert aborts == [{"rid": "", "abort_all": True}] * 2


async def test_abort_all_times_out_naming_busy_engine(http_server):
    async def handler(request):
        if request.path == "/abort_request":
            return web.Response()
        return web.json_response({"num_total_reqs": 4})

    url = await http_server(handler)
    rc = RolloutClient([url])
    with pytest.raises(TimeoutError, match=rf"{url} \(4\)"):
        await rc.abort_all(poll_s=0.001, timeout_s=0.01)


@pytest.mark.parametrize("failover", [False, True])
async def test_an_abort_to_a_frozen_engine_is_bounded_by_the_health_check_timeout(http_server, failover):
    """A frozen engine accepts the connection and never answers: the abort waited out the 1800 s control timeout.

    Now it waits `--rollout-health-check-timeout`; without failover the error names the engine and the flag, with
    failover the frozen engine is passed over (the health monitor judges it) and the live one is aborted.
    """
    release = asyncio.Event()
    aborted = []

    async def frozen(request):
        await release.wait()  # "never": until the test ends
        return web.Response()

    async def live(request):
        if request.path == "/abort_request":
            aborted.append(await request.json())
            return web.Response()
        return web.json_response({"num_total_reqs": 0})

    urls = [await http_server(frozen), await http_server(live)]
    rc = RolloutClient(urls, failover=failover, probe_timeout_s=0.3)
    try:
        if failover:
            await asyncio.wait_for(rc.abort_all(poll_s=0.01), 20)
            assert aborted == [{"rid": "", "abort_all": True}]
        else:
            with pytest.raises(EngineError, match="--rollout-health-check-timeout") as e:
                await asyncio.wait_for(rc.abort_all(poll_s=0.01), 20)
            assert e.value.url == urls[0] and e.value.unreachable
    finally:
        release.set()
        await rc.aclose()


async def test_broadcast_unknown_method():
    rc = RolloutClient(["http://e0:1"])
    with pytest.raises(AttributeError, match="no_such"):
        await rc.broadcast("no_such")


def test_count_requests_shapes():
    assert count_requests({"loads": [{"num_running_reqs": 2, "num_waiting_reqs": 3}, {"num_total_reqs": 1}]}) == 6
    assert count_requests([{"num_reqs": 2}, {"total_reqs": 1}]) == 3
    with pytest.raises(ValueError, match="/v1/loads"):
        count_requests("busy")


def test_get_client_is_cached_per_engine_set():
    reset_client_cache()
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})
    a = get_client(PluginArgs.from_config(cfg, engine_urls=["http://e0:1"]))
    comma = PluginArgs.from_config(cfg)
    comma.rollout_engine_urls = "http://e0:1"  # a plugin may write a comma-separated string on its view
    assert get_client(comma) is a
    routed = get_client(PluginArgs.from_config(cfg, router_url="http://r:3"))
    assert routed is not a and routed.router.url == "http://r:3"
    with pytest.raises(ValueError, match="--rollout-engine-urls"):
        get_client(PluginArgs.from_config(cfg))
    reset_client_cache()


def test_client_works_across_event_loops(threaded_http_server):
    async def handler(request):
        return web.json_response({"weight_version": "v"})

    c = EngineClient(threaded_http_server(handler))
    assert asyncio.run(c.get_weight_version()) == "v"
    first = next(iter(c._sessions.values()))[0]
    assert first.closed  # asyncio.run finalised the session made on its loop
    assert asyncio.run(c.get_weight_version()) == "v"  # a fresh loop gets a fresh session
    assert len(c._sessions) == 1  # the closed loop's entry was dropped


async def test_weight_version_falls_back_to_the_old_route(http_server):
    seen = []

    async def handler(request):
        seen.append(request.path)
        if request.path == "/model_info":
            return web.json_response({"model_path": "m"})  # an engine without the field
        return web.json_response({"weight_version": "9"})

    c = EngineClient(await http_server(handler))
    assert await c.get_weight_version() == "9"
    assert seen == ["/model_info", "/get_weight_version"]


async def test_dropped_connection_is_retried():
    """The server closes the connection without answering (a pooled keep-alive connection it dropped)."""
    attempts = []

    async def serve(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0
        )
        await reader.readexactly(length)
        attempts.append(head.split(b" ")[1].decode())
        if len(attempts) > 1:
            body = b'{"text": "ok", "meta_info": {}}'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        c = EngineClient(f"http://127.0.0.1:{port}", backoff_s=0.001)
        assert (await c.generate({"input_ids": [1]}))["text"] == "ok"
        assert attempts == ["/generate", "/generate"]
        await c.aclose()
    finally:
        server.close()
        await server.wait_closed()


def test_engine_error_pickles_as_itself():
    # Ray ships exceptions with cloudpickle, which uses the same __reduce__ as pickle (slime-rollout
    # does not depend on Ray, so its isolated test run checks plain pickle).
    import pickle

    err = EngineError("http://e:1", "/generate", "boom", 500)
    for dumps, loads in ((pickle.dumps, pickle.loads),):
        back = loads(dumps(err))
        assert type(back) is EngineError and str(back) == "engine http://e:1/generate failed (HTTP 500): boom"
        assert (back.url, back.endpoint, back.message, back.status_code, back.unreachable) == (
            "http://e:1", "/generate", "boom", 500, False,
        )  # fmt: skip
    gone = pickle.loads(pickle.dumps(EngineError("http://e:1", "/generate", "refused", unreachable=True)))
    assert gone.unreachable and gone.status_code is None


async def test_generate_read_timeout_comes_from_the_config_and_marks_the_engine_unreachable(http_server):
    async def handler(request):
        await asyncio.sleep(30)  # a hung engine (SIGSTOP): the request is accepted, no answer comes
        return web.json_response({})

    url = await http_server(handler)
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "sglang_router_request_timeout_secs": 1})
    reset_client_cache()
    client = get_client(PluginArgs.from_config(cfg, engine_urls=[url, url + "/"]))
    assert client.generate_timeout == 1.0
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(EngineError) as e:
        await client.generate({"input_ids": [1]})
    assert 0.9 < asyncio.get_running_loop().time() - t0 < 5 and e.value.unreachable
    reset_client_cache()


def test_connection_pool_sizes_follow_sglang_server_concurrency():
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "sglang_server_concurrency": 3000})
    reset_client_cache()
    direct = get_client(PluginArgs.from_config(cfg, engine_urls=["http://e0:1", "http://e1:1"]))
    assert [e.max_connections for e in direct.engines] == [3000, 3000]  # was a fixed 1024 whatever the flag
    routed = get_client(
        PluginArgs.from_config(cfg, engine_urls=["http://e0:1", "http://e1:1"], router_url="http://r:3")
    )
    assert routed.router.max_connections == 6000
    # One engine whose address doubles as the plugins' router address: requests go to the engine directly.
    single = get_client(PluginArgs.from_config(cfg, engine_urls=["http://e0:2"], router_url="http://e0:2"))
    assert single.router is None and single.urls == ["http://e0:2"]
    reset_client_cache()


def test_default_concurrency_is_the_originals_and_is_logged_once(caplog):
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})
    assert cfg.sglang_server_concurrency == 512  # slime's --sglang-server-concurrency default
    assert RolloutClient(["http://e0:1"]).concurrency == 512
    reset_client_cache()
    args = PluginArgs.from_config(cfg, engine_urls=["http://e0:1", "http://e1:1"])
    with caplog.at_level("INFO", logger="slime_rollout.engines.client"):
        for _ in range(3):
            get_client(args)
    lines = [r.getMessage() for r in caplog.records if "requests in flight per engine" in r.getMessage()]
    want = "engine client: up to 512 requests in flight per engine (--sglang-server-concurrency), 2 engine(s)"
    assert lines == [want]
    reset_client_cache()


def test_open_file_limit_is_raised_to_fit_the_requests_in_flight():
    import resource

    from slime_rollout.engines.open_files import ensure_open_files

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd"))
    low = open_now + 64
    wanted = 4000
    if hard != resource.RLIM_INFINITY and hard < low + wanted:
        pytest.skip(f"hard open-file limit {hard} too low for this test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        assert ensure_open_files(wanted) == wanted + 1024  # the sockets plus spare descriptors
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted + 1024
        assert ensure_open_files(10) == wanted + 1024  # already enough: left alone
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_an_abort_is_sent_while_every_generation_slot_is_taken(http_server):
    # One generation slot (--sglang-server-concurrency 1), taken by a generation the engine holds until the abort:
    # the abort must not wait for a connection behind it (it did: the over-sampling abort came a response late).
    aborted = asyncio.Event()

    async def handler(request):
        if request.path == "/generate":
            await asyncio.wait_for(aborted.wait(), timeout=30)
            return web.json_response({"text": "", "output_ids": [], "meta_info": {"finish_reason": {"type": "abort"}}})
        if request.path == "/abort_request":
            aborted.set()
        return web.json_response({})

    url = await http_server(handler)
    engine = EngineClient(url, max_connections=1)
    generation = asyncio.create_task(engine.request("POST", "/generate", {"input_ids": [1]}))
    await asyncio.sleep(0.2)  # the generation holds the one planned connection
    await asyncio.wait_for(engine.abort_request(abort_all=True), timeout=10)
    assert (await asyncio.wait_for(generation, timeout=10))["meta_info"]["finish_reason"]["type"] == "abort"
