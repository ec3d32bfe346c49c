"""The rollout against a hostile SGLang: recorded 0.5.16 replies, mutated one way at a time (issue 27, pass 91).

A real aiohttp server (the `http_server` fixture) answers `/generate` with `text.json`'s `generate_logprob` reply
(SGLang 0.5.16, recorded) changed by one mutation, and the default generate function sends its request through the
production `RolloutClient`. A reply that is valid SGLang is read as the original's `sglang_rollout.generate` reads it;
an invalid one ends in one `ValueError` or `EngineError` naming the engine URL, `/generate` and the sample, and the
sample keeps nothing of it (no tokens, no log-probs). Valid per the 0.5.16 source: `finish_reason` is always one of
`{"type": "stop" | "length" | "abort", ...}` (`schedule_batch.py`), `output_token_logprobs` has one
`[logprob, id, text]` per output id, and the numeric `meta_info` fields slime does not read may be null
(`cached_tokens_details`, `dp_rank` are, as recorded).
"""

import asyncio
import copy
import json
import math
import pathlib
import re

import pytest
from aiohttp import web

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample, Status
from slime_rollout.engines.client import EngineError, RolloutClient
from slime_rollout.engines.engine_client import EngineClient
from slime_rollout.generation import generate as single_turn

WIRE = json.loads((pathlib.Path(__file__).parents[1] / "fixtures" / "sglang-wire" / "text.json").read_text())
RECORDED = WIRE["generate_logprob"]["reply"]  # 4 tokens, finish_reason length, weight_version "wire-1"
PROMPT = WIRE["generate_logprob"]["request"]["body"]["input_ids"]
IDS = RECORDED["output_ids"]
LOG_PROBS = [e[0] for e in RECORDED["meta_info"]["output_token_logprobs"]]


def _mutated(change) -> dict:
    reply = copy.deepcopy(RECORDED)
    change(reply, reply["meta_info"])
    return reply


def _args() -> PluginArgs:
    return PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1}))


async def _generate(monkeypatch, url: str, **client_kw) -> Sample:
    """The default generate function on sample 7 against the server at `url`, through a real `RolloutClient`."""
    client = RolloutClient([url], max_retries=0, **client_kw)
    monkeypatch.setattr(single_turn, "get_client", lambda args: client)
    sample = Sample(prompt="p", tokens=list(PROMPT), response_length=0, index=7)
    try:
        return await single_turn.generate(_args(), sample, {"max_new_tokens": 4})
    finally:
        await client.aclose()


async def _serve_json(http_server, body, status: int = 200) -> str:
    async def handler(request):
        return web.json_response(body, status=status)

    return await http_server(handler)


def _unchanged(sample: Sample) -> bool:
    return sample.tokens == PROMPT and sample.response_length == 0 and sample.rollout_log_probs is None


# ---- valid SGLang: read as the original reads it -------------------------------------------------------------------


def _set_meta(key: str, value):
    return lambda r, m: m.__setitem__(key, value)


def _drop_meta(key: str):
    return lambda r, m: m.pop(key)


NULLABLE = ("prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency", "weight_version",
            "output_token_logprobs_length", "num_retractions", "reasoning_tokens", "cached_tokens_details")  # fmt: skip
OPTIONAL = ("prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency", "weight_version", "id",
            "input_token_logprobs", "output_token_logprobs_length")  # fmt: skip
VALID = {
    "recorded": lambda r, m: None,
    # The numbers slime does not read may be null (0.5.16 sends `dp_rank: null`); a null weight version is not kept.
    **{f"{key}=None": _set_meta(key, None) for key in NULLABLE},
    # The waiting-queue abort has no prompt_tokens (tokenizer_manager.py `_handle_abort_req`).
    **{f"no {key}": _drop_meta(key) for key in OPTIONAL},
    # A token whose text is empty (a special token under skip_special_tokens): the ids are what trains.
    "empty text": lambda r, m: r.__setitem__("text", ""),
    "no text": lambda r, m: r.pop("text"),
    "no output_ids": lambda r, m: r.pop("output_ids"),
}


