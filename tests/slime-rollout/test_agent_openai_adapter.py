"""The OpenAI-compatible agent adapter: driven with the `openai` SDK, episodes recorded token-in/token-out.

The end-to-end test puts the adapter in front of a real CPU reference engine (tiny random Qwen3, real Qwen3
tokenizer) and plays a two-call tool episode; a recorder between adapter and engine keeps every request and
reply, so the samples are checked against the ids the engine really sent back. The other tests use a scripted
engine (the real Qwen3 tokenization of scripted turns, log-probs -0.01, -0.02, ...) to pin tool-call framing,
forks, sampling parameters and the refusals.
"""

import json

import pytest

pytest.importorskip(
    "openai", reason="these tests drive the adapter with the OpenAI SDK (absent on the GPU trainer path)"
)
import openai  # noqa: E402

from slime_core.sample import Sample, Status  # noqa: E402
from slime_rollout.agent import OpenAIAdapter  # noqa: E402
from slime_rollout.data.source import get_tokenizer  # noqa: E402
from slime_rollout.engines.client import EngineClient  # noqa: E402
from slime_rollout.generation.template_check import check_sample  # noqa: E402

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


@pytest.mark.slow  # 5-12 s: runs in the full suite, not in the per-package isolation run
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
    # The random model made no tool call, so a `tool` reply is a 400 (OpenAI's rule); the user message that Qwen3's
    # template renders a tool reply as gives the same ids.
    messages.append({"role": "user", "content": "<tool_response>\n42\n</tool_response>"})
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

    # Conformance of the whole sample (generation.template_check): Qwen3's template renders the last assistant
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


# ---- scripted engine ---------------------------------------------------------------------------------------

TOOL_TURN = (
    "<think>\nI should compute.\n</think>\n\n"
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
)
FINAL_TURN = "<think>\nok\n</think>\n\nThe answer is 42.<|im_end|>"


class ScriptedEngine:
    """Answers call i with the Qwen3 ids of `turns[i]` and log-probs -0.01, -0.02, ... (SGLang's reply shape)."""

    def __init__(self, tok, turns, *, finish_types=None, fail=None):
        self.tok, self.turns, self.finish_types, self.fail = tok, list(turns), list(finish_types or []), fail
        self.payloads = []

    async def generate(self, payload):
        self.payloads.append(json.loads(json.dumps(payload)))
        if self.fail is not None:
            raise self.fail
        i = len(self.payloads) - 1
        ids = self.tok.encode(self.turns[i], add_special_tokens=False)
        finish = self.finish_types[i] if i < len(self.finish_types) else "stop"
        lps = [-(k + 1) / 100 for k in range(len(ids))]
        return {
            "text": self.tok.decode(ids),
            "meta_info": {
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids, strict=True)],
                "finish_reason": {"type": finish},
                "weight_version": "2",
            },
        }


@pytest.fixture
async def scripted(tok, served):
    """Factory: `await scripted(turns, sid=..., **adapter_kw)` -> (adapter, engine, AsyncOpenAI client)."""
    clients = []

    async def make(turns, *, sid="s", finish_types=None, fail=None, defaults=None, max_context_tokens=0, **kw):
        engine = ScriptedEngine(tok, turns, finish_types=finish_types, fail=fail)
        adapter = await served(OpenAIAdapter(tokenizer=tok, client=engine, **kw))
        adapter.open_session(
            sid, sampling_defaults=defaults or {"max_new_tokens": 64}, max_context_tokens=max_context_tokens
        )
        client = openai.AsyncOpenAI(base_url=adapter.base_url, api_key=sid, max_retries=0, timeout=30)
        clients.append(client)
        return adapter, engine, client

    yield make
    for c in clients:
        await c.close()


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


