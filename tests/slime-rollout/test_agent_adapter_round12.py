"""Agent adapter, hostile pass: concurrent calls against the turn cap, a string `stop`, a client that left.

Same scripted engine as `test_agent_openai_adapter.py` (the real Qwen3 tokenization of scripted turns).
"""

import asyncio
import json

import aiohttp
import pytest

pytest.importorskip(
    "openai", reason="these tests drive the adapter with the OpenAI SDK (absent on the GPU trainer path)"
)
import openai  # noqa: E402

from slime_core.sample import Sample  # noqa: E402
from slime_rollout.agent import OpenAIAdapter  # noqa: E402


class SlowEngine:
    """Answers every call with the Qwen3 ids of `turn` after `delay` seconds (or when `release` is set)."""

    def __init__(self, tok, turn, *, release=None):
        self.tok, self.turn, self.release = tok, turn, release
        self.payloads = []

    async def generate(self, payload):
        self.payloads.append(json.loads(json.dumps(payload)))
        if self.release is not None:
            await self.release.wait()
        ids = self.tok.encode(self.turn, add_special_tokens=False)
        return {
            "text": self.tok.decode(ids),
            "meta_info": {
                "output_token_logprobs": [[-0.5, t, None] for t in ids],
                "finish_reason": {"type": "stop"},
                "weight_version": "1",
            },
        }


@pytest.fixture
async def adapter_for():
    adapters = []

    async def make(engine, **kw):
        adapter = OpenAIAdapter(tokenizer=engine.tok, client=engine, **kw)
        await adapter.start()
        adapters.append(adapter)
        return adapter

    yield make
    for a in adapters:
        await a.stop()


async def test_concurrent_calls_cannot_pass_max_turns_per_sid(tok, adapter_for):
    release = asyncio.Event()
    engine = SlowEngine(tok, "a<|im_end|>", release=release)
    adapter = await adapter_for(engine, max_turns_per_sid=2)
    adapter.open_session("s", sampling_defaults={"max_new_tokens": 8})
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=30)
    calls = [
        asyncio.create_task(agent.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}]))
        for i in range(5)
    ]
    while len(engine.payloads) < 2:  # two calls reach the engine and wait there
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the other three have had their answer by now
    release.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    await agent.close()
    refused = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert len(engine.payloads) == 2 and len(refused) == 3
    assert all("max_turns_per_sid=2" in str(r) for r in refused)
    samples = await adapter.finish_session("s", base_sample=Sample(index=0))
    assert sum(len(s.metadata["agent"]["turns"]) for s in samples) == 2


async def test_a_string_stop_in_the_sampling_defaults_is_one_stop_string(tok, adapter_for):
    # SGLang takes `stop` as a string or a list; a string was spread into one stop string per character.
    engine = SlowEngine(tok, "yes</answer> more")
    adapter = await adapter_for(engine)
    adapter.open_session("s", sampling_defaults={"max_new_tokens": 8, "stop": "</answer>"})
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=30)
    reply = await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    await agent.close()
    assert engine.payloads[0]["sampling_params"]["stop"] == ["</answer>"]
    assert reply.choices[0].message.content == "yes"


async def test_a_calls_stop_replaces_the_sessions_stop_strings(tok, adapter_for):
    # The call's list was added to the session's: the engine also stopped at "</answer>", which the agent never
    # asked for, and the reply was cut there. OpenAI's API and the original's adapter (`sp["stop"] = body["stop"]`)
    # use the call's list; a call without one keeps the session's (test above).
    engine = SlowEngine(tok, "yes</answer> more END")
    adapter = await adapter_for(engine)
    adapter.open_session("s", sampling_defaults={"max_new_tokens": 8, "stop": "</answer>"})
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=30)
    reply = await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], stop="END")
    await agent.close()
    assert engine.payloads[0]["sampling_params"]["stop"] == ["END"]
    assert reply.choices[0].message.content == "yes</answer> more"


def test_a_stop_default_of_another_type_is_refused_when_the_session_opens(tok):
    adapter = OpenAIAdapter(tokenizer=tok, client=SlowEngine(tok, "a"))
    with pytest.raises(ValueError, match=r"agent session 's': sampling_defaults\['stop'\] must be a string or a list"):
        adapter.open_session("s", sampling_defaults={"stop": 5})