@pytest.mark.parametrize("change", VALID.values(), ids=VALID.keys())
async def test_a_valid_reply_is_read_as_the_original_reads_it(http_server, monkeypatch, change):
    reply = _mutated(change)
    sample = await _generate(monkeypatch, await _serve_json(http_server, reply))
    assert sample.tokens == PROMPT + IDS and sample.response_length == 4
    assert sample.rollout_log_probs == LOG_PROBS and sample.loss_mask == [1] * 4
    assert sample.status is Status.TRUNCATED  # {"type": "length"}
    assert sample.response == (reply.get("text") or "")
    version = reply["meta_info"].get("weight_version")
    assert sample.weight_versions == ([version] if version is not None else [])


async def test_an_abort_reply_keeps_its_tokens_and_is_aborted(http_server, monkeypatch):
    """SGLang answers an aborted request with HTTP 200 and the tokens so far; the original appends them (ABORTED)."""
    abort = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    reply = _mutated(lambda r, m: m.__setitem__("finish_reason", abort))
    sample = await _generate(monkeypatch, await _serve_json(http_server, reply))
    assert sample.status is Status.ABORTED and sample.tokens == PROMPT + IDS and sample.rollout_log_probs == LOG_PROBS


@pytest.mark.parametrize("arity", [2, 4])
async def test_log_prob_entries_of_another_arity_give_the_same_ids_and_log_probs(http_server, monkeypatch, arity):
    entries = [[lp, t, None, "extra"][:arity] for lp, t in zip(LOG_PROBS, IDS, strict=True)]
    reply = _mutated(lambda r, m: m.__setitem__("output_token_logprobs", entries))
    sample = await _generate(monkeypatch, await _serve_json(http_server, reply))
    assert sample.tokens == PROMPT + IDS and sample.rollout_log_probs == LOG_PROBS


# ---- invalid replies: one error naming the engine, /generate and the sample; nothing kept ---------------------------


def _entries(m) -> list:
    return m["output_token_logprobs"]


INVALID = {
    # Before: warned "engine gave no known finish_reason" and trained the sample as COMPLETED.
    "no finish_reason": (lambda r, m: m.pop("finish_reason"), r"meta_info\.finish_reason is None, not SGLang's"),
    "finish_reason None": (lambda r, m: m.__setitem__("finish_reason", None), r"meta_info\.finish_reason is None"),
    "finish_reason eos": (
        lambda r, m: m.__setitem__("finish_reason", {"type": "eos"}),
        r"meta_info\.finish_reason is \{'type': 'eos'\}",
    ),
    "finish_reason number": (lambda r, m: m.__setitem__("finish_reason", 3), r"meta_info\.finish_reason is 3,"),
    # Before: the sample was named but not the engine.
    "no meta_info": (lambda r, m: r.pop("meta_info"), r"reply has no meta_info\.output_token_logprobs"),
    "no output_token_logprobs": (lambda r, m: m.pop("output_token_logprobs"), r"has no meta_info\.output_token_log"),
    "log-probs longer than output_ids": (
        lambda r, m: _entries(m).append([-0.1, 5, None]),
        r"output_ids .* disagree .* \(4 ids, 5 log-prob entries\)",
    ),
    "log-probs shorter than output_ids": (
        lambda r, m: _entries(m).pop(),
        r"output_ids .* disagree .* \(4 ids, 3 log-prob entries\)",
    ),
    "entry of arity 1": (lambda r, m: _entries(m).__setitem__(2, [-0.1]), r"output_token_logprobs\[2\] is \[-0\.1\]"),
    "log-prob NaN": (lambda r, m: _entries(m)[1].__setitem__(0, math.nan), r"\[1\]: log-prob nan is not a finite"),
    "log-prob inf": (lambda r, m: _entries(m)[1].__setitem__(0, math.inf), r"\[1\]: log-prob inf is not a finite"),
    "log-prob None": (lambda r, m: _entries(m)[0].__setitem__(0, None), r"\[0\]: log-prob None is not a finite"),
    "token id None": (lambda r, m: _entries(m)[3].__setitem__(1, None), r"\[3\]: token id None is not a non-negative"),
    "negative token id": (lambda r, m: _entries(m)[3].__setitem__(1, -1), r"\[3\]: token id -1 is not a non-negative"),
    # Before: a bare TypeError ("'int' object is not iterable", "can only concatenate str (not "int") to str").
    "output_ids a number": (lambda r, m: r.__setitem__("output_ids", 4), r"output_ids is 4, not a list of token ids"),
    "text a number": (lambda r, m: r.__setitem__("text", 5), r"reply text is 5, not a string"),
}


