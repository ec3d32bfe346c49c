"""The rollout's client of a set of inference engines (SGLang or the CPU reference engine) and the router.

One engine's endpoints are `slime_rollout.engines.engine_client.EngineClient` (re-exported here, its import path
for plugins and the compat layer). `RolloutClient(engine_urls, router_url=None)` is what the rollout loop uses:
`generate` goes through the router when there is one, otherwise to the engine with the fewest outstanding requests;
`abort_all` and `broadcast` fan out to every engine. `get_client(args)` returns one cached `RolloutClient` per
process. Every error names the engine URL and endpoint (`EngineError`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slime_core.lora import LORA_NAME
from slime_rollout.engines.engine_client import EngineClient
from slime_rollout.engines.open_files import ensure_open_files
from slime_rollout.engines.pool import EnginePool, EngineState, note_answering_engine
from slime_rollout.engines.transport import DEFAULT_TIMEOUT_S, EngineError, EngineResponse
from slime_rollout.runtime.deadlines import DeadlineExceeded, await_with_deadline, backstop_timeout_s

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineResponse",
    "RolloutClient",
    "ensure_open_files",
    "get_client",
    "reset_client_cache",
]

logger = logging.getLogger(__name__)


class RolloutClient:
    """Generation and control over a set of engines, optionally behind a router.

    Args:
        engine_urls: base URLs of every engine (needed for control calls; may be empty in router mode,
            then `discover_engines()` asks the router).
        router_url: sglang-router base URL; None dispatches `generate` over the engines' `EnginePool`.
        concurrency: the most `/generate` requests in flight per engine (`--sglang-server-concurrency`): the
            size of each engine's connection pool, and of the router's times the number of engines.
        generate_timeout: deadline of one `/generate` call in seconds (None: no limit).
        failover: re-queue the requests of a failed engine on the others (`--use-fault-tolerance`).
        recovery_timeout: with `failover`, how long a request waits when no engine serves (seconds).
        lora_name: LoRA runs: the adapter every `generate` runs with (`lora_path` of SGLang's `/generate`) unless
            the payload names one.
        slow_warning_s: seconds between warnings while a `/generate` call runs (`--slow-call-warning-secs`).
        probe_timeout_s: without `failover`, how long a slow call's engine may take to answer `/health_generate`
            before it counts as frozen (`--rollout-health-check-timeout`; `slime_rollout.engines.pool`).
        update_weight_timeout_s: seconds a weight push's slow calls may take (`--update-weight-timeout`;
            `slime_rollout.weight_sync.push.PushSession`); the engines' read timeout stays past it.
        **client_kw: passed to every `EngineClient` (timeout, max_retries, ...).
    """

    def __init__(
        self,
        engine_urls: Sequence[str],
        router_url: str | None = None,
        *,
        concurrency: int = 512,
        generate_timeout: float | None = None,
        failover: bool = False,
        recovery_timeout: float = 600.0,
        lora_name: str | None = None,
        slow_warning_s: float = 60.0,
        probe_timeout_s: float = 30.0,
        update_weight_timeout_s: float = DEFAULT_TIMEOUT_S,
        **client_kw: Any,
    ):
        # The socket's read timeout is a backstop behind the push's deadline, whose error names the flag.
        read_s = max(DEFAULT_TIMEOUT_S, backstop_timeout_s(update_weight_timeout_s) or 0.0)
        self._client_kw = {"max_connections": concurrency, "timeout": read_s, **client_kw}
        self.update_weight_timeout_s = update_weight_timeout_s
        self.concurrency = concurrency
        self.lora_name = lora_name
        self.router = None
        if router_url:
            router_kw = {**self._client_kw, "max_connections": concurrency * max(len(engine_urls), 1)}
            self.router = EngineClient(router_url, **router_kw)
        if not engine_urls and self.router is None:
            raise ValueError("RolloutClient needs engine URLs (--rollout-engine-urls) or a router (--sglang-router-ip)")
        self.generate_timeout = generate_timeout
        self.pool = EnginePool(
            [EngineClient(u, **self._client_kw) for u in engine_urls],
            failover=failover,
            recovery_timeout_s=recovery_timeout,
            generate_timeout_s=generate_timeout,
            slow_warning_s=slow_warning_s,
            probe_timeout_s=probe_timeout_s,
        )

    @property
    def engines(self) -> list[EngineClient]:
        """Every engine's client, serving or not, in engine order."""
        return [s.client for s in self.pool.slots]

    @property
    def urls(self) -> list[str]:
        """Engine base URLs."""
        return [e.url for e in self.engines]

    def _live(self) -> list[EngineClient]:
        """Engines whose process runs (serving, or restarted and waiting for weights): control calls go there."""
        down = (EngineState.FAILED, EngineState.RESTARTING)
        return [s.client for s in self.pool.slots if s.state not in down]

    async def discover_engines(self) -> list[str]:
        """Refreshes the engine list from the router's `GET /workers` (router mode)."""
        if self.router is None:
            return self.urls
        body = await self.router.request("GET", "/workers")
        workers = body.get("workers", []) if isinstance(body, dict) else body
        urls = [w["url"] if isinstance(w, dict) else str(w) for w in workers]
        old = self.pool
        self.pool = EnginePool(
            [EngineClient(u, **self._client_kw) for u in urls],
            failover=old.failover,
            recovery_timeout_s=old.recovery_timeout_s,
            generate_timeout_s=old.generate_timeout_s,
            on_suspect=old.on_suspect,
            slow_warning_s=old.slow_warning_s,
            probe_timeout_s=old.probe_timeout_s,
        )
        self.pool.stats = old.stats
        return self.urls

    async def generate(self, payload: dict[str, Any]) -> Any:
        """POST /generate through the router, else on the serving engine with the fewest requests in flight.

        Ties go round-robin so idle engines share the load. With `failover`, a request whose engine fails is
        sent again to another engine (`slime_rollout.engines.pool`).

        Raises:
            EngineError: the engine/router failed (the message names its URL).
            NoHealthyEngineError: with `failover`, no engine served within the recovery timeout.
        """
        if self.lora_name is not None and "lora_path" not in payload:
            payload = {**payload, "lora_path": self.lora_name}
        if self.router is not None:
            return await self._generate_via_router(payload)
        return await self.pool.generate(payload)

    async def _generate_via_router(self, payload: dict[str, Any]) -> Any:
        """Through the router; with `failover`, an unreachable router or a 502/503/504 (its worker died) is retried."""
        deadline = asyncio.get_running_loop().time() + self.pool.recovery_timeout_s
        while True:
            try:
                reply = await await_with_deadline(
                    self.router.generate(payload, timeout=backstop_timeout_s(self.generate_timeout)),
                    what=f"/generate through the router {self.router.url}",
                    deadline_s=self.generate_timeout,
                    flag="--sglang-router-request-timeout-secs",
                    warn_every_s=self.pool.slow_warning_s,
                )
                note_answering_engine(self.router.url)
                return reply
            except DeadlineExceeded as exc:
                raise EngineError(self.router.url, "/generate", str(exc), unreachable=True) from None
            except EngineError as exc:
                if not (self.pool.failover and exc.unavailable) or asyncio.get_running_loop().time() > deadline:
                    raise
                self.pool.stats.requeued_requests += 1
                await asyncio.sleep(1.0)

    async def _engines(self) -> list[EngineClient]:
        if not self.pool.slots:
            await self.discover_engines()
        return self._live()

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

    async def broadcast_settled(self, method_name: str, **kw: Any) -> dict[str, Any]:
        """`broadcast`, but every live engine's outcome: URL -> its result, or the exception its call raised.

        Raises:
            AttributeError: unknown method name.
        """
        engines = await self._engines()
        if not hasattr(EngineClient, method_name):
            raise AttributeError(f"EngineClient has no method {method_name!r}")
        results = await asyncio.gather(*(getattr(e, method_name)(**kw) for e in engines), return_exceptions=True)
        return {e.url: r for e, r in zip(engines, results, strict=True)}

    async def abort_all(self, *, poll_s: float = 0.1, timeout_s: float = 300.0, retry_s: float = 3.0) -> None:
        """Aborts every request on every engine, then waits until no engine has unfinished requests.

        An engine still busy `retry_s` after its last abort is aborted again, as the original's
        `abort_servers_until_idle` does every 3 s: a request that reached it after the abort (sent by a task that
        was already past the rollout's aborted check) is not covered by the first one, and ran to its full length
        here, or past `timeout_s`, which failed the rollout.

        Each engine must answer each call (`/abort_request`, `/v1/loads`) within `--rollout-health-check-timeout`
        (`probe_timeout_s`): SGLang answers both at once, and a frozen engine kept the abort waiting for the control
        timeout (30 minutes) before the run could stop.

        Raises:
            TimeoutError: requests are still running after `timeout_s` (names the busy engines).
            EngineError: an engine failed or did not answer in time (without `failover`; with it, that engine is
                left to the health monitor).
        """
        engines = await self._engines()
        loop = asyncio.get_running_loop()
        await self._tolerant(engines, "/abort_request", lambda e: e.abort_request(abort_all=True))
        deadline = loop.time() + timeout_s
        last_abort = loop.time()
        while True:
            counts = await self._tolerant(engines, "/v1/loads", lambda e: e.num_unfinished_requests())
            busy = [(e, c) for e, c in zip(engines, counts, strict=True) if c]
            if not busy:
                return
            if loop.time() > deadline:
                names = ", ".join(f"{e.url} ({c})" for e, c in busy)
                raise TimeoutError(f"abort_all: requests still running after {timeout_s}s on {names}")
            if loop.time() - last_abort >= retry_s:
                again = [e for e, _ in busy]
                logger.info("abort_all: %s still busy after an abort; aborting again", ", ".join(e.url for e in again))
                await self._tolerant(again, "/abort_request", lambda e: e.abort_request(abort_all=True))
                last_abort = loop.time()
            await asyncio.sleep(poll_s)

    async def _tolerant(self, engines: list[EngineClient], endpoint: str, call: Any) -> list[Any]:
        """`call(engine)` on every engine, each within `probe_timeout_s` (unbounded while weights move).

        With failover, an unreachable engine (one that did not answer in time included) answers None (the health
        monitor judges it); without, its `EngineError` is raised.
        """

        async def bounded(engine: EngineClient) -> Any:
            try:
                return await await_with_deadline(
                    call(engine),
                    what=f"{endpoint} on engine {engine.url}",
                    # A push in progress may hold the engine's scheduler (loading weights): it bounds itself.
                    deadline_s=None if self.pool.weights_moving else self.pool.probe_timeout_s,
                    flag="--rollout-health-check-timeout",
                    warn_every_s=self.pool.slow_warning_s,
                )
            except DeadlineExceeded as exc:
                raise EngineError(engine.url, endpoint, str(exc), unreachable=True) from None

        results = await asyncio.gather(*(bounded(e) for e in engines), return_exceptions=True)
        for e, r in zip(engines, results, strict=True):
            if isinstance(r, BaseException):
                if not (self.pool.failover and isinstance(r, EngineError) and r.unreachable):
                    raise r
                logger.warning("engine %s unreachable during abort: %s", e.url, r)
        return [None if isinstance(r, BaseException) else r for r in results]

    async def get_weight_versions(self) -> list[str | None]:
        """`weight_version` of every engine."""
        return await self.broadcast("get_weight_version")

    async def aclose(self) -> None:
        """Closes the HTTP clients of the running loop."""
        for c in [*self.engines, *([self.router] if self.router else [])]:
            await c.aclose()


