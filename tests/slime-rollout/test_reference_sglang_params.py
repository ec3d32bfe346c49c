"""The reference engine reads `/generate` requests as SGLang 0.5.16 does (issue 27, hostile pass on the wire).

Each case cites the SGLang 0.5.16 source it follows (the wheel's `sglang/srt/...`); the recorded replies of
`tests/fixtures/sglang-wire` cover the plain requests, these cover the sampling fields, budgets and refusals that
were not recorded. Before the fixes the engine silently ignored `min_p`, the penalties and `n`, refused
`logit_bias`, answered an out-of-vocabulary id with HTTP 500, generated past SGLang's budget, and gave a request
aborted in the waiting queue the reply of a running one.
"""

from __future__ import annotations

import concurrent.futures
import math
import time

import pytest

pytest.importorskip("fastapi", reason="the reference engine's HTTP app needs fastapi (absent on the GPU trainer path)")
import torch  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from slime_rollout.engines.reference.logits import adjust_logits  # noqa: E402
from slime_rollout.engines.reference.model import ReferenceModel  # noqa: E402
from slime_rollout.engines.reference.sampling import SamplingParams  # noqa: E402
from slime_rollout.engines.reference.server import build_app  # noqa: E402

PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]  # "The answer to 2+2=", as recorded
EOS = 151645  # <|im_end|>, the tiny model's eos (tests/conftest.py QWEN3_SPECIAL_IDS)
GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 3}


@pytest.fixture(scope="module")
def engine_client(tiny_qwen3_dir):
    app = build_app(ReferenceModel(str(tiny_qwen3_dir)), max_running_requests=2, random_seed=0, server_args={})
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def short_context_client(private_tmp, make_tiny_qwen3):
    # A 16-token context: SGLang's budget arithmetic shows within a few decode steps.
    model_dir = make_tiny_qwen3(private_tmp / "ctx16-qwen3", max_position_embeddings=16)
    app = build_app(ReferenceModel(str(model_dir)), max_running_requests=2, random_seed=0, server_args={})
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def generate(client: TestClient, **body):
    return client.post("/generate", json={"input_ids": PROMPT, **body})


# sampling/sampling_params.py `SamplingParams.verify`: HTTP 400 `{"error": {"message": str(ValueError)}}`
# (entrypoints/http_server.py `_create_error_response`).
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": -1.0}, "temperature must be a non-negative finite number, got -1.0."),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0."),
        ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
        ({"top_k": 0, "temperature": 1.0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"frequency_penalty": 3.0}, "frequency_penalty must be in [-2, 2], got 3.0."),
        ({"presence_penalty": -2.5}, "presence_penalty must be in [-2, 2], got -2.5."),
        ({"repetition_penalty": 5.0}, "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 5.0."),
        ({"min_new_tokens": 5, "max_new_tokens": 3}, "min_new_tokens must be in [0, max_new_tokens(3)], got 5."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        ({"logit_bias": {"151936": 1.0}}, "logit_bias must has keys in [0, 151935], got 151936."),
        ({"regex": "a", "ebnf": "b"}, "Only one of regex, json_schema, or ebnf can be set."),
    ],
)
def test_out_of_range_sampling_params_get_sglangs_400(engine_client, params, message):
    reply = generate(engine_client, sampling_params=params)
    assert (reply.status_code, reply.json()) == (400, {"error": {"message": message}})


def test_top_k_zero_is_accepted_when_greedy(engine_client):
    # SamplingParams.__post_init__ turns temperature 0 into top_k 1 before verify() runs.
    assert generate(engine_client, sampling_params={**GREEDY, "top_k": 0}).status_code == 200


def test_nulls_take_sglangs_defaults(engine_client):
    nulls = {k: None for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "n", "stop")}
    reply = generate(engine_client, sampling_params={**nulls, "max_new_tokens": 2, "ignore_eos": True})
    assert reply.status_code == 200 and reply.json()["meta_info"]["completion_tokens"] == 2


def test_an_unsupported_field_is_refused_by_name_not_ignored(engine_client):
    reply = generate(engine_client, sampling_params={**GREEDY, "json_schema": '{"type": "string"}'})
    assert reply.status_code == 400 and reply.json()["error"]["message"].startswith("sampling_params.json_schema:")


