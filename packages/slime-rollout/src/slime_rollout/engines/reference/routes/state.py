"""What the routes of one reference engine share (`EngineState`), and the small helpers every route group uses."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter, ValidationError

from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.reference.push_guard import PushGuard
from slime_rollout.engines.reference.routed_experts import RouteCapture
from slime_rollout.engines.reference.scheduler import Scheduler

__all__ = ["EngineState", "abort_all_requests", "engine_of", "error", "json_or_empty", "parse_request"]


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


def engine_of(request: Request) -> EngineState:
    """The `EngineState` of the app serving `request` (set by `build_app`)."""
    return request.app.state.engine


def error(message: str, status: int = 400) -> JSONResponse:
    """SGLang's error body `{"error": {"message": ...}}`."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _decode(raw: bytes) -> Any:
    """`raw` parsed as JSON, a body that does not parse refused as FastAPI refuses it.

    SGLang declares its request bodies as typed parameters, so FastAPI refuses a bad body before the handler runs:
    HTTP 422 `{"detail": [{"type": "json_invalid", "loc": ["body", <position>], "msg", "input", "ctx"}]}`.
    Raising `RequestValidationError` gets that exact reply from FastAPI's own handler (was a 500 here).
    """
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        pos, msg = (e.pos, e.msg) if isinstance(e, json.JSONDecodeError) else (e.start, e.reason)
        error = {"type": "json_invalid", "loc": ("body", pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": msg}}], body=raw) from e


async def json_or_empty(request: Request) -> dict:
    """The JSON body of `request`, or `{}` when it has none (routes SGLang also serves on GET).

    Raises:
        RequestValidationError: the body does not parse or is not an object (FastAPI's 422, as SGLang answers).
    """
    raw = await request.body()
    body = _decode(raw) if raw else {}
    if not isinstance(body, dict):
        error = {"type": "dict_type", "loc": ("body",), "msg": "Input should be a valid dictionary", "input": body}
        raise RequestValidationError([error], body=body)
    return body


_ADAPTERS: dict[type, TypeAdapter] = {}


async def parse_request[R](request: Request, record: type[R]) -> tuple[R, dict[str, Any]]:
    """The body of `request` validated as `record` (a dataclass of `slime_rollout.engines.wire`), and the raw dict.

    Validation is pydantic's, as FastAPI runs it on SGLang's typed body parameters
    (`obj: UpdateWeightFromDiskReqInput`), so a malformed request gets SGLang's reply: HTTP 422
    `{"detail": [{"type", "loc": ["body", field], "msg", "input"}]}` for a missing or mistyped field, a body that is
    not an object, or one that does not parse. Keys the record does not have (SGLang's `abort_all_requests`) are
    ignored; the raw dict carries them.

    Raises:
        RequestValidationError: the body does not validate (FastAPI answers it with 422).
    """
    raw = await request.body()
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    body = _decode(raw)
    adapter = _ADAPTERS.get(record) or _ADAPTERS.setdefault(record, TypeAdapter(record))
    try:
        req = adapter.validate_python(body)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        raise RequestValidationError(errors, body=body) from e
    return req, body


def abort_all_requests(body: dict[str, Any]) -> bool:
    """SGLang's optional `abort_all_requests` of the weight-update bodies (slime never sends it)."""
    return bool(body.get("abort_all_requests", False))
