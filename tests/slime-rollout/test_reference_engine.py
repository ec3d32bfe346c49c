"""The CPU reference engine against an independent transformers forward (tiny random Qwen3, fp32)."""

import asyncio
import shutil

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slime_rollout.engines.client import EngineClient, EngineError, RolloutClient
from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.reference.request import GenRequest
from slime_rollout.engines.reference.sampling import SamplingParams, sample_next_token, sample_with_kept_ids

LOGPROB_ATOL = 1e-5  # fp32 engine (left-padded, KV cache) vs one unpadded forward


@pytest.fixture(scope="module")
def hf(tiny_qwen3_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_qwen3_dir)


def reference_logprobs(model, prompt_ids, output_ids, temperature):
    """log p(output_t | prefix) from one full forward; temperature-scaled (greedy: unscaled)."""
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logits = logits[len(prompt_ids) - 1 : -1]
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, dim=-1)
    return lp[torch.arange(len(output_ids)), torch.tensor(output_ids)], logits


def prompt(tok, text="Natalia sold clips to 48 of her friends in April. How many clips?"):
    return tok.encode(text)


@pytest.fixture
def engine(reference_engine):
    return EngineClient(reference_engine.urls[0], timeout=120)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.0])
async def test_logprobs_match_transformers(engine, hf, temperature):
    model, tok = hf
    ids = prompt(tok)
    out = await engine.generate(
        {
            "input_ids": ids,
            "sampling_params": {
                "temperature": temperature,
                "max_new_tokens": 6,
                "ignore_eos": True,
                "sampling_seed": 3,
            },
            "return_logprob": True,
        }
    )
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 6
    assert meta["weight_version"] == "default"
    lps = meta["output_token_logprobs"]
    assert [e[1] for e in lps] == out["output_ids"] and all(e[2] is None for e in lps)
    expected, logits = reference_logprobs(model, ids, out["output_ids"], temperature)
    got = torch.tensor([e[0] for e in lps], dtype=torch.float32)
    torch.testing.assert_close(got, expected, atol=LOGPROB_ATOL, rtol=0)
    if temperature == 0.0:
        assert out["output_ids"] == logits.argmax(-1).tolist()
    assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)


async def test_top_p_replay_returns_the_kept_ids_and_renormalized_log_probs(engine, hf):
    # Issue 17: with custom_params.return_top_p_token_ids the engine reports each step's nucleus (SGLang-with-patch
    # field names) and the log-prob of the distribution it sampled from: softmax(logits/T) renormalized over it.
    from slime_core.algorithms import KeptTokens, log_probs_from_logits
    from slime_rollout.generation.top_p_replay import parse_top_p_sets

    model, tok = hf
    ids = prompt(tok)
    sampling = {"temperature": 0.9, "top_p": 0.3, "max_new_tokens": 3, "ignore_eos": True, "sampling_seed": 5}
    out = await engine.generate(
        {
            "input_ids": ids,
            "sampling_params": {**sampling, "custom_params": {"return_top_p_token_ids": True}},
            "return_logprob": True,
        }
    )
    kept_ids, offsets = parse_top_p_sets(out["meta_info"], len(out["output_ids"]))
    nuclei = [kept_ids[offsets[t] : offsets[t + 1]] for t in range(len(out["output_ids"]))]
    assert all(t in n for t, n in zip(out["output_ids"], nuclei, strict=True))  # sampled from its nucleus
    _, logits = reference_logprobs(model, ids, out["output_ids"], 0.9)  # logits already / T
    # Independent check of the nucleus rule (up to fp32 ties at its edge): the most likely tokens, just enough of
    # them to reach the top-p mass.
    for t, n in enumerate(nuclei):
        probs = torch.softmax(logits[t].double(), -1)
        inside = torch.zeros_like(probs, dtype=torch.bool)
        inside[n] = True
        assert probs[inside].min() >= probs[~inside].max() - 1e-7
        mass = probs[inside].sum()
        assert mass - probs[inside].min() <= 0.3 + 1e-5 and mass >= 0.3 - 1e-5
    expected = log_probs_from_logits(
        logits, torch.tensor(out["output_ids"]), kept=KeptTokens.from_offsets([kept_ids], [offsets])
    )
    got = torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])
    # The random tiny model is nearly uniform: nuclei hold ~10^4 ids, log-probs are ~-10 and fp32 sums over that
    # many terms agree to ~1e-6 relative.
    torch.testing.assert_close(got, expected, atol=LOGPROB_ATOL, rtol=1e-5)
    plain = await engine.generate({"input_ids": ids, "sampling_params": sampling, "return_logprob": True})
    assert "top_p_token_ids" not in plain["meta_info"]  # only when asked