@pytest.mark.parametrize(("change", "message"), INVALID.values(), ids=INVALID.keys())
async def test_an_invalid_reply_names_the_engine_endpoint_and_sample(http_server, monkeypatch, change, message):
    url = await _serve_json(http_server, _mutated(change))
    client = RolloutClient([url], max_retries=0)
    monkeypatch.setattr(single_turn, "get_client", lambda args: client)
    sample = Sample(prompt="p", tokens=list(PROMPT), response_length=0, index=7)
    try:
        with pytest.raises(ValueError, match=message) as err:
            await single_turn.generate(_args(), sample, {"max_new_tokens": 4})
    finally:
        await client.aclose()
    said = str(err.value)
    assert said.startswith(f"sample 7: engine {url}/generate reply "), said
    assert _unchanged(sample)


async def test_a_200_html_page_names_the_engine_and_the_sample(http_server, monkeypatch):
    async def handler(request):
        return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="text/html")

    url = await http_server(handler)
    with pytest.raises(ValueError) as err:
        await _generate(monkeypatch, url)
    assert str(err.value) == (
        f"sample 7: the engine {url}/generate's reply is str '<html><body>502 Bad Gateway</body></html>', not a JSON "
        "object"
    )


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (500, {"error": {"message": "CUDA error"}}, '{"error": {"message": "CUDA error"}}'),
        (500, "Internal Server Error", "Internal Server Error"),
        (503, {"error": {"message": "overloaded"}}, '{"error": {"message": "overloaded"}}'),
        (503, "Service Unavailable", "Service Unavailable"),
    ],
)
async def test_an_http_error_names_the_engine_and_the_sample(http_server, monkeypatch, status, body, said):
    """Before: `engine URL/generate failed (HTTP 500): ...`, which sample it served unsaid."""

    async def handler(request):
        if isinstance(body, dict):
            return web.json_response(body, status=status)
        return web.Response(text=body, status=status)

    url = await http_server(handler)
    with pytest.raises(EngineError) as err:
        await _generate(monkeypatch, url)
    assert str(err.value) == f"engine {url}/generate failed for sample 7 (HTTP {status}): {said}"
    assert err.value.status_code == status and err.value.context == "sample 7"


async def test_a_connection_reset_mid_body_names_the_engine_and_the_sample(http_server, monkeypatch):
    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "4000"})
        await resp.prepare(request)
        await resp.write(json.dumps(RECORDED).encode()[:100])
        request.transport.close()  # the engine process dies while sending
        return resp

    url = await http_server(handler)
    with pytest.raises(EngineError) as err:
        await _generate(monkeypatch, url)
    assert re.match(rf"engine {re.escape(url)}/generate failed for sample 7: ClientPayloadError", str(err.value))
    assert err.value.unreachable


async def test_a_body_that_never_ends_fails_at_the_request_deadline(http_server, monkeypatch):
    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "4000"})
        await resp.prepare(request)
        await resp.write(b'{"text": "')
        await asyncio.sleep(60)  # cancelled by the fixture's cleanup
        return resp

    url = await http_server(handler)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(EngineError) as err:
        await _generate(monkeypatch, url, generate_timeout=1.0, slow_warning_s=10.0)
    assert loop.time() - start < 10
    assert str(err.value).startswith(f"engine {url}/generate failed for sample 7: ")
    assert "--sglang-router-request-timeout-secs" in str(err.value) and err.value.unreachable


async def test_the_answering_engine_is_named_of_two(http_server, monkeypatch):
    """The pool picks the engine; the error names the one whose reply was malformed, not the other."""
    good = await _serve_json(http_server, RECORDED)
    bad = await _serve_json(http_server, _mutated(lambda r, m: _entries(m)[0].__setitem__(0, math.nan)))
    client = RolloutClient([good, bad], max_retries=0)
    monkeypatch.setattr(single_turn, "get_client", lambda args: client)
    errors = []
    for index in range(4):  # ties go round-robin: both engines answer
        sample = Sample(prompt="p", tokens=list(PROMPT), response_length=0, index=index)
        try:
            await single_turn.generate(_args(), sample, {"max_new_tokens": 4})
        except ValueError as e:
            errors.append(str(e))
    await client.aclose()
    assert len(errors) == 2 and all(f"engine {bad}/generate reply" in e and good not in e for e in errors)


