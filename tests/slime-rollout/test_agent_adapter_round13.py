"""Agent adapter, hostile pass 3: OpenAI's `parallel_tool_calls`, `finish_reason` of a cut reply, tool calls closed
by a stop string or holding `</tool_call>` in a JSON string, a `<think>` cut before it closed, `max_tokens` fields.

Driven with the `openai` SDK; the engine is scripted (the real Qwen3 tokenization of scripted turns, SGLang's reply
shape), since a random model writes no tool call.
"""

import json

import pytest

pytest.importorskip(
    "openai", reason="these tests drive the adapter with the OpenAI SDK (absent on the GPU trainer path)"
)
import openai  # noqa: E402

from slime_core.sample import Sample  # noqa: E402
from slime_rollout.agent import OpenAIAdapter  # noqa: E402

CALC = {
    "type": "function",
    "function": {"name": "calc", "parameters": {"type": "object", "properties": {"e": {"type": "string"}}}},
}
USER = [{"role": "user", "content": "6*7 and 2+2?"}]


def block(expression):
    return f'<tool_call>\n{{"name": "calc", "arguments": {{"e": "{expression}"}}}}\n</tool_call>'


class Engine:
    """Answers call i with the Qwen3 ids of `turns[i]`, finish type `finish[i]` (default "stop")."""

    def __init__(self, tok, turns, finish=()):
        self.tok, self.turns, self.finish = tok, list(turns), list(finish)
        self.payloads = []

    async def generate(self, payload):
        self.payloads.append(json.loads(json.dumps(payload)))
        i = len(self.payloads) - 1
        ids = self.tok.encode(self.turns[i], add_special_tokens=False)
        return {
            "text": self.tok.decode(ids),
            "meta_info": {
                "output_token_logprobs": [[-0.25, t, None] for t in ids],
                "finish_reason": {"type": self.finish[i] if i < len(self.finish) else "stop"},
                "weight_version": "1",
            },
        }


@pytest.fixture
async def make(tok):
    """`await make(turns, finish=..., defaults=..., **adapter_kw)` -> (adapter, engine, AsyncOpenAI for session s)."""
    opened = []

    async def build(turns, *, finish=(), defaults=None, **kw):
        engine = Engine(tok, turns, finish)
        adapter = OpenAIAdapter(tokenizer=tok, client=engine, **kw)
        await adapter.start()
        adapter.open_session("s", sampling_defaults=defaults or {"max_new_tokens": 64})
        agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=30)
        opened.append((adapter, agent))
        return adapter, engine, agent

    yield build
    for adapter, agent in opened:
        await agent.close()
        await adapter.stop()


async def test_parallel_tool_calls_false_returns_only_the_first_call(tok, make):
    # Both calls came back although the request said parallel_tool_calls=false (OpenAI returns at most one).
    two = f"{block('6*7')}\n{block('2+2')}<|im_end|>"
    adapter, engine, agent = await make([two, two, "done<|im_end|>"])
    both = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC])
    calls = both.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == [{"e": "6*7"}, {"e": "2+2"}]

    single = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC], parallel_tool_calls=False)
    (call,) = single.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"e": "6*7"} and single.choices[0].finish_reason == "tool_calls"
    # The agent answers the one call it got: its echo continues the branch of that turn.
    messages = [
        *USER,
        single.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    await agent.chat.completions.create(model="m", messages=messages, tools=[CALC], parallel_tool_calls=False)
    samples = await adapter.finish_session("s", base_sample=Sample(index=0))
    assert len(samples) == 2  # the first (parallel) call's branch, and the continued one
    continued = samples[1]
    assert [t["trained"] for t in continued.metadata["agent"]["turns"]] == [True, True]
    assert continued.metadata["agent"]["num_dropped_tool_calls"] == 1
    # The second call's tokens stay in the trained turn: what the model wrote.
    sent, two_ids = engine.payloads[1]["input_ids"], tok.encode(two, add_special_tokens=False)
    assert engine.payloads[2]["input_ids"][: len(sent) + len(two_ids)] == sent + two_ids
    assert continued.loss_mask[: len(two_ids)] == [1] * len(two_ids)


async def test_a_reply_cut_at_the_token_cap_says_length_even_after_a_complete_call(make):
    # It said "tool_calls": an agent took the cut turn for a finished one.
    adapter, engine, agent = await make([f"{block('6*7')}\nand now I will also", "x"], finish=["length"])
    reply = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC], max_tokens=30)
    assert reply.choices[0].finish_reason == "length"
    (call,) = reply.choices[0].message.tool_calls  # complete: its block closed before the cut
    assert json.loads(call.function.arguments) == {"e": "6*7"}


