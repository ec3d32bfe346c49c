"""What the routes of one reference engine share (`EngineState`), and the small helpers every route group uses.

Request bodies are read by `bodies.py`, as SGLang reads them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.reference.push_guard import PushGuard
from slime_rollout.engines.reference.routed_experts import RouteCapture
from slime_rollout.engines.reference.scheduler import Scheduler

__all__ = ["EngineState", "engine_of", "error"]


@dataclasses.dataclass(kw_only=True, slots=True)
class EngineState:
    """One engine's model, scheduler and mutable serving state, shared by its route groups.

    Attributes:
        model: the loaded model.
        scheduler: batches generation requests.
        server_args: the parsed CLI flags (what /server_info reports).
        max_running_requests: largest generation batch (what /v1/loads reports).
        weight_version: the version string of the weights served (SGLang's `weight_version`).
        weights_released: weights released by `/release_memory_occupation` with the memory saver, not resumed yet.
        lora_paths: every adapter ever loaded, name -> path (SGLang reloads an unloaded one a request names).
        push_guard: refuses a bucket of another push's version (two writers), see `push_guard.py`.
        update_lock: one weight update at a time, so a bucket's check and its landing are one step.
        groups: weight-update process groups by name (`/init_weights_update_group`).
        routes: the MoE router hooks (`--enable-return-routed-experts`), else None.
        rids: the request ids of `/generate` requests in flight (the keys of SGLang's `rid_to_state`).
    """

    model: ReferenceModel
    scheduler: Scheduler
    server_args: dict[str, Any]
    max_running_requests: int
    weight_version: str
    weights_released: bool = False
    lora_paths: dict[str, str] = dataclasses.field(default_factory=dict)
    push_guard: PushGuard = dataclasses.field(default_factory=PushGuard)
    update_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    groups: dict[str, Any] = dataclasses.field(default_factory=dict)
    routes: RouteCapture | None = None
    rids: set[str] = dataclasses.field(default_factory=set)


def engine_of(request: Request) -> EngineState:
    """The `EngineState` of the app serving `request` (set by `build_app`)."""
    return request.app.state.engine


def error(message: str, status: int = 400) -> JSONResponse:
    """SGLang's error body `{"error": {"message": ...}}`."""
    return JSONResponse({"error": {"message": message}}, status_code=status)
