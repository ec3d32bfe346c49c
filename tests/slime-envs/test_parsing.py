import pytest

from slime_envs.parsing import ToolCall, extract_answer, parse_tag_action, parse_tool_calls


def test_hermes_calls_in_order():
    text = (
        '<think>x</think>\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": [2]}"}</tool_call><|im_end|>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == [ToolCall(name="a", arguments={"x": 1}), ToolCall(name="b", arguments={"y": [2]})]
    assert parsed.errors == [] and parsed.answer is None


def test_malformed_calls_become_errors():
    text = (
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>["a"]</tool_call>'
        '<tool_call>{"name": "f", "arguments": 3}</tool_call>'
        '<tool_call>{"name": "f", "arguments": "nope"}</tool_call>'
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
        "<tool_call>{"
    )
    parsed = parse_tool_calls(text)
    assert [c.name for c in parsed.tool_calls] == ["ok"]
    assert len(parsed.errors) == 6
    assert parsed.errors[0].startswith("invalid JSON in <tool_call>: ")
    assert parsed.errors[1] == "<tool_call> is missing a string 'name'"
    assert "got list" in parsed.errors[2]
    assert "'arguments' of tool 'f' must be a JSON object, got int" == parsed.errors[3]
    assert "is a string that is not valid JSON" in parsed.errors[4]
    assert parsed.errors[5] == "a <tool_call> block is not closed with </tool_call>"


def test_no_calls_and_answer():
    parsed = parse_tool_calls("so <answer> 42 </answer> and <answer>43</answer>")
    assert parsed.tool_calls == [] and parsed.errors == []
    assert parsed.answer == "43"
    assert extract_answer("nothing") is None


def test_tag_action_first_complete_tag():
    assert parse_tag_action("<think>a</think><search> q1 </search><answer>x</answer>") == ("search", "q1")
    assert parse_tag_action("<answer>\nParis\n</answer>") == ("answer", "Paris")
    assert parse_tag_action("<search>unclosed") == (None, "")
    assert parse_tag_action("<search>a</answer>") == (None, "")


def test_tag_parsers_read_what_search_r1s_regexes_read():
    import random
    import re

    rng = random.Random(1)
    pieces = ["<search>", "</search>", "<answer>", "</answer>", "q", " ", "\n", "<", "/"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 24)))
        match = re.search(r"<(search|answer)>(.*?)</\1>", text, re.DOTALL)
        assert parse_tag_action(text) == ((match.group(1), match.group(2).strip()) if match else (None, ""))
        answers = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
        assert extract_answer(text) == (answers[-1].strip() if answers else None)


@pytest.mark.timeout(60)
def test_repeated_opening_tags_parse_in_linear_time():
    # A model repeating one token: the regexes took 6 s for 8,000 openings on the event loop (quadratic);
    # 200,000 would take ~15 min.
    n = 200_000
    parsed = parse_tool_calls("<tool_call>" * n + "<answer>" * n)
    assert parsed.tool_calls == [] and parsed.errors == ["a <tool_call> block is not closed with </tool_call>"]
    assert parsed.answer is None
    assert parse_tag_action("<search>" * n + "<answer>" * n + "</answer>") == ("answer", "<answer>" * (n - 1))


def test_json_nested_past_the_decoders_depth_is_an_error_not_an_exception():
    # json.loads raises RecursionError past ~1,000 levels: 5,000 "[" in a model turn escaped the parser, and the
    # env step failed the whole sample (removed from training) instead of showing the model its error.
    deep = "[" * 5000
    parsed = parse_tool_calls(f"<tool_call>{deep}</tool_call>")
    assert parsed.tool_calls == [] and parsed.errors == ["invalid JSON in <tool_call>: nested too deeply"]
    parsed = parse_tool_calls('<tool_call>{"name": "f", "arguments": "' + deep + '"}</tool_call>')
    assert parsed.errors == ["invalid JSON in 'arguments' of tool 'f': nested too deeply"]


def test_an_integer_longer_than_the_decoder_reads_is_an_error_not_an_exception():
    # json.loads raises a plain ValueError (not JSONDecodeError) for an integer past Python's 4,300-digit limit:
    # 5,000 digits (~1,700 tokens) in a call failed the whole sample as a broken env instead of an observation.
    digits = "9" * 5000
    parsed = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": ' + digits + "}}</tool_call>")
    assert parsed.tool_calls == []
    assert parsed.errors == ["invalid JSON in <tool_call>: a number has more than 4300 digits"]
    parsed = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": ' + digits + '}"}</tool_call>')
    assert parsed.errors == ["invalid JSON in 'arguments' of tool 'f': a number has more than 4300 digits"]


def test_blocks_keep_the_order_the_model_wrote():
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        "<tool_call>{bad}</tool_call>"
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
        "<tool_call>{"
    )
    blocks = parse_tool_calls(text).blocks
    assert [b.name if isinstance(b, ToolCall) else b.split(":")[0] for b in blocks] == [
        "a",
        "invalid JSON in <tool_call>",
        "b",
        "a <tool_call> block is not closed with </tool_call>",
    ]


