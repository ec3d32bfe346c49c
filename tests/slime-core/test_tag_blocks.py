"""`slime_core.tag_blocks`: the blocks `re.finditer(open(.*?)close, DOTALL)` finds, in linear time."""

import random
import re

import pytest

from slime_core.tag_blocks import tag_blocks


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


def test_empty_tags_are_refused():
    with pytest.raises(ValueError, match="tags must not be empty"):
        list(tag_blocks("x", "", "</t>"))


@pytest.mark.timeout(60)
def test_unclosed_openings_are_linear():
    # The regex scans to the end from each of 200,000 openings (~15 min); find() scans once (ms).
    text = "<tool_call>" * 200_000 + "</tool_call>"[:-1]
    assert list(tag_blocks(text, "<tool_call>", "</tool_call>")) == []
