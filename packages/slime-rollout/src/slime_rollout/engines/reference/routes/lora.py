"""LoRA adapter routes: `/load_lora_adapter` and `/unload_lora_adapter` with SGLang's `LoRAUpdateOutput` replies."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from slime_rollout.engines.reference.routes.state import EngineState, engine_of, json_or_empty

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
    body = await json_or_empty(request)
    try:
        await asyncio.to_thread(engine.model.load_lora_adapter, str(body["lora_name"]), str(body["lora_path"]))
    except (KeyError, ValueError, FileNotFoundError) as exc:
        return _lora_result(engine, False, f"{type(exc).__name__}: {exc}")
    engine.lora_paths[str(body["lora_name"])] = str(body["lora_path"])
    return _lora_result(engine, True)


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(request: Request):
    """SGLang's UnloadLoRAAdapterReqInput: `lora_name`."""
    engine = engine_of(request)
    body = await json_or_empty(request)
    name = str(body["lora_name"])
    try:
        await asyncio.to_thread(engine.model.unload_lora_adapter, name)
    except KeyError:
        loaded = list(engine.model.adapters.paths)
        return _lora_result(engine, False, f"LoRA with name {name} does not exist. Loaded LoRAs: {loaded}")
    return _lora_result(engine, True)
