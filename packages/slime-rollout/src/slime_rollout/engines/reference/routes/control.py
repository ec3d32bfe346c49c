"""Serving control: pause/continue generation, flush the cache, release/resume memory (SGLang's sleep and wake)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from slime_rollout.engines.reference.routes.bodies import json_or_empty
from slime_rollout.engines.reference.routes.state import engine_of, error

__all__ = ["router"]

router = APIRouter()


# SGLang 0.5.16's body for both outcomes (entrypoints/http_server.py `flush_cache`).
_FLUSH_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the "
    "operation will not be performed.)\n"
)


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request):
    """SGLang's reply: 200 when idle, 400 while its scheduler holds requests (`Scheduler.flush_cache`).

    There is nothing to flush (every batch starts from an empty KV cache), but the refusal is SGLang's, so a
    client that flushes right after an abort meets it here too.
    """
    idle = engine_of(request).scheduler.num_scheduled == 0
    return Response(content=_FLUSH_TEXT, status_code=200 if idle else 400)


@router.post("/pause_generation")
async def pause_generation(request: Request):
    """Pauses the scheduler (`mode`: abort, retract or in_place, as SGLang)."""
    body = await json_or_empty(request)
    try:
        engine_of(request).scheduler.pause(body.get("mode", "abort"))
    except ValueError as exc:
        return error(str(exc))
    return {"message": "Generation paused successfully.", "status": "ok"}


@router.post("/continue_generation")
async def continue_generation(request: Request):
    """Resumes a paused scheduler."""
    engine_of(request).scheduler.resume()
    return {"message": "Generation continued successfully.", "status": "ok"}


def _weight_tags(body: dict[str, Any]) -> bool:
    tags = body.get("tags")  # SGLang: None or [] means every tag ("weights", "kv_cache", "cuda_graph")
    return not tags or "weights" in tags


@router.api_route("/release_memory_occupation", methods=["GET", "POST"])
async def release_memory_occupation(request: Request):
    """Marks the weights released when the memory saver is on and the `tags` include weights."""
    engine = engine_of(request)
    # As SGLang with --enable-memory-saver: released weights come back as fresh memory on resume, i.e. lost,
    # unless --enable-weights-cpu-backup (a LoRA sync, which never rewrites them, needs the backup).
    if engine.server_args.get("enable_memory_saver") and _weight_tags(await json_or_empty(request)):
        engine.weights_released = True
    return Response(status_code=200)


@router.api_route("/resume_memory_occupation", methods=["GET", "POST"])
async def resume_memory_occupation(request: Request):
    """Brings released weights back: zeroed (lost, as SGLang's) unless `--enable-weights-cpu-backup`."""
    engine = engine_of(request)
    if engine.weights_released and _weight_tags(await json_or_empty(request)):
        engine.weights_released = False
        if not engine.server_args.get("enable_weights_cpu_backup"):
            await asyncio.to_thread(engine.model.weights.zero_weights)
    return Response(status_code=200)