def test_an_engine_error_names_its_context_after_pickling():
    import pickle

    err = EngineError("http://h:1", "/generate", "boom", 500).for_context("sample 3")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == "engine http://h:1/generate failed for sample 3 (HTTP 500): boom"
    assert (again.context, again.status_code, again.message) == ("sample 3", 500, "boom")


# ---- /v1/loads (the rollout's abort waits on it) ---------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "2", -1, 1.5])
async def test_loads_that_are_no_counts_name_the_engine(http_server, value):
    """Before: `int(None)` was a bare TypeError out of `abort_all`, naming no engine."""
    url = await _serve_json(http_server, {"loads": [{"num_running_reqs": value, "num_waiting_reqs": 0}]})
    engine = EngineClient(url, max_retries=0)
    try:
        with pytest.raises(EngineError, match=rf"engine {re.escape(url)}/v1/loads failed: /v1/loads: num_running_reqs"):
            await engine.num_unfinished_requests()
    finally:
        await engine.aclose()


# ---- the OPD teacher's scoring replies (`--rm-url`) ------------------------------------------------------------------


def _teacher_reply(*entries) -> dict:
    return {"text": "", "output_ids": [], "meta_info": {"input_token_logprobs": [[None, 2, None], *entries]}}


BAD_TEACHER = {
    # Before: AttributeError "'list' object has no attribute 'get'".
    "meta_info a list": ({"meta_info": [1]}, r"sample 7: the teacher's meta_info is \[1\], not an object"),
    # Before: TypeError "object of type 'int' has no len()".
    "input_token_logprobs a number": (
        {"meta_info": {"input_token_logprobs": 5}},
        r"sample 7: the teacher's meta_info\.input_token_logprobs is 5, not a list",
    ),
    # Before: TypeError "int() argument must be ... not 'NoneType'".
    "token id None": (
        _teacher_reply([-0.5, None, None], [-0.25, 4, None]),
        r"sample 7: the teacher's input_token_logprobs entry of response token 0: token id None is not a non-neg",
    ),
    # Before: ValueError "could not convert string to float: 'x'", naming no sample.
    "log-prob text": (
        _teacher_reply([-0.5, 3, None], ["x", 4, None]),
        r"sample 7: the teacher's input_token_logprobs entry of response token 1 has log-prob 'x', not a number",
    ),
}


@pytest.mark.parametrize(("reply", "message"), BAD_TEACHER.values(), ids=BAD_TEACHER.keys())
def test_a_malformed_teacher_reply_names_the_sample(reply, message):
    from slime_rollout.generation.opd import teacher_log_probs_from_reply

    sample = Sample(tokens=[1, 2, 3, 4], response_length=2, index=7)
    with pytest.raises(ValueError, match=message):
        teacher_log_probs_from_reply(reply, sample, logprob_start_len=1)


async def test_a_malformed_teacher_reply_names_the_teacher_url(http_server):
    """Before: "sample 0: the teacher's log-prob of response token 1 is nan ...", which teacher unsaid."""
    from slime_rollout.generation.opd import score_teacher

    url = await _serve_json(http_server, _teacher_reply([-0.5, 3, None], [math.nan, 4, None]))
    fields = {"rollout_batch_size": 1, "num_rollout": 1, "use_opd": True, "opd_type": "sglang"}
    args = PluginArgs.from_config(SlimeArgs.from_dict({**fields, "rm_url": f"{url}/generate"}))
    sample = Sample(tokens=[1, 2, 3, 4], response_length=2, index=0, status=Status.COMPLETED, reward=1.0)
    with pytest.raises(ValueError) as err:
        await score_teacher(args, [sample])
    assert str(err.value).startswith(
        f"OPD teacher --rm-url {url}/generate: sample 0: the teacher's log-prob of response token 1 is nan "
    )
    assert sample.teacher_log_probs is None
    good = await _serve_json(http_server, _teacher_reply([-0.5, 3, None], [-0.25, 4, None]))
    args = PluginArgs.from_config(SlimeArgs.from_dict({**fields, "rm_url": f"{good}/generate"}))
    assert await score_teacher(args, [sample]) == 1 and sample.teacher_log_probs == [-0.5, -0.25]


# ---- routed experts (`--use-rollout-routing-replay`) -----------------------------------------------------------------