async def test_a_reply_the_agent_never_received_is_not_recorded(tok, adapter_for):
    # The agent's HTTP client gave up (its timeout) while the engine was still generating; its SDK then retries the
    # same messages. The first reply reached no one: recorded, it was trained as a branch of its own with the
    # episode's reward.
    release = asyncio.Event()
    engine = SlowEngine(tok, "a<|im_end|>", release=release)
    adapter = await adapter_for(engine)
    adapter.open_session("s", sampling_defaults={"max_new_tokens": 8})
    impatient = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=0.5)
    messages = [{"role": "user", "content": "q"}]
    with pytest.raises(openai.APITimeoutError):
        await impatient.chat.completions.create(model="m", messages=messages)
    await impatient.close()
    while any(h.transport is not None for h in adapter._runner.server.connections):  # the server saw it close
        await asyncio.sleep(0.01)
    release.set()
    while adapter._sessions["s"].inflight:  # the handler finishes the engine call it started
        await asyncio.sleep(0.01)
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=30)
    reply = await agent.chat.completions.create(model="m", messages=messages)
    await agent.close()
    assert reply.choices[0].message.content == "a" and len(engine.payloads) == 2
    samples = await adapter.finish_session("s", base_sample=Sample(index=0))
    assert len(samples) == 1 and len(samples[0].metadata["agent"]["turns"]) == 1
    assert samples[0].metadata["agent"]["num_unanswered"] == 1


async def test_half_a_surrogate_pair_in_a_request_is_a_400_naming_where(tok, adapter_for):
    # JSON's "\ud800" decodes to a lone surrogate: the chat template rendered it and the tokenizer raised (HTTP 500).
    # Python's SDK cannot send one (it encodes UTF-8); an agent written in another language can.
    engine = SlowEngine(tok, "a<|im_end|>")
    adapter = await adapter_for(engine)
    adapter.open_session("s", sampling_defaults={"max_new_tokens": 8})
    body = b'{"model": "m", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "x\\ud800"}]}'
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{adapter.base_url}/chat/completions", data=body, headers={"Authorization": "Bearer s"}
        ) as response:
            status, reply = response.status, await response.json()
    assert status == 400 and engine.payloads == []
    assert reply["error"]["message"] == (
        "body['messages'][1]['content']: '\\ud800' at character 1 is half of a surrogate pair, not a character"
    )


async def test_a_model_call_with_half_a_surrogate_pair_stays_in_the_content(tok, adapter_for):
    # Offered as a call, the agent's echo of it would be refused above: the block is ill-formed instead.
    engine = SlowEngine(tok, '<tool_call>\n{"name": "f", "arguments": {"s": "\\udc00"}}\n</tool_call><|im_end|>')
    adapter = await adapter_for(engine)
    adapter.open_session("s", sampling_defaults={"max_new_tokens": 64})
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=30)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    reply = await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], tools=[tool])
    await agent.close()
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop" and message.tool_calls is None
    assert message.content == '<tool_call>\n{"name": "f", "arguments": {"s": "\\udc00"}}\n</tool_call>'


async def test_logprobs_bytes_of_tokens_that_split_a_character_join_to_its_utf8(tok, adapter_for):
    # 🦜 is three Qwen tokens; each decoded alone is U+FFFD, whose bytes [239, 191, 189] were sent three times.
    text = "𝜋≈3 🦜 é"
    engine = SlowEngine(tok, text + "<|im_end|>")
    adapter = await adapter_for(engine)
    adapter.open_session("s", sampling_defaults={"max_new_tokens": 64})
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=30)
    reply = await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], logprobs=True)
    await agent.close()
    entries = reply.choices[0].logprobs.content
    ids = tok.encode(text + "<|im_end|>", add_special_tokens=False)
    assert len(entries) == len(ids) and [e.token for e in entries] == [tok.decode([i]) for i in ids]
    assert bytes(b for e in entries for b in e.bytes) == (text + "<|im_end|>").encode()
    assert [e.bytes for e in entries if e.token.endswith("\ufffd")] == [[32, 240, 159], [166], [156]]
