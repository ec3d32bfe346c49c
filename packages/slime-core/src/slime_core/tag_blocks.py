"""`<tag>...</tag>` blocks of model output, found in linear time.

`re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)` retries from every opening tag that has no
closing tag after it, scanning to the end of the text each time: quadratic in the number of unclosed openings.
A model that repeats `<tool_call>` (one token in Qwen's vocabulary) 8,000 times made one parse take 6 s on the
rollout's event loop, stalling every episode in flight. `tag_blocks` finds the same blocks with `str.find`:
once an opening has no closing tag after it, no later opening has one either, so the scan stops there.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["tag_blocks"]


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
    if not open_tag or not close_tag:
        raise ValueError(f"tag_blocks: tags must not be empty, got {open_tag!r} and {close_tag!r}")
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return
        body_start = start + len(open_tag)
        close = text.find(close_tag, body_start)
        if close < 0:
            return  # no closing tag after this opening, hence none after any later one
        end = close + len(close_tag)
        yield start, end, text[body_start:close]
        pos = end
