"""The response budget against the context: `--rollout-max-context-len`, `--eval-max-context-len`, the model's and
the engine's context length (`slime_rollout.generation.generate` against a scripted engine client)."""

import pytest
from slime_rollout_fakes import FakeClient
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Sample, Status
from slime_rollout.generation import generate as generate_mod
from slime_rollout.generation import rollout as rollout_mod

A = ord("A")


async def test_max_context_len_caps_new_tokens(use_client):
    client = use_client(FakeClient({0: [A]}, lengths={0: 100}))
    s = Sample(tokens=[0, 5, 5, 5])  # 4 prompt tokens
    s = await generate_mod.generate(_args(rollout_max_context_len=10), s, {"max_new_tokens": 8})
    assert client.payloads[0]["sampling_params"]["max_new_tokens"] == 6
    assert s.response_length == 6 and s.status is Status.TRUNCATED


async def test_without_a_context_flag_the_models_context_caps_new_tokens(use_client, tmp_path):
    # SGLang 0.5.16 answers HTTP 400 when prompt + max_new_tokens exceeds its context (tokenizer_manager.py
    # _validate_one_request; the reference engine now does too): a 12-token prompt with --rollout-max-response-len 8
    # on a 16-token model failed the rollout instead of getting a shorter response.
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 16}')
    client = use_client(FakeClient({0: [A]}, lengths={0: 100}))
    s = Sample(tokens=[0, *[5] * 11])  # 12 prompt tokens
    s = await generate_mod.generate(_args(hf_checkpoint=str(tmp_path)), s, {"max_new_tokens": 8})
    assert client.payloads[0]["sampling_params"]["max_new_tokens"] == 4
    assert s.response_length == 4 and s.status is Status.TRUNCATED


async def test_the_engines_context_length_flag_wins_over_the_models(use_client, tmp_path):
    # SGLang serves --context-length when given (RoPE-scaled or shortened): the cap and the default prompt limit
    # follow it, as preflight's length check already did (both read only max_position_embeddings before).
    from slime_rollout.data.prompt_length import default_max_prompt_len

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 16}')
    client = use_client(FakeClient({0: [A]}, lengths={0: 100}))
    args = _args(hf_checkpoint=str(tmp_path), sglang_args={"context_length": "14"})
    s = await generate_mod.generate(args, Sample(tokens=[0, *[5] * 11]), {"max_new_tokens": 8})
    assert client.payloads[0]["sampling_params"]["max_new_tokens"] == 2
    assert s.response_length == 2
    assert default_max_prompt_len(_args(hf_checkpoint=str(tmp_path), sglang_args={"context-length": "40"})) == 39
    assert default_max_prompt_len(_args(hf_checkpoint=str(tmp_path))) == 15
    with pytest.raises(ValueError, match="--sglang-context-length 'long': not a number of tokens"):
        default_max_prompt_len(_args(hf_checkpoint=str(tmp_path), sglang_args={"context_length": "long"}))


@pytest.mark.parametrize(
    ("evaluation", "eval_ctx", "expected"),
    [(True, 7, 3), (False, 7, 6), (True, None, 6)],  # eval: --eval-max-context-len, else the rollout's 10
)
async def test_eval_max_context_len_caps_eval_samples(use_client, evaluation, eval_ctx, expected):
    client = use_client(FakeClient({0: [A]}, lengths={0: 100}))
    args = _args(rollout_max_context_len=10, eval_max_context_len=eval_ctx)
    s = await generate_mod.generate(args, Sample(tokens=[0, 5, 5, 5]), {"max_new_tokens": 8}, evaluation=evaluation)
    assert client.payloads[0]["sampling_params"]["max_new_tokens"] == expected
    assert s.response_length == expected


async def test_eval_rollout_passes_evaluation_to_the_default_generate(use_client):
    client = use_client(FakeClient({0: [A]}, lengths={0: 100}))
    state = rollout_mod.RolloutState.create(_args(), rollout_id=0, evaluation=True)
    args = _args(rollout_max_context_len=10, eval_max_context_len=6)
    await rollout_mod.generate_and_rm(args, Sample(tokens=[0, 5, 5, 5]), state, {"max_new_tokens": 8})
    assert client.payloads[0]["sampling_params"]["max_new_tokens"] == 2