NUM_LAYERS, TOPK = 2, 2  # make_tiny_qwen3_moe (8 experts)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, make_tiny_qwen3_moe) -> pathlib.Path:
    return make_tiny_qwen3_moe(tmp_path_factory.mktemp("tiny-qwen3-moe"))


def _routes(rows: int, value: int = 0) -> str:
    import torch

    from slime_core.routing_replay import encode_routed_experts

    return encode_routed_experts(torch.full((rows, NUM_LAYERS, TOPK), value, dtype=torch.int32))


async def _generate_routed(monkeypatch, moe_dir, url: str) -> Sample:
    fields = dict(rollout_batch_size=1, num_rollout=1, rollout_max_response_len=4, hf_checkpoint=str(moe_dir),
                  rollout_engine="reference", train_backend="fsdp", use_rollout_routing_replay=True)  # fmt: skip
    args = PluginArgs.from_config(SlimeArgs.from_dict(fields))
    client = RolloutClient([url], max_retries=0)
    monkeypatch.setattr(single_turn, "get_client", lambda args: client)
    try:
        return await single_turn.generate(args, Sample(tokens=list(PROMPT), index=7), {"max_new_tokens": 4})
    finally:
        await client.aclose()


ROWS = len(PROMPT) + len(IDS) - 1  # SGLang: prompt + completion - 1 rows
BAD_ROUTES = {
    "one row short": (_routes(ROWS - 1), rf"rollout_routed_experts has {ROWS - 1} rows, its {ROWS + 1} tokens need"),
    # Before: RuntimeError "Could not infer dtype of dict", naming neither field nor sample.
    "an object": ({"rows": 3}, r"sample 7: meta_info\.routed_experts is dict, not base64 int32 or a list of ints"),
    "a ragged list": ([[1, 2], [3]], r"sample 7: meta_info\.routed_experts is list, not base64 int32 or a list of"),
    "not base64": ("@@@", r"sample 7: meta_info\.routed_experts is not base64"),
}


@pytest.mark.parametrize(("routes", "message"), BAD_ROUTES.values(), ids=BAD_ROUTES.keys())
async def test_routes_of_the_wrong_shape_or_type_are_refused(http_server, monkeypatch, moe_dir, routes, message):
    url = await _serve_json(http_server, _mutated(lambda r, m: m.__setitem__("routed_experts", routes)))
    with pytest.raises(ValueError, match=message):
        await _generate_routed(monkeypatch, moe_dir, url)


async def test_routes_in_range_are_kept(http_server, monkeypatch, moe_dir):
    url = await _serve_json(http_server, _mutated(lambda r, m: m.__setitem__("routed_experts", _routes(ROWS, 7))))
    sample = await _generate_routed(monkeypatch, moe_dir, url)
    assert tuple(sample.rollout_routed_experts.shape) == (ROWS, NUM_LAYERS, TOPK)
    assert int(sample.rollout_routed_experts.min()) == int(sample.rollout_routed_experts.max()) == 7


async def test_an_abort_without_routes_given_as_a_bare_type_is_aborted(http_server, monkeypatch, moe_dir):
    """A finish reason given as its bare type ("abort", which slime reads as SGLang's {"type": "abort"}) without routes:
    before, `(finish_reason or {}).get("type")` was a bare AttributeError ('str' object has no attribute 'get')."""
    url = await _serve_json(http_server, _mutated(lambda r, m: m.__setitem__("finish_reason", "abort")))
    sample = await _generate_routed(monkeypatch, moe_dir, url)
    assert sample.status is Status.ABORTED and sample.rollout_routed_experts is None


# ---- the agent adapter (sends a rid; the reply's meta_info.id is that rid in SGLang 0.5.16) --------------------------


async def _chat_through_adapter(tok, url: str) -> tuple[int, dict]:
    """One chat completion through `OpenAIAdapter` backed by a real `RolloutClient` on the engine at `url`."""
    import aiohttp

    from slime_rollout.agent import OpenAIAdapter

    client = RolloutClient([url], max_retries=0)
    adapter = OpenAIAdapter(tokenizer=tok, client=client)
    await adapter.start()
    adapter.open_session("s", sampling_defaults={"max_new_tokens": 4})
    try:
        async with aiohttp.ClientSession() as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"Authorization": "Bearer s"}
            async with http.post(f"{adapter.base_url}/chat/completions", json=body, headers=headers) as resp:
                return resp.status, await resp.json()
    finally:
        await adapter.stop()
        await client.aclose()


