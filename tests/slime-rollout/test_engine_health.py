"""Health monitor + engine pool against real local HTTP servers standing in for engines.

A "hung" engine accepts requests and never answers (what SIGSTOP does to a real engine); a "dead" one's process
is gone. The restart callback brings the engine back on the same URL, as `EngineGroup.restart` does.
"""

import asyncio

import pytest
from aiohttp import web

from slime_rollout.engines.client import EngineClient, RolloutClient
from slime_rollout.engines.health import HealthMonitor
from slime_rollout.engines.pool import EngineState, NoHealthyEngineError


def _engine(name, state, log):
    """Answers /generate with its name after 50 ms; while `state["hung"]`, never answers anything."""

    async def handler(request):
        if state["hung"]:
            while not state.get("closing"):  # "forever": until the test ends (a stopped process never answers)
                await asyncio.sleep(0.05)
            return web.Response(status=503)
        if request.path == "/generate":
            body = await request.json()
            await asyncio.sleep(0.05)
            log.append((name, body["id"]))
            return web.json_response({"engine": name, "id": body["id"]})
        return web.Response()  # /health_generate

    return handler


def _monitor(client, restarts, restored, *, alive=None, restart=None, timeout_s=0.3):
    def default_restart(index):
        restarts.append(index)
        return client.engines[index].url

    async def restore(index, url):
        restored.append((index, url))

    monitor = HealthMonitor(
        client.pool,
        interval_s=0.2,
        timeout_s=timeout_s,
        is_alive=alive,
        restart=restart or default_restart,
        make_client=EngineClient,
        restore=restore,
    )
    monitor.start()
    monitor.resume()
    return monitor


async def test_a_hung_engine_is_restarted_and_its_in_flight_requests_are_generated_once_elsewhere(http_server):
    log, states = [], [{"hung": False}, {"hung": False}]
    urls = [await http_server(_engine(f"e{i}", states[i], log)) for i in range(2)]
    client = RolloutClient(urls, failover=True, recovery_timeout=30)
    restarts, restored = [], []

    def restart(index):  # the new process answers again
        restarts.append(index)
        states[index]["hung"] = False
        return urls[index]

    # A probe of the healthy engine that took over 0.3 s under CI load (two e2e runs beside it) judged it hung too,
    # and its in-flight requests were generated twice; 2 s leaves the hung verdict to the engine that is hung.
    monitor = _monitor(client, restarts, restored, restart=restart, timeout_s=2.0)
    states[1]["hung"] = True  # e1 freezes; about half the requests are already on it
    replies = await asyncio.wait_for(asyncio.gather(*(client.generate({"id": i}) for i in range(40))), 30)
    await monitor.stop()
    states[1]["closing"] = True

    assert sorted(r["id"] for r in replies) == list(range(40))  # every request answered exactly once
    assert sorted(i for _, i in log) == list(range(40))  # and generated exactly once (nothing on the hung engine)
    stats = client.pool.stats
    assert restarts == [1] and restored == [(1, urls[1])]
    assert (stats.engine_failures, stats.engine_restarts) == (1, 1)
    assert 1 <= stats.requeued_requests <= 40 and stats.time_lost_s > 0
    assert client.pool.slots[1].state is EngineState.SERVING


@pytest.mark.parametrize("asked", ["in process", "remotely"])
async def test_a_dead_engine_is_found_by_the_failed_request_without_waiting_for_the_interval(http_server, asked):
    """`is_alive` answers at once (a local process) or is awaited (an engine host on another node)."""
    log, states = [], [{"hung": False}]
    live = await http_server(_engine("e0", states[0], log))
    from slime_rollout.engines.process import find_free_port

    dead = f"http://127.0.0.1:{find_free_port(start=42000)}"  # nothing listens: connection refused
    client = RolloutClient([live, dead], failover=True, recovery_timeout=30)
    restarts = []
    alive = {0: True, 1: False}
    asks = []

    async def ask_host(i):
        asks.append(i)
        await asyncio.sleep(0.01)
        return alive[i]

    monitor = HealthMonitor(
        client.pool, interval_s=3600, timeout_s=1, is_alive=(lambda i: alive[i]) if asked == "in process" else ask_host,
        restart=lambda i: (restarts.append(i), alive.__setitem__(i, True), live)[-1],  # comes back elsewhere
        make_client=EngineClient, restore=None,
    )  # fmt: skip
    monitor.start()
    monitor.resume()
    await asyncio.sleep(0.1)  # the first check ran; the next is an hour away
    alive[1] = False
    client.pool.slots[1].state = EngineState.SERVING
    replies = await asyncio.wait_for(asyncio.gather(*(client.generate({"id": i}) for i in range(10))), 20)
    await monitor.stop()
    assert sorted(r["id"] for r in replies) == list(range(10))
    assert client.pool.slots[1].url == live  # its restart moved it: the pool uses the new URL
    assert restarts == [1]
    assert (1 in asks) == (asked == "remotely")


