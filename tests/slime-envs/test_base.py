"""`ToolEnv.step`: tool responses answer the blocks in the order written, and a turn's blocks past
`max_calls_per_turn` get one response together."""

import asyncio
import json

import pytest

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


class OddToolsEnv(ToolEnv):
    """Tools that return a huge text or something other than text."""

    def tool_functions(self):
        async def big(n):
            return "x" * n

        async def number():
            return 42

        async def raw():
            return b"\xff"

        return {"big": big, "number": number, "raw": raw}


def named(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


async def test_a_huge_tool_response_is_cut_marked_and_counted(caplog, monkeypatch):
    # A tool that printed 10 MB was passed whole: the observation used up the episode's token budget, cut without
    # a word, and the sample carried the 10 MB in its recorded conversation.
    from slime_envs import base

    monkeypatch.setattr(base, "_num_truncated", 0)  # the process's count (the log fires at its powers of two)
    env = OddToolsEnv(max_response_chars=100)
    step = await env.step(named("big", n=10_000_000) + named("big", n=100) + named("big", n=101))
    first, exact, over = step.tool_responses
    assert first == "x" * 100 + "\n... (tool response truncated: 100 of 10,000,000 characters shown)"
    assert exact == "x" * 100
    assert over == "x" * 100 + "\n... (tool response truncated: 100 of 101 characters shown)"
    assert step.info["num_truncated"] == 2
    assert "longer than max_response_chars=100 and were cut" in caplog.text
    assert (await EchoEnv().step(call("a"))).info["num_truncated"] == 0


@pytest.mark.parametrize(("tool", "kind"), [("number", "int 42"), ("raw", "bytes b'\\\\xff'")])
async def test_a_tool_returning_no_text_is_one_error_naming_it(tool, kind):
    # It failed as "sequence item 0: expected str instance, int found", naming neither the tool nor the env.
    with pytest.raises(TypeError, match=rf"OddToolsEnv tool '{tool}' returned {kind}, not a str"):
        await OddToolsEnv().step(named(tool))


def test_a_limit_out_of_range_is_refused():
    with pytest.raises(ValueError, match="max_response_chars >= 1, got 16, 4, 0"):
        EchoEnv(max_response_chars=0)


class HangingEnv(ToolEnv):
    """A tool that never answers, and one that raises its own TimeoutError."""

    def tool_functions(self):
        async def hang():
            await asyncio.Event().wait()

        async def own_timeout():
            raise TimeoutError("upstream took too long")

        return {"hang": hang, "own_timeout": own_timeout}


async def test_a_tool_that_hangs_is_cancelled_at_its_deadline_and_logged(caplog):
    # It held its episode, and so the rollout, until --plugin-timeout-secs (4 h) failed the whole rollout.
    env = HangingEnv(tool_timeout_s=0.2)
    step = await asyncio.wait_for(env.step(named("hang") + named("own_timeout")), timeout=60)
    assert step.tool_responses == [
        "Error: tool 'hang' did not answer within 0.2 s.",
        "Error: tool 'own_timeout' failed: TimeoutError: upstream took too long",
    ]
    assert not step.done and "HangingEnv tool hang did not answer within tool_timeout_s=0.2 s" in caplog.text
    with pytest.raises(ValueError, match="tool_timeout_s must be > 0 or None"):
        HangingEnv(tool_timeout_s=0)


async def test_an_episode_changing_its_stop_strings_or_tools_changes_no_other_episode():
    # The class-level lists were shared by every env of the process: an env that appended a stop string in its
    # __init__ added it to every episode's generation (every ToolEnv subclass's too).
    from slime_envs.calculator import CalculatorEnv

    class TaggedEnv(EchoEnv):
        def __init__(self):
            super().__init__()
            self.stop.append("</x>")
            self.tool_specs.append({"type": "function", "function": {"name": "x"}})

    envs = [TaggedEnv() for _ in range(3)]
    assert [e.stop for e in envs] == [["</x>"]] * 3 and len(envs[0].tool_specs) == 1
    assert ToolEnv.stop == [] and ToolEnv.tool_specs == [] and CalculatorEnv().stop == []
    assert [t["function"]["name"] for t in CalculatorEnv().tool_specs] == ["calculator"]


class BuggyToolEnv(ToolEnv):
    """A tool whose own code raises TypeError, whatever arguments it gets."""

    def tool_functions(self):
        async def add(a, b):
            return str(a + b)  # 1 + "x": the tool's bug, not the model's

        return {"add": add}


async def test_a_type_error_inside_a_tool_is_a_logged_tool_failure_not_bad_arguments(caplog):
    # Every TypeError of a call was answered "bad arguments" (the model was told to fix a call that was right) and
    # logged nowhere, so a broken tool went unnoticed; arguments that do not fit the signature still are.
    env = BuggyToolEnv()
    step = await env.step(named("add", a=1, b="x"))
    assert step.tool_responses == [
        "Error: tool 'add' failed: TypeError: unsupported operand type(s) for +: 'int' and 'str'"
    ]
    assert "tool add failed: TypeError(\"unsupported operand type(s) for +: 'int' and 'str'\")" in caplog.text
    caplog.clear()
    step = await env.step(named("add", a=1) + named("add", a=1, b=2, c=3) + named("add", a=1, b=2))
    assert step.tool_responses == [
        "Error: bad arguments for tool 'add': missing a required argument: 'b'",
        "Error: bad arguments for tool 'add': got an unexpected keyword argument 'c'",
        "3",
    ]
    assert caplog.text == ""


class CancelledToolEnv(ToolEnv):
    """`lookup` awaits an inner request that something else cancelled; `echo` answers."""

    def tool_functions(self):
        async def lookup():
            inner = asyncio.ensure_future(asyncio.sleep(60))
            await asyncio.sleep(0)
            inner.cancel()  # e.g. a client library's connection pool closing the request
            await inner
            return "never"

        async def echo(text):
            return text

        return {"lookup": lookup, "echo": echo}


async def test_a_tools_own_cancelled_error_is_a_tool_failure_and_a_real_cancel_still_cancels(caplog):
    # A CancelledError the tool raised while its episode was not being cancelled escaped `step` (a BaseException):
    # the sample's generate ended as if the rollout had cancelled it, instead of showing the model an error.
    env = CancelledToolEnv()
    step = await env.step(named("lookup") + named("echo", text="ok"))
    assert step.tool_responses == ["Error: tool 'lookup' failed: CancelledError", "ok"]
    assert "tool lookup failed: CancelledError()" in caplog.text
    # The episode's own cancellation (the rollout aborting it) is not swallowed.
    hanging = HangingEnv(tool_timeout_s=None)
    task = asyncio.ensure_future(hanging.step(named("hang")))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
