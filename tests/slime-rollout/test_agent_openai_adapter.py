"""The OpenAI-compatible agent adapter: driven with the `openai` SDK, episodes recorded token-in/token-out.

The end-to-end test puts the adapter in front of a real CPU reference engine (tiny random Qwen3, real Qwen3
tokenizer) and plays a two-call tool episode; a recorder between adapter and engine keeps every request and
reply, so the samples are checked against the ids the engine really sent back. The other tests use a scripted
engine (the real Qwen3 tokenization of scripted turns, log-probs -0.01, -0.02, ...) to pin tool-call framing,
forks, sampling parameters and the refusals.
"""

import json

import openai
import pytest

from slime_core.sample import Sample, Status
from slime_rollout.agent import OpenAIAdapter
from slime_rollout.client import EngineClient
from slime_rollout.data_source import get_tokenizer
from slime_rollout.template_check import check_sample

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
# What Qwen3's chat template puts between an assistant turn that the model did not close with <|im_end|> (cut by
# max_tokens) and the next assistant turn, for one tool message "42" (written out by hand from the template).
QWEN_TOOL_42_AFTER_OPEN_TURN = (
    "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)
QWEN_TOOL_42_AFTER_CLOSED_TURN = QWEN_TOOL_42_AFTER_OPEN_TURN.removeprefix("<|im_end|>")


class Recorder:
    """Passes calls to an engine client and keeps (payload, reply) of each."""

    def __init__(self, client):
        self.client = client
        self.calls = []

    async def generate(self, payload):
        reply = await self.client.generate(payload)
        self.calls.append((json.loads(json.dumps(payload)), reply))
        return reply


def engine_ids(reply):
    return [e[1] for e in reply["meta_info"]["output_token_logprobs"]]


def engine_lps(reply):
    return [e[0] for e in reply["meta_info"]["output_token_logprobs"]]


def template_ids(tok, messages, tools):
    return list(tok.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)["input_ids"])


@pytest.fixture
async def served():
    """Factory: `await served(adapter)` starts it; stopped at the end."""
    adapters = []

    async def start(adapter):
        await adapter.start()
        adapters.append(adapter)
        return adapter

    yield start
    for a in adapters:
        await a.stop()


async def test_two_call_tool_episode_against_reference_engine(reference_engine, tiny_qwen3_dir, served):
    tok = get_tokenizer(str(tiny_qwen3_dir))
    engine = EngineClient(reference_engine.urls[0])
    recorder = Recorder(engine)
    adapter = await served(OpenAIAdapter(tokenizer=str(tiny_qwen3_dir), client=recorder))
    assert adapter.base_url.startswith("http://127.0.0.1:")
    adapter.open_session("episode-1", sampling_defaults={"temperature": 1.0, "max_new_tokens": 64, "sampling_seed": 7})
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="episode-1", max_retries=0, timeout=120)

    messages = [{"role": "user", "content": "What is 6*7? Use the calculator."}]
    first = await agent.chat.completions.create(model="m", messages=messages, tools=[CALC_TOOL], max_tokens=6)
    assert first.choices[0].finish_reason == "length"  # a random model does not close its turn in 6 tokens
    assert first.usage.completion_tokens == 6
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": "call_0", "content": "42"})
    second = await agent.chat.completions.create(model="m", messages=messages, tools=[CALC_TOOL], max_tokens=5)
    await agent.close()

    samples = await adapter.finish_session("episode-1", base_sample=Sample(prompt="6*7", index=3, label="42"))
    await engine.aclose()
    assert len(recorder.calls) == 2 and len(samples) == 1
    (p1, r1), (p2, r2) = recorder.calls
    out1, out2 = engine_ids(r1), engine_ids(r2)
    assert len(out1) == 6 and len(out2) == 5
    # Call 1: the prompt is the chat template's tokenization of the messages (tools in the system prompt).
    prompt = template_ids(tok, messages[:1], [CALC_TOOL])
    assert p1["input_ids"] == prompt
    # Call 2: the first call's ids as sent and generated (never re-tokenized), then the template's tool wrapper.
    wrapper = tok.encode(QWEN_TOOL_42_AFTER_OPEN_TURN, add_special_tokens=False)
    assert p2["input_ids"] == prompt + out1 + wrapper
    assert second.usage.prompt_tokens == len(p2["input_ids"])
    # Each call draws from its own seed, derived from the run's.
    assert p1["sampling_params"]["sampling_seed"] != p2["sampling_params"]["sampling_seed"]
    assert p1["sampling_params"]["max_new_tokens"] == 6 and p2["sampling_params"]["max_new_tokens"] == 5

    s = samples[0]
    assert s.tokens == prompt + out1 + wrapper + out2
    assert s.response_length == len(out1) + len(wrapper) + len(out2)
    assert s.loss_mask == [1] * 6 + [0] * len(wrapper) + [1] * 5
    assert s.rollout_log_probs == engine_lps(r1) + [0.0] * len(wrapper) + engine_lps(r2)
    assert all(lp < 0 for lp in engine_lps(r1) + engine_lps(r2))
    assert s.status is Status.TRUNCATED  # the last call hit max_tokens
    assert (s.index, s.rollout_id, s.label, s.prompt, s.session_id) == (3, 3, "42", "6*7", "episode-1")
    assert [t["trained"] for t in s.metadata["agent"]["turns"]] == [True, True]

    # Conformance of the whole sample (slime_rollout.template_check): Qwen3's template renders the last assistant
    # turn with an empty `<think>\n\n</think>\n\n` the model never wrote; the check finds it where the second
    # turn starts (earlier only if the first turn's decoded text re-encodes to other ids).
    report = check_sample(tok, s)
    assert report.message.startswith("chat template:") and not report.consistent
    start2 = len(prompt) + len(out1) + len(wrapper)
    if tok.encode(tok.decode(out1), add_special_tokens=False) == out1:
        assert report.first_mismatch == start2
        assert r"<think>\n\n</think>" in report.message  # the report shows repr()s
    else:
        assert len(prompt) <= report.first_mismatch < len(prompt) + len(out1)
    # Per call: call 1 sent the template's ids; call 2 sent them unless the echoed reply renders other tokens.
    turns = s.metadata["agent"]["turns"]
    assert turns[0]["template_mismatch"] is None
    echoed = template_ids(tok, messages, [CALC_TOOL])
    expected = next((i for i, (a, b) in enumerate(zip(p2["input_ids"], echoed, strict=False)) if a != b), None)
    if expected is None and len(echoed) != len(p2["input_ids"]):
        expected = min(len(echoed), len(p2["input_ids"]))
    assert turns[1]["template_mismatch"] == expected
