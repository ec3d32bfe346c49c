"""`--rm-type remote_rm`: a reward model behind HTTP (`--rm-url`).

POSTs `{"prompt", "response", "label"}` as JSON and returns the reply JSON as the reward. One
`httpx.AsyncClient` per event loop (64 connections); retries with exponential backoff.

As the original's `remote_rm` (an aiohttp session, whose default is `trust_env=False`), the request goes straight
to `--rm-url`: `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY` from the environment are not used (httpx's default would send a
cluster-internal reward model through the user's proxy). Redirects are followed as aiohttp follows them (a 307/308
re-posts the same JSON; httpx's default stopped at the 3xx and retried it until the run failed). Each attempt has at
most 120 s (the original's total) to connect, send, wait and read; the whole call, retries included, is
bounded by `--rm-timeout-secs`.

A reply that is not JSON (a proxy's or gateway's HTML page sent with status 200) is retried like a failed request,
as the original's (`aiohttp`'s `resp.json()` raises on it, and it retries every exception); the last one is
`NotJSONReply`, naming the status, content type and the start of the body (it was a bare "JSONDecodeError: Expecting
value: line 1 column 1 (char 0)" on the first try). A 4xx reply other than 408, 409, 425 and 429 (a wrong path, a
payload the service does not take) is not retried, unlike the original, which sent the same refused request ten times
over about 150 s: it is `RefusedRequest`, with the status and the start of the body (where a service says why).
"""

from __future__ import annotations

import asyncio
import logging
import random
import weakref
from typing import Any

import httpx

from slime_core.error_text import preview

logger = logging.getLogger(__name__)

__all__ = ["NotJSONReply", "RefusedRequest", "ServiceError", "remote_reward"]


_BODY_SHOWN = 200  # characters of a non-JSON reply shown in the error


def _body_start(response: httpx.Response) -> str:
    """The start of a reply's body as text, for a message (`_BODY_SHOWN` characters at most)."""
    return preview(response.content[:_BODY_SHOWN].decode("utf-8", errors="replace"), _BODY_SHOWN)


class RefusedRequest(ValueError):
    """The reward model refused the request itself (HTTP 4xx: a wrong path, a payload it does not take); not retried."""


# Client errors that a later attempt may not meet (timeout, conflict, too early, rate limit): retried with the 5xx.
_RETRIED_CLIENT_ERRORS = frozenset({408, 409, 425, 429})


def _refused(response: httpx.Response, url: str) -> str:
    return (
        f"--rm-url {url} refused the request with HTTP {response.status_code} {response.reason_phrase} (not "
        f"retried: the same request would be refused again): {_body_start(response)}"
    )


class ServiceError(RuntimeError):
    """The reward model kept answering with an HTTP 5xx (or a retried 4xx); the message shows its last reply's body."""


def _failed(response: httpx.Response, url: str, attempts: int) -> str:
    return (
        f"--rm-url {url} answered HTTP {response.status_code} {response.reason_phrase} to all {attempts} attempts; "
        f"the last reply: {_body_start(response)}"
    )


class NotJSONReply(ValueError):
    """The reward model answered with a body that is not JSON; the message shows the status, type and body's start."""


def _json_reply(response: httpx.Response, url: str) -> Any:
    """The decoded JSON body of a successful reply, or `NotJSONReply` describing what came instead."""
    try:
        return response.json()
    except ValueError:  # json.JSONDecodeError, UnicodeDecodeError
        kind = response.headers.get("content-type", "no content-type")
        raise NotJSONReply(
            f"--rm-url {url} replied {response.status_code} with a body that is not JSON ({kind}, "
            f"{len(response.content)} bytes): {_body_start(response)}"
        ) from None


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
            # As aiohttp (the original's client): a 307/308 (FastAPI's "/score" -> "/score/") re-posts the JSON.
            follow_redirects=True,
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
        base_delay_s: first backoff delay; doubles per attempt, capped at 30 s; each wait adds a random
            `[0, base_delay_s)` (the original's `+ random.random()`).

    Raises:
        ValueError: if `url` is empty.
        httpx.HTTPError | TimeoutError | NotJSONReply | ServiceError: the last error after `max_retries` failed
            attempts (TimeoutError: an attempt took more than 120 s; NotJSONReply: the body was not JSON;
            ServiceError: an HTTP error status, with the start of the last reply's body).
        RefusedRequest: at once, an HTTP 4xx other than 408, 409, 425 and 429 (names the status and the body's
            start: a FastAPI service's `{"detail": ...}` says which field it missed).
    """
    if not url:
        raise ValueError("--rm-type remote_rm needs --rm-url")
    delay = base_delay_s
    for attempt in range(1, max_retries + 1):
        try:
            # httpx's timeout is per phase (a reply trickling in could take far longer): bound the attempt too.
            async with asyncio.timeout(_ATTEMPT_S):
                response = await _client().post(url, json=payload)
            if 400 <= response.status_code < 500 and response.status_code not in _RETRIED_CLIENT_ERRORS:
                raise RefusedRequest(_refused(response, url))  # the same request would be refused again
            response.raise_for_status()
            return _json_reply(response, url)
        except (httpx.HTTPError, TimeoutError, NotJSONReply) as e:
            if attempt == max_retries and isinstance(e, httpx.HTTPStatusError):
                # httpx's message names the status and an MDN link; the service's own reason is in the body.
                raise ServiceError(_failed(e.response, url, max_retries)) from e
            if attempt == max_retries:
                raise
            # Jittered as the original's (+ up to one base delay): a rollout's samples that met one outage do not
            # all retry in the same instant.
            wait = delay + random.random() * base_delay_s
            logger.warning(
                "remote RM %s failed (attempt %d/%d): %s; retrying in %.1fs", url, attempt, max_retries, e, wait
            )
            await asyncio.sleep(wait)
            delay = min(delay * 2, _MAX_BACKOFF_S)
    raise AssertionError("unreachable")
