"""Async HTTP clients for inference engines (SGLang or the CPU reference engine) and the router.

`EngineClient(url)` wraps one engine's control surface (SGLang 0.5.16 routes and field names) on the retrying
transport of `slime_rollout.engines.transport`; the request bodies of the weight-update endpoints are the records of
`slime_rollout.engines.wire`. `RolloutClient(engine_urls, router_url=None)` is what the rollout loop uses:
`generate` goes through the router when there is one, otherwise to the engine with the fewest outstanding requests;
`abort_all` and `broadcast` fan out to every engine. `get_client(args)` returns one cached `RolloutClient` per
process. Every error names the engine URL and endpoint (`EngineError`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slime_core.lora import LORA_NAME
from slime_rollout.engines import wire
from slime_rollout.engines.open_files import ensure_open_files
from slime_rollout.engines.pool import EnginePool, EngineState
from slime_rollout.engines.probe import ProbeResult, probe
from slime_rollout.engines.transport import DEFAULT_TIMEOUT_S, EngineError, EngineResponse, HttpEndpoint
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


class EngineClient(HttpEndpoint):
    """One SGLang-compatible engine (SGLang server or the reference engine).

    Args:
        url: base URL, e.g. "http://127.0.0.1:30000" ("host:port" is accepted).
        timeout: read timeout of control calls in seconds (`slime_rollout.engines.transport.DEFAULT_TIMEOUT_S`).
        **kw: connection settings of `slime_rollout.engines.transport.HttpEndpoint` (connect_timeout, max_retries, ...).
    """

    async def generate(
        self, payload: dict[str, Any], *, timeout: float | None = None, max_retries: int | None = None
    ) -> Any:
        """POST /generate (`input_ids`|`text`, `sampling_params`, `return_logprob`, ...); SGLang's reply.

        Args:
            payload: the request body.
            timeout: read timeout in seconds (None: the client's default).
            max_retries: retries of a connection failure (None: the client's default).
        """
        return await self.request("POST", "/generate", payload, timeout=timeout, max_retries=max_retries)

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """POST /abort_request (`slime_rollout.engines.wire.AbortReq`: `{"rid", "abort_all"}`)."""
        await self._post(wire.AbortReq(rid=rid, abort_all=abort_all))

    async def flush_cache(
        self, *, deadline_s: float = 60.0, poll_s: float = 0.2, answer_within_s: float | None = None
    ) -> None:
        """GET /flush_cache, again while SGLang refuses it (HTTP 400: requests still run or wait).

        SGLang's `Scheduler.flush_cache` needs an idle engine, which it is only a moment after `pause_generation`
        aborted its requests; the original retries likewise (60 tries).

        Args:
            deadline_s: seconds to keep asking while refused.
            poll_s: seconds between tries.
            answer_within_s: seconds each try may take (`--rollout-health-check-timeout`: the scheduler answers a
                flush at once; None: the client's read timeout).

        Raises:
            EngineError: still refused after `deadline_s` seconds (tried every `poll_s`), a try unanswered within
                `answer_within_s` (unreachable, naming the flag), or any other failure.
        """
        give_up = time.monotonic() + deadline_s
        while True:
            try:
                await self._within(self.request("GET", "/flush_cache"), "/flush_cache", answer_within_s)
                return
            except EngineError as exc:
                if exc.status_code != 400:
                    raise
                if time.monotonic() >= give_up:
                    raise EngineError(
                        self.url, "/flush_cache", f"requests still run or wait after {deadline_s:g} s", 400
                    ) from exc
            await asyncio.sleep(poll_s)

    async def _within(self, call: Any, endpoint: str, answer_within_s: float | None) -> Any:
        """`call` cut off after `answer_within_s` (`--rollout-health-check-timeout`) as an unreachable EngineError."""
        if answer_within_s is None:
            return await call
        try:
            return await await_with_deadline(
                call, what=f"{endpoint} on engine {self.url}", deadline_s=answer_within_s,
                flag="--rollout-health-check-timeout", warn_every_s=answer_within_s,
            )  # fmt: skip
        except DeadlineExceeded as exc:
            raise EngineError(self.url, endpoint, str(exc), unreachable=True) from None

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
        """POST /update_weights_from_disk (`slime_rollout.engines.wire.UpdateWeightsFromDiskReq`)."""
        return await self._post(
            wire.UpdateWeightsFromDiskReq(model_path=model_path, load_format=load_format, weight_version=weight_version)
        )

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: list[str],
        *,
        load_format: str | None = None,
        flush_cache: bool = False,
        weight_version: str | None = None,
    ) -> dict:
        """POST /update_weights_from_tensor (`weight_sync.wire.UpdateWeightsFromTensorReq`); one entry per TP rank."""
        return await self._post(
            wire.UpdateWeightsFromTensorReq(
                serialized_named_tensors=serialized_named_tensors,
                load_format=load_format,
                flush_cache=flush_cache,
                weight_version=weight_version,
            )
        )

    async def update_weights_from_delta(self, req: wire.WeightUpdateRequest) -> dict:
        """POST /update_weights_from_delta (`slime_rollout.engines.weight_delta.UpdateWeightsFromDeltaReq`)."""
        return await self._post(req)

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = wire.DEFAULT_GROUP_NAME,
        backend: str = "nccl",
    ) -> dict:
        """POST /init_weights_update_group (`slime_rollout.engines.wire.InitWeightsUpdateGroupReq`)."""
        return await self._post(
            wire.InitWeightsUpdateGroupReq(
                master_address=master_address,
                master_port=master_port,
                rank_offset=rank_offset,
                world_size=world_size,
                group_name=group_name,
                backend=backend,
            )
        )

    async def destroy_weights_update_group(
        self,
        group_name: str = wire.DEFAULT_GROUP_NAME,
        *,
        timeout: float | None = None,
        max_retries: int | None = None,
    ) -> dict:
        """POST /destroy_weights_update_group (`slime_rollout.engines.wire.DestroyWeightsUpdateGroupReq`).

        Args:
            group_name: the group to tear down.
            timeout: read timeout in seconds (None: the client's default).
            max_retries: retries of a connection failure (None: the client's default).
        """
        req = wire.DestroyWeightsUpdateGroupReq(group_name=group_name)
        return await self._post(req, timeout=timeout, max_retries=max_retries)

    async def update_weights_from_distributed(
        self,
        *,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = wire.DEFAULT_GROUP_NAME,
        flush_cache: bool = False,
        weight_version: str | None = None,
        load_format: str | None = None,
    ) -> dict:
        """POST /update_weights_from_distributed (`slime_rollout.engines.wire.UpdateWeightsFromDistributedReq`).

        The engine then receives the tensors by broadcast from rank 0 of the group.
        """
        return await self._post(
            wire.UpdateWeightsFromDistributedReq(
                names=names,
                dtypes=dtypes,
                shapes=shapes,
                group_name=group_name,
                flush_cache=flush_cache,
                weight_version=weight_version,
                load_format=load_format,
            )
        )

    async def update_weight_version(self, new_version: str) -> dict:
        """POST /update_weight_version `{"new_version", "abort_all_requests": false}` (the push's version fence)."""
        return await self._post(wire.UpdateWeightVersionReq(new_version=str(new_version)))

    async def _post(
        self, req: wire.WeightUpdateRequest, *, timeout: float | None = None, max_retries: int | None = None
    ) -> Any:
        """POSTs a `slime_rollout.engines.wire` request record to its endpoint (None: the client's defaults)."""
        return await self.request("POST", req.endpoint, req.to_json(), timeout=timeout, max_retries=max_retries)

    async def load_lora_adapter(self, lora_name: str, lora_path: str, *, pinned: bool = False) -> dict:
        """POST /load_lora_adapter (`slime_rollout.engines.wire.LoadLoRAAdapterReq`; SGLang needs `--enable-lora`).

        The body carries `"lora_id": null`: SGLang 0.5.16 types it `Optional[str]` and sets its own id.
        """
        return await self._post(wire.LoadLoRAAdapterReq(lora_name=lora_name, lora_path=lora_path, pinned=pinned))

    async def unload_lora_adapter(self, lora_name: str) -> dict:
        """POST /unload_lora_adapter (`slime_rollout.engines.wire.UnloadLoRAAdapterReq`: `{"lora_name", "lora_id"}`)."""
        return await self._post(wire.UnloadLoRAAdapterReq(lora_name=lora_name))

    async def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        """POST /get_weights_by_name `{"name", "truncate_size"}`: the parameter's first entries along dim 0.

        SGLang answers `weight.float().tolist()[:truncate_size]` under the Hugging Face name (rows of a 2-D
        weight; with TP, the gathered or first-rank rows) for the model classes that implement it, and HTTP 400
        ("Get parameter by name failed") for the others.
        """
        return await self.request("POST", "/get_weights_by_name", {"name": name, "truncate_size": truncate_size})

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

    async def probe_health_generate(self, timeout: float | None = 30.0) -> ProbeResult:
        """GET /health_generate on a new connection: OK, or whether the engine is down, timed out or unhealthy."""
        return await probe(self.url, "/health_generate", timeout)

    async def _probe(self, endpoint: str, timeout: float | None) -> bool:
        return (await probe(self.url, endpoint, timeout)).ok

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
                return await await_with_deadline(
                    self.router.generate(payload, timeout=backstop_timeout_s(self.generate_timeout)),
                    what=f"/generate through the router {self.router.url}",
                    deadline_s=self.generate_timeout,
                    flag="--sglang-router-request-timeout-secs",
                    warn_every_s=self.pool.slow_warning_s,
                )
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