async def test_sampling_seed_is_deterministic_and_text_input_works(engine, hf):
    _, tok = hf
    text = "Question: what is 2+3?"
    sp = {"temperature": 1.0, "max_new_tokens": 5, "ignore_eos": True, "sampling_seed": 11}
    a = await engine.generate({"text": text, "sampling_params": sp})
    b = await engine.generate({"input_ids": tok.encode(text), "sampling_params": sp})
    c = await engine.generate({"text": text, "sampling_params": {**sp, "sampling_seed": 12}})
    assert a["output_ids"] == b["output_ids"]
    assert a["output_ids"] != c["output_ids"]  # 151936-way near-uniform draws: a collision is ~impossible


def _first_clean_new_token(tok, ids, start=1):
    """Index k >= start whose token is new in ids[:k] and decodes to visible text not seen before."""
    for k in range(start, len(ids)):
        piece = tok.decode([ids[k]])
        prefix = tok.decode(ids[:k])
        if ids[k] not in ids[:k] and piece.strip() and "\ufffd" not in piece and piece not in prefix:
            return k, piece
    pytest.skip("no clean token in the greedy continuation")


async def test_stop_token_ids_and_no_stop_trim(engine, hf):
    _, tok = hf
    ids = prompt(tok)
    # Seeded sampling: the same seed replays the same tokens, so a stopped run is a prefix of the full one
    # (greedy decoding of a random model tends to repeat one token).
    base = {"temperature": 1.0, "max_new_tokens": 10, "ignore_eos": True, "sampling_seed": 5}
    full = (await engine.generate({"input_ids": ids, "sampling_params": base}))["output_ids"]
    k, _ = _first_clean_new_token(tok, full)
    stop_id = full[k]
    base["ignore_eos"] = False  # as SGLang, ignore_eos turns stop_token_ids off too (test_reference_finish.py)
    out = await engine.generate({"input_ids": ids, "sampling_params": {**base, "stop_token_ids": [stop_id]}})
    assert out["output_ids"] == full[: k + 1]  # the stop token is kept in the tokens
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert out["text"] == tok.decode(full[:k])  # ... and trimmed from the text
    kept = await engine.generate(
        {"input_ids": ids, "sampling_params": {**base, "stop_token_ids": [stop_id], "no_stop_trim": True}}
    )
    assert kept["text"] == tok.decode(full[: k + 1])