async def test_with_no_healthy_engine_a_request_fails_after_the_recovery_timeout_with_one_line(http_server):
    log, states = [], [{"hung": True}]
    url = await http_server(_engine("e0", states[0], log))
    client = RolloutClient([url], failover=True, recovery_timeout=1.0)

    def restart(index):
        raise RuntimeError("engine exited with code 1 before becoming healthy")

    monitor = _monitor(client, [], [], restart=restart)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(NoHealthyEngineError) as e:
        await asyncio.wait_for(client.generate({"id": 0}), 30)
    await monitor.stop()
    states[0]["closing"] = True
    assert 1.0 <= loop.time() - t0 < 10
    message = str(e.value)
    assert "\n" not in message and "--rollout-engine-recovery-timeout" in message
    assert "restart failed: engine exited with code 1" in message


async def test_a_request_failing_on_every_engine_for_the_recovery_window_is_one_error_naming_flag_and_engines(
    http_server,
):
    # Was: the last engine's own EngineError, naming neither the flag nor the other engines it had failed on.
    async def unavailable(request):
        return web.json_response({"error": {"message": "out of capacity"}}, status=503)

    urls = [await http_server(unavailable), await http_server(unavailable)]
    client = RolloutClient(urls, failover=True, recovery_timeout=1.0)
    with pytest.raises(NoHealthyEngineError) as e:
        await asyncio.wait_for(client.generate({"id": 0}), 30)
    message = str(e.value)
    assert "\n" not in message and "for 1s (--rollout-engine-recovery-timeout)" in message
    assert all(f"{url}: engine {url}/generate failed (HTTP 503)" in message for url in urls)


async def test_without_fault_tolerance_an_unreachable_engine_fails_the_request():
    from slime_rollout.engines.process import find_free_port
    from slime_rollout.engines.transport import EngineError

    client = RolloutClient([f"http://127.0.0.1:{find_free_port(start=42000)}"], max_retries=1, backoff_s=0.01)
    with pytest.raises(EngineError) as e:
        await client.generate({"id": 0})
    assert e.value.unreachable


async def test_an_engine_answering_503_has_its_requests_sent_elsewhere_only_with_fault_tolerance(http_server):
    """An engine out of capacity or shutting down answers 503: failover moves the request, as through the router."""
    from slime_rollout.engines.transport import EngineError

    async def unavailable(request):
        return web.Response(status=503, text="Service Unavailable")

    log = []
    urls = [await http_server(unavailable), await http_server(_engine("e1", {"hung": False}, log))]
    client = RolloutClient(urls, failover=True, recovery_timeout=30)
    replies = await asyncio.wait_for(asyncio.gather(*(client.generate({"id": i}) for i in range(6))), 30)
    assert [r["engine"] for r in replies] == ["e1"] * 6
    assert sorted(i for _, i in log) == list(range(6))
    assert client.pool.stats.requeued_requests >= 1  # some went to the 503 engine first and were moved

    strict = RolloutClient(urls[:1])
    with pytest.raises(EngineError) as e:
        await strict.generate({"id": 0})
    assert e.value.status_code == 503 and urls[0] in str(e.value)