async def test_tool_call_reply_and_its_echo_continue_one_branch(tok, scripted):
    adapter, engine, agent = await scripted([TOOL_TURN, FINAL_TURN], reasoning_parser="qwen3")
    messages = [{"role": "user", "content": "6*7?"}]
    first = await agent.chat.completions.create(model="m", messages=messages, tools=[CALC_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == "I should compute."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "6*7"}
    # The agent echoes the turn its own way: other call id, arguments re-serialized, no reasoning.
    echo = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_mine",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression":"6*7"}'},
            }
        ],
    }
    messages += [echo, {"role": "tool", "tool_call_id": "call_mine", "content": "42"}]
    second = await agent.chat.completions.create(model="m", messages=messages, tools=[CALC_TOOL])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "The answer is 42."
    assert second.choices[0].message.model_extra["reasoning_content"] == "ok"

    (s,) = await adapter.finish_session("s", base_sample=Sample(index=0), reward=1.0)
    prompt = template_ids(tok, messages[:1], [CALC_TOOL])
    t1, t2, obs = enc(tok, TOOL_TURN), enc(tok, FINAL_TURN), enc(tok, QWEN_TOOL_42_AFTER_CLOSED_TURN)
    assert engine.payloads[1]["input_ids"] == prompt + t1 + obs  # the turn closed with <|im_end|>: not repeated
    assert s.tokens == prompt + t1 + obs + t2
    assert s.loss_mask == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
    lps = lambda n: [-(k + 1) / 100 for k in range(n)]  # noqa: E731
    assert s.rollout_log_probs == lps(len(t1)) + [0.0] * len(obs) + lps(len(t2))
    assert (s.status, s.reward, s.weight_versions, s.prompt) == (Status.COMPLETED, 1.0, ["2", "2"], messages[:1])
    # Model text that round-trips and a final turn with its own <think>: the template gives the same ids.
    assert check_sample(tok, s).consistent
    # Call 2's echo drops the reasoning, so the template renders turn 1 without its <think> block.
    assert s.metadata["agent"]["turns"][1]["template_mismatch"] == len(prompt)