def test_min_p_one_keeps_only_the_most_likely_token(engine_client):
    # layers/sampler.py: min-p keeps tokens with prob >= min_p * the top prob; min_p=1 draws the argmax at any
    # temperature. The reported log-prob is the untruncated log_softmax(logits / T), here T=1: greedy's value.
    greedy = generate(engine_client, return_logprob=True, sampling_params=GREEDY).json()
    hot = {**GREEDY, "temperature": 1.0, "min_p": 1.0}
    for seed in range(3):
        got = generate(engine_client, return_logprob=True, sampling_params={**hot, "sampling_seed": seed}).json()
        assert got["output_ids"] == greedy["output_ids"]
        want = greedy["meta_info"]["output_token_logprobs"]
        for (lp, t, _), (want_lp, want_t, _) in zip(got["meta_info"]["output_token_logprobs"], want, strict=True):
            assert t == want_t and math.isclose(lp, want_lp, abs_tol=1e-5)


def test_logit_bias_steers_sampling_and_the_reported_log_probs(engine_client):
    # sampling_batch_info.py apply_logits_bias: the bias is added to the logits sampling and log-probs come from.
    reply = generate(engine_client, return_logprob=True, sampling_params={**GREEDY, "logit_bias": {"5": 100.0}})
    assert reply.status_code == 200, reply.text
    meta = reply.json()["meta_info"]
    assert reply.json()["output_ids"] == [5, 5, 5]
    # A +100 logit on a near-flat random model: its probability is 1 within float32.
    assert all(t == 5 and lp > -1e-3 for lp, t, _ in meta["output_token_logprobs"])


def test_presence_penalty_stops_greedy_repeats(engine_client):
    # The tiny random model repeats its argmax ("===" recorded as 150709 150709 61201 61201 on SGLang); its
    # logits span well under 2, so a presence penalty of 2 (penaltylib/presence_penalty.py) rules out any repeat.
    plain = generate(engine_client, sampling_params=GREEDY).json()["output_ids"]
    assert len(set(plain)) < 3  # the premise: unpenalized greedy repeats
    got = generate(engine_client, sampling_params={**GREEDY, "presence_penalty": 2.0}).json()["output_ids"]
    assert got[0] == plain[0] and len(set(got)) == 3


def test_min_new_tokens_masks_eos_instead_of_ignoring_it(engine_client):
    # penaltylib/min_new_tokens.py: eos and stop ids get -inf logits until min_new_tokens exist; a bias that makes
    # eos certain then ends the request right at the minimum, with eos as its last token.
    sp = {"temperature": 0.0, "max_new_tokens": 6, "min_new_tokens": 2, "logit_bias": {str(EOS): 100.0}}
    reply = generate(engine_client, return_logprob=True, sampling_params=sp).json()
    ids, meta = reply["output_ids"], reply["meta_info"]
    assert len(ids) == 3 and EOS not in ids[:2] and ids[2] == EOS
    assert meta["finish_reason"] == {"type": "stop", "matched": EOS}
    assert all(math.isfinite(lp) for lp, _, _ in meta["output_token_logprobs"])


def test_adjust_logits_by_hand():
    # counts [2, 1, 0]: additive [1 - 2*0.5 - 0.25, -1 - 0.5 - 0.25, 0.5] = [-0.25, -1.75, 0.5]; repetition 2 on the
    # seen ids (negative: times 2) [-0.5, -3.5, 0.5]; bias +1 on id 2 -> 1.5; min_new_tokens 5 masks stop id 1.
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0,
                            logit_bias={2: 1.0}, min_new_tokens=5)  # fmt: skip
    got = adjust_logits(torch.tensor([1.0, -1.0, 0.5]), params, [0, 0, 1], {1})
    assert got.tolist() == [-0.5, float("-inf"), 1.5]
    positive = adjust_logits(torch.tensor([3.0, 0.0]), SamplingParams(repetition_penalty=2.0), [0], set())
    assert positive.tolist() == [1.5, 0.0]  # a positive logit is divided


