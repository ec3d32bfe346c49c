"""`/generate` (one prompt or a batch) and `/abort_request`, with SGLang 0.5.16's request and reply fields."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from slime_rollout.engines.reference.request import GenRequest
from slime_rollout.engines.reference.routes.bodies import json_or_empty, parse_request
from slime_rollout.engines.reference.routes.state import EngineState, engine_of, error
from slime_rollout.engines.reference.sampling import SamplingParams
from slime_rollout.engines.reference.vision import decode_engine_image
from slime_rollout.engines.wire import AbortReq

__all__ = ["router", "submit_one", "to_output"]

router = APIRouter()


def to_output(engine: EngineState, r: GenRequest, return_logprob: bool) -> dict[str, Any]:
    """SGLang's reply to one finished request: `{"text", "output_ids", "meta_info"}`.

    Args:
        engine: the engine that ran it (weight version, vocabulary).
        r: the finished request.
        return_logprob: add the input/output (and top) log-prob lists, entries `[logprob, token_id, None]`.
    """
    model = engine.model
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
        "weight_version": engine.weight_version,
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
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(r.output_logprobs, r.output_ids, strict=True)]
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


def _check_routes_request(engine: EngineState, want: bool, start: int, prompt_len: int | None) -> None:
    """SGLang's checks of `routed_experts_start_len` (scheduler.py; SGLang finishes the request with an abort)."""
    if not want:
        return
    if start < 0:
        raise ValueError(f"{start=} is lower than 0. Please use a non-negative routed_experts_start_len.")
    if prompt_len is not None and start > prompt_len:
        raise ValueError(
            f"{start=} is higher than the number of input tokens {prompt_len}. Please use a smaller "
            "routed_experts_start_len."
        )


async def add_routed_experts(engine: EngineState, r: GenRequest, out: dict[str, Any], start: int) -> dict[str, Any]:
    """Adds `meta_info["routed_experts"]` to the reply `out` of request `r`, as SGLang does.

    Without `--enable-return-routed-experts` SGLang adds nothing, and neither does this.
    """
    if engine.routes is None:
        return out

    def compute() -> str:
        with engine.model.lock:
            return engine.routes.encoded([*r.input_ids, *r.output_ids], start)

    out["meta_info"]["routed_experts"] = await asyncio.to_thread(compute)
    return out


async def submit_one(
    engine: EngineState,
    input_ids: list[int] | None,
    text: str | None,
    sp: dict,
    rid: str | None,
    logprob_start_len: int = -1,
    image_data: Any = None,
    lora: str | None = None,
    top_logprobs_num: int = 0,
) -> GenRequest:
    """Runs one prompt through the scheduler and returns the finished request.

    Args:
        engine: the engine.
        input_ids: prompt token ids, or None to tokenize `text`.
        text: prompt text (when `input_ids` is None).
        sp: SGLang `sampling_params`.
        rid: request id (None: a fresh one).
        logprob_start_len: first prompt position whose log-prob is returned (-1: none).
        image_data: one image or a list (SGLang's `image_data`: path, URL or base64).
        lora: adapter name (SGLang's `lora_path`).
        top_logprobs_num: top log-probs per position.

    Raises:
        ValueError: bad request (SGLang's messages where SGLang has them).
    """
    model, scheduler = engine.model, engine.scheduler
    params = SamplingParams.from_request(sp)
    if lora is not None and lora not in model.adapters:
        # As SGLang: an adapter unloaded earlier is loaded again from where it was; a never loaded one is an error.
        if lora not in engine.lora_paths:
            raise ValueError(
                f"Got LoRA adapter that has never been loaded: {lora}\nAll loaded adapters: {list(engine.lora_paths)}."
            )
        try:
            await asyncio.to_thread(model.load_lora_adapter, lora, engine.lora_paths[lora])
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


@router.post("/generate")
async def generate(request: Request):
    """SGLang's `/generate`: one prompt (a reply object) or a batch (a list), no streaming."""
    engine = engine_of(request)
    body = await json_or_empty(request)
    if body.get("stream"):
        return error("the reference engine does not stream")
    input_ids, text, sp, rid = body.get("input_ids"), body.get("text"), body.get("sampling_params"), body.get("rid")
    image_data = body.get("image_data")
    return_logprob = body.get("return_logprob") or False
    start = body.get("logprob_start_len", -1) if return_logprob else -1
    lora = body.get("lora_path")  # SGLang: the adapter's name (or a list, one per batched prompt)
    top = body.get("top_logprobs_num", 0) if return_logprob else 0
    want_routes = bool(body.get("return_routed_experts", False))
    routes_start = int(body.get("routed_experts_start_len", 0) or 0)
    batched = (isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list)) or isinstance(text, list)
    try:
        if not batched:
            _check_routes_request(engine, want_routes, routes_start, None if input_ids is None else len(input_ids))
            req = await submit_one(engine, input_ids, text, sp or {}, rid, start, image_data, lora, top)
            out = to_output(engine, req, bool(return_logprob))
            return await add_routed_experts(engine, req, out, routes_start) if want_routes else out
        n = len(input_ids if input_ids is not None else text)
        pick = lambda v, i: v[i] if isinstance(v, list) else v  # noqa: E731
        reqs = await asyncio.gather(
            *(
                submit_one(
                    engine,
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
        outs = [to_output(engine, r, bool(pick(return_logprob, i))) for i, r in enumerate(reqs)]
        if want_routes:
            outs = [await add_routed_experts(engine, r, o, routes_start) for r, o in zip(reqs, outs, strict=True)]
        return outs
    except (ValueError, TypeError) as exc:
        return error(str(exc))


@router.post("/abort_request")
async def abort_request(request: Request):
    """Aborts the request `rid`, or every request with `abort_all` (SGLang's bool: "false" is False)."""
    req, _ = await parse_request(request, AbortReq)
    engine_of(request).scheduler.abort(rid=req.rid, abort_all=req.abort_all)
    return Response(status_code=200)