async def test_stop_strings_and_no_stop_trim(engine, hf):
    _, tok = hf
    ids = prompt(tok, "The answer is")
    # Seeded sampling: the same seed replays the same tokens, so a stopped run is a prefix of the full one
    # (greedy decoding of a random model tends to repeat one token).
    base = {"temperature": 1.0, "max_new_tokens": 10, "ignore_eos": True, "sampling_seed": 5}
    full = (await engine.generate({"input_ids": ids, "sampling_params": base}))["output_ids"]
    k, piece = _first_clean_new_token(tok, full)
    out = await engine.generate({"input_ids": ids, "sampling_params": {**base, "stop": [piece]}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": piece}
    assert out["output_ids"] == full[: k + 1]
    text_k1 = tok.decode(full[: k + 1])
    assert out["text"] == text_k1[: text_k1.find(piece)]
    kept = await engine.generate({"input_ids": ids, "sampling_params": {**base, "stop": piece, "no_stop_trim": True}})
    assert kept["text"] == text_k1


async def test_concurrent_requests_match_sequential(engine, hf):
    _, tok = hf
    texts = ["Hi", "A much longer prompt about clips and friends in April and May", "2+2=", "Tell me"]
    reqs = [
        {
            "input_ids": tok.encode(t),
            "sampling_params": {"temperature": 0.9, "max_new_tokens": 4 + i, "ignore_eos": True, "sampling_seed": i},
            "return_logprob": True,
        }
        for i, t in enumerate(texts)
    ]
    sequential = [await engine.generate(r) for r in reqs]
    concurrent = await asyncio.gather(*(engine.generate(r) for r in reqs))
    for s, c in zip(sequential, concurrent, strict=True):
        assert s["output_ids"] == c["output_ids"]
        torch.testing.assert_close(
            torch.tensor([e[0] for e in c["meta_info"]["output_token_logprobs"]]),
            torch.tensor([e[0] for e in s["meta_info"]["output_token_logprobs"]]),
            atol=LOGPROB_ATOL,
            rtol=0,
        )
    assert [c["meta_info"]["completion_tokens"] for c in concurrent] == [4, 5, 6, 7]


async def test_batch_input_returns_a_list(engine, hf):
    _, tok = hf
    out = await engine.generate(
        {
            "input_ids": [tok.encode("a"), tok.encode("bb b")],
            "sampling_params": {"max_new_tokens": 2, "ignore_eos": True},
        }
    )
    assert isinstance(out, list) and [len(o["output_ids"]) for o in out] == [2, 2]


async def test_max_new_tokens_zero_and_bad_params(engine, hf):
    _, tok = hf
    out = await engine.generate({"input_ids": tok.encode("x"), "sampling_params": {"max_new_tokens": 0}})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"
    with pytest.raises(EngineError) as e:
        await engine.generate({"input_ids": tok.encode("x"), "sampling_params": {"top_p": 0}})
    assert engine.url in str(e.value) and "/generate" in str(e.value) and "top_p" in str(e.value)
    with pytest.raises(EngineError, match="unknown field"):
        await engine.generate({"input_ids": [1], "sampling_params": {"temprature": 1.0}})


async def _wait_running(engine, n=1, timeout=60.0):
    for _ in range(int(timeout / 0.05)):
        if await engine.num_unfinished_requests() >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("request never started")


async def test_abort_all_leaves_nothing_running(engine, hf):
    _, tok = hf
    long = {"input_ids": tok.encode("go"), "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
    task = asyncio.create_task(engine.generate({**long, "return_logprob": True}))
    await _wait_running(engine)
    await RolloutClient([engine.url]).abort_all(timeout_s=60)
    out = await asyncio.wait_for(task, 60)
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(out["output_ids"]) < 1500
    assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])
    assert await engine.num_unfinished_requests() == 0


async def test_abort_by_rid_only_hits_that_request(engine, hf):
    _, tok = hf
    sp = {"max_new_tokens": 1500, "ignore_eos": True}
    victim = asyncio.create_task(
        engine.generate({"input_ids": tok.encode("a"), "sampling_params": sp, "rid": "victim"})
    )
    other = asyncio.create_task(
        engine.generate({"input_ids": tok.encode("b"), "sampling_params": {**sp, "max_new_tokens": 30}, "rid": "o"})
    )
    await _wait_running(engine, 1)
    await engine.abort_request(rid="victim")
    v, o = await asyncio.wait_for(asyncio.gather(victim, other), 120)
    assert v["meta_info"]["finish_reason"]["type"] == "abort"
    assert o["meta_info"]["finish_reason"] == {"type": "length", "length": 30}


async def test_pause_abort_mode_then_continue(engine, hf):
    _, tok = hf
    sp = {"max_new_tokens": 1500, "ignore_eos": True}
    task = asyncio.create_task(engine.generate({"input_ids": tok.encode("a"), "sampling_params": sp}))
    await _wait_running(engine)
    await engine.pause_generation()  # default mode "abort", as slime sends it
    assert (await asyncio.wait_for(task, 60))["meta_info"]["finish_reason"]["type"] == "abort"
    queued = asyncio.create_task(
        engine.generate({"input_ids": tok.encode("a"), "sampling_params": {"max_new_tokens": 2}})
    )
    await asyncio.sleep(0.3)
    assert not queued.done()  # paused: held until continue
    await engine.continue_generation()
    assert len((await asyncio.wait_for(queued, 60))["output_ids"]) <= 2


async def test_control_and_info_endpoints(engine, tiny_qwen3_dir):
    assert await engine.health() and await engine.health_generate()
    await engine.flush_cache()
    await engine.release_memory_occupation()
    await engine.resume_memory_occupation(tags=["weights"])
    info = await engine.model_info()
    assert info["is_generation"] is True and info["model_path"] == str(tiny_qwen3_dir)
    server = await engine.server_info()
    assert server["model_path"] == str(tiny_qwen3_dir) and server["tp_size"] == 1
    async with httpx.AsyncClient() as c:
        assert (await c.get(engine.url + "/get_model_info")).status_code == 200
        assert (await c.post(engine.url + "/flush_cache")).status_code == 200
    loads = await engine.get_loads()
    assert loads["loads"][0]["num_running_reqs"] == 0


# ------------------------------------------------------------------------- in-process unit tests


def test_sample_next_token_logprob_is_temperature_scaled_before_truncation():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.5, top_k=1)
    token, lp = sample_next_token(logits, params, gen)
    assert token == 0  # top_k=1 forces the argmax
    # log softmax(logits / 0.5)[0], by hand: 4 - log(e^4 + e^2 + e^1 + e^-2)
    expected = 4.0 - torch.log(torch.exp(torch.tensor([4.0, 2.0, 1.0, -2.0])).sum()).item()
    assert abs(lp - expected) < 1e-6
    top_p = SamplingParams(temperature=1.0, top_p=0.5)  # p(0) = 0.61 > 0.5: only token 0 survives
    assert {sample_next_token(logits, top_p, gen)[0] for _ in range(50)} == {0}
    greedy_token, greedy_lp = sample_next_token(logits, SamplingParams(temperature=0.0), gen)
    assert greedy_token == 0 and abs(greedy_lp - torch.log_softmax(logits, -1)[0].item()) < 1e-6