def test_n_gives_n_samples_per_prompt_under_fresh_ids(engine_client):
    # io_struct.py _handle_parallel_sampling: a single prompt with n > 1 becomes a batch; tokenizer_manager.py
    # _handle_batch_request: prompt by prompt, n each, every one under a regenerated rid.
    reply = generate(engine_client, rid="mine", sampling_params={**GREEDY, "n": 3})
    assert reply.status_code == 200
    outs = reply.json()
    assert isinstance(outs, list) and len(outs) == 3
    assert len({o["meta_info"]["id"] for o in outs} | {"mine"}) == 4
    two = engine_client.post("/generate", json={"input_ids": [PROMPT, PROMPT[:4]],
                                                "sampling_params": {**GREEDY, "n": 2}})  # fmt: skip
    assert [o["meta_info"]["prompt_tokens"] for o in two.json()] == [8, 8, 4, 4]
    mixed = engine_client.post("/generate", json={"input_ids": [PROMPT, PROMPT],
                                                  "sampling_params": [{**GREEDY, "n": 2}, GREEDY]})  # fmt: skip
    assert mixed.status_code == 400
    assert mixed.json()["error"]["message"] == (
        "The parallel_sample_num should be the same for all samples in sample params."
    )


def test_a_batch_with_one_rid_string_numbers_it(engine_client):
    # io_struct.py _normalize_rid: a str rid for a batch becomes f"{rid}_{i}" (was: every request under one rid).
    batch = {"input_ids": [PROMPT, PROMPT], "sampling_params": GREEDY}
    reply = engine_client.post("/generate", json={**batch, "rid": "b"})
    assert [o["meta_info"]["id"] for o in reply.json()] == ["b_0", "b_1"]
    short = engine_client.post("/generate", json={**batch, "rid": ["x"]})
    assert (short.status_code, short.json()["error"]["message"]) == (
        400, "The specified rids length mismatch with the batch_size for batch processing.")  # fmt: skip


def test_return_text_in_logprobs_fills_the_third_entry(engine_client, tok):
    # tokenizer_manager.py detokenize_logprob_tokens: batch_decode([[id] ...]), special tokens kept.
    body = {"return_logprob": True, "logprob_start_len": 6, "top_logprobs_num": 2, "sampling_params": GREEDY}
    plain = generate(engine_client, **body).json()["meta_info"]
    meta = generate(engine_client, return_text_in_logprobs=True, **body).json()["meta_info"]
    assert all(e[2] is None for e in plain["output_token_logprobs"] + plain["input_token_logprobs"])
    for key in ("input_token_logprobs", "output_token_logprobs"):
        assert [e[2] for e in meta[key]] == [tok.decode([e[1]]) for e in meta[key]]
    assert meta["input_top_logprobs"][0] is None  # the first position stays None
    top = meta["output_top_logprobs"][0]
    assert [e[2] for e in top] == [tok.decode([e[1]]) for e in top]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([1, 151936], "The input_ids [1, 151936] contains values greater than the vocab size (151936)."),
        ([-1], "The input_ids [-1] contains a negative value (-1)."),
    ],
)
def test_an_id_outside_the_vocabulary_is_a_400_not_a_crash(engine_client, ids, message):
    # Was an IndexError in the embedding lookup: HTTP 500. Message of tokenizer_manager.py
    # _validate_input_ids_in_vocab (defined, not called, in 0.5.16).
    reply = engine_client.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY})
    assert (reply.status_code, reply.json()) == (400, {"error": {"message": message}})
    assert generate(engine_client, sampling_params=GREEDY).status_code == 200  # still serving


def test_budget_and_context_as_sglang(short_context_client):
    client = short_context_client
    # tokenizer_manager.py _validate_one_request: prompt + max_new_tokens > context is refused.
    over = generate(client, sampling_params={**GREEDY, "max_new_tokens": 9})
    assert over.status_code == 400
    assert over.json()["error"]["message"].startswith(
        "Requested token count exceeds the model's maximum context length of 16 tokens. You requested a total of "
        "17 tokens: 8 tokens from the input messages and 9 tokens for the completion."
    )
    # scheduler.py init_req_max_new_tokens: the budget is clipped to (context - 1) - prompt - 1 = 6, also when
    # max_new_tokens is None (no limit but the context): the recorded reply then says length 6.
    for budget in (8, None):
        meta = generate(client, sampling_params={**GREEDY, "max_new_tokens": budget}).json()["meta_info"]
        assert (meta["completion_tokens"], meta["finish_reason"]) == (6, {"type": "length", "length": 6})
    # A prompt as long as the context is refused outright.
    full = client.post("/generate", json={"input_ids": [17] * 16, "sampling_params": {**GREEDY, "max_new_tokens": 0}})
    assert full.json() == {"error": {"message": "The input (16 tokens) is longer than the model's context length "
                                                "(16 tokens)."}}  # fmt: skip


