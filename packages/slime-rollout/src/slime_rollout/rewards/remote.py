"""`--rm-type remote_rm`: a reward model behind HTTP (`--rm-url`).

POSTs `{"prompt", "response", "label"}` as JSON and returns the reply JSON as the reward. One
`httpx.AsyncClient` per event loop (64 connections); retries with exponential backoff.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

logger = logging.getLogger(__name__)

__all__ = ["remote_reward"]

_MAX_RETRIES = 10
_MAX_BACKOFF_S = 30.0
_clients: dict[int, httpx.AsyncClient] = {}


def _client() -> httpx.AsyncClient:
    # An AsyncClient is bound to the loop it first ran on; keep one per loop.
    key = id(asyncio.get_running_loop())
    client = _clients.get(key)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64), timeout=httpx.Timeout(120.0)
        )
        _clients[key] = client
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
        httpx.HTTPError: the last error after `max_retries` failed attempts.
    """
    if not url:
        raise ValueError("--rm-type remote_rm needs --rm-url")
    delay = base_delay_s
    for attempt in range(1, max_retries + 1):
        try:
            response = await _client().post(url, json=payload)
            response.raise_for_status()
            return response.json()
        except httpx.HTTPError as e:
            if attempt == max_retries:
                raise
            logger.warning(
                "remote RM %s failed (attempt %d/%d): %s; retrying in %.1fs", url, attempt, max_retries, e, delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF_S)
    raise AssertionError("unreachable")