_CLIENTS: dict[tuple, RolloutClient] = {}


def get_client(args: SlimeArgs) -> RolloutClient:
    """The process-wide `RolloutClient` of the run's engines (cached per engine set).

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`) or any config holding the engine addresses:
            `sglang_router_ip` / `sglang_router_port` (router mode when both are set) and `rollout_engine_urls`
            (base URLs; a comma-separated string is accepted, since plugins may write one on their view); with
            `lora_rank`, generation runs with the run's adapter (`slime_core.lora.LORA_NAME`); the request deadline
            `sglang_router_request_timeout_secs`, `slow_call_warning_secs`, `rollout_health_check_timeout`.

    Raises:
        ValueError: neither a router nor engine URLs are configured.
    """
    ip, port = args.sglang_router_ip, args.sglang_router_port
    router_url = f"http://{ip}:{port}" if ip and port else None
    urls = args.rollout_engine_urls or []
    if isinstance(urls, str):
        urls = [u for u in urls.split(",") if u]
    if router_url is not None and router_url in [u.rstrip("/") for u in urls]:
        router_url = None  # the router address plugins see is the single engine itself: dispatch directly
    lora_name = LORA_NAME if args.lora_rank else None
    key = (router_url, tuple(urls), lora_name)
    if key not in _CLIENTS:
        _CLIENTS[key] = RolloutClient(
            list(urls),
            router_url=router_url,
            concurrency=args.sglang_server_concurrency,
            generate_timeout=float(args.sglang_router_request_timeout_secs),
            failover=args.use_fault_tolerance,
            recovery_timeout=args.rollout_engine_recovery_timeout,
            lora_name=lora_name,
            slow_warning_s=args.slow_call_warning_secs,
            probe_timeout_s=args.rollout_health_check_timeout,
        )
        ensure_open_files(args.sglang_server_concurrency * max(len(urls), 1))  # one socket per request in flight
        logger.info(
            "engine client: up to %d requests in flight per engine (--sglang-server-concurrency), %d engine(s)%s%s",
            args.sglang_server_concurrency,
            len(urls),
            f", router {router_url}" if router_url else "",
            ", failover on (--use-fault-tolerance)" if args.use_fault_tolerance else "",
        )
    return _CLIENTS[key]


def reset_client_cache() -> None:
    """Forgets cached clients (after engines were restarted on new ports)."""
    _CLIENTS.clear()
