"""`<tag>...</tag>` blocks of model output, found in linear time.

`re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)` retries from every opening tag that has no
closing tag after it, scanning to the end of the text each time: quadratic in the number of unclosed openings.
A model that repeats `<tool_call>` (one token in Qwen's vocabulary) 8,000 times made one parse take 6 s on the
rollout's event loop, stalling every episode in flight. `tag_blocks` finds the same blocks with `str.find`:
once an opening has no closing tag after it, no later opening has one either, so the scan stops there.

`thinking_end` is where a turn's leading `<think>` reasoning ends: both tool-call parsers (`slime_envs.parsing`
and the agent adapter's `slime_rollout.agent.output_parsing`) read calls after it only, one rule for both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

__all__ = ["json_tag_blocks", "tag_blocks", "thinking_end"]


def tag_blocks(text: str, open_tag: str, close_tag: str) -> Iterator[tuple[int, int, str]]:
    """The blocks `open_tag body close_tag` of `text`, left to right, non-overlapping.

    The same blocks as `re.finditer(re.escape(open_tag) + "(.*?)" + re.escape(close_tag), text, re.DOTALL)`
    (each block ends at the first closing tag after its opening; the body may hold further opening tags), in
    time linear in `len(text)`.

    Args:
        text: the text to scan, e.g. a decoded model turn.
        open_tag: the opening tag, e.g. `"<tool_call>"` (not empty).
        close_tag: the closing tag, e.g. `"</tool_call>"` (not empty).

    Yields:
        `(start, end, body)`: `text[start:end]` is the whole block, `body` the text between the tags.

    Raises:
        ValueError: an empty tag.
    """
    return _scan(text, open_tag, close_tag, "tag_blocks", json_budget=0)


def json_tag_blocks(text: str, open_tag: str, close_tag: str) -> Iterator[tuple[int, int, str]]:
    r"""`tag_blocks` for tags around a JSON object (Qwen/Hermes `<tool_call>`): a closing tag in a JSON string is text.

    A body that is not a JSON object but starts with `{` ends at the first later closing tag that makes it one:
    `<tool_call>{"name": "write", "arguments": {"text": "a </tool_call> b"}}</tool_call>` is one block (`tag_blocks`
    cuts it at the first `</tool_call>`: bad JSON, and the rest left in the text). Any other body ends at the first
    closing tag, as in `tag_blocks`. The characters decoded are bounded by twice the text's length plus 4,096 (past
    that, bodies end at the first closing tag), so crafted text cannot make a parse quadratic.

    Args:
        text: the text to scan, e.g. a decoded model turn.
        open_tag: the opening tag (not empty).
        close_tag: the closing tag (not empty).

    Yields:
        `(start, end, body)` as `tag_blocks`.

    Raises:
        ValueError: an empty tag.
    """
    return _scan(text, open_tag, close_tag, "json_tag_blocks", json_budget=2 * len(text) + 4096)


def _scan(text: str, open_tag: str, close_tag: str, name: str, json_budget: int) -> Iterator[tuple[int, int, str]]:
    """Both scans, the tags checked at the call (not at the first block).

    With `json_budget` 0 every body ends at the first closing tag (`tag_blocks`); else a `{` body that is not yet a
    JSON object extends to a later closing tag while json.loads has characters left to read.
    """
    if not open_tag or not close_tag:
        raise ValueError(f"{name}: tags must not be empty, got {open_tag!r} and {close_tag!r}")
    return _blocks(text, open_tag, close_tag, json_budget)


def _blocks(text: str, open_tag: str, close_tag: str, budget: int) -> Iterator[tuple[int, int, str]]:
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return
        body_start = start + len(open_tag)
        close = text.find(close_tag, body_start)
        if close < 0:
            return  # no closing tag after this opening, hence none after any later one
        body = text[body_start:close]
        if budget > 0 and '"' in body and body.lstrip().startswith("{"):
            budget -= len(body)
            if not _is_json_object(body):
                later = close
                while budget > 0 and (later := text.find(close_tag, later + len(close_tag))) >= 0:
                    budget -= later - body_start
                    if _is_json_object(text[body_start:later]):
                        close, body = later, text[body_start:later]
                        break
        end = close + len(close_tag)
        yield start, end, body
        pos = end


def _is_json_object(body: str) -> bool:
    try:
        return isinstance(json.loads(body), dict)
    # RecursionError: nested past the decoder's ~1,000 levels; ValueError: JSONDecodeError, or an integer past Python's
    # 4,300-digit limit (a plain ValueError: it escaped every tool-call parser).
    except (ValueError, RecursionError):
        return False


def thinking_end(text: str) -> int:
    """Where the leading thinking of a model turn ends (0: the turn has none).

    Qwen3's chat template and SGLang's `qwen3` reasoning parser read a turn as `<think>reasoning</think>answer`:
    a `<tool_call>` the model wrote while thinking is reasoning, not a call (Qwen3's template renders calls from
    `tool_calls`, after the content, never inside `reasoning_content`). The thinking is

    * up to the first `</think>` when the turn opens with `<think>` (leading whitespace aside), as SGLang's reasoning
      parser splits it; else up to the first `</think>` that no `<think>` precedes and that is not text inside a
      well-formed `<tool_call>` JSON block (Qwen3-thinking templates open `<think>` in the prompt, so the turn holds
      only its end; a call whose code prints "</think>" is a call);
    * the whole turn when it opens with `<think>` and never closes it (cut by the token cap or a stop string);
    * nothing otherwise (a `<think>` later in an answer is text).

    Args:
        text: the decoded model turn.

    Returns:
        An index into `text`: `text[:i]` is the thinking with its tags, `text[i:]` the answer.
    """
    close = text.find("</think>")
    if text.lstrip().startswith("<think>"):
        return close + len("</think>") if close >= 0 else len(text)
    # A `</think>` that no `<think>` precedes, unless it is text inside a well-formed call (code that prints
    # "</think>"): read as the thinking's end, it hid the call. At most 16 such calls are stepped over.
    for _ in range(16):
        if close < 0 or "<think>" in text[:close]:
            return 0
        call_end = _call_around(text, close)
        if call_end is None:
            return close + len("</think>")
        close = text.find("</think>", call_end)
    return 0


def _call_around(text: str, at: int) -> int | None:
    """The end of the well-formed `<tool_call>` JSON block that holds position `at` of `text`, or None."""
    for start, end, body in json_tag_blocks(text, "<tool_call>", "</tool_call>"):
        if start > at:
            return None
        if at < end and _is_json_object(body):
            return end
    return None
