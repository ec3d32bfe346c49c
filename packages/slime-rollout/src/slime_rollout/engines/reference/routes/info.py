"""Health and information routes: `/health`, `/health_generate`, `/v1/loads`, `/model_info`, `/server_info`.

`/get_model_info` and `/get_server_info` are SGLang's older names of the last two, served with the same replies.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from slime_rollout.engines.reference.routes.generate import submit_one
from slime_rollout.engines.reference.routes.state import engine_of

__all__ = ["router"]

router = APIRouter()


@router.get("/health")
async def health():
    """Alive."""
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request):
    """SGLang 0.5.16's answer: 200 once output arrives after the probe began, else 503 after the timeout.

    SGLang (entrypoints/http_server.py `health_generate`) sends a one-token request and answers 200 as soon as any
    output (its own or a running request's) arrives after the probe began, 503 after `SGLANG_HEALTH_CHECK_TIMEOUT`
    seconds (20) without any. A paused engine holds the probe like any request. Running requests alone did not make
    a wedged engine (its model thread stuck, the HTTP loop alive) unhealthy here: now a decode step must happen.
    """
    engine = engine_of(request)
    scheduler = engine.scheduler
    began = time.monotonic()
    deadline = began + float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
    if scheduler.paused:
        # SGLang's probe is a generation request, held by the paused tokenizer manager like any other.
        while scheduler.paused and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if scheduler.paused:
            return Response(status_code=503)
    # Busy: healthy once a running request's output moves on (SGLang's `last_receive_tstamp > tic`). Requests that
    # end without another step (aborted, e.g. an earlier probe's) leave the engine idle: then the probe's own
    # generation decides, as SGLang's probe request always does.
    while scheduler.num_running and scheduler.last_step_at <= began and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if scheduler.last_step_at > began:
        return Response(status_code=200)
    if time.monotonic() >= deadline:
        return Response(status_code=503)
    rid = f"HEALTH_CHECK_{time.time()}"
    probe = submit_one(engine, [engine.model.pad_token_id], None, {"max_new_tokens": 1, "temperature": 0.0}, rid)
    try:
        req = await asyncio.wait_for(probe, timeout=max(deadline - time.monotonic(), 0.0))
    except TimeoutError:
        scheduler.abort(rid=rid, held_too=True)  # as SGLang drops its probe's request
        return Response(status_code=503)
    return Response(status_code=200 if req.finished else 503)


@router.get("/v1/loads")
async def loads(request: Request):
    """SGLang's load report (one DP rank)."""
    engine = engine_of(request)
    scheduler = engine.scheduler
    # SGLang's fields; no KV pool or cache here, so the token counts and rates are 0.
    now = time.time()
    load = {"dp_rank": 0, "num_running_reqs": scheduler.num_running, "num_waiting_reqs": scheduler.num_queued,
            "max_running_requests": engine.max_running_requests, "max_total_num_tokens": 0, "num_total_tokens": 0,
            "num_used_tokens": 0, "num_waiting_uncached_tokens": 0, "token_usage": 0.0, "utilization": 0.0,
            "cache_hit_rate": 0.0, "gen_throughput": 0.0, "timestamp": now}  # fmt: skip
    stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat()
    return {"loads": [load], "timestamp": stamp, "version": "slime-reference"}


def model_info(request: Request) -> dict[str, Any]:
    """SGLang's `/model_info` fields (the weight version included)."""
    engine = engine_of(request)
    model = engine.model
    return {
        "model_path": model.model_path,
        "tokenizer_path": model.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": engine.weight_version,
        "has_image_understanding": model.is_vlm,
        "has_audio_understanding": False,
        "model_type": model.model.config.model_type,
        "architectures": getattr(model.model.config, "architectures", None),
    }


def server_info(request: Request) -> dict[str, Any]:
    """SGLang 0.5.16's layout: the server args at the top and in `internal_states[0]`, beside the scheduler's state.

    As recorded (`tests/fixtures/sglang-wire/text.json`): `internal_states[0]` repeats the server args and adds
    `effective_max_running_requests_per_dp`, the batch the scheduler actually admits (here the one it was built
    with: 1 under `--enable-deterministic-inference`), and `last_gen_throughput`. `num_running_reqs` and `paused`
    there, and `pid` at the top (a launcher checks it reached its own engine), are the reference engine's own.
    """
    engine = engine_of(request)
    scheduler = engine.scheduler
    args = {**engine.server_args, "weight_version": engine.weight_version, "tp_size": 1, "dp_size": 1}
    state = {
        **args,
        "effective_max_running_requests_per_dp": scheduler.max_running_requests,
        "last_gen_throughput": 0.0,
        "num_running_reqs": scheduler.num_running,
        "paused": scheduler.paused,
    }
    return {**args, "version": "slime-reference", "pid": os.getpid(), "internal_states": [state]}


router.add_api_route("/model_info", model_info, methods=["GET"])
router.add_api_route("/get_model_info", model_info, methods=["GET"])
router.add_api_route("/server_info", server_info, methods=["GET"])
router.add_api_route("/get_server_info", server_info, methods=["GET"])
