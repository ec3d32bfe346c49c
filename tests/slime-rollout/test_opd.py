"""On-policy distillation with a teacher engine: the reference engine scores the student's tokens.

The teacher is the session's CPU reference engine (a tiny random Qwen3); its log-probs are checked against an
independent transformers forward at the rollout temperature. Tolerance 1e-5 (fp32 engine with left padding and
KV cache vs one unpadded forward).
"""

import asyncio
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime_core.config import PluginArgs
from slime_core.plugins import load_function
from slime_core.sample import Sample, Status
from slime_rollout.generation.opd import score_teacher, teacher_log_probs_from_reply
from slime_rollout.rewards import async_rm
from slime_rollout.rewards.checks import RewardFunctionError

ATOL = 1e-5
TEMPERATURE = 0.8


def _samples() -> list[Sample]:
    """Three student samples over the Qwen3 vocabulary (prompt + response ids), one of them aborted."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (prompt, response) in enumerate([(5, 3), (9, 1), (4, 6)]):
        ids = torch.randint(0, 151_000, (prompt + response,), generator=g).tolist()
        out.append(Sample(tokens=ids, response_length=response, index=i, status=Status.COMPLETED, reward=1.0))
    out.append(Sample(tokens=[5, 6, 7], response_length=1, index=3, status=Status.ABORTED))
    return out


def _reference(model_dir, sample: Sample) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sample.tokens])).logits[0].float() / TEMPERATURE
    targets = torch.tensor(sample.response_tokens)
    return torch.log_softmax(logits[sample.prompt_length - 1 : -1], -1)[torch.arange(len(targets)), targets]


@pytest.fixture(scope="module")
def args(reference_args, tiny_qwen3_dir, reference_engine):
    cfg = reference_args(
        tiny_qwen3_dir, use_opd=True, opd_type="sglang", rm_url=f"{reference_engine.urls[0]}/generate",
        rollout_temperature=TEMPERATURE,
    )  # fmt: skip
    return PluginArgs.from_config(cfg)


def test_builtin_scoring_matches_transformers_and_skips_aborted(args, tiny_qwen3_dir):
    samples = _samples()
    assert asyncio.run(score_teacher(args, samples)) == 3
    for s in samples[:3]:
        torch.testing.assert_close(torch.tensor(s.teacher_log_probs), _reference(tiny_qwen3_dir, s), atol=ATOL, rtol=0)
    assert samples[3].teacher_log_probs is None  # aborted: never trains
    assert asyncio.run(score_teacher(args, samples)) == 0  # already scored


def test_original_plugins_give_the_same_log_probs_and_zero_rewards(args, tiny_qwen3_dir):
    # The original's paths resolve in slime-core's loader too (the post-process hook is loaded there).
    from slime_rollout.generation import opd

    reward_path = "slime.rollout.on_policy_distillation.reward_func"
    assert load_function(reward_path, flag="--custom-rm-path") is opd.reward_func
    post = load_function("slime.rollout.on_policy_distillation.post_process_rewards", flag="--custom-reward-...")
    original = args.model_copy(update={
        "custom_rm_path": reward_path,
        "custom_reward_post_process_path": "slime.rollout.on_policy_distillation.post_process_rewards",
    })  # fmt: skip
    samples = _samples()[:3]

    async def score():
        return await asyncio.gather(*(async_rm(original, s) for s in samples))

    for s, reply in zip(samples, asyncio.run(score()), strict=True):
        assert reply["meta_info"]["input_token_logprobs"][0][0] is None  # the whole sequence, as the original asks
        s.reward = reply
    assert asyncio.run(score_teacher(original, samples)) == 0  # the plugins score; the built-in path stays off
    for s in samples:
        s.teacher_log_probs = None
    raw, rewards = post(original, samples)
    assert raw == rewards == [0.0, 0.0, 0.0]
    for s in samples:
        torch.testing.assert_close(torch.tensor(s.teacher_log_probs), _reference(tiny_qwen3_dir, s), atol=ATOL, rtol=0)
        assert s.metadata["raw_reward"] == 0.0  # the reply is no score: logged as 0


def test_pure_distillation_reward_is_zero_without_a_reward_function(args):
    assert asyncio.run(async_rm(args, _samples()[0])) == 0.0
    with pytest.raises(ValueError, match="no reward function"):
        asyncio.run(async_rm(args.model_copy(update={"use_opd": False}), _samples()[0]))


def test_a_reply_that_does_not_fit_its_sample_fails_clearly():
    sample = Sample(tokens=[1, 2, 3, 4], response_length=2, index=7)
    # SGLang's shape: one entry per position from logprob_start_len on, the first entry always None.
    good = {"meta_info": {"input_token_logprobs": [[None, 2, None], [-0.5, 3, None], [-0.25, 4, None]]}}
    assert teacher_log_probs_from_reply(good, sample, logprob_start_len=1) == [-0.5, -0.25]
    with pytest.raises(ValueError, match="sample 7: the teacher returned 3 input log-probs from position 2 for 4"):
        teacher_log_probs_from_reply(good, sample, logprob_start_len=2)
    other = {"meta_info": {"input_token_logprobs": [[None, 2, None], [-0.5, 9, None], [-0.25, 4, None]]}}
    with pytest.raises(ValueError, match="scored other tokens than the response"):
        teacher_log_probs_from_reply(other, sample, logprob_start_len=1)
    with pytest.raises(ValueError, match="has no meta_info.input_token_logprobs"):
        teacher_log_probs_from_reply({"meta_info": {}}, sample, logprob_start_len=2)


@pytest.mark.parametrize(
    ("reply", "shown"), [("<html>It works!</html>", "str '<html>It works!</html>'"), ([1, 2], "list '[1, 2]'")]
)
def test_a_reply_that_is_no_json_object_names_the_sample_and_the_flag(reply, shown):
    # A --rm-url naming a web server (its HTML page, which the HTTP client gives as text) or a service answering a
    # JSON list failed with AttributeError: 'str' object has no attribute 'get', naming neither sample nor flag.
    sample = Sample(tokens=[1, 2, 3, 4], response_length=2, index=7)
    with pytest.raises(ValueError) as err:
        teacher_log_probs_from_reply(reply, sample, logprob_start_len=1)
    assert str(err.value) == (
        f"sample 7: the teacher's reply is {shown}, not SGLang's /generate JSON object: is --rm-url the teacher "
        "engine's http://host:port/generate?"
    )


def test_a_json_reply_without_log_probs_shows_what_it_holds():
    # {"detail": "Not Found"} (a FastAPI service on the --rm-url port) was "has no meta_info.input_token_logprobs".
    sample = Sample(tokens=[1, 2, 3, 4], response_length=2, index=7)
    with pytest.raises(ValueError) as err:
        teacher_log_probs_from_reply({"detail": "Not Found"}, sample, logprob_start_len=1)
    assert str(err.value) == (
        "sample 7: the teacher's reply has no meta_info.input_token_logprobs (its keys: ['detail']; meta_info: []): "
        "is --rm-url the teacher engine's /generate, and does it return log-probs (return_logprob)?"
    )


def test_a_teacher_that_expands_the_images_otherwise_is_read_from_the_tail():
    # A VL teacher with another image processor (Qwen2.5-VL's 14-pixel patches for a Qwen3-VL student's 16, or another
    # max_pixels) expands the image into more or fewer tokens: its reply was refused ("returned 15 input log-probs
    # from position 0 for 12 tokens"), where the original reads the response from the reply's tail.
    sample = Sample(tokens=[1, 151652, *[151655] * 6, 151653, 2, 30, 31], response_length=2, index=4)
    sample.multimodal_inputs = {"images": ["data:image/png;base64,AAAA"]}
    for prompt_len in (13, 6):  # the teacher's own expansion of the 10 prompt tokens
        entries = [[None, 1, None]] + [[-0.1, 7, None]] * (prompt_len - 1) + [[-0.5, 30, None], [-0.25, 31, None]]
        reply = {"meta_info": {"input_token_logprobs": entries}}
        assert teacher_log_probs_from_reply(reply, sample, logprob_start_len=0) == [-0.5, -0.25]
    with pytest.raises(ValueError, match="sample 4: the teacher returned 2 input log-probs from position 0 for 12"):
        teacher_log_probs_from_reply({"meta_info": {"input_token_logprobs": entries[-2:]}}, sample, logprob_start_len=0)
    # Text-only samples keep the exact count: a shifted reply is no other image processor.
    text = Sample(tokens=[1, 2, 3, 4], response_length=2, index=7)
    longer = {
        "meta_info": {"input_token_logprobs": [[None, 1, None], [-0.1, 2, None], [-0.5, 3, None], [-0.2, 4, None]]}
    }
    with pytest.raises(ValueError, match="sample 7: the teacher returned 4 input log-probs from position 1 for 4"):
        teacher_log_probs_from_reply(longer, text, logprob_start_len=1)


def test_ids_sglang_clips_to_zero_are_not_a_mismatch():
    """SGLang answers id 0 for an input id >= vocab size - 1 (seen on an H200: a random policy sampled one and the
    OPD run stopped with "scored other tokens"); a real misalignment is still named with its position."""
    sample = Sample(tokens=[1, 2, 3, 151935], response_length=2, index=4)
    clipped = {"meta_info": {"input_token_logprobs": [[None, 2, None], [-0.5, 3, None], [-0.25, 0, None]]}}
    assert teacher_log_probs_from_reply(clipped, sample, logprob_start_len=1) == [-0.5, -0.25]
    shifted = {"meta_info": {"input_token_logprobs": [[None, 1, None], [-0.5, 2, None], [-0.25, 3, None]]}}
    with pytest.raises(ValueError, match="2 of 2; first at response position 0: teacher 2, response 3"):
        teacher_log_probs_from_reply(shifted, sample, logprob_start_len=1)


def test_a_request_from_the_response_start_gets_a_none_and_says_so():
    """Real SGLang answered `logprob_start_len` = prompt length with None for the first response token (the
    crash of issue 25: float(None)); the reply is refused with the reason, and the built-in path asks from one
    position earlier (checked against the reference engine, which follows SGLang's rule)."""
    sample = Sample(tokens=[1, 2, 3, 4], response_length=2, index=7)
    sglang_reply = {"meta_info": {"input_token_logprobs": [[None, 3, None], [-0.25, 4, None]]}}
    with pytest.raises(ValueError, match="sample 7: the teacher's log-prob of response token 0 is None"):
        teacher_log_probs_from_reply(sglang_reply, sample, logprob_start_len=2)


def test_builtin_scoring_asks_from_before_the_response(args, reference_engine):
    from slime_rollout.generation.opd import teacher_payload

    sample = _samples()[0]
    payload = teacher_payload(args, sample, logprob_start_len=sample.prompt_length - 1)
    reply = asyncio.run(_post(reference_engine.urls[0], payload))
    entries = reply["meta_info"]["input_token_logprobs"]
    assert entries[0][0] is None and len(entries) == sample.response_length + 1
    assert all(isinstance(e[0], float) for e in entries[1:])


async def _post(url: str, payload: dict) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/generate", json=payload, timeout=aiohttp.ClientTimeout(total=60)) as resp:
            assert resp.status == 200
            return await resp.json()


def test_the_original_reward_func_scores_a_list_in_one_call(args, tiny_qwen3_dir):
    # A fan-out generate function's samples (and a --group-rm group) reach a custom reward as one list: the built-in
    # reward_func answered it with AttributeError ('list' object has no attribute 'tokens').
    from slime_rollout.generation import opd

    samples = _samples()[:2]
    replies = asyncio.run(opd.reward_func(args, samples))
    assert len(replies) == 2
    for s, reply in zip(samples, replies, strict=True):
        assert reply["meta_info"]["input_token_logprobs"][0][0] is None
        torch.testing.assert_close(torch.tensor(s.teacher_log_probs), _reference(tiny_qwen3_dir, s), atol=ATOL, rtol=0)


def test_a_teacher_abort_is_named_as_one():
    """SGLang 0.5.16 answers a request aborted in its waiting queue with HTTP 200 and this body (tokenizer_manager.py
    `_handle_abort_req`: no prompt_tokens, empty log-prob lists); it was reported as "the teacher returned 0 input
    log-probs", which hid the cause."""
    sample = Sample(tokens=[1, 2, 3, 4], response_length=2, index=7)
    aborted = {"text": "", "output_ids": [], "meta_info": {
        "id": "r", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"}, "weight_version": "default",
        "e2e_latency": 0.01, "input_token_logprobs": [], "output_token_logprobs": [],
        "output_token_logprobs_length": 0, "completion_tokens": 0}}  # fmt: skip
    with pytest.raises(ValueError, match="sample 7: the teacher aborted the scoring request .'Abort in waiting queue'"):
        teacher_log_probs_from_reply(aborted, sample, logprob_start_len=1)


def test_a_non_finite_or_malformed_teacher_entry_is_refused_with_its_sample():
    """A NaN / -inf teacher log-prob (a teacher overflowing in fp16, or masking the student's token) went into the
    advantages and made the whole batch NaN after whitening; a bare number instead of SGLang's triple failed with
    "'float' object is not subscriptable", naming no sample. Both are refused naming the sample and token."""
    sample = Sample(tokens=[1, 2, 3, 4], response_length=2, index=7)
    for bad in (float("nan"), float("-inf")):
        reply = {"meta_info": {"input_token_logprobs": [[None, 2, None], [-0.5, 3, None], [bad, 4, None]]}}
        with pytest.raises(ValueError, match=r"sample 7: the teacher's log-prob of response token 1 is (nan|-inf) "):
            teacher_log_probs_from_reply(reply, sample, logprob_start_len=1)
    bare = {"meta_info": {"input_token_logprobs": [None, -0.5, -0.25]}}
    with pytest.raises(ValueError, match=r"sample 7: the teacher's input_token_logprobs entry of response token 0 is "):
        teacher_log_probs_from_reply(bare, sample, logprob_start_len=1)


def test_a_teacher_of_another_vocabulary_is_refused_at_its_first_reply(
    args, qwen3_tokenizer_dir, tmp_path, monkeypatch
):
    # Pass 48: a teacher engine of another tokenizer scored the student's ids as other tokens, silently. Here the
    # student's tokenizer has Qwen3's tokens and size with the ids reversed; the teacher serves Qwen3's own.
    import json
    import shutil

    from slime_rollout.generation import opd

    student_dir = tmp_path / "student"
    shutil.copytree(qwen3_tokenizer_dir, student_dir)
    spec = json.loads((student_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    top = max(vocab.values())
    spec["model"]["vocab"] = {token: top - i for token, i in vocab.items()}
    (student_dir / "tokenizer.json").write_text(json.dumps(spec))

    monkeypatch.setattr(opd, "_vocabulary_checked", set(), raising=False)
    student = args.model_copy(update={"hf_checkpoint": str(student_dir)})
    with pytest.raises(ValueError) as e:
        asyncio.run(score_teacher(student, _samples()[:1]))
    assert str(e.value).startswith(
        f"the OPD teacher at --rm-url {args.rm_url} does not share the student's tokenizer (--hf-checkpoint "
        f"{student_dir}): it decodes 3 of 3 response tokens of sample 0 otherwise (id "
    )
    # The original's plugin path (reward_func) checks its first reply the same way.
    plugin = student.model_copy(update={"custom_rm_path": "slime.rollout.on_policy_distillation.reward_func"})
    with pytest.raises(RewardFunctionError, match=r"reward_func raised ValueError on sample 0: the OPD teacher at "
                       r"--rm-url .* does not share the student's tokenizer"):  # fmt: skip
        asyncio.run(async_rm(plugin, _samples()[0]))
    # The teacher's own tokenizer passes, and is checked once per teacher.
    monkeypatch.setattr(opd, "_vocabulary_checked", set())
    assert asyncio.run(score_teacher(args, _samples()[:1])) == 1
    assert opd._vocabulary_checked == {args.rm_url}


def test_the_vocabulary_check_reads_token_texts(tiny_qwen3_dir):
    from slime_rollout.data.tokenizer import get_tokenizer
    from slime_rollout.generation.opd import check_teacher_vocabulary

    tok = get_tokenizer(str(tiny_qwen3_dir))
    sample = Sample(tokens=[1, 2, 3, 4, 5], response_length=3, index=9)
    same = {"meta_info": {"input_token_logprobs": [[None, 2, "x"]] + [[-1.0, t, tok.decode([t])] for t in (3, 4, 5)]}}
    assert check_teacher_vocabulary(same, sample, rm_url="u", hf_checkpoint=str(tiny_qwen3_dir)) is True
    # One token decoded otherwise of three is not another vocabulary; two are.
    one = {
        "meta_info": {"input_token_logprobs": [[-1.0, 3, "?"], [-1.0, 4, tok.decode([4])], [-1.0, 5, tok.decode([5])]]}
    }
    assert check_teacher_vocabulary(one, sample, rm_url="u", hf_checkpoint=str(tiny_qwen3_dir)) is True
    two = {"meta_info": {"input_token_logprobs": [[-1.0, 3, "?"], [-1.0, 4, "!"], [-1.0, 5, tok.decode([5])]]}}
    with pytest.raises(ValueError, match=r"decodes 2 of 3 response tokens of sample 9 otherwise \(id 3: teacher '\?'"):
        check_teacher_vocabulary(two, sample, rm_url="u", hf_checkpoint=str(tiny_qwen3_dir))
    no_text = {"meta_info": {"input_token_logprobs": [[-1.0, t, None] for t in (3, 4, 5)]}}
    assert check_teacher_vocabulary(no_text, sample, rm_url="u", hf_checkpoint=str(tiny_qwen3_dir)) is False


def test_a_teacher_http_error_names_the_teacher_and_the_sample_once(args, monkeypatch):
    """A teacher answering HTTP 500 ended the run with "engine URL/generate failed (HTTP 500): ..." and the driver's
    advice "--use-fault-tolerance restarts an engine that dies", which never restarts a teacher slime did not start;
    neither the OPD teacher nor the sample was named. It fails at the first reply (no retry of an answer, as the
    original's raise_for_status), naming both and saying --use-fault-tolerance does not restart it (the driver's
    `slime_app.failures.engine_failure` then adds no advice of its own)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from slime_rollout.engines.transport import EngineError
    from slime_rollout.generation import opd

    posts = []

    class Failing(BaseHTTPRequestHandler):
        def do_POST(self):
            posts.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"CUDA out of memory")

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/generate"
        monkeypatch.setattr(args, "rm_url", url)
        for call in (opd.score_teacher(args, _samples()[:1]), opd.reward_func(args, _samples()[0])):
            with pytest.raises(EngineError) as err:
                asyncio.run(call)
            assert err.value.status_code == 500 and not err.value.unreachable
            assert str(err.value) == (
                f"engine http://127.0.0.1:{server.server_address[1]}/generate failed (HTTP 500): the OPD teacher "
                "(--rm-url) did not score sample 0: CUDA out of memory (slime does not start this engine, so "
                "--use-fault-tolerance does not restart it)"
            )
        assert len(posts) == 2  # one request each: an HTTP error is not retried
    finally:
        server.shutdown()


def test_a_stalled_teacher_fails_after_rm_timeout_secs_naming_the_teacher(args, monkeypatch):
    """The teacher's read timeout was a hard-coded 600 s: --rm-timeout-secs, which bounds every remote reward, did
    not bound it. A teacher that answers after 3 s with --rm-timeout-secs 0.3 now fails the scoring request at once
    (a read timeout is not retried), naming the OPD teacher and the sample."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from slime_rollout.engines.transport import EngineError
    from slime_rollout.generation import opd

    class Stalled(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(3.0)
            self.send_response(500)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stalled)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(args, "rm_url", f"http://127.0.0.1:{server.server_address[1]}/generate")
        monkeypatch.setattr(args, "rm_timeout_secs", 0.3)
        start = time.monotonic()
        with pytest.raises(EngineError) as err:
            asyncio.run(opd.score_teacher(args, _samples()[:1]))
        assert time.monotonic() - start < 2.5  # the 3-s answer was not waited for
        assert err.value.unreachable and "the OPD teacher (--rm-url) did not score sample 0" in str(err.value)
    finally:
        server.shutdown()


def test_a_reply_with_no_response_token_to_compare_leaves_the_vocabulary_check_to_the_next(monkeypatch, caplog):
    # The first scored sample had an empty response (a prompt that filled the context) or only ids SGLang clips to 0:
    # the check found nothing to compare, warned "returned no token texts" and never checked the teacher again, so a
    # teacher of another vocabulary went through.
    from types import SimpleNamespace

    from slime_rollout.generation import opd

    monkeypatch.setattr(opd, "_vocabulary_checked", set())
    args = SimpleNamespace(rm_url="http://teacher:1/generate", hf_checkpoint="/not/read")
    payload = {"return_text_in_logprobs": True}
    empty = Sample(tokens=[1, 2, 3], response_length=0, index=2)
    clipped = Sample(tokens=[1, 2, 151935], response_length=1, index=3)
    for sample, entries in ((empty, [[None, 3, "c"]]), (clipped, [[None, 2, "b"], [-1.0, 0, "!"]])):
        reply = {"meta_info": {"input_token_logprobs": entries}}
        assert opd.check_teacher_vocabulary(reply, sample, rm_url=args.rm_url, hf_checkpoint="/not/read") is None
        opd._check_vocabulary_once(args, payload, reply, sample)
        assert opd._vocabulary_checked == set()
    assert "returned no token texts" not in caplog.text
    # A server that sends no texts at all is still warned about once and not asked again.
    plain = Sample(tokens=[1, 2, 3], response_length=1, index=4)
    no_texts = {"meta_info": {"input_token_logprobs": [[None, 2, None], [-1.0, 3, None]]}}
    assert opd.check_teacher_vocabulary(no_texts, plain, rm_url=args.rm_url, hf_checkpoint="/not/read") is False
    with caplog.at_level(logging.WARNING, logger="slime_rollout.generation.opd"):
        opd._check_vocabulary_once(args, payload, no_texts, plain)
    assert opd._vocabulary_checked == {args.rm_url} and caplog.text.count("returned no token texts") == 1
