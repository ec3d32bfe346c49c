"""`slime_rollout.engines.plugin_http.post/get`: the original's retry semantics against a real local aiohttp server."""

import pytest
from aiohttp import web

from slime_core.config import PluginArgs, SlimeArgs
from slime_rollout.engines import plugin_http
from slime_rollout.engines.transport import EngineError


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setattr(plugin_http, "_RETRY_DELAY_S", 0.01)
    plugin_http._endpoints.clear()
    yield
    plugin_http._endpoints.clear()


async def test_post_retries_error_statuses_until_success(http_server):
    calls = []

    async def handler(request):
        calls.append((request.path, request.query_string, request.headers.get("X-Session"), await request.json()))
        if len(calls) < 3:
            return web.Response(status=503, text="warming up")
        return web.json_response({"text": "ok", "meta_info": {"finish_reason": {"type": "stop"}}})

    url = await http_server(handler)
    out = await plugin_http.post(f"{url}/generate?x=1", {"text": "hi"}, headers={"X-Session": "s1"})
    assert out == {"text": "ok", "meta_info": {"finish_reason": {"type": "stop"}}}
    # Three attempts: two 503s retried (the transport alone retries connection errors only), then success.
    assert calls == [("/generate", "x=1", "s1", {"text": "hi"})] * 3


async def test_post_gives_up_after_max_retries_attempts(http_server):
    calls = []

    async def handler(request):
        calls.append(1)
        return web.Response(status=500, text="boom")

    url = await http_server(handler)
    with pytest.raises(EngineError, match=r"/generate failed \(HTTP 500\): boom"):
        await plugin_http.post(f"{url}/generate", None, max_retries=2)
    assert len(calls) == 2  # max_retries counts attempts, as in the original


async def test_post_returns_text_and_success_false_bodies_unchanged(http_server):
    async def handler(request):
        if request.path == "/text":
            return web.Response(text="plain")
        return web.json_response({"success": False, "message": "busy"})

    url = await http_server(handler)
    assert await plugin_http.post(f"{url}/text") == "plain"
    # Engine control calls raise on success:false; a plugin's post hands the body back as the original does.
    assert await plugin_http.post(f"{url}/flag") == {"success": False, "message": "busy"}


async def test_get_decodes_json(http_server):
    async def handler(request):
        return web.json_response({"path": request.path})

    url = await http_server(handler)
    assert await plugin_http.get(f"{url}/health") == {"path": "/health"}
    with pytest.raises(ValueError, match="not an http URL"):
        await plugin_http.post("http:///generate")


def test_init_http_client_takes_timeout_and_pool_from_args():
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "sglang_server_concurrency": 8,
                               "sglang_router_request_timeout_secs": 30})  # fmt: skip
    plugin_http.init_http_client(PluginArgs.from_config(cfg, engine_urls=["http://a:1", "http://b:2"]))
    endpoint, path = plugin_http._endpoint("http://127.0.0.1:5/generate")
    assert path == "/generate"
    assert endpoint.max_connections == 16  # 8 requests per engine × 2 engines
    assert endpoint.timeout.sock_read == 30
    assert endpoint.max_retries == 0  # post retries itself
    plugin_http._settings.update(timeout_s=plugin_http.DEFAULT_TIMEOUT_S, max_connections=1024)