def test_sample_with_kept_ids_by_hand():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    gen = torch.Generator().manual_seed(0)
    # p ∝ e^[2, 1, 0.5, -1] = [.61, .22, .14, .03]: top_p 0.7 keeps {0, 1} (mass before token 2 is .83 > .7).
    token, lp, kept = sample_with_kept_ids(logits, SamplingParams(top_p=0.7), gen)
    assert kept == [0, 1] and token in kept
    z = torch.tensor([2.0, 1.0])
    assert abs(lp - torch.log_softmax(z, -1)[kept.index(token)].item()) < 1e-6
    assert sample_with_kept_ids(logits, SamplingParams(temperature=0.0), gen) == (0, 0.0, [0])
    assert sample_with_kept_ids(logits, SamplingParams(), gen)[2] is None  # nothing truncated: nothing to replay


def test_eos_ignore_eos_and_min_new_tokens(tiny_qwen3_dir):
    model = ReferenceModel(str(tiny_qwen3_dir))
    eos = 151645
    assert eos in model.eos_token_ids
    logits = torch.full((151936,), -10.0)
    logits[eos] = 10.0

    def step(**kw):
        kw = {"temperature": 0.0, "max_new_tokens": 5, **kw}
        r = GenRequest(rid="r", input_ids=[1, 2], params=SamplingParams(**kw))
        model._step(r, logits)
        return r

    assert step().finish_reason == {"type": "stop", "matched": eos}
    assert step(ignore_eos=True).finish_reason is None
    assert step(min_new_tokens=2).finish_reason is None
    r = step(max_new_tokens=1, ignore_eos=True)
    assert r.finish_reason == {"type": "length", "length": 1} and r.output_ids == [eos]
    assert model.output_text(step()) == ""  # eos trimmed from the text, kept in output_ids