async def test_a_call_cut_before_its_closing_tag_is_text_not_a_call(make):
    cut = '<tool_call>\n{"name": "calc", "arguments": {"e": "6*7"}}\n'  # complete JSON, no </tool_call>
    adapter, engine, agent = await make([cut], finish=["length"])
    reply = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC], max_tokens=20)
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == cut.strip()


@pytest.mark.parametrize("where", ["request", "session"])
async def test_a_call_closed_by_the_stop_string_is_a_call(make, where):
    # The engine stops on "</tool_call>" and the adapter cut the stop string before parsing: the block lost its
    # closing tag and the call came back as text (the original's adapter parses with the stop string in place).
    defaults = {"max_new_tokens": 64, "stop": ["</tool_call>"]} if where == "session" else None
    adapter, engine, agent = await make([f"Let me compute.\n{block('6*7')}"], defaults=defaults)
    stop = ["</tool_call>"] if where == "request" else None
    reply = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC], stop=stop)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me compute."
    (call,) = choice.message.tool_calls
    assert json.loads(call.function.arguments) == {"e": "6*7"}


async def test_a_stop_string_that_closes_no_call_is_still_left_out(make):
    adapter, engine, agent = await make(["plain answer</tool_call>"])
    reply = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC], stop="</tool_call>")
    assert reply.choices[0].message.content == "plain answer" and reply.choices[0].message.tool_calls is None


async def test_a_closing_tag_inside_a_json_string_does_not_end_the_call(make):
    # A coding agent writing a file about tool calls: the block was cut at the first "</tool_call>", bad JSON.
    text = "use <tool_call>...</tool_call> blocks"
    turn = "<tool_call>\n" + json.dumps({"name": "calc", "arguments": {"e": text}}) + "\n</tool_call><|im_end|>"
    adapter, engine, agent = await make([turn])
    reply = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC])
    (call,) = reply.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"e": text} and reply.choices[0].message.content is None


async def test_thinking_cut_before_its_end_is_reasoning_and_calls_no_tool(make):
    # With a reasoning parser, an unclosed <think> (cut at max_tokens) was returned as content, and a <tool_call>
    # the model was only considering came back as a call to execute. SGLang's qwen3 parser: all reasoning.
    turn = f"<think>\nMaybe {block('6*7')} first, or"
    adapter, engine, agent = await make([turn], finish=["length"], reasoning_parser="qwen3")
    reply = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC], max_tokens=40)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content == ""
    assert choice.message.model_extra["reasoning_content"] == f"Maybe {block('6*7')} first, or"


async def test_max_completion_tokens_null_falls_back_to_max_tokens(make):
    # `body.get("max_completion_tokens", body.get("max_tokens"))` read an explicit null as "no cap".
    adapter, engine, agent = await make(["a<|im_end|>", "b<|im_end|>"], defaults={"max_new_tokens": 64})
    null_cap = {"max_completion_tokens": None}
    await agent.chat.completions.create(model="m", messages=USER, extra_body=null_cap, max_tokens=5)
    await agent.chat.completions.create(model="m", messages=USER, max_completion_tokens=7, max_tokens=3)
    assert [p["sampling_params"]["max_new_tokens"] for p in engine.payloads] == [5, 7]  # the original's order
    with pytest.raises(openai.BadRequestError, match="max_completion_tokens must be a positive integer, got 0"):
        await agent.chat.completions.create(model="m", messages=USER, max_completion_tokens=0)


