"""`--rm-type remote_rm`: a reward model behind HTTP (`--rm-url`).

POSTs `{"prompt", "response", "label"}` as JSON and returns the reply JSON as the reward. One
`httpx.AsyncClient` per event loop (64 connections); retries with exponential backoff.

As the original's `remote_rm` (an aiohttp session, whose default is `trust_env=False`), the request goes straight
to `--rm-url`: `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY` from the environment are not used (httpx's default would send a
cluster-internal reward model through the user's proxy). Each attempt has at most 120 s (the original's total) to
connect, send, wait and read; the whole call, retries included, is bounded by `--rm-timeout-secs`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

import httpx

logger = logging.getLogger(__name__)

__all__ = ["remote_reward"]

_MAX_RETRIES = 10
_MAX_BACKOFF_S = 30.0
_ATTEMPT_S = 120.0  # the original's ClientTimeout(total=120)
# Keyed by the loop itself, weakly: an id() of a closed loop can be reused by a new one, which then got a client
# whose pooled connections belong to the dead loop.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def _client() -> httpx.AsyncClient:
    # An AsyncClient is bound to the loop it first ran on; keep one per loop.
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            timeout=httpx.Timeout(_ATTEMPT_S),
            trust_env=False,
        )
        _clients[loop] = client
    return client


async def remote_reward(
    url: str, payload: dict[str, Any], *, max_retries: int = _MAX_RETRIES, base_delay_s: float = 1.0
) -> Any:
    """POSTs `payload` to `url` and returns the decoded JSON reply.

    Args:
        url: the `--rm-url` endpoint.
        payload: `{"prompt": str, "response": str, "label": Any}`.
        max_retries: attempts before giving up.
        base_delay_s: first backoff delay; doubles per attempt, capped at 30 s.

    Raises:
        ValueError: if `url` is empty.
        httpx.HTTPError | TimeoutError: the last error after `max_retries` failed attempts (TimeoutError: an attempt
            took more than 120 s).
    """
    if not url:
        raise ValueError("--rm-type remote_rm needs --rm-url")
    delay = base_delay_s
    for attempt in range(1, max_retries + 1):
        try:
            # httpx's timeout is per phase (a reply trickling in could take far longer): bound the attempt too.
            async with asyncio.timeout(_ATTEMPT_S):
                response = await _client().post(url, json=payload)
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, TimeoutError) as e:
            if attempt == max_retries:
                raise
            logger.warning(
                "remote RM %s failed (attempt %d/%d): %s; retrying in %.1fs", url, attempt, max_retries, e, delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF_S)
    raise AssertionError("unreachable")