async def test_prompt_logprobs_for_teacher_scoring(engine, hf):
    """OPD-style scoring: max_new_tokens 0, logprob_start_len 0 -> input_token_logprobs of the prompt."""
    model, tok = hf
    ids = prompt(tok)
    scoring = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    other = {"input_ids": ids[:5], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
    out, _ = await asyncio.gather(engine.generate(scoring), engine.generate(other))  # may share a batch
    entries = out["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == ids and entries[0][0] is None
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    expected = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    torch.testing.assert_close(torch.tensor([e[0] for e in entries[1:]]), expected, atol=LOGPROB_ATOL, rtol=0)
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"
    tail = await engine.generate({**scoring, "logprob_start_len": 3})
    tail_entries = tail["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in tail_entries] == ids[3:]
    # SGLang's rule (recorded from 0.5.16): the entry at logprob_start_len is None whatever the start.
    assert tail_entries[0][0] is None
    torch.testing.assert_close(torch.tensor([e[0] for e in tail_entries[1:]]), expected[3:], atol=LOGPROB_ATOL, rtol=0)


async def test_requests_joining_a_running_batch_match_sequential(engine, hf):
    """Continuous batching: requests admitted mid-generation (cache merge with left padding) are unaffected."""
    model, tok = hf
    texts = ["One", "A somewhat longer prompt that is longer than the first one", "x y"]
    reqs = [
        {
            "input_ids": tok.encode(t),
            "sampling_params": {
                "temperature": 0.8,
                "max_new_tokens": n,
                "ignore_eos": True,
                "sampling_seed": 100 + i,
            },
            "return_logprob": True,
        }
        for i, (t, n) in enumerate(zip(texts, [60, 12, 20], strict=True))
    ]
    sequential = [await engine.generate(r) for r in reqs]
    first = asyncio.create_task(engine.generate(reqs[0]))
    await _wait_running(engine)
    await asyncio.sleep(0.2)  # let it decode a few steps so the caches differ in length
    later = await asyncio.gather(*(engine.generate(r) for r in reqs[1:]))
    joined = [await first, *later]
    for r, s, j in zip(reqs, sequential, joined, strict=True):
        assert j["output_ids"] == s["output_ids"]
        got = torch.tensor([e[0] for e in j["meta_info"]["output_token_logprobs"]])
        expected, _ = reference_logprobs(model, r["input_ids"], j["output_ids"], 0.8)
        torch.testing.assert_close(got, expected, atol=LOGPROB_ATOL, rtol=0)
    assert all(j["meta_info"]["finish_reason"]["type"] == "length" for j in joined)


def test_merge_into_running_batch_is_exact(tiny_qwen3_dir):
    """Deterministic continuous-batching check: B and C join A's batch at decode step 3 (in-process)."""
    model = ReferenceModel(str(tiny_qwen3_dir))

    def make(rid, ids, n, seed):
        sp = SamplingParams(temperature=0.9, max_new_tokens=n, ignore_eos=True)
        return GenRequest(rid=rid, input_ids=ids, params=sp, generator=torch.Generator().manual_seed(seed))

    specs = [
        ("a", [9707, 11, 1246, 525], 15, 1),
        ("b", [785, 4226, 374, 220, 17, 10, 17, 28, 30], 6, 2),
        ("c", [16], 9, 3),
    ]
    alone = []
    for spec in specs:
        r = make(*spec)
        model.generate([r])
        alone.append(r)
    a, b, c = (make(*spec) for spec in specs)
    calls, finished = [], []

    def take_new(n):
        calls.append(n)
        return [b, c] if len(calls) == 3 else []

    model.generate([a], notify=finished.append, take_new=take_new, max_batch=8)
    assert [r.rid for r in finished] == ["b", "c", "a"]  # b and c joined late and finished first
    for r, ref in zip((a, b, c), alone, strict=True):
        assert r.output_ids == ref.output_ids
        torch.testing.assert_close(
            torch.tensor(r.output_logprobs), torch.tensor(ref.output_logprobs), atol=LOGPROB_ATOL, rtol=0
        )


def test_a_bucket_with_one_bad_tensor_changes_no_weight(tiny_qwen3_dir):
    # Fifth hostile pass on issue 27 (item 15): the tensors before the bad one were copied, so a refused bucket
    # left the engine with a mix of two versions under the old weight version.
    model = ReferenceModel(str(tiny_qwen3_dir))
    name = "model.layers.0.mlp.up_proj.weight"
    before = model.model.state_dict()[name].clone()
    new = torch.full_like(before, 0.5)
    with pytest.raises(KeyError, match="unknown parameter 'model.nope.weight'"):
        model.weights.load_named_tensors([(name, new), ("model.nope.weight", new)])
    with pytest.raises(ValueError, match="shape mismatch"):
        model.weights.load_named_tensors([(name, new), ("model.layers.0.mlp.down_proj.weight", torch.zeros(1))])
    assert torch.equal(model.model.state_dict()[name], before)  # was all 0.5
    assert model.weights.load_named_tensors([(name, new)]) == 1
    assert torch.equal(model.model.state_dict()[name], new)


def test_the_served_model_path_follows_a_load_from_disk(tiny_qwen3_dir, tmp_path):
    # /get_model_info's model_path is the weights' directory: it moves with /update_weights_from_disk.
    model = ReferenceModel(str(tiny_qwen3_dir))
    assert model.model_path == str(tiny_qwen3_dir)
    for f in tiny_qwen3_dir.glob("*.safetensors"):
        shutil.copy(f, tmp_path / f.name)
    assert model.weights.load_from_disk(str(tmp_path)) == len(model.model.state_dict()) - 1  # lm_head tied
    assert model.model_path == str(tmp_path)


def test_a_weight_update_to_an_engine_whose_weights_are_released_is_refused(reference_args, tiny_qwen3_dir,
                                                                              private_tmp):  # fmt: skip
    """Was: the reference engine took the update into its released weights and zeroed them at the resume, so the
    engine served a zero model under the pushed version (SGLang writes into unmapped memory). Now one refusal."""
    from slime_rollout.engines.launch import launch_engines

    body = {"input_ids": [785, 4226, 374], "sampling_params": {"temperature": 0.0, "max_new_tokens": 3,
            "ignore_eos": True}, "return_logprob": True}  # fmt: skip

    async def push_while_released(url):
        engine = EngineClient(url, timeout=60, max_retries=0)
        try:
            before = (await engine.generate(body))["meta_info"]["output_token_logprobs"]
            await engine.request("POST", "/release_memory_occupation", {})
            with pytest.raises(EngineError) as refused:
                await engine.update_weights_from_disk(model_path=str(tiny_qwen3_dir), weight_version="7")
            version = await engine.get_weight_version()
            await engine.request("POST", "/resume_memory_occupation", {"tags": ["weights"]})
            await engine.update_weights_from_disk(model_path=str(tiny_qwen3_dir), weight_version="7")
            after = (await engine.generate(body))["meta_info"]["output_token_logprobs"]
            return str(refused.value), version, before, after
        finally:
            await engine.aclose()

    cfg = reference_args(tiny_qwen3_dir)
    with launch_engines(cfg, num_engines=1, gpus_per_engine=1, colocate=True, startup_timeout_s=300,
                        log_dir=private_tmp / "released-logs") as group:  # fmt: skip
        refusal, version, before, after = asyncio.run(push_while_released(group.urls[0]))
    assert "/update_weights_from_disk: the weights are released (/release_memory_occupation)" in refusal
    assert version != "7"  # the refused update did not move the version
    assert after == before  # resumed (zeroed), then updated: the checkpoint's model again
