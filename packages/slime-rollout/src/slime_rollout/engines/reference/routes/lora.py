"""LoRA adapter routes: `/load_lora_adapter` and `/unload_lora_adapter` with SGLang's `LoRAUpdateOutput` replies.

The bodies are SGLang's typed parameters (`sglang.srt.managers.io_struct.LoadLoRAAdapterReqInput`,
`UnloadLoRAAdapterReqInput`; records `slime_rollout.engines.wire.LoadLoRAAdapterReq`, `UnloadLoRAAdapterReq`), read as
SGLang reads them (`bodies.py`): a missing or mistyped field is SGLang's HTTP 400 naming it (a body without
`lora_name` was a 500 here).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from slime_rollout.engines.reference.routes.bodies import parse_request
from slime_rollout.engines.reference.routes.state import EngineState, engine_of
from slime_rollout.engines.wire import LoadLoRAAdapterReq, UnloadLoRAAdapterReq

__all__ = ["router"]

router = APIRouter()


def _lora_result(engine: EngineState, success: bool, message: str = "") -> JSONResponse:
    # SGLang's LoRAUpdateOutput (no adapter list on failure).
    body = {"success": success, "error_message": message, "http_worker_ipc": None, "rid": None,
            "loaded_adapters": dict(engine.model.adapters.paths) if success else None}  # fmt: skip
    return JSONResponse(body, status_code=200 if success else 400)


@router.post("/load_lora_adapter")
async def load_lora_adapter(request: Request):
    """SGLang's LoadLoRAAdapterReqInput: `lora_name`, `lora_path` (its `pinned` is not read)."""
    engine = engine_of(request)
    req, _ = await parse_request(request, LoadLoRAAdapterReq)
    try:
        await asyncio.to_thread(engine.model.load_lora_adapter, req.lora_name, req.lora_path)
    except (KeyError, ValueError, FileNotFoundError) as exc:
        return _lora_result(engine, False, f"{type(exc).__name__}: {exc}")
    engine.lora_paths[req.lora_name] = req.lora_path
    return _lora_result(engine, True)


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(request: Request):
    """SGLang's UnloadLoRAAdapterReqInput: `lora_name`."""
    engine = engine_of(request)
    req, _ = await parse_request(request, UnloadLoRAAdapterReq)
    try:
        await asyncio.to_thread(engine.model.unload_lora_adapter, req.lora_name)
    except KeyError:
        # SGLang formats its registry's keys (an OrderedDict): "odict_keys(['a', 'b'])".
        loaded = list(engine.model.adapters.paths)
        message = f"LoRA with name {req.lora_name} does not exist. Loaded LoRAs: odict_keys({loaded})"
        return _lora_result(engine, False, message)
    return _lora_result(engine, True)
