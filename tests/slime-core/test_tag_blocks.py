"""`slime_core.tag_blocks`: the blocks `re.finditer(open(.*?)close, DOTALL)` finds, in linear time."""

import json
import random
import re

import pytest

from slime_core.tag_blocks import json_tag_blocks, tag_blocks, thinking_end


def _regex_blocks(text, open_tag, close_tag):
    pattern = re.compile(re.escape(open_tag) + "(.*?)" + re.escape(close_tag), re.DOTALL)
    return [(m.start(), m.end(), m.group(1)) for m in pattern.finditer(text)]


def test_blocks_by_hand():
    text = "a<t>x</t>b<t><t>y</t></t><t>open"
    assert list(tag_blocks(text, "<t>", "</t>")) == [(1, 9, "x"), (10, 21, "<t>y")]
    assert list(tag_blocks("</t><t></t>", "<t>", "</t>")) == [(4, 11, "")]
    assert list(tag_blocks("no tags", "<t>", "</t>")) == []


def test_same_blocks_as_the_regex_on_random_text():
    rng = random.Random(0)
    pieces = ["<tool_call>", "</tool_call>", "<tool_", "call>", "x", "\n", "{", "}", "<", ">", "/"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 30)))
        expected = _regex_blocks(text, "<tool_call>", "</tool_call>")
        assert list(tag_blocks(text, "<tool_call>", "</tool_call>")) == expected


def test_a_body_with_an_integer_past_the_decoders_digit_limit_is_not_a_json_object():
    # json.loads raises a plain ValueError past 4,300 digits: it escaped the scan (and every parser above it).
    body = '{"x": ' + "9" * 5000 + "}"
    text = f"<tool_call>{body}</tool_call> then </tool_call>"
    assert list(json_tag_blocks(text, "<tool_call>", "</tool_call>")) == [(0, len(body) + 23, body)]
    assert thinking_end(f'<tool_call>{{"s": "</think>", "x": {"9" * 5000}}}</tool_call> b') > 0


def test_empty_tags_are_refused():
    with pytest.raises(ValueError, match="tags must not be empty"):
        list(tag_blocks("x", "", "</t>"))


@pytest.mark.parametrize("scan", [tag_blocks, json_tag_blocks])
def test_empty_tags_are_refused_at_the_call_even_for_empty_text(scan):
    # A generator checked its tags at the first next(): a caller that never iterated (or an empty text that a
    # caller skipped) hid the bad tag.
    with pytest.raises(ValueError, match=f"{scan.__name__}: tags must not be empty"):
        scan("", "<t>", "")


@pytest.mark.timeout(60)
def test_unclosed_openings_are_linear():
    # The regex scans to the end from each of 200,000 openings (~15 min); find() scans once (ms).
    text = "<tool_call>" * 200_000 + "</tool_call>"[:-1]
    assert list(tag_blocks(text, "<tool_call>", "</tool_call>")) == []


def test_json_blocks_keep_a_closing_tag_inside_a_json_string():
    call = json.dumps({"name": "write", "arguments": {"text": "a </tool_call> b"}})
    text = f"x<tool_call>\n{call}\n</tool_call>y<tool_call>{{bad</tool_call>"
    blocks = list(json_tag_blocks(text, "<tool_call>", "</tool_call>"))
    assert [b[2] for b in blocks] == [f"\n{call}\n", "{bad"]
    assert text[blocks[0][0] : blocks[0][1]] == f"<tool_call>\n{call}\n</tool_call>"
    # tag_blocks cut the first block inside the string.
    assert next(tag_blocks(text, "<tool_call>", "</tool_call>"))[2] == '\n{"name": "write", "arguments": {"text": "a '


def test_json_blocks_are_tag_blocks_where_no_json_object_is_closed_by_the_tag():
    rng = random.Random(1)
    pieces = ["<tool_call>", "</tool_call>", "x", "\n", "{", "}", '"', "<", ">", "/", '{"a": 1}', " "]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 30)))
        expected = list(tag_blocks(text, "<tool_call>", "</tool_call>"))
        got = list(json_tag_blocks(text, "<tool_call>", "</tool_call>"))
        for (_, end, body), (_, tag_end, _) in zip(got, expected, strict=False):
            if end != tag_end:  # only where a JSON object runs past the first closing tag
                json.loads(body)
                break
        else:
            assert got == expected


@pytest.mark.timeout(60)
def test_json_blocks_decode_a_bounded_number_of_characters():
    # Each body is a JSON object left open: unbounded, each opening tried every later closing tag (quadratic, hours
    # for 50,000 blocks); within the budget the rest end at their first closing tag.
    unit = '<tool_call>{"a": "x</tool_call>'
    blocks = list(json_tag_blocks(unit * 50_000, "<tool_call>", "</tool_call>"))
    assert len(blocks) == 50_000 and {b[2] for b in blocks} == {'{"a": "x'}
    with pytest.raises(ValueError, match="tags must not be empty"):
        list(json_tag_blocks("x", "<t>", ""))


_PRINTS_THINK = '<tool_call>{"name": "python", "arguments": {"code": "print(\'</think>\')"}}</tool_call>'


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("<think>a</think>b", len("<think>a</think>")),
        ("  <think>a</think>b</think>", len("  <think>a</think>")),
        ("a</think>b", len("a</think>")),  # opened in the prompt (Qwen3-thinking templates)
        ("<think>a <tool_call>", len("<think>a <tool_call>")),  # never closed: all thinking
        ("See <think> tags</think>", 0),  # a later <think> is text, and so its </think>
        ("no thinking", 0),
        ("", 0),
        # A "</think>" inside a well-formed call is text (code that prints it), not the end of prompt-opened thinking.
        (_PRINTS_THINK, 0),
        (f"maybe {_PRINTS_THINK} no</think>ok", len(f"maybe {_PRINTS_THINK} no</think>")),
        ("Plan <tool_call> maybe</think>x", len("Plan <tool_call> maybe</think>")),  # not a call: the end
        (_PRINTS_THINK * 20 + "</think>", 0),  # past 16 calls stepped over: no thinking (bounded cost)
    ],
)
def test_thinking_end(text, end):
    assert thinking_end(text) == end
