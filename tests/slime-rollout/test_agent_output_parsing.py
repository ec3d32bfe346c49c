"""`slime_rollout.agent.output_parsing.parse_output`: content, reasoning and tool calls of one model turn."""

import pytest

from slime_rollout.agent.output_parsing import parse_output


def test_calls_leave_the_content_and_ill_formed_blocks_stay():
    text = 'Let me look.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><tool_call>{bad}</tool_call> ok'
    parsed = parse_output(text, parse_tools=True, parse_reasoning=False)
    assert parsed.tool_calls == [{"name": "f", "arguments": {"x": 1}}]
    assert parsed.content == "Let me look.<tool_call>{bad}</tool_call> ok" and parsed.num_ill_formed == 1


@pytest.mark.timeout(60)
def test_repeated_opening_tags_parse_in_linear_time():
    # The adapter parses on the rollout loop: the regex was quadratic in unclosed openings (~15 min here).
    text = "<think>r</think>" + "<tool_call>" * 200_000
    parsed = parse_output(text, parse_tools=True, parse_reasoning=True)
    assert parsed.tool_calls == [] and parsed.reasoning == "r" and parsed.content == "<tool_call>" * 200_000


def test_json_nested_past_the_decoders_depth_is_an_ill_formed_block():
    # json.loads raises RecursionError past ~1,000 levels: a turn with 5,000 "[" in a <tool_call> ended the agent's
    # request as an HTTP 500 (the generated turn lost) instead of a reply whose content keeps the block.
    text = "<tool_call>" + "[" * 5000 + "</tool_call>"
    parsed = parse_output(text, parse_tools=True, parse_reasoning=False)
    assert parsed.tool_calls == [] and parsed.num_ill_formed == 1 and parsed.content == text
    deep_args = '<tool_call>{"name": "f", "arguments": "' + "[" * 5000 + '"}</tool_call>'
    assert parse_output(deep_args, parse_tools=True, parse_reasoning=False).num_ill_formed == 1


def test_an_integer_longer_than_the_decoder_reads_is_an_ill_formed_block():
    # json.loads raises a plain ValueError for an integer past Python's 4,300-digit limit: the agent's request
    # ended as an HTTP 500 (the generated turn lost) instead of a reply whose content keeps the block.
    text = '<tool_call>{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}</tool_call>"
    parsed = parse_output(text, parse_tools=True, parse_reasoning=False)
    assert parsed.tool_calls == [] and parsed.num_ill_formed == 1 and parsed.content == text
    as_string = '<tool_call>{"name": "f", "arguments": "{\\"x\\": ' + "9" * 5000 + '}"}</tool_call>'
    assert parse_output(as_string, parse_tools=True, parse_reasoning=False).num_ill_formed == 1


@pytest.mark.parametrize(
    "text",
    [
        '<think>maybe <tool_call>{"name": "f", "arguments": {}}</tool_call> no</think>\nDone.',
        # Qwen3-thinking templates open <think> in the prompt: the turn holds only its end.
        'maybe <tool_call>{"name": "f", "arguments": {}}</tool_call> no</think>\nDone.',
        '<think>maybe <tool_call>{"name": "f", "arguments": {}}</tool_call> and then',  # cut while thinking
    ],
)
def test_a_call_written_while_thinking_is_not_a_call_without_a_reasoning_parser(text):
    # Without a reasoning parser the thinking stays in the content, and the call it considered was returned.
    parsed = parse_output(text, parse_tools=True, parse_reasoning=False)
    assert parsed.tool_calls == [] and parsed.content == text.strip() and parsed.num_ill_formed == 0
    after = text + '\n<tool_call>{"name": "g", "arguments": {"x": 1}}</tool_call>'
    if "</think>" in text:  # a call after the thinking is one
        assert parse_output(after, parse_tools=True, parse_reasoning=False).tool_calls == [
            {"name": "g", "arguments": {"x": 1}}
        ]


def test_a_think_tag_later_in_the_answer_does_not_hide_calls():
    text = 'See <think> tags.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert parse_output(text, parse_tools=True, parse_reasoning=False).tool_calls == [{"name": "f", "arguments": {}}]


