r"""Model output text -> the visible content, reasoning and tool calls of an OpenAI assistant message.

Formats (the ones the Qwen family is trained on, as SGLang's `hermes`/`qwen25` tool parser and `qwen3`
reasoning parser read them):

* tool calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call;
* reasoning: `<think>...</think>` before the answer; a turn that opens `<think>` and never closes it (cut by the
  token cap) is all reasoning, as SGLang's reasoning parser reads it, so a `<tool_call>` the model only thought
  about is never returned as a call; without a reasoning parser the thinking stays in the content and its calls
  are still no calls (`slime_core.tag_blocks.thinking_end`, the rule `slime_envs.parsing` follows too).

A `<tool_call>` inside a markdown code fence is a call: SGLang's qwen25/hermes parsers, vLLM's hermes parser and the
original's retool examples all find the blocks anywhere in the text, and Qwen3's chat template gives fences no
meaning, so a policy trained here meets the same parser where it is served.

A closing `</tool_call>` inside a JSON string of the call does not end the block (`slime_core.tag_blocks.
json_tag_blocks`). A call whose `</tool_call>` is the stop sequence the engine stopped at is complete: the stop
is cut from the content, not from the call (`stop`).

Parsing never raises on model output: a block that is not a well-formed call stays in the content and is counted
as ill-formed, so the agent sees what the model wrote.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from typing import Any

from slime_core.lone_surrogates import first_lone_surrogate
from slime_core.tag_blocks import json_tag_blocks, thinking_end

__all__ = ["REASONING_PARSERS", "TOOL_PARSERS", "ParsedOutput", "parse_output"]

#: `tool_parser` names read as Hermes/Qwen `<tool_call>` JSON blocks (SGLang's names for that format).
TOOL_PARSERS = ("hermes", "qwen", "qwen25", "qwen3")
#: `reasoning_parser` names read as a leading `<think>...</think>` block.
REASONING_PARSERS = ("qwen3", "deepseek-r1", "qwen3-thinking")
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@dataclasses.dataclass(kw_only=True, slots=True)
class ParsedOutput:
    """What one model turn says, split for the OpenAI reply.

    Attributes:
        content: visible text (tool-call blocks and reasoning removed, stripped).
        reasoning: the `<think>` text, or "" when there is none or no reasoning parser is set.
        tool_calls: `[{"name": str, "arguments": dict}]`, in the order the model wrote them.
        num_ill_formed: `<tool_call>` blocks that were not a JSON object with a string `name` (of an offered tool)
            and object `arguments`, or held a JSON escape of half a surrogate pair, U+D800-U+DFFF (left in `content`).
    """

    content: str
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    num_ill_formed: int = 0


def _one_call(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body.strip())
    except (ValueError, RecursionError):
        # RecursionError: json's decoder past ~1,000 nested levels (5,000 "[" in a turn ended the agent's request
        # as an HTTP 500 and lost the turn); ValueError: JSONDecodeError, or an integer past Python's 4,300-digit
        # limit (the same HTTP 500). Either is ill-formed like any other bad JSON.
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        # Some models write the arguments as a JSON string (OpenAI's wire shape).
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict) or first_lone_surrogate([obj["name"], arguments]) is not None:
        # A JSON "\ud800" escape is half a surrogate pair: the agent's echo of such a call cannot be tokenized.
        return None
    return {"name": obj["name"], "arguments": arguments}


def parse_output(
    text: str, *, parse_tools: bool, parse_reasoning: bool, stop: str = "", tool_names: Collection[str] | None = None
) -> ParsedOutput:
    """Splits a model turn's text into content, reasoning and tool calls.

    Args:
        text: the turn decoded from the engine's ids, end-of-turn marker and stop string already removed.
        parse_tools: read `<tool_call>` blocks (the request offered tools and `tool_choice` is not "none").
        parse_reasoning: split off the leading thinking (`slime_core.tag_blocks.thinking_end`: `<think>...</think>`,
            a `</think>` the prompt's `<think>` opened, an unclosed leading `<think>`: all reasoning). Either way, a
            `<tool_call>` inside the thinking is not a call.
        stop: the stop string cut from the end of `text` ("" if none); one that starts with `</tool_call>`
            closes a `<tool_call>` block left open at the end of `text` (the original's adapter parsed the
            text with the stop string in it; trimming it first lost the call).
        tool_names: the names of the tools the request offered; a block calling another name is ill-formed (it
            stays in the content), as SGLang's parsers drop such a call: an agent has no such tool to run.
            None: any name.

    Returns:
        The parsed turn.
    """
    reasoning = ""
    # Once: a stray "</think>" in the answer after a call must not end the thinking a second time (it hid the call).
    end = thinking_end(text)
    if parse_reasoning and end:
        # The thinking as both parsers read it: a "</think>" inside a well-formed call is text (it split the call).
        head, text = text[:end], text[end:]
        reasoning = head.lstrip().removeprefix("<think>")
        if not head.endswith("</think>"):
            # Cut inside its thinking (max_tokens, a stop string): no answer yet, and no call.
            return ParsedOutput(content="", reasoning=reasoning.strip("\n"))
        reasoning = reasoning.removesuffix("</think>").strip("\n")
    calls: list[dict[str, Any]] = []
    ill_formed = 0
    if parse_tools:
        # Without a reasoning parser the thinking stays in the content; a call the model only considered there is
        # no call (it was returned, and executed). Only the text after it is scanned: a `<tool_call>` opened in the
        # thinking must not reach past `</think>` and swallow the real call after it.
        end = 0 if parse_reasoning else end  # the reasoning parser has cut the thinking off already
        head, tail = text[:end], text[end:]
        blocks = list(json_tag_blocks(tail, _OPEN, _CLOSE))  # linear: see tag_blocks
        # A `<tool_call>` opened after the last complete block: the stop string may close it.
        if stop.startswith(_CLOSE) and tail.find(_OPEN, blocks[-1][1] if blocks else 0) >= 0:
            tail += _CLOSE  # the model wrote it: the engine stopped on it
            blocks = list(json_tag_blocks(tail, _OPEN, _CLOSE))  # the closed block may reach back (a JSON string)
        kept = [head]
        last = 0
        for start, block_end, body in blocks:
            call = _one_call(body)
            if call is not None and tool_names is not None and call["name"] not in tool_names:
                call = None
            if call is None:
                ill_formed += 1
                continue  # the malformed block stays in the content
            calls.append(call)
            kept.append(tail[last:start])
            last = block_end
        kept.append(tail[last:])
        text = "".join(kept)
    return ParsedOutput(content=text.strip(), reasoning=reasoning, tool_calls=calls, num_ill_formed=ill_formed)
