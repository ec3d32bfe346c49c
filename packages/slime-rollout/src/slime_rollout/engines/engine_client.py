"""One engine's HTTP control surface: `EngineClient(url)` (SGLang 0.5.16 routes and field names).

It runs on the retrying transport of `slime_rollout.engines.transport`; the request bodies of the weight-update
endpoints are the records of `slime_rollout.engines.wire`. A set of engines (dispatch, fan-out, abort) is
`slime_rollout.engines.client.RolloutClient`. Every error names the engine URL and endpoint (`EngineError`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from slime_core.error_text import preview
from slime_rollout.engines import wire
from slime_rollout.engines.probe import ProbeResult, probe
from slime_rollout.engines.transport import EngineError, HttpEndpoint
from slime_rollout.runtime.deadlines import DeadlineExceeded, await_with_deadline

__all__ = ["EngineClient", "count_requests"]


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

        Raises:
            EngineError: the engine failed, or neither reply holds a `weight_version` (naming the engine).
        """
        info = await self.request("GET", "/model_info")
        if isinstance(info, dict) and "weight_version" in info:
            return info["weight_version"]
        old = await self.request("GET", "/get_weight_version")
        if not isinstance(old, dict) or "weight_version" not in old:
            # A bare KeyError / TypeError ("string indices must be integers") out of the weight push's version check.
            raise EngineError(
                self.url, "/get_weight_version",
                f"no weight_version in its reply {preview(old)} nor in /model_info's {preview(info)}",
            )  # fmt: skip
        return old["weight_version"]

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
        """Running plus waiting requests, summed over the engine's DP ranks (parsed from /v1/loads).

        Raises:
            EngineError: the engine failed, or its reply holds no counts (`count_requests`), naming the engine.
        """
        loads = await self.get_loads()
        try:
            return count_requests(loads)
        except ValueError as exc:
            raise EngineError(self.url, "/v1/loads", str(exc)) from None

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


def count_requests(loads: Any) -> int:
    """Total unfinished requests in a /v1/loads reply (several SGLang versions' shapes)."""
    if isinstance(loads, list):
        return sum(count_requests(x) for x in loads)
    if not isinstance(loads, dict):
        raise ValueError(f"/v1/loads: unexpected reply {loads!r}")
    if "loads" in loads:
        return count_requests(loads["loads"])
    for key in ("num_total_reqs", "total_reqs", "num_reqs"):
        if key in loads:
            return _count(loads, key)
    return _count(loads, "num_running_reqs") + _count(loads, "num_waiting_reqs")


def _count(loads: dict, key: str) -> int:
    """`loads[key]` as a request count (0 when absent); SGLang 0.5.16 sends ints (`v1_loads.py`).

    `None` there was a bare `TypeError: int() argument must be ... not 'NoneType'` out of the rollout's abort.
    """
    value = loads.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer() or value < 0:
        raise ValueError(f"/v1/loads: {key} is {value!r}, not a request count (reply {str(loads)[:200]})")
    return int(value)