async def test_a_refused_connection_is_a_dead_engine_when_its_host_does_not_say(http_server):
    """The host's `alive` call timed out (it answers True: not known); the refused /health_generate decides."""
    from slime_rollout.engines.process import find_free_port

    live = await http_server(_engine("e0", {"hung": False}, []))
    dead = f"http://127.0.0.1:{find_free_port(start=42000)}"  # the killed engine's port: connection refused
    client = RolloutClient([live, dead], failover=True, recovery_timeout=30)
    reasons, found = [], asyncio.Event()

    def restart(index):
        reasons.append(client.pool.slots[index].reason)
        found.set()
        return live

    async def host_does_not_know(index):
        return True  # what HostedEngines.alive answers when the host's call times out

    monitor = HealthMonitor(
        client.pool, interval_s=3600, timeout_s=30, is_alive=host_does_not_know, restart=restart,
        make_client=EngineClient, restore=None,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    monitor.start()
    monitor.resume()
    await asyncio.wait_for(found.wait(), 10)
    await monitor.stop()
    assert loop.time() - t0 < 5  # found at the first check, without waiting out the 30 s probe timeout
    assert len(reasons) == 1 and reasons[0].startswith("process gone: /health_generate ClientConnectorError")
    assert "hung" not in reasons[0]


def _paused_engine(paused: asyncio.Event, resumed: asyncio.Event, log):
    """SGLang while a weight push pauses it: `/health_generate` is held, then 503 (its 20 s timeout, shortened to
    0.2 s here); `/generate` waits for the resume; otherwise a healthy engine."""

    async def handler(request):
        if request.path == "/health_generate":
            if paused.is_set():
                await asyncio.sleep(0.2)
                return web.Response(status=503)
            return web.Response()
        body = await request.json()
        if paused.is_set():
            await resumed.wait()
        log.append(body["id"])
        return web.json_response({"id": body["id"]})

    return handler


async def test_no_health_verdict_while_a_weight_push_pauses_the_engines(http_server):
    """Fully async, generation goes on around a weight push; a paused SGLang engine answers /health_generate 503
    after 20 s. Was: the monitor restarted a healthy engine whose only fault was being paused for the push."""
    paused, resumed, log = asyncio.Event(), asyncio.Event(), []
    url = await http_server(_paused_engine(paused, resumed, log))
    client = RolloutClient([url], failover=True, recovery_timeout=30)
    restarts, restored = [], []
    client.pool.begin_weight_move()
    paused.set()
    monitor = _monitor(client, restarts, restored)
    request = asyncio.ensure_future(client.generate({"id": 1}))
    await asyncio.sleep(1.0)  # five check intervals, each probe would answer 503
    assert restarts == [] and client.pool.slots[0].state is EngineState.SERVING
    paused.clear()
    resumed.set()
    client.pool.end_weight_move()
    assert await asyncio.wait_for(request, 10) == {"id": 1} and log == [1]
    await monitor.stop()
    assert restarts == [] and client.pool.stats.engine_failures == 0


async def test_a_verdict_from_a_check_that_a_weight_push_overlapped_is_dropped(http_server):
    paused, resumed, log = asyncio.Event(), asyncio.Event(), []
    url = await http_server(_paused_engine(paused, resumed, log))
    client = RolloutClient([url], failover=True, recovery_timeout=30)
    restarts = []
    monitor = HealthMonitor(client.pool, interval_s=60, timeout_s=5, is_alive=None,
                            restart=lambda i: restarts.append(i) or url, make_client=EngineClient)  # fmt: skip
    paused.set()  # the probe is answered 503 ...
    check = asyncio.ensure_future(monitor.check_all())
    await asyncio.sleep(0.05)
    client.pool.begin_weight_move()  # ... because a push paused the engine after the check began
    await check
    client.pool.end_weight_move()
    assert restarts == [] and client.pool.slots[0].state is EngineState.SERVING
    paused.clear()
    await monitor.check_all()  # an unpaused engine is judged again (and healthy)
    assert restarts == [] and client.pool.slots[0].state is EngineState.SERVING
    await monitor.stop()


async def test_a_check_that_outlives_its_generation_gives_no_verdict(http_server):
    """Seen in a CI hang: a probe started late in rollout 0 timed out under load after the rollout ended, and the
    monitor, already paused, restarted a healthy engine, which the next rollout then found starting up."""
    release = asyncio.Event()

    async def handler(request):
        if request.path == "/health_generate":
            await release.wait()  # slow, not dead: answers only after the check's timeout
        return web.Response()

    url = await http_server(handler)
    client = RolloutClient([url], failover=True, recovery_timeout=30)
    restarts = []
    monitor = HealthMonitor(client.pool, interval_s=60, timeout_s=0.5, is_alive=None,
                            restart=lambda i: restarts.append(i) or url, make_client=EngineClient)  # fmt: skip
    monitor.resume()
    check = asyncio.ensure_future(monitor.check_all())
    await asyncio.sleep(0.1)
    monitor.pause()  # the generation ends while the probe waits
    await check
    await asyncio.sleep(0.2)  # a recovery would have started by now
    release.set()
    assert restarts == [] and client.pool.slots[0].state is EngineState.SERVING
    monitor.resume()
    await monitor.check_all()  # judged again once generating: healthy
    assert restarts == [] and client.pool.stats.engine_failures == 0
    await monitor.stop()
