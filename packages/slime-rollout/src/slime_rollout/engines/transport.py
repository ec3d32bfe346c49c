"""Retrying HTTP transport bound to one engine (or router) base URL, and the errors it raises.

`HttpEndpoint.request` sends one JSON request with retries on connection-level failures and raises
`EngineError` (naming the URL and endpoint) on anything else; `slime_rollout.engines.engine_client.EngineClient`
builds the engine's API on it.

The transport is aiohttp: httpx/httpcore's pool scans every connection for every request, which made 512
concurrent /generate calls about 8x slower than aiohttp's. Connection errors are retried with
exponential backoff. An `aiohttp.ClientSession` belongs to one event loop, so each endpoint keeps one per
running loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

__all__ = ["CONTROL_CONNECTIONS", "UNAVAILABLE_STATUSES", "EngineError", "EngineResponse", "HttpEndpoint"]

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

# Retries of a refused connection once the URL has answered: nothing listens on the port any more, which is a dead
# server (a live one under load drops SYNs from a full backlog, it does not refuse them). The full budget (about
# 20 s) was spent on every request of a killed engine and again on its abort: ~40 s before the rollout saw it.
_REFUSED_AFTER_ANSWER_RETRIES = 1

# Idle pooled connections are dropped after this many seconds, before servers drop them (uvicorn's
# default keep-alive, which SGLang uses, is 5 s), so a connection the server is closing is rarely reused.
_KEEPALIVE_S = 3.0

# Read timeout of control calls (flush, pause, weight updates, loads): generous, since SGLang loads a large
# checkpoint from disk within one call, but finite, so a hung engine surfaces as an error.
DEFAULT_TIMEOUT_S = 1800.0

# HTTP statuses that say "not now" rather than "not this request": a router whose worker died (502/504), an engine
# or router out of capacity or shutting down (503). With --use-fault-tolerance a generation answered so goes to
# another engine, as an unreachable one does.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


class EngineError(RuntimeError):
    """An engine call failed (HTTP error status, `success: false`, or the engine is unreachable).

    Picklable (it crosses Ray from the rollout manager to the driver as itself).

    Attributes:
        url: the engine (or router) base URL.
        endpoint: the route that failed, e.g. "/generate".
        message: what went wrong (the engine's error text or the client exception).
        status_code: HTTP status, or None when no response arrived.
        unreachable: no answer came at all (connection refused/reset, timeout, server gone): the engine may be
            dead or hung, so the request can go to another engine. False for an HTTP error reply.
        context: what the call was for, e.g. "sample 7" (`for_context`); "" when the caller did not say.
    """

    def __init__(
        self,
        url: str,
        endpoint: str,
        message: str,
        status_code: int | None = None,
        *,
        unreachable: bool = False,
        context: str = "",
    ):
        super().__init__(
            f"engine {url}{endpoint} failed"
            + (f" for {context}" if context else "")
            + (f" (HTTP {status_code})" if status_code else "")
            + f": {message}"
        )
        self.url, self.endpoint, self.message, self.status_code = url, endpoint, message, status_code
        self.unreachable, self.context = unreachable, context

    def for_context(self, context: str) -> EngineError:
        """The same failure, its message naming what the call was for (the sample a `/generate` served).

        The pool and the transport know the engine but not the sample; the generate function knows the sample.
        """
        return EngineError(
            self.url, self.endpoint, self.message, self.status_code, unreachable=self.unreachable, context=context
        )

    @property
    def unavailable(self) -> bool:
        """No usable answer that blames the request: unreachable, or an `UNAVAILABLE_STATUSES` reply."""
        return self.unreachable or self.status_code in UNAVAILABLE_STATUSES

    @property
    def engine_message(self) -> str:
        """The engine's own words: the `message` of SGLang's error bodies, else `message` as it came.

        SGLang 0.5.16 answers a refused `/generate` with `{"error": {"message": ...}}` (http_server.py
        `_create_error_response`) and a refused body with `{"object": "error", "message": ...}` (its
        `RequestValidationError` handler).
        """
        try:
            body = json.loads(self.message)
        except ValueError:
            return self.message
        if not isinstance(body, dict):
            return self.message
        inner = body.get("error")
        found = inner.get("message") if isinstance(inner, dict) else body.get("message")
        return found if isinstance(found, str) else self.message

    def __reduce__(self) -> tuple:
        # BaseException pickles only `args` (the formatted message), which this __init__ cannot take back.
        fields = (self.url, self.endpoint, self.message, self.status_code, self.unreachable, self.context)
        return (_rebuild_engine_error, fields)


def _said(exc: BaseException) -> str:
    """`Type: message` of a client exception, or its type alone (its repr spelled out aiohttp's connection key)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _rebuild_engine_error(
    url: str, endpoint: str, message: str, status_code: int | None, unreachable: bool, context: str = ""
) -> EngineError:
    return EngineError(url, endpoint, message, status_code, unreachable=unreachable, context=context)


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


# Connections kept beyond `max_connections` for control calls: with every generation slot taken, the over-sampling
# abort waited for a generation to finish (a whole response) before it could be sent.
CONTROL_CONNECTIONS = 16


def _refused(exc: BaseException) -> bool:
    """Whether a connection attempt was refused (no listener on the port)."""
    return isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, ConnectionRefusedError)