def _agent_engine(http_server, change):
    async def handler(request):
        reply = copy.deepcopy(RECORDED)
        reply["meta_info"]["id"] = (await request.json())["rid"]  # SGLang answers under the request's rid
        change(reply, reply["meta_info"])
        return web.json_response(reply)

    return http_server(handler)


async def test_the_adapter_reads_a_reply_under_its_rid(tok, http_server):
    status, body = await _chat_through_adapter(tok, await _agent_engine(http_server, lambda r, m: None))
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # Before: HTTP 200, another request's reply answered (and recorded for training) as this call's.
        (_set_meta("id", "another-request"), r"answered rid '[0-9a-f]{32}' with the reply of rid"),
        # Before: HTTP 200 with finish_reason "stop"; a finish reason given as text was an HTTP 500 (AttributeError).
        (_set_meta("finish_reason", {"type": "eos"}), r"meta_info\.finish_reason is \{'type': 'eos'\}"),
        (_set_meta("finish_reason", "eos"), r"meta_info\.finish_reason is 'eos'"),
    ],
    ids=["another rid", "unknown finish type", "finish reason as text"],
)
async def test_the_adapter_refuses_a_reply_that_is_not_this_calls(tok, http_server, change, message):
    url = await _agent_engine(http_server, change)
    status, body = await _chat_through_adapter(tok, url)
    assert status == 502, body
    said = body["error"]["message"]
    assert said.startswith(f"session s: engine {url}/generate") and re.search(message, said), said


# ---- weight version (every weight push checks it) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_info", "old_route", "version"),
    [
        (WIRE["model_info"]["reply"], None, "default"),  # SGLang 0.5.16, recorded
        ({"model_path": "m"}, {"weight_version": "3"}, "3"),  # an older SGLang: the deprecated route answers
    ],
)
async def test_the_weight_version_is_read_from_either_route(http_server, model_info, old_route, version):
    async def handler(request):
        return web.json_response(model_info if request.path == "/model_info" else old_route)

    engine = EngineClient(await http_server(handler), max_retries=0)
    try:
        assert await engine.get_weight_version() == version
    finally:
        await engine.aclose()


@pytest.mark.parametrize("old_route", [{}, "<html>ok</html>"], ids=["no key", "html"])
async def test_a_weight_version_in_neither_reply_names_the_engine(http_server, old_route):
    """Before: a bare KeyError 'weight_version' / TypeError "string indices must be integers"."""

    async def handler(request):
        if request.path == "/model_info":
            return web.json_response({"model_path": "m"})
        if isinstance(old_route, str):
            return web.Response(text=old_route, content_type="text/html")
        return web.json_response(old_route)

    url = await http_server(handler)
    engine = EngineClient(url, max_retries=0)
    try:
        with pytest.raises(
            EngineError, match=rf"^engine {re.escape(url)}/get_weight_version failed: no weight_version"
        ):
            await engine.get_weight_version()
    finally:
        await engine.aclose()


async def test_with_fault_tolerance_a_503_is_retried_within_the_recovery_timeout_and_said(http_server, caplog):
    """`--use-fault-tolerance`: a 503 goes to a serving engine (again this one, the only one) until
    `--rollout-engine-recovery-timeout`; before, those retries were silent until the final error."""
    from slime_rollout.engines.pool import NoHealthyEngineError

    url = await _serve_json(http_server, {"error": {"message": "overloaded"}}, status=503)
    client = RolloutClient([url], failover=True, recovery_timeout=1.0, slow_warning_s=60.0)
    caplog.set_level("WARNING", logger="slime_rollout.engines.pool")
    try:
        with pytest.raises(NoHealthyEngineError, match=r"for 1s \(--rollout-engine-recovery-timeout\)"):
            await asyncio.wait_for(client.generate({"input_ids": PROMPT}), 30)
    finally:
        await client.aclose()
    said = [r.getMessage() for r in caplog.records if r.name == "slime_rollout.engines.pool"]
    assert len(said) == 1, said  # one line per engine per half warning interval, not one per retry
    assert said[0].startswith(f"engine {url}/generate failed (HTTP 503): ")
    assert "the request goes to a serving engine (--use-fault-tolerance)" in said[0]
    assert client.pool.stats.requeued_requests >= 2