async def test_retry_from_an_earlier_turn_forks_and_trains_each_turn_once(tok, scripted):
    adapter, engine, agent = await scripted(["A<|im_end|>", "B<|im_end|>", "C<|im_end|>"])
    user = {"role": "user", "content": "go"}
    a = (await agent.chat.completions.create(model="m", messages=[user])).choices[0].message
    assert a.content == "A"
    history = [user, {"role": "assistant", "content": "A"}]
    await agent.chat.completions.create(model="m", messages=[*history, {"role": "user", "content": "again"}])
    # The agent goes back to turn 1 and asks something else: a fork that shares turn 1 as context.
    await agent.chat.completions.create(model="m", messages=[*history, {"role": "user", "content": "other"}])
    samples = await adapter.finish_session("s", base_sample=Sample(index=5, group_index=2))
    assert len(samples) == 2
    prompt = template_ids(tok, [user], None)
    obs = {u: enc(tok, f"\n<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n") for u in ("again", "other")}
    a_ids, b_ids, c_ids = (enc(tok, f"{x}<|im_end|>") for x in "ABC")
    assert samples[0].tokens == prompt + a_ids + obs["again"] + b_ids
    assert samples[0].loss_mask == [1] * len(a_ids) + [0] * len(obs["again"]) + [1] * len(b_ids)
    assert samples[1].tokens == prompt + a_ids + obs["other"] + c_ids
    assert samples[1].loss_mask == [0] * len(a_ids) + [0] * len(obs["other"]) + [1] * len(c_ids)
    assert samples[1].rollout_log_probs[: len(a_ids)] == [0.0] * len(a_ids)
    assert [t["trained"] for t in samples[1].metadata["agent"]["turns"]] == [False, True]
    assert samples[1].metadata["agent"]["forked_from"] == 0
    assert {(x.index, x.group_index, x.rollout_id) for x in samples} == {(5, 2, 5)}  # siblings share the rollout
    assert engine.payloads[2]["input_ids"] == samples[1].tokens[: -len(c_ids)]


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"stream": True}, "stream: true is not supported"),
        ({"n": 2}, "n must be 1"),
        ({"tools": [CALC_TOOL], "tool_choice": "required"}, "tool_choice must be 'auto' or 'none'"),
        ({"extra_body": {"guided_regex": "a+"}}, "unsupported field(s) ['guided_regex']"),
        ({"logprobs": True, "top_logprobs": 2}, "top_logprobs is not supported"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0]: content part of type 'image_url' is not supported",
        ),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, "last message"),
        ({"messages": [{"role": "function", "content": "a"}]}, "role 'function' is not supported"),
        # Wrong types: each was a bare HTTP 500 or named the wrong field (a bad seed said "chat template: ...").
        ({"seed": "abc"}, "seed must be a 64-bit integer, got 'abc'"),
        ({"seed": 2**64}, "seed must be a 64-bit integer"),
        ({"stop": 5}, "stop must be a string or a list of strings, got 5"),
        ({"stop": [1, "x"]}, "stop must be a string or a list of strings, got [1, 'x']"),  # after generating
        ({"tools": ["calculator"]}, "tools[0]: must be an object, got str"),
        (
            {"messages": [{"role": "assistant", "content": "a", "tool_calls": 5}, {"role": "user", "content": "b"}]},
            "messages[0].tool_calls: must be a list, got int",
        ),
        (
            # An echoed tool call whose arguments nest past json's decoder depth: RecursionError, a bare HTTP 500.
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[" * 5000}}]},
                    {"role": "tool", "content": "b"},
                ]
            },
            "messages[1].tool_calls[0].function: arguments are not valid JSON (nested too deeply)",
        ),
        (
            # An echoed call whose arguments hold an integer past json's 4,300-digit limit: ValueError, an HTTP 500.
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "9" * 5000}}]},
                    {"role": "tool", "content": "b"},
                ]
            },
            "messages[1].tool_calls[0].function: arguments are not valid JSON (a number has more than 4300 digits)",
        ),
        ({"temperature": "hot"}, "temperature must be a finite number, got 'hot'"),
        ({"temperature": -1}, "temperature must be a number >= 0"),
        ({"top_p": 0}, "top_p must be a number in (0, 1]"),
        ({"extra_body": {"top_k": 2.5}}, "top_k must be an integer, -1 or >= 1"),
        ({"max_tokens": True}, "max_tokens must be a positive integer, got True"),
        ({"logprobs": "yes"}, "logprobs must be true or false"),
        # Issue 27: each was accepted and rendered as an empty or stringified turn the model was trained on.
        ({"messages": [{"role": "user"}]}, "messages[0]: content must be a string or a list of parts, got none"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0]: content must be a string or a list"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text must be a"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "text must be a string, got 5"),
        ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0].function.name must be a string"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"name": 1}}]},
                    {"role": "user", "content": "b"},
                ]
            },
            "messages[0].tool_calls[0].function.name must be a string",
        ),
        # Issue 27, round 10: each was accepted (OpenAI's API refuses them, naming the field).
        ({"metadata": "run-7"}, "metadata must be an object, got str"),
        ({"user": 7}, "user must be a string, got 7"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls must be true or false, got 'yes'"),
        ({"metadata": {"run": 7}}, "metadata['run'] must be a string of at most 512 characters, got 7"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata has 17 keys, at most 16 allowed"),
        ({"messages": [{"role": "user", "content": "a", "name": 5}]}, "messages[0].name must be a string, got int"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "42"}]},
            "messages[1]: a message with role 'tool' must answer a preceding assistant message with 'tool_calls'",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "no call here"},
                    {"role": "tool", "content": "42"},
                ]
            },
            "messages[2]: a message with role 'tool' must answer",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "tool_calls": [{"id": "call_1", "function": {"name": "f"}}]},
                    {"role": "tool", "content": "42"},
                ]
            },
            "messages[2].tool_call_id is required: the id of the tool call it answers, got None",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "tool_calls": [{"id": "call_1", "function": {"name": "f"}}]},
                    {"role": "tool", "tool_call_id": "call_9", "content": "42"},
                ]
            },
            "messages[2].tool_call_id 'call_9' names no tool call of messages[1] (call_1)",
        ),
    ],
)
async def test_unsupported_requests_are_400_naming_the_field(scripted, kw, needle):
    adapter, engine, agent = await scripted(["x"])
    kw = {"messages": [{"role": "user", "content": "hi"}], **kw}
    with pytest.raises(openai.BadRequestError) as err:
        await agent.chat.completions.create(model="m", **kw)
    assert needle in err.value.body["message"]
    assert engine.payloads == []  # refused before the engine


async def test_well_formed_metadata_names_and_tool_replies_are_accepted(scripted):
    # The other side of the round-10 refusals: OpenAI's schema allows each of these.
    adapter, engine, agent = await scripted(["x<|im_end|>"])
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "a", "name": "alice"},
        {"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        {"role": "tool", "tool_call_id": "call_2", "content": "2"},
    ]
    reply = await agent.chat.completions.create(
        model="m", messages=messages, metadata={"run": "7"}, user="u1", parallel_tool_calls=False
    )
    assert reply.choices[0].message.content == "x" and len(engine.payloads) == 1


