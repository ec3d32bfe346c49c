"""SGLang's HTTP wire, recorded: the requests slime's engine contract is made of, and how replies are compared.

Each case sends a fixed request (or a short fixed sequence) to a server and returns `{case name: exchange}`,
an exchange being `{"request": {"method", "route", "body"}, "status": int, "reply": JSON | text}`. The GPU test
(`test_sglang_wire.py`, marked `sglang`) runs the cases against real SGLang servers and writes the exchanges to
`tests/fixtures/sglang-wire/<server>.json`; the CPU test runs the same cases against the reference engine and
compares with `diff_shapes`: the same keys, value types, `None` positions, list lengths and status codes.
Values (log-probs, text, checksums) differ between the two models and are not compared.

Servers: `text` (a small bf16 Qwen3 started as a colocated engine: memory saver on), `lora` (the same model with
`--enable-lora`), `vl` (a Qwen-VL checkpoint). Which endpoint serves what is written down in
`tests/fixtures/sglang-wire/README.md`.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "sglang-wire"
TIMEOUT = aiohttp.ClientTimeout(total=120)
PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]  # "The answer to 2+2=" in Qwen3 ids
GREEDY = {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}
LORA_NAME = "wire-lora"
# Every parameter kind of a Qwen3 decoder under its HF name (SGLang fuses q/k/v and gate/up).
QWEN3_KINDS = [
    "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
    *(f"model.layers.0.{k}.weight" for k in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
        "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm")),
]  # fmt: skip

Exchange = dict[str, Any]
Case = Callable[["Ctx"], Awaitable[dict[str, Exchange]]]


class Ctx:
    """What a case needs: the server, the checkpoint it serves, and per-server extras.

    Attributes:
        url: base URL of the server.
        model_dir: the checkpoint directory the server loaded (also the `update_weights_from_disk` source).
        session: the aiohttp session of the run.
        extras: `lora_dir` (a PEFT adapter directory), `vl_request` (a multimodal `/generate` body), `tensor`
            (`(name, tensor)` for `/update_weights_from_tensor`).
    """

    def __init__(self, url: str, model_dir: str, session: aiohttp.ClientSession, **extras: Any):
        self.url, self.model_dir, self.session, self.extras = url.rstrip("/"), str(model_dir), session, extras

    async def call(self, method: str, route: str, body: Any = None) -> Exchange:
        """One request; the exchange keeps the body as sent (large payloads elided)."""
        kwargs = {"json": body} if method == "POST" and body is not None else {}
        async with self.session.request(method, self.url + route, timeout=TIMEOUT, **kwargs) as resp:
            text = await resp.text()
            try:
                reply = json.loads(text) if text else None
            except json.JSONDecodeError:
                reply = text
            return {"request": {"method": method, "route": route, "body": _elide(body)}, "status": resp.status,
                    "reply": reply}  # fmt: skip


def _elide(body: Any) -> Any:
    """The request body as recorded: long strings (serialized tensors, images) cut to a marker."""
    if isinstance(body, dict):
        return {k: _elide(v) for k, v in body.items()}
    if isinstance(body, list):
        return [_elide(v) for v in body]
    if isinstance(body, str) and len(body) > 200:
        return f"<{len(body)} chars>"
    return body


# ------------------------------------------------------------------------------------------------- cases


async def info_cases(ctx: Ctx) -> dict[str, Exchange]:
    """Health, model and server info, weight versions."""
    return {
        "health": await ctx.call("GET", "/health"),
        "health_generate": await ctx.call("GET", "/health_generate"),
        "model_info": await ctx.call("GET", "/model_info"),
        "get_model_info": await ctx.call("GET", "/get_model_info"),
        "server_info": await ctx.call("GET", "/server_info"),
        "get_weight_version": await ctx.call("GET", "/get_weight_version"),
        "update_weight_version": await ctx.call("POST", "/update_weight_version", {"new_version": "wire-1"}),
        "loads": await ctx.call("GET", "/v1/loads?include=core"),
        "no_such_route": await ctx.call("GET", "/no_such_route"),
    }


async def generate_cases(ctx: Ctx) -> dict[str, Exchange]:
    """`/generate` without and with log-probs, from several start positions, top log-probs, batched, by text."""
    out = {
        "generate": await ctx.call("POST", "/generate", {"input_ids": PROMPT, "sampling_params": GREEDY}),
        "generate_logprob": await ctx.call(
            "POST", "/generate", {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True}
        ),
    }
    for start in (0, 3, len(PROMPT) - 1, len(PROMPT), len(PROMPT) + 1):
        body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True, "logprob_start_len": start}
        out[f"generate_logprob_start_{start}"] = await ctx.call("POST", "/generate", body)
    # The teacher-scoring shape of on-policy distillation: no new tokens, log-probs from before the response.
    out["generate_score_only"] = await ctx.call("POST", "/generate", {
        "input_ids": PROMPT, "sampling_params": {"temperature": 1.0, "max_new_tokens": 0}, "return_logprob": True,
        "logprob_start_len": 4})  # fmt: skip
    out["generate_top_logprobs"] = await ctx.call("POST", "/generate", {
        "input_ids": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 2}, "return_logprob": True,
        "logprob_start_len": 5, "top_logprobs_num": 2})  # fmt: skip
    out["generate_batch"] = await ctx.call("POST", "/generate", {
        "input_ids": [PROMPT, PROMPT[:5]], "sampling_params": GREEDY, "return_logprob": True})  # fmt: skip
    out["generate_text"] = await ctx.call(
        "POST", "/generate", {"text": "The answer to 2+2=", "sampling_params": {**GREEDY, "max_new_tokens": 2}}
    )
    out["generate_sampled"] = await ctx.call("POST", "/generate", {
        "input_ids": PROMPT, "return_logprob": True,
        "sampling_params": {"temperature": 1.0, "top_p": 0.9, "top_k": 20, "max_new_tokens": 4, "ignore_eos": True,
                            "skip_special_tokens": False, "no_stop_trim": True,
                            "spaces_between_special_tokens": False}})  # fmt: skip
    out["generate_empty"] = await ctx.call("POST", "/generate", {"sampling_params": GREEDY})
    return out


async def abort_cases(ctx: Ctx) -> dict[str, Exchange]:
    """A long generation aborted by rid, then pause (abort mode) and continue."""
    long = {"input_ids": PROMPT, "rid": "wire-abort", "return_logprob": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 1500, "ignore_eos": True}}  # fmt: skip
    running = asyncio.ensure_future(ctx.call("POST", "/generate", long))
    await asyncio.sleep(1.0)
    aborted = await ctx.call("POST", "/abort_request", {"rid": "wire-abort"})
    generated = await running
    # The reply's length depends on timing: keep only its first two entries of each per-token list.
    meta = (generated.get("reply") or {}).get("meta_info") or {}
    for key in ("output_token_logprobs",):
        if isinstance(meta.get(key), list):
            meta[key] = meta[key][:2]
    if isinstance((generated.get("reply") or {}).get("output_ids"), list):
        generated["reply"]["output_ids"] = generated["reply"]["output_ids"][:2]
    return {
        "abort_request": aborted,
        "generate_aborted": generated,
        "pause_generation": await ctx.call("POST", "/pause_generation", {"mode": "abort"}),
        "continue_generation": await ctx.call("POST", "/continue_generation", {}),
    }


async def memory_cases(ctx: Ctx) -> dict[str, Exchange]:
    """Cache flush and the colocated engine's memory release / resume."""
    return {
        "flush_cache": await ctx.call("POST", "/flush_cache"),
        "release_memory_occupation": await ctx.call("POST", "/release_memory_occupation", {}),
        "resume_memory_occupation": await ctx.call("POST", "/resume_memory_occupation", {}),
        "generate_after_resume": await ctx.call("POST", "/generate", {"input_ids": PROMPT, "sampling_params": GREEDY}),
    }


