"""Weight routes: updates from disk, shared tensors and a broadcast group, the version fence, checksums and reads.

Request bodies are read as SGLang reads them (`bodies.py`) into the records of `slime_rollout.engines.wire` (the
trainer encodes with the same module); `abort_all_requests` is SGLang's validated field, its default when absent. Every
update runs under the engine's update lock and its push guard (`push_guard.py`): a bucket of another push's version
is refused, and the version changes only after a successful update, as in SGLang.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from slime_rollout.engines.reference.delta import apply_delta_request, base_refusal
from slime_rollout.engines.reference.routes.bodies import json_or_empty, parse_request
from slime_rollout.engines.reference.routes.state import EngineState, engine_of, error
from slime_rollout.engines.weight_delta import UpdateWeightsFromDeltaReq
from slime_rollout.engines.wire import (
    DestroyWeightsUpdateGroupReq,
    InitWeightsUpdateGroupReq,
    UpdateWeightsFromDiskReq,
    UpdateWeightsFromDistributedReq,
    UpdateWeightsFromTensorReq,
    UpdateWeightVersionReq,
    broadcast_buffer,
    deserialize_named_tensors,
    dtype_from_name,
    init_custom_process_group,
)

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter()


async def _run_update(
    engine: EngineState,
    fn: Callable[[], Any],
    weight_version: str | None,
    abort_all: bool,
    *,
    endpoint: str,
    from_disk: bool = False,
    drain: Callable[[], Any] | None = None,
) -> JSONResponse:
    """Runs the update `fn` in a thread under the update lock and the push guard; SGLang's reply body."""
    # SGLang answers `num_paused_requests` from /update_weights_from_disk only.
    extra = {"num_paused_requests": 0} if from_disk else {}
    async with engine.update_lock:
        refusal = engine.push_guard.refusal(weight_version, endpoint)
        if refusal is None and engine.weights_released:
            # SGLang would write into unmapped memory (a crash) or lose the update at the resume: refused instead.
            refusal = (
                f"{endpoint}: the weights are released (/release_memory_occupation); resume them "
                "(/resume_memory_occupation with the 'weights' tag) before updating them"
            )
        if refusal is not None:
            if drain is not None:
                await asyncio.to_thread(drain)  # a collective's sender waits for this rank: receive, discard
            logger.error("%s", refusal)
            return JSONResponse({"success": False, "message": refusal, **extra}, status_code=400)
        if abort_all:
            engine.scheduler.abort(abort_all=True)
        try:
            await asyncio.to_thread(fn)
        except Exception as exc:  # noqa: BLE001 (any payload that does not load is the request's failure)
            # SGLang answers a failed load with 400 and its message; a payload that does not unpickle or holds no
            # tensors raised past this (a 500 without a body). Loads check the whole bucket before copying any
            # tensor, so nothing was applied.
            logger.warning("%s: refused: %s: %s", endpoint, type(exc).__name__, exc)
            named = isinstance(exc, (KeyError, ValueError, OSError, TypeError))  # their messages name the tensor/file
            message = str(exc) if named else f"{type(exc).__name__}: {exc}"
            return JSONResponse({"success": False, "message": message, **extra}, status_code=400)
        if from_disk:
            engine.push_guard.close()  # every weight replaced: no partial push is left
        else:
            engine.push_guard.landed(weight_version)
        if weight_version is not None:
            engine.weight_version = str(weight_version)  # SGLang: after each successful request
    return JSONResponse({"success": True, "message": "Succeeded to update model weights.", **extra})


def _load_bucket(engine: EngineState, named: list[tuple[str, torch.Tensor]], endpoint: str) -> int:
    """Loads one bucket unless the push guard refuses its tensors (`PushGuard.bucket_refusal`: a ValueError, 400)."""
    refusal = engine.push_guard.bucket_refusal(named, endpoint)
    if refusal is not None:
        raise ValueError(refusal)
    return engine.model.weights.load_named_tensors(named)


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request):
    """Loads every weight from the safetensors checkpoint at `model_path`."""
    engine = engine_of(request)
    req, fields = await parse_request(request, UpdateWeightsFromDiskReq)
    return await _run_update(
        engine,
        lambda: engine.model.weights.load_from_disk(req.model_path),
        req.weight_version,
        fields["abort_all_requests"],
        endpoint="/update_weights_from_disk",
        from_disk=True,
    )


