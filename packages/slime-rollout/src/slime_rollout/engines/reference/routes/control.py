"""Serving control: pause/continue generation, flush the cache, release/resume memory (SGLang's sleep and wake)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import ClassVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from slime_rollout.engines.reference.routes.bodies import parse_request
from slime_rollout.engines.reference.routes.state import engine_of

__all__ = ["router"]

router = APIRouter()


# The bodies of SGLang's control routes (`bodies.SGLANG_BODIES`): typed and required there too, so a call without a
# body, or with `"tags": "weights"`, is SGLang's HTTP 400 (it was served here).
@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _PauseReq:
    endpoint: ClassVar[str] = "/pause_generation"
    mode: str = "abort"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _ContinueReq:
    endpoint: ClassVar[str] = "/continue_generation"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _ReleaseReq:
    endpoint: ClassVar[str] = "/release_memory_occupation"
    tags: list[str] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _ResumeReq:
    endpoint: ClassVar[str] = "/resume_memory_occupation"
    tags: list[str] | None = None


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
    req, _ = await parse_request(request, _PauseReq)
    engine_of(request).scheduler.pause(req.mode)
    return {"message": "Generation paused successfully.", "status": "ok"}


@router.post("/continue_generation")
async def continue_generation(request: Request):
    """Resumes a paused scheduler."""
    await parse_request(request, _ContinueReq)
    engine_of(request).scheduler.resume()
    return {"message": "Generation continued successfully.", "status": "ok"}


def _weight_tags(tags: list[str] | None) -> bool:
    return not tags or "weights" in tags  # SGLang: None or [] means every tag ("weights", "kv_cache", "cuda_graph")


@router.api_route("/release_memory_occupation", methods=["GET", "POST"])
async def release_memory_occupation(request: Request):
    """Marks the weights released when the memory saver is on and the `tags` include weights."""
    engine = engine_of(request)
    req, _ = await parse_request(request, _ReleaseReq)
    # As SGLang with --enable-memory-saver: released weights come back as fresh memory on resume, i.e. lost,
    # unless --enable-weights-cpu-backup (a LoRA sync, which never rewrites them, needs the backup).
    if engine.server_args.get("enable_memory_saver") and _weight_tags(req.tags):
        engine.weights_released = True
    return Response(status_code=200)


@router.api_route("/resume_memory_occupation", methods=["GET", "POST"])
async def resume_memory_occupation(request: Request):
    """Brings released weights back: zeroed (lost, as SGLang's) unless `--enable-weights-cpu-backup`."""
    engine = engine_of(request)
    req, _ = await parse_request(request, _ResumeReq)
    if engine.weights_released and _weight_tags(req.tags):
        engine.weights_released = False
        if not engine.server_args.get("enable_weights_cpu_backup"):
            await asyncio.to_thread(engine.model.weights.zero_weights)
    return Response(status_code=200)
