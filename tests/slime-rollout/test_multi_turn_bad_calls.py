"""Multi-turn episodes whose calls are wrong: bad JSON, an unknown tool, wrong argument types, a call only thought
about, a tool result past the budget. The model gets an error observation (masked, log-prob 0.0) and its own turns
stay trainable with the engine's log-probs; the expected streams are built here from the tokenizer."""

import json

import pytest
from slime_multi_turn_fakes import FINAL_TURN, ScriptedEngine, calc_sample, enc, install, make_args, params

from slime_core.sample import Status
from slime_rollout.generation import multi_turn


def _turn(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call><|im_end|>"


def _observation(text: str) -> str:
    return f"\n<|im_start|>user\n<tool_response>\n{text}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('{"name": "calculator", "arguments": {"expression": }', "Error: invalid JSON in <tool_call>: "),
        (json.dumps({"name": "weather", "arguments": {"city": "Paris"}}), "Error: unknown tool 'weather'. "),
        (json.dumps({"name": "calculator", "arguments": {"expression": 6}}), "Error: 'expression' must be a string"),
        (json.dumps({"name": "calculator", "arguments": {"expr": "6*7"}}), "Error: bad arguments for tool"),
    ],
)
async def test_a_wrong_call_gets_an_error_observation_and_the_mask_is_exact(
    tok, qwen3_tokenizer_dir, monkeypatch, body, error
):
    turn = _turn(body)
    engine = ScriptedEngine(tok, [turn, FINAL_TURN])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params())
    t1, t2 = enc(tok, turn), enc(tok, FINAL_TURN)
    obs = out.response_tokens[len(t1) : -len(t2)]
    text = tok.decode(obs)
    assert text.startswith("\n<|im_start|>user\n<tool_response>\nError: ") and error in text
    assert out.response_tokens == t1 + obs + t2
    assert out.loss_mask == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
    lps = [-(k + 1) / 100 for k in range(len(t1))], [-(k + 1) / 100 for k in range(len(t2))]
    assert out.rollout_log_probs == lps[0] + [0.0] * len(obs) + lps[1]
    assert out.status is Status.COMPLETED and out.metadata["num_turns"] == 2


async def test_a_call_only_thought_about_ends_the_episode_without_running(tok, qwen3_tokenizer_dir, monkeypatch):
    # slime_envs ran it (an observation, a second turn); the agent adapter returned no call for the same turn.
    call = _turn(json.dumps({"name": "calculator", "arguments": {"expression": "6*7"}})).removesuffix("<|im_end|>")
    turn = f"<think>\n{call}\n</think>\n\n42<|im_end|>"
    engine = ScriptedEngine(tok, [turn, FINAL_TURN])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params())
    assert len(engine.payloads) == 1 and out.response_tokens == enc(tok, turn)
    assert out.loss_mask == [1] * len(enc(tok, turn)) and out.metadata["num_turns"] == 1


async def test_a_tool_result_past_the_budget_is_cut_and_the_sample_truncated(tok, qwen3_tokenizer_dir, monkeypatch):
    turn = _turn(json.dumps({"name": "calculator", "arguments": {"expression": "10**999"}}))
    t1 = enc(tok, turn)
    full = enc(tok, _observation(str(10**999)))
    budget = len(t1) + 40  # the 1,000-digit result does not fit
    assert len(full) > 40
    engine = ScriptedEngine(tok, [turn, FINAL_TURN])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params(budget))
    assert len(engine.payloads) == 1  # no room left for a model token: no second turn
    assert out.response_length == budget and out.status is Status.TRUNCATED
    assert out.response_tokens == t1 + full[:40]
    assert out.loss_mask == [1] * len(t1) + [0] * 40
