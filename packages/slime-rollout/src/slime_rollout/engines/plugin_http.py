"""HTTP calls for rollout plugins: `post(url, payload)` and `get(url)` with the original slime's semantics.

Custom generate functions written for the original (`from slime.utils.http_utils import post`) send their
requests to the router (`http://{args.sglang_router_ip}:{args.sglang_router_port}/generate`) with `post`,
which retries every failure (connection errors and error statuses alike) up to `max_retries` times, one
second apart, and returns the decoded JSON body (the text when it is not JSON). The engines' own control
traffic goes through `slime_rollout.engines.client`; this module is the plugin-facing door, built on the same
transport (`slime_rollout.engines.transport.HttpEndpoint`, aiohttp, one session per base URL and event loop).

Every request has a read timeout: `--sglang-router-request-timeout-secs` once `init_http_client(args)` ran
(the rollout manager calls it), 14400 s before.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any

from slime_rollout.engines.transport import EngineError, HttpEndpoint

__all__ = ["DEFAULT_TIMEOUT_S", "get", "init_http_client", "post"]

logger = logging.getLogger(__name__)

#: Read timeout of a plugin request in seconds (the default of --sglang-router-request-timeout-secs).
DEFAULT_TIMEOUT_S = 14400.0
_RETRY_DELAY_S = 1.0  # the original waits one second between attempts

_settings: dict[str, Any] = {"timeout_s": DEFAULT_TIMEOUT_S, "max_connections": 1024}
_endpoints: dict[str, HttpEndpoint] = {}


def init_http_client(args: Any) -> None:
    """Sizes the connection pool and sets the read timeout from the run's args.

    Args:
        args: the plugin view of the run; reads `sglang_router_request_timeout_secs`,
            `sglang_server_concurrency` and `rollout_engine_urls` (or `rollout_num_gpus` /
            `rollout_num_gpus_per_engine` when the engines are not known yet).
    """
    engines = len(args.rollout_engine_urls or []) or max(
        (args.rollout_num_gpus or 0) // args.rollout_num_gpus_per_engine, 1
    )
    _settings["timeout_s"] = float(args.sglang_router_request_timeout_secs)
    _settings["max_connections"] = int(args.sglang_server_concurrency) * engines
    _endpoints.clear()  # new pool size and timeout for the next requests


def _endpoint(url: str) -> tuple[HttpEndpoint, str]:
    """The cached endpoint of `url`'s scheme://host:port and the path (with query) to request on it."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if not parts.netloc:
        raise ValueError(f"post/get: not an http URL: {url!r}")
    base = f"{parts.scheme}://{parts.netloc}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    endpoint = _endpoints.get(base)
    if endpoint is None:
        # No retries inside the transport: `post` retries every failure itself, as the original does.
        endpoint = HttpEndpoint(
            base, timeout=_settings["timeout_s"], max_retries=0, max_connections=_settings["max_connections"]
        )
        _endpoints[base] = endpoint
    return endpoint, path


async def post(url: str, payload: dict[str, Any] | None = None, max_retries: int = 60, headers: Any = None) -> Any:
    """POSTs JSON to `url`, retrying any failure (original `slime.utils.http_utils.post`).

    Args:
        url: full URL, e.g. `http://127.0.0.1:30000/generate`.
        payload: the JSON body (`{}` when None).
        max_retries: attempts in total before the last error is raised; one second between attempts.
        headers: extra request headers.

    Returns:
        The decoded JSON body, or the body text when it is not JSON (None for an empty body).

    Raises:
        slime_rollout.engines.transport.EngineError: every attempt failed (the last failure's message, with URL and
            HTTP status).
        ValueError: `url` is not an http URL.
    """
    endpoint, path = _endpoint(url)
    attempts = max(int(max_retries), 1)
    for attempt in range(1, attempts + 1):
        try:
            return await endpoint.request(
                "POST", path, payload or {}, headers=dict(headers) if headers else None, check_success=False
            )
        except EngineError as e:
            if attempt >= attempts:
                logger.warning("post %s failed %d times, giving up: %s", url, attempt, e)
                raise
            logger.info("post %s failed (attempt %d/%d), retrying in %.0f s: %s", url, attempt, attempts,
                        _RETRY_DELAY_S, e)  # fmt: skip
            await asyncio.sleep(_RETRY_DELAY_S)
    raise AssertionError("unreachable")


async def get(url: str) -> Any:
    """GETs `url` once and returns the decoded JSON body (original `slime.utils.http_utils.get`).

    Raises:
        slime_rollout.engines.transport.EngineError: an error status or no response within the timeout.
    """
    endpoint, path = _endpoint(url)
    return await endpoint.request("GET", path, check_success=False)