async def test_a_body_nested_past_the_json_decoders_depth_is_a_400(scripted):
    # aiohttp's request.json() raised RecursionError: a bare HTTP 500.
    import httpx

    adapter, engine, _ = await scripted(["x"])
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        reply = await http.post(
            f"{adapter.base_url}/chat/completions",
            content='{"a": ' * 5000,
            headers={"Authorization": "Bearer s", "Content-Type": "application/json"},
        )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == "the body is not JSON: nested too deeply"
    assert engine.payloads == []


async def test_a_body_with_an_integer_past_the_json_decoders_digit_limit_is_a_400(scripted):
    # aiohttp's request.json() raised a plain ValueError (Python's 4,300-digit limit): a bare HTTP 500.
    import httpx

    adapter, engine, _ = await scripted(["x"])
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        reply = await http.post(
            f"{adapter.base_url}/chat/completions",
            content='{"seed": ' + "1" * 5000 + "}",
            headers={"Authorization": "Bearer s", "Content-Type": "application/json"},
        )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == "the body is not JSON: a number has more than 4300 digits"
    assert engine.payloads == []


async def test_a_chat_template_that_refuses_the_messages_is_a_400(qwen3_tokenizer_dir, served):
    # A template's own raise_exception (Mistral's, Llama 2's "roles must alternate") is a jinja2 TemplateError,
    # not a ValueError: it ended the call as a bare HTTP 500.
    from transformers import AutoTokenizer

    strict = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))
    strict.chat_template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    engine = ScriptedEngine(strict, ["a"])
    adapter = await served(OpenAIAdapter(tokenizer=strict, client=engine))
    adapter.open_session("s")
    agent = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="s", max_retries=0, timeout=30)
    try:
        with pytest.raises(openai.BadRequestError) as err:
            await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        await agent.close()
    assert err.value.body["message"] == "chat template: Conversation roles must alternate user/assistant"
    assert err.value.body["param"] == "messages" and engine.payloads == []


async def test_sessions_unknown_capped_and_finished(tok, scripted, served):
    adapter, engine, agent = await scripted(["a<|im_end|>", "b<|im_end|>"], max_turns_per_sid=1)
    with pytest.raises(ValueError, match="already open"):
        adapter.open_session("s")
    stranger = openai.AsyncOpenAI(base_url=adapter.base_url, api_key="nobody", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="unknown agent session 'nobody'"):
        await stranger.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    await stranger.close()
    await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    # The original's refusal: HTTP 429 rate_limit_error (it was a 400 here).
    with pytest.raises(openai.RateLimitError, match="max_turns_per_sid=1") as err:
        await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
    assert err.value.status_code == 429 and err.value.body["type"] == "rate_limit_error"
    assert len(await adapter.finish_session("s", base_sample=Sample())) == 1
    assert await adapter.finish_session("s", base_sample=Sample()) == []
    with pytest.raises(openai.NotFoundError):
        await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])
    models = await agent.models.list()
    assert [m.id for m in models.data] == ["slime-actor"]


async def test_sampling_params_stop_and_logprobs(tok, scripted):
    defaults = {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 50, "stop": ["</answer>"], "sampling_seed": 11}
    adapter, engine, agent = await scripted(["yes STOP more", "x"], defaults=defaults)
    reply = await agent.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "q"}], temperature=0.2, max_tokens=100, seed=5, stop="STOP",
        logprobs=True,
    )  # fmt: skip
    assert engine.payloads[0]["sampling_params"] == {
        "temperature": 0.2, "top_p": 0.9, "max_new_tokens": 50, "stop": ["STOP"], "sampling_seed": 5,
        "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False,
    }  # fmt: skip
    assert reply.choices[0].message.content == "yes"  # the stop sequence and what follows it are left out
    ids = enc(tok, "yes STOP more")
    assert [c.token for c in reply.choices[0].logprobs.content] == [tok.decode([i]) for i in ids]
    assert [c.logprob for c in reply.choices[0].logprobs.content] == [-(k + 1) / 100 for k in range(len(ids))]
    (s,) = await adapter.finish_session("s", base_sample=Sample())
    assert s.tokens[-len(ids) :] == ids  # trained on what the engine generated, stop string included