def test_half_a_surrogate_pair_in_a_call_is_an_error():
    # JSON's "\\ud800" decodes to a lone surrogate, which no tokenizer encodes (the error echoing it raised later).
    parsed = parse_tool_calls(
        '<tool_call>{"name": "f\\udc00", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "f", "arguments": "{\\"code\\": [\\"\\\\ud83d\\"]}"}</tool_call>'
        '<tool_call>{"name": "f", "arguments": {"s": "\\ud83d\\ude00"}}</tool_call>'
    )
    assert parsed.errors == [
        "invalid text in <tool_call>: ['name']: '\\udc00' at character 1 is half of a surrogate pair",
        "invalid text in <tool_call>: arguments['code'][0]: '\\ud83d' at character 0 is half of a surrogate pair",
    ]
    assert parsed.tool_calls == [ToolCall(name="f", arguments={"s": "\U0001f600"})]  # a whole pair is a character


def test_a_closing_tag_inside_a_json_string_is_part_of_the_call():
    # A call writing a file that mentions </tool_call>: the block was cut at it (an "invalid JSON" error shown to
    # the model for a well-formed call, and the rest of the JSON taken for text).
    call = '{"name": "write", "arguments": {"text": "end with </tool_call> then"}}'
    parsed = parse_tool_calls(f"<tool_call>\n{call}\n</tool_call><|im_end|>")
    assert parsed.blocks == [ToolCall(name="write", arguments={"text": "end with </tool_call> then"})]
    # An opening inside a call's JSON string is not an unclosed block either.
    inner = '{"name": "write", "arguments": {"text": "<tool_call>"}}'
    assert parse_tool_calls(f"<tool_call>{inner}</tool_call>").blocks == [
        ToolCall(name="write", arguments={"text": "<tool_call>"})
    ]


_F = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
_G = '<tool_call>{"name": "g", "arguments": {"x": 1}}</tool_call>'


@pytest.mark.parametrize(
    "thinking",
    [
        f"<think>maybe {_F} no</think>",
        f"maybe {_F} no</think>",  # Qwen3-thinking templates open <think> in the prompt: the turn holds only its end
        f"\n<think>maybe {_F} and then",  # cut while thinking: all of it is reasoning
    ],
)
def test_a_call_written_while_thinking_is_not_a_call(thinking):
    # The env ran it (the agent adapter did not): one rule for both parsers, Qwen3's reading of a turn.
    parsed = parse_tool_calls(thinking)
    assert parsed.blocks == [] and parsed.answer is None
    if "</think>" in thinking:  # a call after the thinking is one
        assert parse_tool_calls(thinking + "\n" + _G).blocks == [ToolCall(name="g", arguments={"x": 1})]


def test_a_call_opened_while_thinking_does_not_swallow_the_call_after_it():
    # The scan over the whole turn ran the thinking's unclosed <tool_call> up to the real call's </tool_call>: one
    # block, its JSON invalid, so the real call was answered with a parse error.
    parsed = parse_tool_calls("<think>maybe <tool_call> hmm, no</think>\n" + _G)
    assert parsed.blocks == [ToolCall(name="g", arguments={"x": 1})]
    # An unclosed opening in the thinking is reasoning, not an unclosed block.
    assert parse_tool_calls("<think>a <tool_call> b</think>The answer is 4.").blocks == []


def test_a_think_tag_later_in_the_answer_does_not_hide_calls():
    assert parse_tool_calls("See the <think> tags.\n" + _F).tool_calls == [ToolCall(name="f", arguments={})]


def test_a_call_in_a_markdown_code_fence_is_a_call():
    # As SGLang's qwen25/hermes parser, vLLM's hermes parser and the original's retool regex read it, and as the
    # agent adapter does (tests/slime-rollout/test_agent_output_parsing.py).
    for fence in ("```\n{}\n```", "```json\n{}\n```", "Call:\n```xml\n{}\n```\nthen wait."):
        assert parse_tool_calls(fence.format(_G)).tool_calls == [ToolCall(name="g", arguments={"x": 1})]


def test_a_call_whose_code_prints_the_thinking_end_tag_is_a_call():
    # A "</think>" with no "<think>" before it was read as the end of prompt-opened thinking, even inside a call's
    # JSON: the call before it was hidden (and the agent adapter hid it too).
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(\'</think>\')"}}</tool_call>'
    assert parse_tool_calls(call).tool_calls == [ToolCall(name="python", arguments={"code": "print('</think>')"})]


def test_a_stray_thinking_end_tag_after_a_call_in_the_answer_does_not_hide_it():
    # The agent adapter's reasoning parser hid this call (tests/slime-rollout/test_agent_output_parsing.py).
    text = '<think>plan</think><tool_call>{"name":"f","arguments":{}}</tool_call> I closed the </think> tag'
    assert parse_tool_calls(text).tool_calls == [ToolCall(name="f", arguments={})]
