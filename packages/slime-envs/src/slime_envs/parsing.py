r"""Parsing model turns into tool calls or final answers.

Two formats that users train with:

* Qwen3 / Hermes tool calls: the chat template describes the tools and the model writes
  `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (one block per call).
* Search-R1 tags: `<search>query</search>` to call the retriever, `<answer>text</answer>` to finish.

A call is read after the turn's leading `<think>...</think>` only (`slime_core.tag_blocks.thinking_end`): what the
model wrote while thinking is reasoning, as Qwen3's template and SGLang's reasoning parser read it, and as the agent
adapter (`slime_rollout.agent.output_parsing`) reads it. A `<tool_call>` in a markdown code fence is a call, in both
(SGLang's and vLLM's parsers and the original's retool examples find blocks anywhere).

Parsing never raises on model output: what is wrong with a call is returned as an error string so
the environment can show it to the model as an observation (the model learns from it).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from slime_core.lone_surrogates import first_lone_surrogate
from slime_core.tag_blocks import json_tag_blocks, tag_blocks, thinking_end

__all__ = ["ParsedTurn", "ToolCall", "extract_answer", "parse_tag_action", "parse_tool_calls"]

_TOO_DEEP = "invalid JSON in {what}: nested too deeply"
_TOO_LONG = "invalid JSON in {what}: a number has more than {limit} digits"


@dataclasses.dataclass(kw_only=True, slots=True)
class ToolCall:
    """One well-formed tool call.

    Attributes:
        name: tool name, e.g. `"code_interpreter"` or `"search"`.
        arguments: keyword arguments of the call (a JSON object).
    """

    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(kw_only=True, slots=True)
class ParsedTurn:
    """What a model turn asks for.

    Attributes:
        blocks: every `<tool_call>` block in the order the model wrote them: the `ToolCall` of a well-formed one,
            the error message of a malformed one (an unclosed opening is last). Tool responses follow this order,
            so that the n-th response answers the n-th block (`tool_calls` then `errors` would not).
        answer: the final answer text if the turn gives one (`<answer>...</answer>`), else None.
    """

    blocks: list[ToolCall | str] = dataclasses.field(default_factory=list)
    answer: str | None = None

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The well-formed calls of `blocks`, in order."""
        return [b for b in self.blocks if isinstance(b, ToolCall)]

    @property
    def errors(self) -> list[str]:
        """One message per malformed block of `blocks` (for the observation), in order."""
        return [b for b in self.blocks if isinstance(b, str)]


def _lone_surrogate(value: Any, where: str = "") -> str | None:
    r"""The error of a JSON `\ud800` escape (half a surrogate pair: no tokenizer encodes it), or None."""
    found = first_lone_surrogate(value, where)
    return None if found is None else f"invalid text in <tool_call>: {found} is half of a surrogate pair"


def _parse_one_call(body: str) -> ToolCall | str:
    """Parses the JSON inside one `<tool_call>` block; returns the call or an error message."""
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as e:
        return f"invalid JSON in <tool_call>: {e.msg} at line {e.lineno} column {e.colno}"
    except RecursionError:
        # json's decoder raises it past ~1,000 nested arrays or objects: 5,000 "[" (a few hundred tokens) in a
        # model turn failed the whole sample as a broken env instead of being shown to the model.
        return _TOO_DEEP.format(what="<tool_call>")
    except ValueError:
        # An integer past Python's digit limit (4,300): json raises a plain ValueError, which failed the sample.
        return _TOO_LONG.format(what="<tool_call>", limit=sys.get_int_max_str_digits())
    if not isinstance(obj, dict):
        return f"<tool_call> must hold a JSON object with 'name' and 'arguments', got {type(obj).__name__}"
    if (where := _lone_surrogate(obj)) is not None:
        return where
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "<tool_call> is missing a string 'name'"
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        # Some models emit the arguments as a JSON-encoded string (OpenAI style); accept it.
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            return f"'arguments' of tool '{name}' is a string that is not valid JSON: {e.msg}"
        except RecursionError:
            return _TOO_DEEP.format(what=f"'arguments' of tool '{name}'")
        except ValueError:  # an integer past Python's digit limit
            return _TOO_LONG.format(what=f"'arguments' of tool '{name}'", limit=sys.get_int_max_str_digits())
        if (where := _lone_surrogate(arguments, "arguments")) is not None:
            return where
    if not isinstance(arguments, dict):
        return f"'arguments' of tool '{name}' must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments)


def parse_tool_calls(text: str) -> ParsedTurn:
    r"""Parses Qwen3/Hermes `<tool_call>{json}</tool_call>` blocks and an optional `<answer>`.

    Args:
        text: the decoded model turn (special tokens such as `<|im_end|>` may be present).

    Returns:
        The calls found after the turn's leading thinking (`<think>...</think>`, or all of an unclosed leading
        `<think>`: no call), an error per malformed block (bad JSON, JSON nested too deeply for the decoder,
        a `\ud800` escape that decodes to half a surrogate pair, an integer past Python's 4,300-digit limit,
        missing name, non-object arguments, an unclosed `<tool_call>`), both also in the order written
        (`blocks`), and the content of the last `<answer>` after the thinking, if present.
    """
    parsed = ParsedTurn()
    # Calls are read after the leading thinking only; scanning the whole text let a `<tool_call>` opened while
    # thinking run past `</think>` and swallow the real call after it.
    tail = text[thinking_end(text) :]
    after = 0
    # json_tag_blocks: a "</tool_call>" inside a JSON string of the call (a file the call writes) is text.
    for _, end, body in json_tag_blocks(tail, "<tool_call>", "</tool_call>"):
        parsed.blocks.append(_parse_one_call(body))
        after = end
    if tail.find("<tool_call>", after) >= 0:
        parsed.blocks.append("a <tool_call> block is not closed with </tool_call>")
    parsed.answer = extract_answer(tail)  # an <answer> only thought about is not the answer either
    return parsed


def parse_tag_action(text: str, *, tags: tuple[str, ...] = ("search", "answer")) -> tuple[str | None, str]:
    r"""Finds the first Search-R1 style action `<tag>content</tag>` in a model turn.

    Args:
        text: the decoded model turn.
        tags: the action tags to look for.

    Returns:
        `(tag, content)` of the first complete action (content stripped), or `(None, "")` if there is
        none (the caller turns that into an "invalid action" observation). The same action as
        `re.search(r"<(search|answer)>(.*?)</\1>", text, re.DOTALL)` (Search-R1's parser), in linear time.
    """
    # The first block of each tag starts at its leftmost opening that has a closing tag after it.
    best: tuple[int, str, str] | None = None
    for tag in tags:
        block = next(tag_blocks(text, f"<{tag}>", f"</{tag}>"), None)
        if block is not None and (best is None or block[0] < best[0]):
            best = (block[0], tag, block[2])
    if best is None:
        return None, ""
    return best[1], best[2].strip()


def extract_answer(text: str) -> str | None:
    """The content of the last `<answer>...</answer>` block (stripped), or None."""
    last = None
    for _, _, body in tag_blocks(text, "<answer>", "</answer>"):
        last = body
    return last.strip() if last is not None else None
