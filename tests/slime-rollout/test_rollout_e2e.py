"""End to end: the default rollout against the real CPU reference engine (tiny random Qwen3, real tokenizer).

Checks the whole path: data source (GSM8K fixture, Qwen3 chat template) → default generate over HTTP →
math reward → metrics; log-probs against an independent transformers forward pass; over-sampling with
a filter, abort of the surplus on the engine, and partial-rollout continuation in the next rollout.
"""

import asyncio

import pytest
import torch

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Status
from slime_rollout.data.source import RolloutDataSourceWithBuffer
from slime_rollout.engines.client import EngineClient
from slime_rollout.generation.rollout import generate_rollout

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

LOGPROB_ATOL = 2e-3  # fp32 CPU, batched engine forward vs one unbatched HF forward


@pytest.fixture(scope="module")
def hf_model(tiny_qwen3_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_qwen3_dir)


def _args(engine, model_dir, fixtures_dir, **kw):
    """The plugin view of a run whose engine is `engine`."""
    fields = dict(
        hf_checkpoint=str(model_dir),
        prompt_data=f"{fixtures_dir / 'gsm8k' / 'test-50.jsonl'}@[:12]",
        input_key="question",
        label_key="answer",
        apply_chat_template=True,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        num_rollout=1,
        rm_type="math",
        rollout_max_response_len=12,
        sglang_server_concurrency=16,
    )
    fields.update(kw)
    return PluginArgs.from_config(SlimeArgs.from_dict(fields), engine_urls=engine.urls)


def _check_log_probs(model, sample):
    ids = torch.tensor([sample.tokens])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    log_probs = torch.log_softmax(logits, dim=-1)  # temperature 1.0
    p = sample.prompt_length
    expected = log_probs[p - 1 : len(sample.tokens) - 1].gather(-1, ids[0, p:, None])[:, 0]
    got = torch.tensor(sample.rollout_log_probs)
    mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
    torch.testing.assert_close(got[mask], expected[mask], atol=LOGPROB_ATOL, rtol=0)


def test_rollout_against_reference_engine(reference_engine, tiny_qwen3_dir, fixtures_dir, hf_model):
    model, tok = hf_model
    args = _args(reference_engine, tiny_qwen3_dir, fixtures_dir)
    ds = RolloutDataSourceWithBuffer(args)
    out = generate_rollout(args, 0, ds)
    assert [[(s.group_index, s.index) for s in g] for g in out.samples] == [[(0, 0), (0, 1)], [(1, 2), (1, 3)]]
    for group in out.samples:
        for s in group:
            # Prompt ids are the chat-templated question, tokenized without special tokens added.
            assert s.prompt.startswith("<|im_start|>user\nJanet" if s.group_index == 0 else "<|im_start|>user\nA robe")
            assert s.tokens[: s.prompt_length] == tok.encode(s.prompt, add_special_tokens=False)
            assert 0 < s.response_length <= 12 and len(s.rollout_log_probs) == s.response_length
            assert all(lp <= 0.0 for lp in s.rollout_log_probs)
            if s.status is Status.TRUNCATED:
                assert s.response_length == 12
            else:
                assert s.status is Status.COMPLETED and s.response_tokens[-1] in (151645, 151643)
            assert s.reward in (0.0, 1.0) and s.weight_versions
            assert s.response == tok.decode(s.response_tokens)
            _check_log_probs(model, s)
    flat = [s for g in out.samples for s in g]
    m = out.metrics
    assert m["rollout/truncated_ratio"] == pytest.approx(sum(s.status is Status.TRUNCATED for s in flat) / 4, abs=1e-12)
    assert m["rollout/response_len/mean"] == pytest.approx(sum(s.response_length for s in flat) / 4, abs=1e-12)
    assert -20 < m["rollout/rollout_log_probs"] < 0


