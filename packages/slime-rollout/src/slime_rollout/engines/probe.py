"""One health probe of an engine route (`/health`, `/health_generate`), with what kind of failure it met.

The health monitor must tell a dead engine from a hung one without trusting the engine host's `alive` answer
(that RPC may time out on a loaded machine): a refused or reset connection means no process serves the port any
more (dead), while an engine that accepts the connection and never answers (a `SIGSTOP`ped or wedged process: the
kernel still completes the TCP handshake) times out (hung). Each probe opens a fresh connection, so a pooled
keep-alive connection that the server closed while idle is never read as a dead server.

Usage: `result = await probe("http://127.0.0.1:30000", "/health_generate", timeout_s=30)`; `result.ok`.
"""

from __future__ import annotations

import dataclasses
import enum

import aiohttp

__all__ = ["Probe", "ProbeResult", "probe"]


class Probe(enum.Enum):
    """What a probe found.

    OK: HTTP 200. DOWN: connection refused, reset or closed before a reply (no process serves the port).
    TIMEOUT: no complete reply within the timeout (hung, or a connect that got no answer). UNHEALTHY: the engine
    answered, but not 200 (e.g. SGLang's 503 when its test generation fails), or sent a broken reply.
    """

    OK = "ok"
    DOWN = "down"
    TIMEOUT = "timeout"
    UNHEALTHY = "unhealthy"


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeResult:
    """The outcome of one probe.

    Attributes:
        verdict: what the probe found.
        detail: for the log: "HTTP 503", "no reply within 30 s (...)", or the client exception's class and
            message; "" when OK.
    """

    verdict: Probe
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether the engine answered 200."""
        return self.verdict is Probe.OK


async def probe(url: str, endpoint: str, timeout_s: float | None) -> ProbeResult:
    """GET `url + endpoint` on a new connection and classifies the outcome; never raises for a network failure.

    Args:
        url: the engine's base URL, e.g. "http://127.0.0.1:30000".
        endpoint: the route, e.g. "/health_generate".
        timeout_s: seconds for the whole call (connect, request, reading the body); None: no limit.

    Returns:
        The verdict (see `Probe`) and a detail for the log.
    """
    # force_close: one connection per probe, closed after it (see the module docstring); trust_env=False: engines
    # are never behind the user's HTTP proxy.
    connector = aiohttp.TCPConnector(force_close=True)
    try:
        async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with session.get(url + endpoint, timeout=timeout) as resp:
                await resp.read()
                if resp.status == 200:
                    return ProbeResult(Probe.OK)
                return ProbeResult(Probe.UNHEALTHY, f"HTTP {resp.status}")
    # TimeoutError first: aiohttp's ServerTimeoutError (connect or read timeout) is also a ClientConnectionError.
    except TimeoutError as exc:
        return ProbeResult(Probe.TIMEOUT, f"no reply within {timeout_s} s ({_describe(exc)})")
    except aiohttp.ClientConnectionError as exc:  # refused (ClientConnectorError), reset, server disconnected
        return ProbeResult(Probe.DOWN, _describe(exc))
    except aiohttp.ClientError as exc:  # e.g. a malformed or truncated reply: something answered
        return ProbeResult(Probe.UNHEALTHY, _describe(exc))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