@router.post("/update_weights_from_tensor")
async def update_weights_from_tensor(request: Request):
    """Loads one bucket of named tensors (shared memory or CUDA IPC handles; unpickled as SGLang does)."""
    engine = engine_of(request)
    req, fields = await parse_request(request, UpdateWeightsFromTensorReq)
    if not req.serialized_named_tensors:
        return JSONResponse({"success": False, "message": "serialized_named_tensors is empty"}, status_code=400)

    def load() -> int:
        # One entry per TP rank; the reference engine has a single rank.
        named = deserialize_named_tensors(req.serialized_named_tensors[0], req.load_format)
        return _load_bucket(engine, named, "/update_weights_from_tensor")

    return await _run_update(
        engine, load, req.weight_version, fields["abort_all_requests"], endpoint="/update_weights_from_tensor"
    )


@router.post("/update_weights_from_delta")
async def update_weights_from_delta(request: Request):
    """Applies one bucket of weight deltas against the base version the engine holds (ours, not SGLang's).

    The codec is `slime_rollout.engines.weight_delta`; every tensor's checksum is verified before anything is loaded.
    A malformed body is refused as SGLang refuses one on its own update routes (`bodies.py`).
    """
    engine = engine_of(request)
    req, fields = await parse_request(request, UpdateWeightsFromDeltaReq)

    def load() -> int:
        # Checked under the update lock, so no other update moves the version in between.
        refusal = base_refusal(req, engine.weight_version, engine.push_guard.version)
        if refusal is not None:
            raise ValueError(refusal)
        named = deserialize_named_tensors(req.serialized_named_tensors[0], None)
        return apply_delta_request(engine.model, named, req)

    return await _run_update(
        engine, load, req.weight_version, fields["abort_all_requests"], endpoint="/update_weights_from_delta"
    )


@router.post("/init_weights_update_group")
async def init_weights_update_group(request: Request):
    """Joins the trainer's broadcast group as rank `rank_offset` (one TP rank)."""
    engine = engine_of(request)
    req, _ = await parse_request(request, InitWeightsUpdateGroupReq)
    try:
        engine.groups[req.group_name] = await asyncio.to_thread(
            init_custom_process_group,
            backend=req.backend,
            init_method=f"tcp://{req.master_address}:{req.master_port}",
            world_size=int(req.world_size),
            rank=int(req.rank_offset),  # one TP rank: its rank is the offset
            group_name=req.group_name,
        )
    except Exception as exc:  # noqa: BLE001 - SGLang's ModelRunner answers every failure to join this way
        message = f"Failed to initialize custom process group: {exc}."
        logger.error("%s", message)
        return JSONResponse({"success": False, "message": message}, status_code=400)
    return {"success": True, "message": "Succeeded to initialize custom process group."}


