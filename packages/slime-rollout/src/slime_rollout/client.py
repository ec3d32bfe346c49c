"""Async HTTP clients for inference engines (SGLang or the CPU reference engine) and the router.

`EngineClient(url)` wraps one engine's control surface (SGLang 0.5.16 routes and field names);
`RolloutClient(engine_urls, router_url=None)` is what the rollout loop uses: `generate` goes through the
router when there is one, otherwise to the engine with the fewest outstanding requests; `abort_all` and
`broadcast` fan out to every engine. `get_client(args)` returns one cached `RolloutClient` per process.

The transport is aiohttp: httpx/httpcore's pool scans every connection for every request, which made 512
concurrent /generate calls about 8x slower than aiohttp's. Connection errors are retried with
exponential backoff; every error names the engine URL and endpoint. An `aiohttp.ClientSession` belongs to
one event loop, so each client keeps one per running loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp

__all__ = ["EngineClient", "EngineError", "EngineResponse", "RolloutClient", "get_client", "reset_client_cache"]

logger = logging.getLogger(__name__)

# Connection-level failures before any response: the engine is starting (connect refused / timed out,
# no free pooled connection in time), or a pooled keep-alive connection was closed or reset by the
# server just as it was reused. Retrying may repeat a request the engine never answered; slime retries
# every POST likewise. Read timeouts (SocketTimeoutError) and broken bodies (ClientPayloadError) are not
# retried: the engine got the request.
_RETRYABLE = (
    aiohttp.ClientOSError,  # includes ClientConnectorError (refused, DNS) and resets while sending
    aiohttp.ClientConnectionResetError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.ServerDisconnectedError,
)
_NOT_RETRYABLE = (aiohttp.ClientSSLError,)  # a ClientConnectorError that will not heal by retrying

# Idle pooled connections are dropped after this many seconds, before servers drop them (uvicorn's
# default keep-alive, which SGLang uses, is 5 s), so a connection the server is closing is rarely reused.
_KEEPALIVE_S = 3.0


class EngineError(RuntimeError):
    """An engine call failed (HTTP error status, `success: false`, or the engine is unreachable).

    Attributes:
        url: the engine (or router) base URL.
        endpoint: the route that failed, e.g. "/generate".
        status_code: HTTP status, or None when no response arrived.
    """

    def __init__(self, url: str, endpoint: str, message: str, status_code: int | None = None):
        super().__init__(
            f"engine {url}{endpoint} failed" + (f" (HTTP {status_code})" if status_code else "") + f": {message}"
        )
        self.url, self.endpoint, self.status_code = url, endpoint, status_code


@dataclasses.dataclass(frozen=True)
class EngineResponse:
    """A fully read HTTP response (what `request(..., raw=True)` returns).

    Attributes:
        status_code: HTTP status.
        headers: response headers (case-insensitive lookups).
        content: the body bytes.
    """

    status_code: int
    headers: Any
    content: bytes

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (undecodable bytes replaced)."""
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON.

        Raises:
            ValueError: the body is not JSON.
        """
        return json.loads(self.content)


async def _close_with_loop(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    """An async generator whose finalisation closes `session`.

    asyncio.run() (and loops torn down with `shutdown_asyncgens`) finalise the async generators started
    on them, so a session made on a short-lived loop (weight sync's asyncio.run) is closed while its loop
    still runs, instead of leaking sockets and "Unclosed client session" errors.
    """
    try:
        yield
    finally:
        await session.close()


class _HttpBase:
    """Shared retrying request logic bound to one base URL."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float | None = None,
        connect_timeout: float = 10.0,
        max_retries: int = 8,
        backoff_s: float = 0.25,
        max_backoff_s: float = 4.0,
        max_connections: int = 1024,
    ):
        if not url.startswith(("http://", "https://")):
            url = f"http://{url}"
        self.url = url.rstrip("/")
        self.connect_timeout = connect_timeout
        self.timeout = self._timeout(timeout)
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.max_connections = max_connections
        # loop -> (session, finaliser generator); the generator is kept alive here because the loop only
        # holds it weakly.
        self._sessions: dict[asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, AsyncIterator[None]]] = {}

    def _timeout(self, read_s: float | None) -> aiohttp.ClientTimeout:
        # Like httpx.Timeout(read_s, connect=connect_timeout): `connect` bounds waiting for a pooled
        # connection plus connecting, `sock_read` the gap between received chunks; no total limit.
        return aiohttp.ClientTimeout(total=None, connect=read_s, sock_connect=self.connect_timeout, sock_read=read_s)

    async def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        entry = self._sessions.get(loop)
        if entry is not None and not entry[0].closed:
            return entry[0]
        for other in [lp for lp in self._sessions if lp.is_closed()]:
            # Its loop closed without finalising async generators; the session cannot be closed any more.
            self._sessions.pop(other)[0].detach()
        connector = aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=_KEEPALIVE_S)
        # trust_env=False: engines live on the cluster network, never behind the user's HTTP proxy.
        session = aiohttp.ClientSession(connector=connector, timeout=self.timeout, trust_env=False)
        closer = _close_with_loop(session)
        await closer.__anext__()
        self._sessions[loop] = (session, closer)
        return session

    async def aclose(self) -> None:
        """Closes the HTTP session of the running event loop."""
        entry = self._sessions.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[1].aclose()

    async def request(
        self,
        method: str,
        endpoint: str,
        payload: dict | None = None,
        *,
        timeout: float | None = None,
        raw: bool = False,
    ) -> Any:
        """Sends one request with retries on connection errors.

        Args:
            method: "GET" or "POST".
            endpoint: route, e.g. "/generate".
            payload: JSON body (POST) or query parameters (GET).
            timeout: per-request read timeout in seconds (None: the client's default).
            raw: return the `EngineResponse` (status, headers, body bytes) instead of decoded JSON.

        Returns:
            Decoded JSON (None for an empty body, the text for a non-JSON body), or the response when `raw`.

        Raises:
            EngineError: non-2xx status, `{"success": false}` body, or still unreachable after retries.
        """
        kwargs: dict[str, Any] = {"json": payload} if method == "POST" else {"params": payload}
        if timeout is not None:
            kwargs["timeout"] = self._timeout(timeout)
        delay = self.backoff_s
        for attempt in itertools.count():
            try:
                session = await self._http()
                async with session.request(method, self.url + endpoint, **kwargs) as resp:
                    out = EngineResponse(resp.status, resp.headers, await resp.read())
                break
            except _NOT_RETRYABLE as exc:
                raise EngineError(self.url, endpoint, repr(exc)) from exc
            except _RETRYABLE as exc:
                if attempt >= self.max_retries:
                    raise EngineError(self.url, endpoint, f"unreachable after {attempt + 1} attempts: {exc!r}") from exc
                logger.debug("%s%s: %r, retry %d in %.2fs", self.url, endpoint, exc, attempt + 1, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise EngineError(self.url, endpoint, repr(exc)) from exc
        if out.status_code >= 400:
            raise EngineError(self.url, endpoint, out.text[:1000], out.status_code)
        if raw:
            return out
        if not out.content:
            return None
        try:
            body = out.json()
        except ValueError:
            return out.text
        if isinstance(body, dict) and body.get("success") is False:
            raise EngineError(self.url, endpoint, str(body.get("message", body)), out.status_code)
        return body


class EngineClient(_HttpBase):
    """One SGLang-compatible engine (SGLang server or the reference engine).

    Args:
        url: base URL, e.g. "http://127.0.0.1:30000" ("host:port" is accepted).
        timeout: default read timeout in seconds (None: wait forever, as slime does for /generate).
        **kw: connection settings of `_HttpBase` (connect_timeout, max_retries, backoff_s, ...).
    """

    async def generate(self, payload: dict[str, Any]) -> Any:
        """POST /generate (`input_ids`|`text`, `sampling_params`, `return_logprob`, ...); SGLang's reply."""
        return await self.request("POST", "/generate", payload)

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """POST /abort_request `{"rid", "abort_all"}`."""
        await self.request("POST", "/abort_request", {"rid": rid, "abort_all": abort_all})

    async def flush_cache(self) -> None:
        """GET /flush_cache (fails with HTTP 400 while requests are running in SGLang)."""
        await self.request("GET", "/flush_cache")

    async def pause_generation(self, mode: str = "abort") -> None:
        """POST /pause_generation `{"mode": "abort"|"retract"|"in_place"}`."""
        await self.request("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        """POST /continue_generation."""
        await self.request("POST", "/continue_generation", {})

    async def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """POST /release_memory_occupation `{"tags"}` (None: weights and KV cache)."""
        await self.request("POST", "/release_memory_occupation", {"tags": tags})

    async def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """POST /resume_memory_occupation `{"tags"}` (e.g. ["weights"] or ["kv_cache", "cuda_graph"])."""
        await self.request("POST", "/resume_memory_occupation", {"tags": tags})

    async def update_weights_from_disk(
        self, model_path: str, *, load_format: str | None = None, weight_version: str | None = None
    ) -> dict:
        """POST /update_weights_from_disk `{"model_path", "load_format", "weight_version"}`."""
        body = {"model_path": model_path, "load_format": load_format, "weight_version": weight_version}
        return await self.request("POST", "/update_weights_from_disk", body)

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: list[str],
        *,
        load_format: str | None = None,
        flush_cache: bool = False,
        weight_version: str | None = None,
    ) -> dict:
        """POST /update_weights_from_tensor; one serialized entry per engine TP rank."""
        body = {
            "serialized_named_tensors": serialized_named_tensors,
            "load_format": load_format,
            "flush_cache": flush_cache,
            "weight_version": weight_version,
        }
        return await self.request("POST", "/update_weights_from_tensor", body)

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> dict:
        """POST /init_weights_update_group: the engine's TP ranks join the trainer's broadcast group."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return await self.request("POST", "/init_weights_update_group", body)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict:
        """POST /destroy_weights_update_group `{"group_name"}`."""
        return await self.request("POST", "/destroy_weights_update_group", {"group_name": group_name})

    async def update_weights_from_distributed(
        self,
        *,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = False,
        weight_version: str | None = None,
        load_format: str | None = None,
    ) -> dict:
        """POST /update_weights_from_distributed; the engine receives the tensors by broadcast from rank 0."""
        body = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
            "flush_cache": flush_cache,
            "weight_version": weight_version,
            "load_format": load_format,
        }
        return await self.request("POST", "/update_weights_from_distributed", body)

    async def get_weight_version(self) -> str | None:
        """The engine's `weight_version`, from GET /model_info.

        SGLang 0.5.16 answers 404 on the older `/get_weight_version` ("deprecated, use /model_info"),
        so `/model_info` is asked first; engines without the field there fall back to the old route.
        """
        info = await self.request("GET", "/model_info")
        if isinstance(info, dict) and "weight_version" in info:
            return info["weight_version"]
        return (await self.request("GET", "/get_weight_version"))["weight_version"]

    async def health(self, timeout: float | None = 5.0) -> bool:
        """GET /health; False instead of raising when the engine does not answer 200."""
        return await self._probe("/health", timeout)

    async def health_generate(self, timeout: float | None = 30.0) -> bool:
        """GET /health_generate (runs a one-token generation on SGLang); False on any failure."""
        return await self._probe("/health_generate", timeout)

    async def _probe(self, endpoint: str, timeout: float | None) -> bool:
        try:
            session = await self._http()
            async with session.get(self.url + endpoint, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def get_loads(self) -> dict:
        """GET /v1/loads?include=core (per-DP-rank running/waiting request counts)."""
        return await self.request("GET", "/v1/loads", {"include": "core"})

    async def num_unfinished_requests(self) -> int:
        """Running plus waiting requests, summed over the engine's DP ranks (parsed from /v1/loads)."""
        return _count_requests(await self.get_loads())

    async def server_info(self) -> dict:
        """GET /server_info (server args and internal state)."""
        return await self.request("GET", "/server_info")

    async def model_info(self) -> dict:
        """GET /model_info (falls back to the older /get_model_info)."""
        try:
            return await self.request("GET", "/model_info")
        except EngineError as exc:
            if exc.status_code != 404:
                raise
            return await self.request("GET", "/get_model_info")


def _count_requests(loads: Any) -> int:
    """Total unfinished requests in a /v1/loads reply (several SGLang versions' shapes)."""
    if isinstance(loads, list):
        return sum(_count_requests(x) for x in loads)
    if not isinstance(loads, dict):
        raise ValueError(f"/v1/loads: unexpected reply {loads!r}")
    if "loads" in loads:
        return _count_requests(loads["loads"])
    for key in ("num_total_reqs", "total_reqs", "num_reqs"):
        if key in loads:
            return int(loads[key])
    return int(loads.get("num_running_reqs", 0)) + int(loads.get("num_waiting_reqs", 0))


class RolloutClient:
    """Generation and control over a set of engines, optionally behind a router.

    Args:
        engine_urls: base URLs of every engine (needed for control calls; may be empty in router mode,
            then `discover_engines()` asks the router).
        router_url: sglang-router base URL; None dispatches `generate` by least outstanding requests.
        **client_kw: passed to every `EngineClient` (timeout, max_retries, ...).
    """

    def __init__(self, engine_urls: Sequence[str], router_url: str | None = None, **client_kw: Any):
        self._client_kw = client_kw
        self.engines = [EngineClient(u, **client_kw) for u in engine_urls]
        self.router = EngineClient(router_url, **client_kw) if router_url else None
        if not self.engines and self.router is None:
            raise ValueError("RolloutClient needs engine URLs (--rollout-engine-urls) or a router (--sglang-router-ip)")
        self._outstanding = [0] * len(self.engines)
        self._rr = itertools.count()

    @property
    def urls(self) -> list[str]:
        """Engine base URLs."""
        return [e.url for e in self.engines]

    async def discover_engines(self) -> list[str]:
        """Refreshes the engine list from the router's `GET /workers` (router mode)."""
        if self.router is None:
            return self.urls
        body = await self.router.request("GET", "/workers")
        workers = body.get("workers", []) if isinstance(body, dict) else body
        urls = [w["url"] if isinstance(w, dict) else str(w) for w in workers]
        self.engines = [EngineClient(u, **self._client_kw) for u in urls]
        self._outstanding = [0] * len(self.engines)
        return self.urls

    async def generate(self, payload: dict[str, Any]) -> Any:
        """POST /generate through the router, else on the engine with the fewest requests in flight.

        Ties go round-robin so idle engines share the load.

        Raises:
            EngineError: the engine/router failed (the message names its URL).
        """
        if self.router is not None:
            return await self.router.generate(payload)
        n = len(self.engines)
        start = next(self._rr) % n
        idx = min(((start + k) % n for k in range(n)), key=lambda i: self._outstanding[i])
        self._outstanding[idx] += 1
        try:
            return await self.engines[idx].generate(payload)
        finally:
            self._outstanding[idx] -= 1

    async def _engines(self) -> list[EngineClient]:
        if not self.engines:
            await self.discover_engines()
        return self.engines

    async def broadcast(self, method_name: str, **kw: Any) -> list[Any]:
        """Calls `EngineClient.<method_name>(**kw)` on every engine concurrently; returns their results.

        Raises:
            AttributeError: unknown method name.
            EngineError: the first engine failure (all calls are awaited first).
        """
        engines = await self._engines()
        if not hasattr(EngineClient, method_name):
            raise AttributeError(f"EngineClient has no method {method_name!r}")
        return await asyncio.gather(*(getattr(e, method_name)(**kw) for e in engines))

    async def abort_all(self, *, poll_s: float = 0.1, timeout_s: float = 300.0) -> None:
        """Aborts every request on every engine, then waits until no engine has unfinished requests.

        Raises:
            TimeoutError: requests are still running after `timeout_s` (names the busy engines).
        """
        engines = await self._engines()
        await asyncio.gather(*(e.abort_request(abort_all=True) for e in engines))
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            counts = await asyncio.gather(*(e.num_unfinished_requests() for e in engines))
            busy = [f"{e.url} ({c})" for e, c in zip(engines, counts, strict=True) if c > 0]
            if not busy:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"abort_all: requests still running after {timeout_s}s on {', '.join(busy)}")
            await asyncio.sleep(poll_s)

    async def get_weight_versions(self) -> list[str | None]:
        """`weight_version` of every engine."""
        return await self.broadcast("get_weight_version")

    async def aclose(self) -> None:
        """Closes the HTTP clients of the running loop."""
        for c in [*self.engines, *([self.router] if self.router else [])]:
            await c.aclose()


_CLIENTS: dict[tuple, RolloutClient] = {}


def get_client(args: Any) -> RolloutClient:
    """The process-wide `RolloutClient` for a run config (cached per engine set).

    Reads `args.sglang_router_ip`/`args.sglang_router_port` (router mode when both are set) and
    `args.rollout_engine_urls` (list of base URLs, or a comma-separated string).

    Raises:
        ValueError: neither a router nor engine URLs are configured.
    """
    ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    router_url = f"http://{ip}:{port}" if ip and port else None
    urls = getattr(args, "rollout_engine_urls", None) or []
    if isinstance(urls, str):
        urls = [u for u in urls.split(",") if u]
    key = (router_url, tuple(urls))
    if key not in _CLIENTS:
        _CLIENTS[key] = RolloutClient(list(urls), router_url=router_url)
    return _CLIENTS[key]


def reset_client_cache() -> None:
    """Forgets cached clients (after engines were restarted on new ports)."""
    _CLIENTS.clear()