async def test_engine_seed_is_derived_per_call_when_the_agent_sends_none(scripted):
    adapter, engine, agent = await scripted(["a<|im_end|>", "b<|im_end|>"], defaults={"sampling_seed": 11})
    await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "r"}]
    await agent.chat.completions.create(model="m", messages=msgs)
    seeds = [p["sampling_params"]["sampling_seed"] for p in engine.payloads]
    from slime_rollout.generation.seeds import continuation_seed

    assert seeds == [continuation_seed(11, len(p["input_ids"])) for p in engine.payloads]
    assert seeds[0] != seeds[1]


async def test_engine_abort_error_and_context_limit(tok, scripted):
    adapter, engine, agent = await scripted(["a", "b"], finish_types=["abort"])
    with pytest.raises(openai.InternalServerError, match="aborted") as err:
        await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert err.value.status_code == 503
    assert adapter._sessions["s"].num_aborted == 1  # counted (it went unlogged), for metadata["agent"]
    assert await adapter.finish_session("s", base_sample=Sample()) == []  # an aborted call is not recorded

    from slime_rollout.engines.transport import EngineError

    adapter, engine, agent = await scripted(["a"], sid="t", fail=EngineError("http://e", "/generate", "boom", 500))
    with pytest.raises(openai.APIStatusError, match="boom") as err:
        await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert err.value.status_code == 502

    # SGLang's own refusal of the request (HTTP 400 `{"error": {"message"}}`, http_server.py `_create_error_response`):
    # the agent's request is at fault, so a 400 it will not retry, not a 502 the openai SDK retries twice.
    refusal = '{"error": {"message": "presence_penalty must be in [-2, 2], got 3.0."}}'
    adapter, engine, agent = await scripted(["a"], sid="v", fail=EngineError("http://e", "/generate", refusal, 400))
    with pytest.raises(openai.BadRequestError, match=r"refused the call: presence_penalty must be in \[-2, 2\]") as err:
        await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert err.value.code is None
    # Its context refusal (tokenizer_manager.py _validate_one_request) carries OpenAI's code, which agents read.
    too_long = ('{"error": {"message": "Requested token count exceeds the model\'s maximum context length of 16 '
                'tokens. You requested a total of 17 tokens: 8 tokens from the input messages and 9 tokens for the '
                'completion."}}')  # fmt: skip
    adapter, engine, agent = await scripted(["a"], sid="w", fail=EngineError("http://e", "/generate", too_long, 400))
    with pytest.raises(openai.BadRequestError, match="maximum context length of 16 tokens") as err:
        await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert err.value.code == "context_length_exceeded"

    adapter, engine, agent = await scripted(["a"], sid="u", max_context_tokens=5)
    with pytest.raises(openai.BadRequestError, match="the limit is 5") as err:
        await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert engine.payloads == []
    # OpenAI's code, which agents read to compact their history (it was None, as the open_session docstring denied).
    assert err.value.code == "context_length_exceeded"


async def test_all_engines_down_is_a_503_naming_the_cause(tok, served):
    # A real pool whose only engine is out of service: after the recovery window it raises NoHealthyEngineError,
    # which reached the agent as aiohttp's bare "500 Internal Server Error" (no cause, not an engine error code).
    from slime_rollout.engines.pool import EnginePool, EngineState

    pool = EnginePool([EngineClient("http://127.0.0.1:9")], failover=True, recovery_timeout_s=0.2)
    pool.set_state(0, EngineState.FAILED)
    adapter = await served(OpenAIAdapter(tokenizer=tok, client=pool))
    adapter.open_session("d", sampling_defaults={"max_new_tokens": 8})
    async with openai.AsyncOpenAI(base_url=adapter.base_url, api_key="d", max_retries=0, timeout=30) as agent:
        with pytest.raises(openai.APIStatusError) as err:
            await agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert err.value.status_code == 503
    assert err.value.type == "server_error"
    assert "no healthy engine for 0s (--rollout-engine-recovery-timeout): http://127.0.0.1:9 failed" in str(err.value)
    assert await adapter.finish_session("d", base_sample=Sample()) == []  # nothing recorded


def test_constructor_errors(tok):
    with pytest.raises(ValueError, match="exactly one of client="):
        OpenAIAdapter(tokenizer=tok)
    with pytest.raises(ValueError, match="tool_parser 'mistral' is not supported"):
        OpenAIAdapter(tokenizer=tok, sglang_url="http://127.0.0.1:1", tool_parser="mistral")