async def weight_cases(ctx: Ctx) -> dict[str, Exchange]:
    """Weight updates (disk, tensor), checksums, and `/get_weights_by_name` for every Qwen3 parameter kind."""
    from slime_rollout.engines.wire import serialize_named_tensors

    out = {
        "update_weights_from_disk": await ctx.call(
            "POST", "/update_weights_from_disk", {"model_path": ctx.model_dir, "weight_version": "wire-2"}
        ),
        "update_weights_from_disk_missing": await ctx.call(
            "POST", "/update_weights_from_disk", {"model_path": ctx.model_dir + "-missing"}
        ),
    }
    name, tensor = ctx.extras["tensor"]
    out["update_weights_from_tensor"] = await ctx.call("POST", "/update_weights_from_tensor", {
        "serialized_named_tensors": [serialize_named_tensors([(name, tensor)])], "load_format": None,
        "flush_cache": True, "weight_version": "wire-3"})  # fmt: skip
    out["weights_checker"] = await ctx.call("POST", "/weights_checker", {"action": "checksum"})
    # A body that fails SGLang's request validation (a required field missing): its status and error shape.
    out["update_weight_version_malformed"] = await ctx.call("POST", "/update_weight_version", {})
    for hf_name in QWEN3_KINDS:
        kind = hf_name.removeprefix("model.layers.0.").removeprefix("model.").removesuffix(".weight")
        out[f"get_weights_by_name.{kind}"] = await ctx.call(
            "POST", "/get_weights_by_name", {"name": hf_name, "truncate_size": 2}
        )
    return out