async def test_an_aborted_call_is_counted_in_the_episodes_metadata(make):
    # The rollout aborts its surplus mid-episode: the engine answers "abort", the adapter said 503 and kept no count,
    # so the generate function could not tell a cut episode from a finished one.
    adapter, engine, agent = await make(["a<|im_end|>", "b"], finish=["stop", "abort"])
    await agent.chat.completions.create(model="m", messages=USER)
    messages = [*USER, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
    with pytest.raises(openai.InternalServerError):
        await agent.chat.completions.create(model="m", messages=messages)
    (s,) = await adapter.finish_session("s", base_sample=Sample(index=0))
    assert s.metadata["agent"]["num_aborted"] == 1 and len(s.metadata["agent"]["turns"]) == 1


async def test_a_call_to_a_tool_the_request_did_not_offer_is_text(make):
    # It came back as a call the agent has no tool for (SGLang's parsers, which the original uses, drop such a
    # call); it stays in the content and is counted per turn.
    turn = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>' + block("6*7") + "<|im_end|>"
    adapter, engine, agent = await make([turn])
    reply = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC])
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "calc"
    assert reply.choices[0].message.content == '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    (s,) = await adapter.finish_session("s", base_sample=Sample(index=0))
    assert s.metadata["agent"]["turns"][0]["ill_formed_tool_calls"] == 1


async def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(tok, make):
    # SGLang's chat serving renders no tools for tool_choice "none" (and parses no call): the model is not shown
    # tools it may not call. The prompt must be the one of the same request without tools.
    turn = block("6*7") + "<|im_end|>"
    adapter, engine, agent = await make([turn, turn])
    reply = await agent.chat.completions.create(model="m", messages=USER, tools=[CALC], tool_choice="none")
    assert reply.choices[0].message.tool_calls is None
    await agent.chat.completions.create(model="m", messages=USER)
    with_none, without = (p["input_ids"] for p in engine.payloads)
    assert with_none == without
    assert tok.decode(with_none) == tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert "calc" not in tok.decode(with_none)


async def test_shutdown_session_closes_to_calls_and_keeps_the_episode(make):
    # The original's public shutdown_session (close + drain, records kept for finish_session) was missing here.
    adapter, engine, agent = await make(["a<|im_end|>", "b<|im_end|>"])
    await agent.chat.completions.create(model="m", messages=USER)
    await adapter.shutdown_session("s")
    with pytest.raises(openai.APIStatusError, match="is finished") as err:
        await agent.chat.completions.create(model="m", messages=USER)
    assert err.value.status_code == 410 and len(engine.payloads) == 1
    (s,) = await adapter.finish_session("s", base_sample=Sample(index=0))
    assert len(s.metadata["agent"]["turns"]) == 1
    await adapter.shutdown_session("s")  # gone: a no-op, as the original's for a drained id


@pytest.mark.slow  # ~10 s: a real CPU reference engine (tiny random Qwen3)
async def test_against_the_reference_engine_cap_and_token_fields(reference_engine, tiny_qwen3_dir):
    # The same refusals and token caps with a real engine behind the adapter: the turn cap is the original's 429,
    # and a null max_completion_tokens falls back to max_tokens (the engine then generates exactly 3 tokens).
    from slime_rollout.engines.client import EngineClient

    engine = EngineClient(reference_engine.urls[0])
    adapter = OpenAIAdapter(tokenizer=str(tiny_qwen3_dir), client=engine, max_turns_per_sid=1)
    await adapter.start()
    adapter.open_session("e", sampling_defaults={"temperature": 1.0, "max_new_tokens": 32, "sampling_seed": 3})
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="e", max_retries=0, timeout=120)
    try:
        reply = await agent.chat.completions.create(
            model="m", messages=USER, tools=[CALC], parallel_tool_calls=False, max_tokens=3,
            extra_body={"max_completion_tokens": None},
        )  # fmt: skip
        assert reply.usage.completion_tokens == 3 and reply.choices[0].finish_reason == "length"
        with pytest.raises(openai.RateLimitError, match="max_turns_per_sid=1"):
            await agent.chat.completions.create(model="m", messages=USER, max_tokens=3)
    finally:
        await agent.close()
        await adapter.stop()
        await engine.aclose()


async def test_a_session_without_a_token_cap_gets_the_originals_4096(tok):
    # No max_new_tokens anywhere was sent as none: SGLang (and the reference engine) then stop at 128 tokens.
    engine = Engine(tok, ["a<|im_end|>"] * 3)
    adapter = OpenAIAdapter(tokenizer=tok, client=engine)
    await adapter.start()
    adapter.open_session("s")
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=30)
    try:
        for max_tokens in (None, 8000, 10):
            extra = {} if max_tokens is None else {"max_tokens": max_tokens}
            await agent.chat.completions.create(model="m", messages=USER, **extra)
    finally:
        await agent.close()
        await adapter.stop()
    assert [p["sampling_params"]["max_new_tokens"] for p in engine.payloads] == [4096, 4096, 10]