class HttpEndpoint:
    """Retrying JSON requests to one base URL (an engine or a router).

    Args:
        url: base URL ("host:port" gets `http://`).
        timeout: default read timeout in seconds (None: wait forever); control calls use it.
        connect_timeout: seconds to open a connection.
        max_retries: retries of a connection-level failure before `EngineError`; a refused connection after the URL
            answered once is retried once only (the server is gone).
        backoff_s: first retry delay in seconds; doubles per retry.
        max_backoff_s: cap of the retry delay in seconds.
        max_connections: the requests in flight the caller plans per event loop (generations: the rollout's
            semaphore bounds them); the pool holds `CONTROL_CONNECTIONS` more, so an abort, a load report or a
            health probe never waits behind a full set of generations.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
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
        self.answered = False  # some request got a response: a refused connection now means the server is gone

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
        limit = self.max_connections + CONTROL_CONNECTIONS
        connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=_KEEPALIVE_S)
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
        headers: dict[str, str] | None = None,
        check_success: bool = True,
        max_retries: int | None = None,
    ) -> Any:
        """Sends one request with retries on connection errors.

        Args:
            method: "GET" or "POST".
            endpoint: route, e.g. "/generate".
            payload: JSON body (POST) or query parameters (GET).
            timeout: per-request read timeout in seconds (None: the client's default).
            raw: return the `EngineResponse` (status, headers, body bytes) instead of decoded JSON.
            headers: extra request headers (e.g. a router's session-affinity key).
            check_success: raise on a `{"success": false}` body (engine control endpoints); False returns it.
            max_retries: retries of a connection-level failure (None: the endpoint's `max_retries`).

        Returns:
            Decoded JSON (None for an empty body, the text for a non-JSON body), or the response when `raw`.

        Raises:
            EngineError: non-2xx status, `{"success": false}` body, or still unreachable after retries.
        """
        kwargs: dict[str, Any] = {"json": payload} if method == "POST" else {"params": payload}
        if headers:
            kwargs["headers"] = headers
        if timeout is not None:
            kwargs["timeout"] = self._timeout(timeout)
        delay = self.backoff_s
        max_retries = self.max_retries if max_retries is None else max_retries
        for attempt in itertools.count():
            try:
                session = await self._http()
                async with session.request(method, self.url + endpoint, **kwargs) as resp:
                    self.answered = True
                    out = EngineResponse(resp.status, resp.headers, await resp.read())
                break
            except _NOT_RETRYABLE as exc:
                raise EngineError(self.url, endpoint, _said(exc), unreachable=True) from exc
            except _RETRYABLE as exc:
                gone = self.answered and _refused(exc)
                if attempt >= (min(max_retries, _REFUSED_AFTER_ANSWER_RETRIES) if gone else max_retries):
                    why = " (it answered before: its server is gone)" if gone else ""
                    raise EngineError(
                        self.url, endpoint, f"unreachable after {attempt + 1} attempts: {_said(exc)}{why}",
                        unreachable=True,
                    ) from exc  # fmt: skip
                logger.debug("%s%s: %r, retry %d in %.2fs", self.url, endpoint, exc, attempt + 1, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # A read timeout or a broken reply: the engine took the request but gave no usable answer.
                raise EngineError(self.url, endpoint, _said(exc), unreachable=True) from exc
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
        if check_success and isinstance(body, dict) and body.get("success") is False:
            raise EngineError(self.url, endpoint, str(body.get("message", body)), out.status_code)
        return body