def test_the_context_length_flag_is_the_engines_context_as_sglangs(private_tmp, make_tiny_qwen3):
    # The engine kept max_position_embeddings (16) under --context-length 32, and refused an 8-token prompt with 12
    # new tokens (the budget the rollout now caps by the flag) with "exceeds the model's maximum context length of 16".
    from slime_rollout.engines.reference.__main__ import parse_args

    model_dir = make_tiny_qwen3(private_tmp / "ctx16-flag-qwen3", max_position_embeddings=16)
    flags = parse_args(["--model-path", str(model_dir), "--context-length", "32"])
    model = ReferenceModel(flags.model_path, context_length=flags.context_length)
    app = build_app(model, max_running_requests=2, random_seed=0, server_args={})
    with TestClient(app, raise_server_exceptions=False) as client:
        reply = generate(client, sampling_params={**GREEDY, "max_new_tokens": 12})
        assert reply.status_code == 200 and reply.json()["meta_info"]["completion_tokens"] == 12
        # Past the flag's context SGLang's refusal names the flag's length.
        over = generate(client, sampling_params={**GREEDY, "max_new_tokens": 25})
        assert over.status_code == 400
        assert "maximum context length of 32 tokens" in over.json()["error"]["message"]


def test_a_request_aborted_in_the_waiting_queue_gets_sglangs_reduced_reply(engine_client):
    # tokenizer_manager.py _handle_abort_req (0.5.16): a request popped from the scheduler's waiting queue answers
    # with finish_reason {"type": "abort", "message": "Abort in waiting queue"} and only these meta_info keys (no
    # prompt_tokens, no cached_tokens): a client that reads them unguarded breaks on SGLang, not on a stand-in.
    # Queued behind two running requests (max_running_requests=2), not behind a pause: SGLang holds a request that
    # arrives while paused before its scheduler, where /abort_request does not reach it.
    scheduler = engine_client.app.state.engine.scheduler
    long = {"sampling_params": {**GREEDY, "max_new_tokens": 2000}}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = [pool.submit(generate, engine_client, rid=f"run{i}", **long) for i in range(2)]
        _wait_for(lambda: scheduler.num_running == 2, "two running requests")
        queued = pool.submit(generate, engine_client, rid="queued", return_logprob=True, sampling_params=GREEDY)
        _wait_for(lambda: scheduler.num_waiting == 1, "the third request to queue")
        assert engine_client.post("/abort_request", json={"rid": "queued"}).status_code == 200
        reply = queued.result(timeout=60)
        for rid in ("run0", "run1"):
            engine_client.post("/abort_request", json={"rid": rid})
        assert [r.result(timeout=60).status_code for r in running] == [200, 200]
    out = reply.json()
    assert (out["text"], out["output_ids"]) == ("", [])
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert set(meta) == {"id", "finish_reason", "weight_version", "e2e_latency", "completion_tokens",
                         "input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length"}  # fmt: skip
    assert (meta["id"], meta["completion_tokens"], meta["output_token_logprobs"]) == ("queued", 0, [])


def _wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_flush_cache_is_refused_while_the_scheduler_holds_a_request(engine_client):
    # entrypoints/http_server.py flush_cache: one text, status 200 if Scheduler.flush_cache succeeded, else 400
    # (it needs no running or waiting request). Was always 200, hiding a client that flushed once and gave up.
    text = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n")  # fmt: skip
    idle = engine_client.get("/flush_cache")
    assert (idle.status_code, idle.text) == (200, text)
    scheduler = engine_client.app.state.engine.scheduler
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        body = {"input_ids": PROMPT, "rid": "long", "sampling_params": {**GREEDY, "max_new_tokens": 2000}}
        pending = pool.submit(engine_client.post, "/generate", json=body)
        try:
            _wait_for(lambda: scheduler.num_running == 1, "the request to run")
            # "in_place" keeps the running request in the scheduler, as SGLang's pause does.
            assert engine_client.post("/pause_generation", json={"mode": "in_place"}).status_code == 200
            busy = engine_client.post("/flush_cache")
            engine_client.post("/abort_request", json={"rid": "long"})
        finally:
            engine_client.post("/continue_generation", json={})
        assert pending.result(timeout=60).json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert (busy.status_code, busy.text) == (400, text)
    _wait_for(lambda: scheduler.num_running == 0, "the aborted request to leave")
    assert engine_client.post("/flush_cache").status_code == 200