async def slow_even_fake_odd(args, sample, sampling_params):
    """Test generate: even prompt groups go to the engine; odd ones wait until the engine is busy with
    them, then answer without the engine (a fixed 3-token response). The reference engine batches
    statically, so this is how an odd group can finish while even groups are still mid-generation."""
    from slime_rollout.generation.generate import generate

    if sample.group_index % 2 == 0:
        return await generate(args, sample, sampling_params)
    engine = EngineClient(args.rollout_engine_urls[0], timeout=60)
    while await engine.num_unfinished_requests() == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    sample.tokens = [151644, 77091, 198]  # stands in for a prompt
    sample.append_response_tokens([16, 17, 151645], log_probs=[-1.0, -1.0, -1.0], text="12<|im_end|>")
    sample.status = Status.COMPLETED
    return sample


def keep_odd_groups(args, group):
    """Test filter: accept only odd prompt groups."""
    return group[0].group_index % 2 == 1


def test_oversampling_abort_and_partial_rollout_against_reference_engine(
    reference_engine, tiny_qwen3_dir, fixtures_dir, hf_model
):
    model, _ = hf_model
    args = _args(
        reference_engine,
        tiny_qwen3_dir,
        fixtures_dir,
        rollout_batch_size=1,
        over_sampling_batch_size=4,
        n_samples_per_prompt=2,
        dynamic_sampling_filter_path=f"{__name__}.keep_odd_groups",
        custom_generate_function_path=f"{__name__}.slow_even_fake_odd",
        partial_rollout=True,
        # Long enough that no even request can finish before the abort on a loaded machine. (The flake this test
        # had was the abort itself waiting for a free connection behind the generations: CONTROL_CONNECTIONS.)
        rollout_max_response_len=1500,
    )
    ds = RolloutDataSourceWithBuffer(args)
    engine = EngineClient(reference_engine.urls[0], timeout=60)
    assert asyncio.run(engine.num_unfinished_requests()) == 0  # no other test's request left on the shared engine
    out0 = generate_rollout(args, 0, ds)
    assert len(out0.samples) == 1 and out0.samples[0][0].group_index % 2 == 1
    assert ds.sample_group_index == 4  # one top-up of --over-sampling-batch-size groups was submitted
    # Nothing is left running on the engine after the rollout returned.
    assert asyncio.run(engine.num_unfinished_requests()) == 0
    # The surplus groups went back to the buffer (partial ones marked with their start rollout).
    buffered = [s for g in ds.buffer for s in g]
    assert buffered, "expected surplus groups in the partial-rollout buffer"
    accepted = out0.samples[0][0].group_index
    assert accepted not in {s.group_index for s in buffered}
    assert all(len(g) == 2 for g in ds.buffer)
    partial = {s.index: list(s.tokens) for s in buffered if s.status is Status.ABORTED and s.response_length > 0}
    assert partial, [(s.index, s.status, s.response_length) for s in buffered]
    assert all(s.group_index % 2 == 0 for s in buffered if s.index in partial)
    for s in buffered:
        if s.response_length > 0:
            assert s.metadata["start_rollout_id"] == 0
            assert len(s.rollout_log_probs) == s.response_length

    # Next rollout: accept everything; buffered groups are served first and continued.
    args.dynamic_sampling_filter_path = None
    args.rollout_batch_size = args.over_sampling_batch_size = len(ds.buffer)
    # A few more tokens than the longest partial response: every sample continues, and the test stays short.
    limit = args.rollout_max_response_len = max(s.response_length for s in buffered) + 16
    out1 = generate_rollout(args, 1, ds)
    got = {s.index: s for g in out1.samples for s in g}
    assert set(got) == {s.index for s in buffered}
    for index, prefix in partial.items():
        s = got[index]
        assert s.tokens[: len(prefix)] == prefix  # continued from where it was aborted
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and len(prefix) - s.prompt_length < s.response_length
        assert s.response_length == limit or s.status is Status.COMPLETED
        assert s.metadata["start_rollout_id"] == 0
        _check_log_probs(model, s)  # same weights: old and new parts both match a full forward
    assert asyncio.run(engine.num_unfinished_requests()) == 0
