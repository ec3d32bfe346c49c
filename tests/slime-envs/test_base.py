"""`ToolEnv.step`: tool responses answer the blocks in the order written, and a turn's blocks past
`max_calls_per_turn` get one response together."""

import json

from slime_envs.base import ToolEnv


class EchoEnv(ToolEnv):
    """One tool, `echo(text)`, returning its argument."""

    def tool_functions(self):
        async def echo(text):
            return f"echo {text}"

        return {"echo": echo}


def call(text):
    return "<tool_call>" + json.dumps({"name": "echo", "arguments": {"text": text}}) + "</tool_call>"


async def test_responses_follow_the_blocks_in_the_order_written():
    # The n-th tool response must answer the n-th block: errors used to come first, so a model that wrote a good
    # call and then a malformed one read the parse error as the answer to its call.
    env = EchoEnv()
    step = await env.step(call("one") + "<tool_call>{oops}</tool_call>" + call("two"))
    assert step.tool_responses[0] == "echo one"
    assert step.tool_responses[1].startswith("Error: invalid JSON in <tool_call>: ")
    assert step.tool_responses[2] == "echo two"
    assert len(step.tool_responses) == 3 and env.num_tool_calls == 2


async def test_blocks_past_the_per_turn_limit_get_one_response():
    # 4,000 empty blocks (8,000 Qwen tokens) got 4,000 error messages: a 750 KB observation built and rendered
    # through the chat template on the rollout loop, for a turn that only the first few blocks of deserve an answer.
    env = EchoEnv(max_calls_per_turn=2)
    step = await env.step("<tool_call></tool_call>" * 4000)
    assert len(step.tool_responses) == 3
    assert step.tool_responses[0].startswith("Error: invalid JSON in <tool_call>: Expecting value")
    assert step.tool_responses[2] == "Error: at most 2 tool calls per turn; the 3998 after them were not run."
    step = await env.step(call("a") + call("b") + call("c"))
    assert step.tool_responses == [
        "echo a",
        "echo b",
        "Error: at most 2 tool calls per turn; the 1 after them were not run.",
    ]
    assert env.num_tool_calls == 2


async def test_a_turn_without_blocks_ends_the_episode():
    step = await EchoEnv().step("The answer is 4.")
    assert step.done and step.tool_responses is None


async def test_a_call_only_thought_about_is_not_run_and_the_turn_is_the_answer():
    # The env ran calls written inside <think>; the agent adapter returned none for the same turn.
    env = EchoEnv()
    step = await env.step(f"<think>maybe {call('x')}? No.</think>\nThe answer is 4.")
    assert step.done and step.tool_responses is None and env.num_tool_calls == 0
    step = await env.step(f"<think>I will call it.</think>\n{call('y')}")
    assert not step.done and step.tool_responses == ["echo y"] and env.num_tool_calls == 1
