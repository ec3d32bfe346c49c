"""`/generate` (one prompt or a batch) and `/abort_request`, with SGLang 0.5.16's request and reply fields."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from slime_rollout.engines.reference.request import GenRequest, is_queued_abort
from slime_rollout.engines.reference.routes.bodies import parse_generate, parse_request
from slime_rollout.engines.reference.routes.state import EngineState, engine_of, error
from slime_rollout.engines.reference.sampling import SamplingParams
from slime_rollout.engines.reference.vision import decode_engine_image
from slime_rollout.engines.wire import AbortReq

__all__ = ["router", "submit_one", "to_output"]

router = APIRouter()


def to_output(
    engine: EngineState, r: GenRequest, return_logprob: bool, text_in_logprobs: bool = False
) -> dict[str, Any]:
    """SGLang's reply to one finished request: `{"text", "output_ids", "meta_info"}`.

    Args:
        engine: the engine that ran it (weight version, vocabulary).
        r: the finished request.
        return_logprob: add the input/output (and top) log-prob lists, entries `[logprob, token_id, text]`.
        text_in_logprobs: SGLang's `return_text_in_logprobs`: `text` is the token decoded alone
            (`TokenizerManager.detokenize_logprob_tokens`, special tokens kept), else None.
    """
    model = engine.model
    if text_in_logprobs:
        entry = lambda lp, t: [lp, t, model.tokenizer.decode([t])]  # noqa: E731
    else:
        entry = lambda lp, t: [lp, t, None]  # noqa: E731
    if is_queued_abort(r.finish_reason):
        meta = _queued_abort_meta(engine, r)
    else:
        # SGLang 0.5.16's meta_info keys (tests/fixtures/sglang-wire); no prefix cache here: nothing cached.
        meta = {
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
    if r.vision is not None and "prompt_tokens" in meta:
        meta["image_tokens"] = sum(1 for t in r.input_ids if t == model.vision.image_token_id)
    if return_logprob:
        start = r.logprob_start_len
        # SGLang reports id 0 for input ids >= vocab size - 1 (logprob_result_processor.py clips them).
        clip = model.vocab_size - 1
        meta["input_token_logprobs"] = [
            entry(lp, t if t < clip else 0)
            for lp, t in zip(r.input_logprobs or [], r.input_ids[start:] if r.input_logprobs else [], strict=True)
        ]
        meta["output_token_logprobs"] = [entry(lp, t) for lp, t in zip(r.output_logprobs, r.output_ids, strict=True)]
        meta["output_token_logprobs_length"] = len(r.output_ids)
        if r.top_logprobs_num > 0:
            as_entries = lambda top: None if top is None else [entry(lp, t) for lp, t in top]  # noqa: E731
            meta["input_top_logprobs"] = [as_entries(top) for top in r.input_top_logprobs or []]
            meta["output_top_logprobs"] = [as_entries(top) for top in r.output_top_logprobs]
    if r.output_kept_ids is not None and len(r.output_kept_ids) == len(r.output_ids):
        # Top-p replay, in the field names of SGLang with the original slime's patch.
        meta["top_p_token_ids"] = [t for kept in r.output_kept_ids for t in kept]
        meta["top_p_token_offsets"] = [0, *itertools.accumulate(len(kept) for kept in r.output_kept_ids)]
    return {"text": model.output_text(r), "output_ids": list(r.output_ids), "meta_info": meta}


def _queued_abort_meta(engine: EngineState, r: GenRequest) -> dict[str, Any]:
    """`meta_info` of a request aborted in the waiting queue, with SGLang 0.5.16's keys only.

    SGLang builds it in `TokenizerManager._handle_abort_req` (sglang/srt/managers/tokenizer_manager.py): no
    `prompt_tokens`, no `cached_tokens`, a finish reason without `status_code`/`err_type`.
    """
    return {
        "id": r.rid,
        "finish_reason": r.finish_reason,
        "weight_version": engine.weight_version,
        "e2e_latency": time.monotonic() - r.created,
        "completion_tokens": len(r.output_ids),
    }


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


def _check_prompt(vocab_size: int, context_len: int, input_ids: list[int]) -> None:
    """SGLang's refusals of a prompt, as HTTP 400 messages.

    The length check is `TokenizerManager._validate_one_request` (sglang/srt/managers/tokenizer_manager.py). An id
    outside the vocabulary gets the message of that file's `_validate_input_ids_in_vocab` (negative ids too):
    0.5.16 defines it but does not call it, so SGLang's own answer is whatever its embedding kernel does; here the
    lookup raised IndexError, an HTTP 500.
    """
    bad = next((t for t in input_ids if not 0 <= int(t) < vocab_size), None)
    if bad is not None and bad < 0:
        raise ValueError(f"The input_ids {input_ids} contains a negative value ({bad}).")
    if bad is not None:
        raise ValueError(f"The input_ids {input_ids} contains values greater than the vocab size ({vocab_size}).")
    if len(input_ids) >= context_len:
        raise ValueError(
            f"The input ({len(input_ids)} tokens) is longer than the model's context length ({context_len} tokens)."
        )


def _fit_budget(params: SamplingParams, input_len: int, context_len: int) -> None:
    """SGLang's token budget of a request, set on `params` in place.

    A request whose prompt plus `max_new_tokens` exceeds the context is refused (`_validate_one_request`,
    tokenizer_manager.py, `validate_total_tokens` is always on); the budget is then clipped to
    `(context_len - 1) - input_len - 1` (`Scheduler.init_req_max_new_tokens` with `max_req_len = context_len - 1`,
    tp_worker.py; None means no limit but that), and `min_new_tokens` to the budget.

    Raises:
        ValueError: prompt plus `max_new_tokens` longer than the context (SGLang's message).
    """
    if params.max_new_tokens is not None and params.max_new_tokens + input_len > context_len:
        raise ValueError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. You "
            f"requested a total of {params.max_new_tokens + input_len} tokens: {input_len} tokens from the input "
            f"messages and {params.max_new_tokens} tokens for the completion. Please reduce the number of tokens in "
            "the input messages or the completion to fit within the limit."
        )
    room = max(0, context_len - 1 - input_len - 1)
    params.max_new_tokens = room if params.max_new_tokens is None else min(params.max_new_tokens, room)
    params.min_new_tokens = min(params.min_new_tokens, params.max_new_tokens)


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
    params = SamplingParams.from_request(sp, model.vocab_size)
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
    # SGLang's refusals of an empty prompt (io_struct.py `_determine_batch_size`, tokenizer_manager.py
    # `_tokenize_texts`); an image prompt's text may be empty.
    if input_ids is not None and len(input_ids) == 0:
        raise ValueError("input_ids cannot be empty.")
    if input_ids is None and not text and not image_data:
        raise ValueError("texts cannot be empty and tokenizer must be initialized")
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
    _check_prompt(model.vocab_size, model.max_context_len, input_ids)
    _fit_budget(params, len(input_ids), model.max_context_len)
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


def _parallel_sample_num(sp: Any) -> int:
    """SGLang's `n` of a request (`GenerateReqInput._handle_parallel_sampling`, managers/io_struct.py)."""
    if isinstance(sp, dict):
        return int(sp.get("n") or 1)
    if isinstance(sp, list) and sp:
        n = int((sp[0] or {}).get("n") or 1)
        if any(int((one or {}).get("n") or 1) != n for one in sp):
            raise ValueError("The parallel_sample_num should be the same for all samples in sample params.")
        return n
    return 1


def _batch_rids(rid: Any, size: int, n: int) -> list[str] | None:
    """The request ids of a batch of `size` prompts sampled `n` times each.

    SGLang's `GenerateReqInput._normalize_rid` (io_struct.py): a string numbers all `size * n`, a list names the
    prompts.
    """
    if rid is None:
        return None
    if isinstance(rid, str):
        return [f"{rid}_{i}" for i in range(size * n)]
    if isinstance(rid, list):
        if len(rid) != size:
            raise ValueError("The specified rids length mismatch with the batch_size for batch processing.")
        return rid
    raise ValueError("The rid should be a string or a list of strings.")


@contextlib.contextmanager
def _in_flight(engine: EngineState, rids: list[str], hold: bool = True) -> Iterator[None]:
    """SGLang's request-id bookkeeping around a `/generate` request.

    An id given twice in one request is refused (`GenerateReqInput._validate_rid_uniqueness`, io_struct.py), and so is
    one still in flight (`TokenizerManager._init_req_state`, tokenizer_manager.py); otherwise the ids are held until
    the request's reply (`hold`; parallel samples run under fresh ids, SGLang frees theirs at once).

    Raises:
        ValueError: SGLang's message, naming the ids.
    """
    counts = collections.Counter(rids)
    if len(counts) < len(rids):
        twice = [r for r, c in counts.items() if c > 1]
        raise ValueError(f"Duplicate request IDs detected within the request: {twice}")
    for rid in rids:
        if rid in engine.rids:
            raise ValueError(f"Duplicate request ID detected: {rid}")
    held = set(rids) if hold else set()
    engine.rids |= held
    try:
        yield
    finally:
        engine.rids -= held


@router.post("/generate")
async def generate_request(request: Request):
    """SGLang's `/generate`: one prompt (a reply object) or a batch (a list), no streaming.

    With `sampling_params.n > 1` every prompt is sampled `n` times under fresh request ids and the reply is a list,
    prompt by prompt (SGLang's `TokenizerManager._handle_batch_request` order), even for a single prompt.
    """
    engine = engine_of(request)
    body = await parse_generate(request)
    if body.stream:
        return error("the reference engine does not stream")
    input_ids, text, sp, rid, image_data = body.input_ids, body.text, body.sampling_params, body.rid, body.image_data
    return_logprob = body.return_logprob or False
    text_in_logprobs = body.return_text_in_logprobs
    start = body.logprob_start_len if return_logprob and body.logprob_start_len is not None else -1
    lora = body.lora_path  # SGLang: the adapter's name (or a list, one per batched prompt)
    top = (body.top_logprobs_num or 0) if return_logprob else 0
    want_routes, routes_start = body.return_routed_experts, body.routed_experts_start_len
    batched = (isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list)) or isinstance(text, list)
    try:
        n = _parallel_sample_num(sp)
        if not batched and n == 1:
            rid = rid or uuid.uuid4().hex
            _check_routes_request(engine, want_routes, routes_start, None if input_ids is None else len(input_ids))
            with _in_flight(engine, [rid]):
                req = await submit_one(engine, input_ids, text, sp or {}, rid, start, image_data, lora, top)
            out = to_output(engine, req, bool(return_logprob), bool(text_in_logprobs))
            return await add_routed_experts(engine, req, out, routes_start) if want_routes else out
        if not batched:  # SGLang turns a single prompt with n > 1 into a batch of one
            input_ids = None if input_ids is None else [input_ids]
            text = None if text is None else [text]
            image_data = None if image_data is None else [image_data]
        size = len(input_ids if input_ids is not None else text)
        rid = _batch_rids(rid, size, n)
        pick = lambda v, i: v[i] if isinstance(v, list) else v  # noqa: E731
        rows = [i for i in range(size) for _ in range(n)]
        # SGLang regenerates the ids of parallel samples.
        row_rids = [None if rid is None or n > 1 else rid[i] for i in range(size)]
        with _in_flight(engine, rid or [], hold=n == 1):
            reqs = await asyncio.gather(
                *(
                    submit_one(
                        engine,
                        None if input_ids is None else input_ids[i],
                        None if text is None else text[i],
                        pick(sp, i) or {},
                        row_rids[i],
                        pick(start, i),
                        None if image_data is None else image_data[i],
                        pick(lora, i),
                        pick(top, i),
                    )
                    for i in rows
                )
            )
        outs = [
            to_output(engine, r, bool(pick(return_logprob, i)), bool(pick(text_in_logprobs, i)))
            for i, r in zip(rows, reqs, strict=True)
        ]
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