def test_a_request_that_arrives_while_paused_does_not_block_flush_cache(engine_client):
    # SGLang's tokenizer manager holds a request that arrives while generation is paused (tokenizer_manager.py
    # generate_request waits on is_pause_cond) before its scheduler: a fully async rollout keeps sending during a
    # weight push, and the push's flush must still succeed (the first version of the 400 above failed the push).
    scheduler = engine_client.app.state.engine.scheduler
    assert engine_client.post("/pause_generation", json={"mode": "abort"}).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(engine_client.post, "/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY})
        try:
            _wait_for(lambda: scheduler.num_waiting == 1, "the request to queue")
            assert engine_client.post("/flush_cache").status_code == 200
        finally:
            engine_client.post("/continue_generation", json={})
        assert pending.result(timeout=60).json()["meta_info"]["completion_tokens"] == 3


def test_a_request_id_in_flight_or_given_twice_is_refused(engine_client):
    # tokenizer_manager.py _init_req_state: "Duplicate request ID detected" while the first request runs (was: both
    # ran, and an abort by that id hit both); io_struct.py _validate_rid_uniqueness within one batch.
    scheduler = engine_client.app.state.engine.scheduler
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        body = {"rid": "dup", "sampling_params": {**GREEDY, "max_new_tokens": 2000}}
        first = pool.submit(generate, engine_client, **body)
        try:
            _wait_for(lambda: scheduler.num_running == 1, "the first request to run")
            again = generate(engine_client, rid="dup", sampling_params=GREEDY)
            in_batch = engine_client.post("/generate", json={"input_ids": [PROMPT, PROMPT], "rid": ["dup", "x"],
                                                             "sampling_params": GREEDY})  # fmt: skip
        finally:
            engine_client.post("/abort_request", json={"rid": "dup"})
        assert first.result(timeout=60).json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert (again.status_code, again.json()) == (400, {"error": {"message": "Duplicate request ID detected: dup"}})
    assert (in_batch.status_code, in_batch.json()) == (
        400,
        {"error": {"message": "Duplicate request ID detected: dup"}},
    )
    twice = engine_client.post("/generate", json={"input_ids": [PROMPT, PROMPT], "rid": ["a", "a"],
                                                  "sampling_params": GREEDY})  # fmt: skip
    assert twice.json() == {"error": {"message": "Duplicate request IDs detected within the request: ['a']"}}
    # Once its reply is out the id is free again.
    assert generate(engine_client, rid="dup", sampling_params=GREEDY).json()["meta_info"]["id"] == "dup"


@pytest.mark.parametrize("abort", [{"abort_all": True}, {"rid": "held"}])
def test_a_request_held_by_a_pause_survives_an_abort_and_runs_after_continue(engine_client, abort):
    # tokenizer_manager.py: a request that arrives while paused waits on is_pause_cond before reaching the scheduler,
    # and abort_request acts in the scheduler; its /v1/loads (the scheduler's) does not count it, so a client's
    # abort-until-idle returns. Was: aborted here ("Abort in waiting queue"), so a CPU run lost what a GPU run keeps.
    scheduler = engine_client.app.state.engine.scheduler
    assert engine_client.post("/pause_generation", json={"mode": "abort"}).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(generate, engine_client, rid="held", sampling_params=GREEDY)
        try:
            _wait_for(lambda: scheduler.num_waiting == 1, "the request to be held")
            assert engine_client.post("/abort_request", json=abort).status_code == 200
            loads = engine_client.get("/v1/loads").json()["loads"][0]
        finally:
            engine_client.post("/continue_generation", json={})
        meta = held.result(timeout=60).json()["meta_info"]
    assert (loads["num_waiting_reqs"], loads["num_running_reqs"]) == (0, 0)
    assert meta["finish_reason"] == {"type": "length", "length": 3}