@pytest.mark.parametrize("parse_reasoning", [True, False])
def test_a_stray_thinking_end_tag_after_a_call_in_the_answer_does_not_hide_it(parse_reasoning):
    # With a reasoning parser the answer was searched for the thinking's end a second time: the stray "</think>"
    # after the call made the call count as thinking (tool_calls was []); slime_envs.parsing found it.
    text = '<think>plan</think><tool_call>{"name":"f","arguments":{}}</tool_call> I closed the </think> tag'
    parsed = parse_output(text, parse_tools=True, parse_reasoning=parse_reasoning)
    assert parsed.tool_calls == [{"name": "f", "arguments": {}}]
    if parse_reasoning:
        assert parsed.reasoning == "plan" and parsed.content == "I closed the </think> tag"


def test_the_stop_closed_tail_costs_no_second_pass(monkeypatch):
    # _open_block_at_end ran a whole json_tag_blocks pass (JSON-decoding every body) before the main loop ran the
    # same pass again; now one pass decides, and a second runs only when the stop string closes a tail block.
    from slime_rollout.agent import output_parsing

    num_passes = []
    real = output_parsing.json_tag_blocks

    def counting(*args):
        num_passes.append(1)
        return real(*args)

    monkeypatch.setattr(output_parsing, "json_tag_blocks", counting)
    call = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    out = parse_output(f"a {call} b", parse_tools=True, parse_reasoning=False, stop="</tool_call>")
    assert len(num_passes) == 1 and out.tool_calls == [{"name": "f", "arguments": {"x": 1}}] and out.content == "a  b"
    out = parse_output(
        f"a {call[: -len('</tool_call>')]}", parse_tools=True, parse_reasoning=False, stop="</tool_call>"
    )
    assert len(num_passes) == 3 and out.tool_calls == [{"name": "f", "arguments": {"x": 1}}] and out.content == "a"


def test_a_call_opened_while_thinking_does_not_swallow_the_call_after_it():
    # Without a reasoning parser the whole turn was scanned: the thinking's unclosed <tool_call> ran up to the real
    # call's </tool_call>, one block starting in the thinking, skipped: the real call was lost.
    text = 'Plan <tool_call> maybe</think>\n<tool_call>{"name": "g", "arguments": {"x": 1}}</tool_call>'
    for opened in ("<think>", ""):
        parsed = parse_output(opened + text, parse_tools=True, parse_reasoning=False)
        assert parsed.tool_calls == [{"name": "g", "arguments": {"x": 1}}] and parsed.num_ill_formed == 0
        assert parsed.content == f"{opened}Plan <tool_call> maybe</think>"


@pytest.mark.parametrize("parse_reasoning", [False, True])
def test_a_call_in_a_markdown_code_fence_is_a_call(parse_reasoning):
    # As SGLang's qwen25/hermes parser, vLLM's hermes parser and the original's retool regex read it, and as
    # slime_envs.parsing does (tests/slime-envs/test_parsing.py).
    call = '<tool_call>{"name": "g", "arguments": {"x": 1}}</tool_call>'
    parsed = parse_output(
        f"<think>r</think>Call:\n```json\n{call}\n```", parse_tools=True, parse_reasoning=parse_reasoning
    )
    assert parsed.tool_calls == [{"name": "g", "arguments": {"x": 1}}]
    assert parsed.content.endswith("Call:\n```json\n\n```")


def test_a_call_whose_code_prints_the_thinking_end_tag_is_a_call():
    # A "</think>" with no "<think>" before it was read as the end of prompt-opened thinking, even inside a call's
    # JSON: the call was hidden in the content.
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(\'</think>\')"}}</tool_call>'
    parsed = parse_output(call, parse_tools=True, parse_reasoning=False)
    assert parsed.tool_calls == [{"name": "python", "arguments": {"code": "print('</think>')"}}]
    assert parsed.content == ""


def test_with_a_reasoning_parser_a_thinking_end_tag_inside_a_call_does_not_split_it():
    # The reasoning parser split at the first "</think>", here inside the call's JSON: half the call became
    # reasoning and the call was lost (SGLang's qwen3 parser reads a turn without "<think>" as content).
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(\'</think>\')"}}</tool_call>'
    parsed = parse_output(call, parse_tools=True, parse_reasoning=True)
    assert parsed.tool_calls == [{"name": "python", "arguments": {"code": "print('</think>')"}}]
    assert parsed.reasoning == "" and parsed.content == ""
    parsed = parse_output(f"<think>\nr\n</think>\n\n{call}", parse_tools=True, parse_reasoning=True)
    assert parsed.reasoning == "r" and len(parsed.tool_calls) == 1
