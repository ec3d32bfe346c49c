"""HTTP surface of the reference engine: the subset of SGLang's `http_server.py` that slime uses.

Routes, methods and field names follow SGLang 0.5.16 so the rollout code cannot tell the two apart:
`/generate`, `/abort_request`, `/flush_cache`, `/pause_generation`, `/continue_generation`,
`/release_memory_occupation`, `/resume_memory_occupation`, `/update_weights_from_disk`,
`/update_weights_from_tensor`, `/get_weight_version`, `/get_weights_by_name`, `/load_lora_adapter`,
`/unload_lora_adapter` (with `lora_path` of `/generate`), `/health`, `/health_generate`, `/v1/loads`,
`/model_info` (`/get_model_info`), `/server_info` (`/get_server_info`), and the weight-update group routes
`/init_weights_update_group`, `/update_weights_from_distributed`, `/destroy_weights_update_group`.
Weight-update bodies and payloads are decoded with `slime_rollout.wire`, the module the trainer side encodes with.
A vision-language checkpoint also takes SGLang's `image_data` on `/generate` (see `vision.py`).

`/update_weights_from_tensor` unpickles what the caller sends (as SGLang does): bind the engine to a
trusted network only.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import itertools
import json
import logging
import os
import time
import uuid
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from slime_rollout.engines.reference.delta import apply_delta_request, base_refusal
from slime_rollout.engines.reference.model import GenRequest, ReferenceModel
from slime_rollout.engines.reference.push_guard import PushGuard
from slime_rollout.engines.reference.sampling import SamplingParams
from slime_rollout.engines.reference.scheduler import Scheduler
from slime_rollout.engines.reference.vision import decode_engine_image
from slime_rollout.weight_delta import UpdateWeightsFromDeltaReq
from slime_rollout.wire import (
    DestroyWeightsUpdateGroupReq,
    InitWeightsUpdateGroupReq,
    UpdateWeightsFromDiskReq,
    UpdateWeightsFromDistributedReq,
    UpdateWeightsFromTensorReq,
    deserialize_named_tensors,
    dtype_from_name,
    init_custom_process_group,
)

__all__ = ["build_app"]

logger = logging.getLogger(__name__)


def build_app(model: ReferenceModel, *, max_running_requests: int, random_seed: int, server_args: dict) -> FastAPI:
    """Builds the FastAPI application serving `model`.

    Args:
        model: the loaded model.
        max_running_requests: largest generation batch.
        random_seed: engine seed for requests without `sampling_seed`.
        server_args: what /server_info reports (the parsed CLI flags).
    """
    state: dict[str, Any] = {"weight_version": server_args.get("weight_version") or "default"}
    scheduler = Scheduler(
        model,
        max_running_requests=max_running_requests,
        batch_wait_s=float(server_args.get("batch_wait_ms", 5)) / 1000.0,
        random_seed=random_seed,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        yield
        await scheduler.stop()

    app = FastAPI(lifespan=lifespan)
    app.state.scheduler = scheduler

    def error(message: str, status: int = 400) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    def to_output(r: GenRequest, return_logprob: bool) -> dict[str, Any]:
        # SGLang 0.5.16's meta_info keys (tests/fixtures/sglang-wire); no prefix cache here: nothing cached.
        meta: dict[str, Any] = {
            "id": r.rid,
            "finish_reason": r.finish_reason,
            "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(r.output_ids),
            "cached_tokens": 0,
            "cached_tokens_details": None,
            "dp_rank": None,
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "weight_version": state["weight_version"],
            "e2e_latency": time.monotonic() - r.created,
            "response_sent_to_client_ts": time.time(),
        }
        if r.vision is not None:
            meta["image_tokens"] = sum(1 for t in r.input_ids if t == model.vision.image_token_id)
        if return_logprob:
            start = r.logprob_start_len
            # SGLang reports id 0 for input ids >= vocab size - 1 (logprob_result_processor.py clips them).
            clip = model.vocab_size - 1
            meta["input_token_logprobs"] = [
                [lp, t if t < clip else 0, None]
                for lp, t in zip(r.input_logprobs or [], r.input_ids[start:] if r.input_logprobs else [], strict=True)
            ]
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(r.output_logprobs, r.output_ids, strict=True)
            ]
            meta["output_token_logprobs_length"] = len(r.output_ids)
            if r.top_logprobs_num > 0:
                as_entries = lambda top: None if top is None else [[lp, t, None] for lp, t in top]  # noqa: E731
                meta["input_top_logprobs"] = [as_entries(top) for top in r.input_top_logprobs or []]
                meta["output_top_logprobs"] = [as_entries(top) for top in r.output_top_logprobs]
        if r.output_kept_ids is not None and len(r.output_kept_ids) == len(r.output_ids):
            # Top-p replay, in the field names of SGLang with the original slime's patch.
            meta["top_p_token_ids"] = [t for kept in r.output_kept_ids for t in kept]
            meta["top_p_token_offsets"] = [0, *itertools.accumulate(len(kept) for kept in r.output_kept_ids)]
        return {"text": model.output_text(r), "output_ids": list(r.output_ids), "meta_info": meta}

    async def one(
        input_ids: list[int] | None,
        text: str | None,
        sp: dict,
        rid: str | None,
        logprob_start_len: int = -1,
        image_data: Any = None,
        lora: str | None = None,
        top_logprobs_num: int = 0,
    ) -> GenRequest:
        params = SamplingParams.from_request(sp)
        if lora is not None and lora not in model.adapters:
            # As SGLang: an adapter unloaded earlier is loaded again from where it was; a never loaded one is an error.
            if lora not in lora_paths:
                raise ValueError(
                    f"Got LoRA adapter that has never been loaded: {lora}\nAll loaded adapters: {list(lora_paths)}."
                )
            try:
                await asyncio.to_thread(model.load_lora_adapter, lora, lora_paths[lora])
            except (KeyError, ValueError, FileNotFoundError) as exc:
                raise ValueError(f"Failed to implicitly load LoRA adapter {lora}: {exc}") from None
        if input_ids is None and text is None:
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        images = [image_data] if isinstance(image_data, str) else list(image_data or [])
        vision = None
        if images:
            if model.vision is None:
                raise ValueError(f"image_data given, but {model.model_path} is not a vision-language model")
            # Decoding and image preprocessing are CPU work: off the event loop that serves the other requests.
            pil = await asyncio.to_thread(lambda: [decode_engine_image(i) for i in images])
            input_ids, vision = await asyncio.to_thread(model.vision.prepare, input_ids, text, pil)
        elif input_ids is None:
            input_ids = model.tokenizer.encode(text)
        if not input_ids:
            raise ValueError("the prompt is empty")
        req = GenRequest(
            rid=rid or uuid.uuid4().hex,
            input_ids=[int(t) for t in input_ids],
            params=params,
            generator=scheduler.make_generator(params.sampling_seed),
            logprob_start_len=int(logprob_start_len if logprob_start_len is not None else -1),
            vision=vision,
            lora=lora,
            top_logprobs_num=int(top_logprobs_num or 0),
        )
        if req.logprob_start_len > len(req.input_ids):
            raise ValueError(
                f"req.logprob_start_len={req.logprob_start_len} is higher than the number of input tokens "
                f"len(req.origin_input_ids)={len(req.input_ids)}. Please use a smaller logprob_start_len."
            )
        return await scheduler.submit(req)

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        if body.get("stream"):
            return error("the reference engine does not stream")
        input_ids, text, sp, rid = body.get("input_ids"), body.get("text"), body.get("sampling_params"), body.get("rid")
        image_data = body.get("image_data")
        return_logprob = body.get("return_logprob") or False
        start = body.get("logprob_start_len", -1) if return_logprob else -1
        lora = body.get("lora_path")  # SGLang: the adapter's name (or a list, one per batched prompt)
        top = body.get("top_logprobs_num", 0) if return_logprob else 0
        batched = (isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list)) or isinstance(
            text, list
        )
        try:
            if not batched:
                return to_output(
                    await one(input_ids, text, sp or {}, rid, start, image_data, lora, top), bool(return_logprob)
                )
            n = len(input_ids if input_ids is not None else text)
            pick = lambda v, i: v[i] if isinstance(v, list) else v  # noqa: E731
            reqs = await asyncio.gather(
                *(
                    one(
                        None if input_ids is None else input_ids[i],
                        None if text is None else text[i],
                        pick(sp, i) or {},
                        None if rid is None else pick(rid, i),
                        pick(start, i),
                        None if image_data is None else image_data[i],
                        pick(lora, i),
                        pick(top, i),
                    )
                    for i in range(n)
                )
            )
            return [to_output(r, bool(pick(return_logprob, i))) for i, r in enumerate(reqs)]
        except (ValueError, TypeError) as exc:
            return error(str(exc))

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await request.json()
        scheduler.abort(rid=body.get("rid"), abort_all=bool(body.get("abort_all", False)))
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        # No prefix cache to drop: every batch starts from an empty KV cache.
        return Response(content="Cache flushed.\n", status_code=200)

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await _json_or_empty(request)
        try:
            scheduler.pause(body.get("mode", "abort"))
        except ValueError as exc:
            return error(str(exc))
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        scheduler.resume()
        return {"message": "Generation continued successfully.", "status": "ok"}

    def weight_tags(body: dict[str, Any]) -> bool:
        tags = body.get("tags")  # SGLang: None or [] means every tag ("weights", "kv_cache", "cuda_graph")
        return not tags or "weights" in tags

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release_memory_occupation(request: Request):
        # As SGLang with --enable-memory-saver: released weights come back as fresh memory on resume, i.e. lost,
        # unless --enable-weights-cpu-backup (a LoRA sync, which never rewrites them, needs the backup).
        if server_args.get("enable_memory_saver") and weight_tags(await _json_or_empty(request)):
            state["weights_released"] = True
        return Response(status_code=200)

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume_memory_occupation(request: Request):
        if state.get("weights_released") and weight_tags(await _json_or_empty(request)):
            state["weights_released"] = False
            if not server_args.get("enable_weights_cpu_backup"):
                await asyncio.to_thread(model.zero_weights)
        return Response(status_code=200)

    push_guard = PushGuard()  # refuses a bucket of another push's version (two writers), see push_guard.py
    update_lock = asyncio.Lock()  # one update at a time, so a bucket's check and its landing are one step

    async def run_update(
        fn, weight_version: str | None, abort_all: bool, *, endpoint: str, from_disk: bool = False, drain=None
    ) -> JSONResponse:
        # SGLang answers `num_paused_requests` from /update_weights_from_disk only.
        extra = {"num_paused_requests": 0} if from_disk else {}
        async with update_lock:
            refusal = push_guard.refusal(weight_version, endpoint)
            if refusal is not None:
                if drain is not None:
                    await asyncio.to_thread(drain)  # a collective's sender waits for this rank: receive, discard
                logger.error("%s", refusal)
                return JSONResponse({"success": False, "message": refusal, **extra}, status_code=400)
            if abort_all:
                scheduler.abort(abort_all=True)
            try:
                await asyncio.to_thread(fn)
            except (KeyError, ValueError, FileNotFoundError, TypeError) as exc:
                return JSONResponse({"success": False, "message": str(exc), **extra}, status_code=400)
            if from_disk:
                push_guard.close()  # every weight replaced: no partial push is left
            else:
                push_guard.landed(weight_version)
            if weight_version is not None:
                state["weight_version"] = str(weight_version)  # SGLang: after each successful request
        return JSONResponse({"success": True, "message": "Succeeded to update model weights.", **extra})

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = await request.json()
        if not body.get("model_path"):
            return JSONResponse({"success": False, "message": "model_path is required"}, status_code=400)
        req = UpdateWeightsFromDiskReq.from_json(body)
        return await run_update(
            lambda: model.load_from_disk(req.model_path),
            req.weight_version,
            _abort_all_requests(body),
            endpoint="/update_weights_from_disk",
            from_disk=True,
        )

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(request: Request):
        body = await request.json()
        if not body.get("serialized_named_tensors"):
            return JSONResponse({"success": False, "message": "serialized_named_tensors is empty"}, status_code=400)
        req = UpdateWeightsFromTensorReq.from_json(body)

        def load() -> int:
            # One entry per TP rank; the reference engine has a single rank.
            return model.load_named_tensors(deserialize_named_tensors(req.serialized_named_tensors[0], req.load_format))

        return await run_update(
            load, req.weight_version, _abort_all_requests(body), endpoint="/update_weights_from_tensor"
        )

    @app.post("/update_weights_from_delta")
    async def update_weights_from_delta(request: Request):
        body = await request.json()
        try:
            req = UpdateWeightsFromDeltaReq.from_json(body)
        except ValueError as exc:
            return JSONResponse({"success": False, "message": str(exc)}, status_code=400)

        def load() -> int:
            # Checked under the update lock, so no other update moves the version in between.
            refusal = base_refusal(req, state["weight_version"], push_guard.version)
            if refusal is not None:
                raise ValueError(refusal)
            named = deserialize_named_tensors(req.serialized_named_tensors[0], None)
            return apply_delta_request(model, named, req)

        return await run_update(
            load, req.weight_version, _abort_all_requests(body), endpoint="/update_weights_from_delta"
        )

    groups: dict[str, Any] = {}

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        try:
            req = InitWeightsUpdateGroupReq.from_json(await request.json())
            groups[req.group_name] = await asyncio.to_thread(
                init_custom_process_group,
                backend=req.backend,
                init_method=f"tcp://{req.master_address}:{req.master_port}",
                world_size=int(req.world_size),
                rank=int(req.rank_offset),  # one TP rank: its rank is the offset
                group_name=req.group_name,
            )
        except (KeyError, RuntimeError, ValueError) as exc:
            return JSONResponse({"success": False, "message": f"init_weights_update_group: {exc!r}"}, status_code=400)
        return {"success": True, "message": "Succeeded to initialize custom process group."}

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request):
        req = DestroyWeightsUpdateGroupReq.from_json(await request.json())
        group = groups.pop(req.group_name, None)
        if group is None:
            return JSONResponse({"success": False, "message": "no such group"}, status_code=400)
        torch.distributed.destroy_process_group(group)
        return {"success": True, "message": "Succeeded to destroy custom process group."}

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        body = await request.json()
        try:
            req = UpdateWeightsFromDistributedReq.from_json(body)
        except ValueError as exc:
            return JSONResponse({"success": False, "message": str(exc)}, status_code=400)
        group = groups.get(req.group_name)
        if group is None:
            return JSONResponse({"success": False, "message": "weight update group not initialized"}, status_code=400)

        def receive_only() -> list[tuple[str, torch.Tensor]]:
            named = []
            for name, dtype, shape in zip(req.names, req.dtypes, req.shapes, strict=True):
                t = torch.empty(shape, dtype=dtype_from_name(dtype), device=model.device)
                torch.distributed.broadcast(t, group=group, group_src=0)
                named.append((name, t))
            return named

        return await run_update(
            lambda: model.load_named_tensors(receive_only()),
            req.weight_version,
            _abort_all_requests(body),
            endpoint="/update_weights_from_distributed",
            drain=receive_only,
        )

    lora_paths: dict[str, str] = {}  # every adapter ever loaded: SGLang reloads an unloaded one a request names

    def lora_result(success: bool, message: str = "") -> JSONResponse:
        # SGLang's LoRAUpdateOutput (no adapter list on failure).
        body = {"success": success, "error_message": message, "http_worker_ipc": None, "rid": None,
                "loaded_adapters": dict(model.adapters.paths) if success else None}  # fmt: skip
        return JSONResponse(body, status_code=200 if success else 400)

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body = await request.json()  # SGLang's LoadLoRAAdapterReqInput: lora_name, lora_path, pinned
        try:
            await asyncio.to_thread(model.load_lora_adapter, str(body["lora_name"]), str(body["lora_path"]))
        except (KeyError, ValueError, FileNotFoundError) as exc:
            return lora_result(False, f"{type(exc).__name__}: {exc}")
        lora_paths[str(body["lora_name"])] = str(body["lora_path"])
        return lora_result(True)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        body = await request.json()  # SGLang's UnloadLoRAAdapterReqInput: lora_name
        name = str(body["lora_name"])
        try:
            await asyncio.to_thread(model.unload_lora_adapter, name)
        except KeyError:
            loaded = list(model.adapters.paths)
            return lora_result(False, f"LoRA with name {name} does not exist. Loaded LoRAs: {loaded}")
        return lora_result(True)

    @app.api_route("/get_weights_by_name", methods=["GET", "POST"])
    async def get_weights_by_name(request: Request):
        # SGLang's GetWeightsByNameReqInput: {"name", "truncate_size" (default 100)}; answers the list itself.
        body = await _json_or_empty(request)
        try:
            values = await asyncio.to_thread(
                model.get_weights_by_name, str(body["name"]), int(body.get("truncate_size", 100))
            )
        except KeyError:
            return error("Get parameter by name failed")
        return JSONResponse(values)

    @app.api_route("/weights_checker", methods=["GET", "POST"])
    async def weights_checker(request: Request):
        # SGLang's CheckWeightsReqInput {"action": "checksum"} → one ChecksumInfo per TP rank (one here).
        body = await _json_or_empty(request)
        action = body.get("action", "checksum")
        if action != "checksum":
            return JSONResponse({"success": False, "message": f"Unsupported action={action!r}"}, status_code=400)
        checksums = await asyncio.to_thread(model.weight_checksums)
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

    @app.get("/get_weight_version")
    async def get_weight_version():
        # Gone from SGLang 0.5.16 (the version is in /model_info), with this body.
        message = "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead."
        body = {"object": "error", "message": message, "type": "404", "param": None, "code": 404}
        return JSONResponse(body, status_code=404)

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        body = await request.json()
        async with update_lock:
            mismatch = push_guard.fence_mismatch(str(body["new_version"]))
            if mismatch is not None:
                logger.warning("%s", mismatch)  # accepted, as SGLang does
            push_guard.close()
            state["weight_version"] = str(body["new_version"])
        return {"success": True, "message": "Weight version updated", "new_version": state["weight_version"]}

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        if scheduler.paused or scheduler.num_running:
            return Response(status_code=200)  # busy or paused is healthy; SGLang answers likewise
        req = await one([model.pad_token_id], None, {"max_new_tokens": 1, "temperature": 0.0}, None)
        return Response(status_code=200 if req.finished else 503)

    @app.get("/v1/loads")
    async def loads():
        # SGLang's fields; no KV pool or cache here, so the token counts and rates are 0.
        now = time.time()
        load = {"dp_rank": 0, "num_running_reqs": scheduler.num_running, "num_waiting_reqs": scheduler.num_waiting,
                "max_running_requests": max_running_requests, "max_total_num_tokens": 0, "num_total_tokens": 0,
                "num_used_tokens": 0, "num_waiting_uncached_tokens": 0, "token_usage": 0.0, "utilization": 0.0,
                "cache_hit_rate": 0.0, "gen_throughput": 0.0, "timestamp": now}  # fmt: skip
        stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat()
        return {"loads": [load], "timestamp": stamp, "version": "slime-reference"}

    def model_info() -> dict[str, Any]:
        return {
            "model_path": model.model_path,
            "tokenizer_path": model.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": state["weight_version"],
            "has_image_understanding": model.is_vlm,
            "has_audio_understanding": False,
            "model_type": model.model.config.model_type,
            "architectures": getattr(model.model.config, "architectures", None),
        }

    def server_info() -> dict[str, Any]:
        return {
            **server_args,
            "weight_version": state["weight_version"],
            "tp_size": 1,
            "dp_size": 1,
            "version": "slime-reference",
            "pid": os.getpid(),
            "internal_states": [{"num_running_reqs": scheduler.num_running, "paused": scheduler.paused}],
        }

    app.add_api_route("/model_info", model_info, methods=["GET"])
    app.add_api_route("/get_model_info", model_info, methods=["GET"])
    app.add_api_route("/server_info", server_info, methods=["GET"])
    app.add_api_route("/get_server_info", server_info, methods=["GET"])
    return app


def _abort_all_requests(body: dict[str, Any]) -> bool:
    """SGLang's optional `abort_all_requests` of the weight-update bodies (slime never sends it)."""
    return bool(body.get("abort_all_requests", False))


async def _json_or_empty(request: Request) -> dict:
    body = await request.body()
    return json.loads(body) if body else {}