@router.post("/destroy_weights_update_group")
async def destroy_weights_update_group(request: Request):
    """Leaves and destroys the named group, with SGLang's replies (`ModelRunner.destroy_weights_update_group`).

    The group is forgotten before it is destroyed, as SGLang pops it first: a failed teardown leaves no name behind.
    """
    req, _ = await parse_request(request, DestroyWeightsUpdateGroupReq)
    group = engine_of(request).groups.pop(req.group_name, None)
    if group is None:
        return JSONResponse({"success": False, "message": "The group to be destroyed does not exist."}, 400)
    try:
        await asyncio.to_thread(torch.distributed.destroy_process_group, group)
    except Exception as exc:  # noqa: BLE001 - SGLang answers any teardown failure with its message
        message = f"Failed to destroy custom process group: {exc}."
        logger.error("%s", message)
        return JSONResponse({"success": False, "message": message}, status_code=400)
    return {"success": True, "message": "Succeeded to destroy custom process group."}


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(request: Request):
    """Receives one bucket by broadcast from group rank 0 (`names`, `dtypes`, `shapes`) and loads it."""
    engine = engine_of(request)
    req, fields = await parse_request(request, UpdateWeightsFromDistributedReq)
    if not len(req.names) == len(req.dtypes) == len(req.shapes):
        message = f"names, dtypes and shapes differ in length: {len(req.names)}, {len(req.dtypes)}, {len(req.shapes)}"
        return JSONResponse({"success": False, "message": message}, status_code=400)
    group = engine.groups.get(req.group_name)
    if group is None:
        return JSONResponse({"success": False, "message": "weight update group not initialized"}, status_code=400)

    def receive_only() -> list[tuple[str, torch.Tensor]]:
        named = []
        for name, dtype, shape in zip(req.names, req.dtypes, req.shapes, strict=True):
            t = torch.empty(shape, dtype=dtype_from_name(dtype), device=engine.model.device)
            buffer = broadcast_buffer(t, torch.distributed.get_backend(group))  # FP8 over gloo: its bytes
            torch.distributed.broadcast(buffer, group=group, group_src=0)
            named.append((name, t))
        return named

    return await _run_update(
        engine,
        lambda: _load_bucket(engine, receive_only(), "/update_weights_from_distributed"),
        req.weight_version,
        fields["abort_all_requests"],
        endpoint="/update_weights_from_distributed",
        drain=receive_only,
    )


@router.api_route("/get_weights_by_name", methods=["GET", "POST"])
async def get_weights_by_name(request: Request):
    """SGLang's GetWeightsByNameReqInput: `{"name", "truncate_size" (default 100)}`; answers the list itself."""
    body = await json_or_empty(request)
    try:
        values = await asyncio.to_thread(
            engine_of(request).model.weights.get_weights_by_name, str(body["name"]), int(body.get("truncate_size", 100))
        )
    except KeyError:
        return error("Get parameter by name failed")
    return JSONResponse(values)


@router.api_route("/weights_checker", methods=["GET", "POST"])
async def weights_checker(request: Request):
    """SGLang's CheckWeightsReqInput `{"action": "checksum"}` -> one ChecksumInfo per TP rank (one here)."""
    body = await json_or_empty(request)
    action = body.get("action", "checksum")
    if action != "checksum":
        return JSONResponse({"success": False, "message": f"Unsupported action={action!r}"}, status_code=400)
    checksums = await asyncio.to_thread(engine_of(request).model.weights.weight_checksums)
    per_gpu = hashlib.sha256()
    for name in sorted(checksums):
        per_gpu.update(name.encode())
        per_gpu.update(checksums[name].encode())
    info = dict.fromkeys(("tp_rank", "dp_rank", "pp_rank", "rank"), 0) | dict.fromkeys(
        ("tp_size", "dp_size", "pp_size", "size"), 1
    )
    rank = {"checksums": checksums, "per_gpu_checksum": per_gpu.hexdigest(), "parallelism_info": info}
    per_engine = hashlib.sha256(rank["per_gpu_checksum"].encode()).hexdigest()
    return {"success": True, "message": "Success.", "ranks": [rank], "per_engine_checksum": per_engine}


@router.get("/get_weight_version")
async def get_weight_version():
    """Gone from SGLang 0.5.16 (the version is in /model_info): its 404 body."""
    message = "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead."
    body = {"object": "error", "message": message, "type": "404", "param": None, "code": 404}
    return JSONResponse(body, status_code=404)


@router.post("/update_weight_version")
async def update_weight_version(request: Request):
    """The version fence that ends a push: sets `new_version` (a mismatch with the push's buckets is logged)."""
    engine = engine_of(request)
    req, _ = await parse_request(request, UpdateWeightVersionReq)
    if req.abort_all_requests:  # SGLang's validated field: "false" is False, an absent one True (its default)
        engine.scheduler.abort(abort_all=True)
    async with engine.update_lock:
        mismatch = engine.push_guard.fence_mismatch(req.new_version)
        if mismatch is not None:
            logger.warning("%s", mismatch)  # accepted, as SGLang does
        engine.push_guard.close()
        engine.weight_version = req.new_version
    return {"success": True, "message": "Weight version updated", "new_version": engine.weight_version}