async def lora_cases(ctx: Ctx) -> dict[str, Exchange]:
    """Load an adapter, generate naming it, unload it twice, name an adapter that is not loaded."""
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True, "lora_path": LORA_NAME}
    return {
        "load_lora_adapter": await ctx.call(
            "POST", "/load_lora_adapter", {"lora_name": LORA_NAME, "lora_path": str(ctx.extras["lora_dir"])}
        ),
        "generate_lora": await ctx.call("POST", "/generate", body),
        "unload_lora_adapter": await ctx.call("POST", "/unload_lora_adapter", {"lora_name": LORA_NAME}),
        "unload_lora_adapter_again": await ctx.call("POST", "/unload_lora_adapter", {"lora_name": LORA_NAME}),
        "generate_lora_not_loaded": await ctx.call("POST", "/generate", body),
        "load_lora_adapter_malformed": await ctx.call("POST", "/load_lora_adapter", {"lora_path": "x"}),
    }


async def vl_cases(ctx: Ctx) -> dict[str, Exchange]:
    """A multimodal `/generate` as the rollout sends it (one `<|image_pad|>` per image + `image_data`)."""
    return {"generate_image": await ctx.call("POST", "/generate", ctx.extras["vl_request"])}


async def validation_cases(ctx: Ctx) -> dict[str, Exchange]:
    """Bodies SGLang's request models refuse (mistyped fields, empty prompts, a request id given twice, control
    routes without their required fields), and an empty stop string: statuses and error shapes.

    Last on the `text` server: a control body SGLang would accept after all (a release that went through) must not
    change what the other cases see.
    """
    out = {}
    for name, body in (
        ("float_ids", {"input_ids": [1.5, 2], "sampling_params": GREEDY}),
        ("int_rid", {"input_ids": PROMPT, "rid": 5, "sampling_params": GREEDY}),
        ("text_not_str", {"text": 5, "sampling_params": GREEDY}),
        ("sampling_not_dict", {"input_ids": PROMPT, "sampling_params": "x"}),
        ("return_logprob_word", {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": "maybe"}),
        ("empty_ids", {"input_ids": [], "sampling_params": GREEDY}),
        ("empty_text", {"text": "", "sampling_params": GREEDY}),
        ("rid_twice", {"input_ids": [PROMPT, PROMPT], "rid": ["wire-dup", "wire-dup"], "sampling_params": GREEDY}),
    ):
        out[f"generate_malformed_{name}"] = await ctx.call("POST", "/generate", body)
    out["generate_stop_empty_string"] = await ctx.call(
        "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {**GREEDY, "ignore_eos": False, "stop": [""]}}
    )
    out["pause_generation_no_body"] = await ctx.call("POST", "/pause_generation")
    out["pause_generation_bad_mode"] = await ctx.call("POST", "/pause_generation", {"mode": "bogus"})
    out["continue_generation_after_bad_pause"] = await ctx.call("POST", "/continue_generation", {})
    out["release_memory_occupation_tags_str"] = await ctx.call(
        "POST", "/release_memory_occupation", {"tags": "weights"}
    )
    out["generate_after_bad_release"] = await ctx.call(
        "POST", "/generate", {"input_ids": PROMPT, "sampling_params": GREEDY}
    )
    return out


SERVERS: dict[str, list[Case]] = {
    "text": [info_cases, generate_cases, abort_cases, memory_cases, weight_cases, validation_cases],
    "lora": [lora_cases],
    "vl": [vl_cases],
}


async def record(server: str, ctx: Ctx) -> dict[str, Exchange]:
    """Runs every case of `server` against `ctx.url`; a case that raises is recorded as `{"error": ...}`."""
    out: dict[str, Exchange] = {}
    for case in SERVERS[server]:
        try:
            out.update(await case(ctx))
        except Exception as exc:  # noqa: BLE001 - one broken case must not lose the others' recordings
            out[f"{case.__name__}.error"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


# --------------------------------------------------------------------------------------------- shapes


def shape(value: Any) -> Any:
    """The structure of a JSON value: dict keys, list lengths, and the type of every leaf (`None` kept)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    if value is None:
        return None
    return type(value).__name__


# Keys whose value SGLang sets only when its prefix cache hit (null otherwise); the reference engine has no cache.
CACHE_DEPENDENT = frozenset({"cached_tokens_details"})


def diff_shapes(want: Any, got: Any, path: str = "") -> list[str]:
    """Where `got`'s structure differs from `want`'s (`shape` of each), one line per difference.

    A `CACHE_DEPENDENT` key may be None on either side where the other has a value (a cache hit or not).
    """
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}.{k}: missing" for k in want if k not in got]
        out += [f"{path}.{k}: not in SGLang's reply" for k in got if k not in want]
        for k in want:
            if k in got and not (k in CACHE_DEPENDENT and None in (got[k], want[k])):
                out += diff_shapes(want[k], got[k], f"{path}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(got)} entries, SGLang {len(want)}"]
        return [d for i, (w, g) in enumerate(zip(want, got, strict=True)) for d in diff_shapes(w, g, f"{path}[{i}]")]
    if want != got:
        return [f"{path}: {got!r}, SGLang {want!r}"]
    return []


def load(server: str) -> dict[str, Exchange]:
    """The recorded exchanges of one server (`{}` when none were recorded)."""
    path = FIXTURES / f"{server}.json"
    return json.loads(path.read_text()) if path.exists() else {}
