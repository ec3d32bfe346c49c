"""HTTP surface of the reference engine: the subset of SGLang's `http_server.py` that slime uses.

Routes, methods and field names follow SGLang 0.5.16 so the rollout code cannot tell the two apart:
`/generate`, `/abort_request`, `/flush_cache`, `/pause_generation`, `/continue_generation`,
`/release_memory_occupation`, `/resume_memory_occupation`, `/update_weights_from_disk`,
`/update_weights_from_tensor`, `/get_weight_version`, `/get_weights_by_name`, `/load_lora_adapter`,
`/unload_lora_adapter` (with `lora_path` of `/generate`), `/health`, `/health_generate`, `/v1/loads`,
`/model_info` (`/get_model_info`), `/server_info` (`/get_server_info`), and the weight-update group routes
`/init_weights_update_group`, `/update_weights_from_distributed`, `/destroy_weights_update_group`.
Weight-update bodies and payloads are decoded with `slime_rollout.engines.wire`, which the trainer encodes with.
A vision-language checkpoint also takes SGLang's `image_data` on `/generate` (see `vision.py`).
The routes live in `routes/` by endpoint group; `build_app` assembles them around one `routes.state.EngineState`.

`/update_weights_from_tensor` unpickles what the caller sends (as SGLang does): bind the engine to a
trusted network only.
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.reference.routed_experts import RouteCapture
from slime_rollout.engines.reference.routes import control, generate, info, lora, weights
from slime_rollout.engines.reference.routes.bodies import validation_error_reply
from slime_rollout.engines.reference.routes.state import EngineState
from slime_rollout.engines.reference.scheduler import Scheduler

__all__ = ["build_app"]


def build_app(model: ReferenceModel, *, max_running_requests: int, random_seed: int, server_args: dict) -> FastAPI:
    """Builds the FastAPI application serving `model`.

    Args:
        model: the loaded model.
        max_running_requests: largest generation batch.
        random_seed: engine seed for requests without `sampling_seed`.
        server_args: what /server_info reports (the parsed CLI flags); reads `weight_version` (initial version,
            default "default"), `batch_wait_ms` (default 5), `enable_memory_saver`, `enable_weights_cpu_backup`,
            `enable_return_routed_experts`.
    """
    scheduler = Scheduler(
        model,
        max_running_requests=max_running_requests,
        batch_wait_s=float(server_args.get("batch_wait_ms", 5)) / 1000.0,
        random_seed=random_seed,
    )
    routes = RouteCapture(model.model) if server_args.get("enable_return_routed_experts") else None
    engine = EngineState(
        model=model,
        scheduler=scheduler,
        server_args=server_args,
        max_running_requests=max_running_requests,
        weight_version=server_args.get("weight_version") or "default",
        routes=routes,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        yield
        await scheduler.stop()

    app = FastAPI(lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, validation_error_reply)  # SGLang's 400, not FastAPI's 422
    app.state.scheduler = scheduler
    app.state.engine = engine
    for group in (generate, control, weights, lora, info):
        app.include_router(group.router)
    return app
