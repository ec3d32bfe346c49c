"""OpenAI Chat Completions wire format: request validation and translation, reply bodies.

`parse_request` turns a `/v1/chat/completions` body into a `ChatRequest`: the messages in the shape the
tokenizer's chat template takes (tool-call arguments as dicts, wire-only ids dropped), one match key per message
(what must be equal for an echoed assistant message to be the turn the adapter generated), the tools and the
sampling fields. A field this adapter cannot honour is a `RequestError` (HTTP 400) naming it, never ignored:
`n` > 1, `stream: true`, `tool_choice` that forces a call, `response_format` other than text, images, ...

`completion_body` builds the reply (`object: chat.completion`) with OpenAI's shapes: `tool_calls[].id`
(`call_<hex>`), `tool_calls[].function.arguments` as a JSON string, `finish_reason` `stop`/`length`/`tool_calls`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import secrets
import sys
import time
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ChatRequest",
    "RequestError",
    "assistant_messages",
    "completion_body",
    "error_body",
    "match_key",
    "parse_request",
]

# Fields accepted as they are or translated; anything else is refused with its name.
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty", "repetition_penalty")
_KNOWN_FIELDS = {
    "model", "messages", "max_tokens", "max_completion_tokens", "stop", "seed", "n", "stream", "tools",
    "tool_choice", "parallel_tool_calls", "user", "metadata", "logprobs", "top_logprobs", "response_format",
    *_SAMPLING_FIELDS,
}  # fmt: skip
_ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(ValueError):
    """A request this adapter refuses (HTTP 400); `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclasses.dataclass(kw_only=True, slots=True)
class ChatRequest:
    """A validated `/v1/chat/completions` request.

    Attributes:
        model: the `model` field (echoed in the reply).
        messages: chat-template messages (`role`, `content` str, assistant `tool_calls` with dict arguments,
            `reasoning_content` when sent).
        keys: one match key per message (`match_key`).
        tools: chat-template tool specs (`[{"type": "function", "function": {...}}]`), or None.
        parse_tools: read tool calls from the output (tools offered and `tool_choice` is not "none").
        sampling: SGLang sampling fields from the request (`temperature`, `top_p`, ..., `sampling_seed`).
        max_tokens: `max_completion_tokens` / `max_tokens`, or None.
        stop: stop strings (removed from the returned content, kept in the trained tokens).
        logprobs: return per-token log-probs (`choices[0].logprobs.content`).
        parallel_tool_calls: the request's `parallel_tool_calls` (default True); False: a reply carries at most one
            tool call, the first the model wrote (OpenAI's meaning).
    """

    model: str
    messages: list[dict[str, Any]]
    keys: list[str]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    sampling: dict[str, Any]
    max_tokens: int | None
    stop: list[str]
    logprobs: bool
    parallel_tool_calls: bool = True


def _content(value: Any, where: str, *, optional: bool) -> str:
    """A message content as text: a string, a list of text parts (joined by newlines), or None where `optional`.

    As OpenAI's API: only an assistant message may omit its content (a tool-call turn). A user message with
    `content: null` or a text part without a string `text` rendered as an empty turn the model was trained on.
    """
    if value is None:
        if optional:
            return ""
        raise RequestError(f"{where}: content must be a string or a list of parts, got none", where)
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RequestError(f"{where}: content must be a string or a list of parts", where)
    parts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            raise RequestError(f"{where}: content part of type {kind!r} is not supported (text only)", where)
        text = part.get("text")
        if not isinstance(text, str):
            raise RequestError(f"{where}.content[{j}].text must be a string, got {text!r}", where)
        parts.append(text)
    return "\n".join(parts)


def _arguments(value: Any, where: str) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RequestError(f"{where}: arguments are not valid JSON ({e.msg})", where) from None
        except RecursionError:  # json's decoder past ~1,000 nested levels: a 400 naming the field, not a 500
            raise RequestError(f"{where}: arguments are not valid JSON (nested too deeply)", where) from None
        except ValueError:  # an integer past Python's digit limit (a plain ValueError): a 400, not a 500
            limit = sys.get_int_max_str_digits()
            raise RequestError(
                f"{where}: arguments are not valid JSON (a number has more than {limit} digits)", where
            ) from None
    if not isinstance(value, Mapping):
        raise RequestError(f"{where}: arguments must be a JSON object", where)
    return dict(value)


def _message(raw: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise RequestError(f"{where}: must be an object", where)
    role = raw.get("role")
    if role not in _ROLES:
        raise RequestError(f"{where}: role {role!r} is not supported (one of {', '.join(_ROLES)})", where)
    message: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": _content(raw.get("content"), where, optional=role == "assistant"),
    }
    name = raw.get("name")
    if name is not None and not isinstance(name, str):  # OpenAI: `name` is a string on every role
        raise RequestError(f"{where}.name must be a string, got {type(name).__name__}", f"{where}.name")
    if role == "tool" and name:
        message["name"] = name
    if role == "assistant":
        if raw.get("reasoning_content"):
            message["reasoning_content"] = str(raw["reasoning_content"])
        calls = []
        raw_calls = raw.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise RequestError(f"{where}.tool_calls: must be a list, got {type(raw_calls).__name__}", where)
        for j, call in enumerate(raw_calls):
            function = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(function, Mapping) or not function.get("name"):
                raise RequestError(f"{where}.tool_calls[{j}]: needs function.name", where)
            if not isinstance(function["name"], str):
                raise RequestError(f"{where}.tool_calls[{j}].function.name must be a string", where)
            args = _arguments(function.get("arguments"), f"{where}.tool_calls[{j}].function")
            calls.append({"type": "function", "function": {"name": str(function["name"]), "arguments": args}})
        if calls:
            message["tool_calls"] = calls
    return message


def _check_tool_replies(raw_messages: list[Any], messages: list[dict[str, Any]]) -> None:
    """Refuses a `tool` message that answers no tool call, as OpenAI's API does (a 400 naming the field).

    It must follow an assistant message with `tool_calls` (directly or after that message's other tool replies)
    and name one of those calls in `tool_call_id` (checked where the echoed calls carry ids); else the chat
    template would render a tool result nobody asked for, and the model be trained on it.
    """
    answering: int | None = None  # the index of the assistant message whose tool calls are being answered
    call_ids: set[str] = set()
    for i, message in enumerate(messages):
        if message["role"] != "tool":
            answering = i if message["role"] == "assistant" and message.get("tool_calls") else None
            calls = raw_messages[i].get("tool_calls") or [] if answering is not None else []
            call_ids = {c["id"] for c in calls if isinstance(c.get("id"), str)}
            continue
        if answering is None:
            raise RequestError(
                f"messages[{i}]: a message with role 'tool' must answer a preceding assistant message with "
                "'tool_calls'",
                f"messages[{i}].role",
            )
        call_id = raw_messages[i].get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise RequestError(
                f"messages[{i}].tool_call_id is required: the id of the tool call it answers, got {call_id!r:.80}",
                f"messages[{i}].tool_call_id",
            )
        if call_ids and call_id not in call_ids:
            raise RequestError(
                f"messages[{i}].tool_call_id {call_id!r:.80} names no tool call of messages[{answering}] "
                f"({', '.join(sorted(call_ids))})",
                f"messages[{i}].tool_call_id",
            )


# OpenAI's documented limits on `metadata`: at most 16 pairs, keys up to 64 characters, string values up to 512.
_METADATA_PAIRS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512


def _check_metadata(metadata: Any) -> None:
    """`metadata` as OpenAI's schema has it (an object of strings, within its limits), or a 400 naming it."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise RequestError(f"metadata must be an object, got {type(metadata).__name__}", "metadata")
    if len(metadata) > _METADATA_PAIRS:
        raise RequestError(f"metadata has {len(metadata)} keys, at most {_METADATA_PAIRS} allowed", "metadata")
    for key, value in metadata.items():
        if len(key) > _METADATA_KEY_CHARS:
            raise RequestError(f"metadata key {key[:80]!r} is longer than {_METADATA_KEY_CHARS} characters", "metadata")
        if not isinstance(value, str) or len(value) > _METADATA_VALUE_CHARS:
            raise RequestError(
                f"metadata[{key[:80]!r}] must be a string of at most {_METADATA_VALUE_CHARS} characters, "
                f"got {value!r:.80}",
                "metadata",
            )


def match_key(message: Mapping[str, Any]) -> str:
    """What identifies a chat-template message across requests.

    Role, content (surrounding whitespace ignored), tool calls (name and arguments, key order ignored) and a tool
    message's name; not `reasoning_content` (clients often drop it when they echo a turn) nor wire-only ids.
    """
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    key = [message["role"], (message.get("content") or "").strip(), calls, message.get("name")]
    return json.dumps(key, sort_keys=True, ensure_ascii=False)


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RequestError("tools must be a list", "tools")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, Mapping):
            raise RequestError(f"tools[{i}]: must be an object, got {type(tool).__name__}", "tools")
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, Mapping) or not function.get("name"):
            raise RequestError(f"tools[{i}]: only {{type: function, function: {{name, ...}}}} tools are supported")
        if not isinstance(function["name"], str):
            raise RequestError(f"tools[{i}].function.name must be a string, got {function['name']!r}", "tools")
        spec = {"name": function["name"], "description": function.get("description") or ""}
        spec["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
        tools.append({"type": "function", "function": spec})
    return tools or None


def _check_unsupported(body: Mapping[str, Any]) -> None:
    unknown = sorted(set(body) - _KNOWN_FIELDS)
    if unknown:
        raise RequestError(f"unsupported field(s) {unknown} (this adapter serves chat completions only)", unknown[0])
    if body.get("n") not in (None, 1):
        raise RequestError("n must be 1: each call is one recorded turn (send several requests instead)", "n")
    if body.get("stream"):
        raise RequestError("stream: true is not supported; send stream: false", "stream")
    if body.get("top_logprobs"):
        raise RequestError("top_logprobs is not supported (only the sampled token's log-prob)", "top_logprobs")
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise RequestError("response_format other than {type: text} is not supported", "response_format")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(
            "tool_choice must be 'auto' or 'none': forcing a call needs constrained decoding", "tool_choice"
        )
    # The types OpenAI's schema gives these (accepted and dropped, they were never checked).
    for key, wanted, ok in (
        ("model", "a string", str),
        ("user", "a string", str),
        ("parallel_tool_calls", "true or false", bool),
    ):
        if body.get(key) is not None and not isinstance(body[key], ok):
            raise RequestError(f"{key} must be {wanted}, got {body[key]!r:.80}", key)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The SGLang sampling fields of a request, each checked (a wrong type failed later as HTTP 500 or 502)."""
    sampling = {}
    for key in _SAMPLING_FIELDS:
        value = body.get(key)
        if value is None:
            continue
        if key == "top_k":
            ok = _is_int(value) and (value == -1 or value >= 1)
            wanted = "an integer, -1 or >= 1"
        else:
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            wanted = "a finite number"
            if ok and key == "temperature":
                ok, wanted = value >= 0, "a number >= 0"
            elif ok and key == "top_p":
                ok, wanted = 0 < value <= 1, "a number in (0, 1]"
        if not ok:
            raise RequestError(f"{key} must be {wanted}, got {value!r:.80}", key)
        sampling[key] = value
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed) or not -(2**63) <= seed < 2**63:
            raise RequestError(f"seed must be a 64-bit integer, got {seed!r:.80}", "seed")
        sampling["sampling_seed"] = seed
    return sampling


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    """The reply's token cap: `max_completion_tokens`, else the deprecated `max_tokens` (each checked).

    As the original's adapter reads them (`max_token_keys`): a field sent as null counts as absent, so
    `{"max_completion_tokens": null, "max_tokens": 5}` caps at 5 (it was uncapped); with both set, the first wins.
    """
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise RequestError(f"{key} must be a positive integer, got {value!r:.80}", key)
        return value
    return None


def parse_request(body: Any) -> ChatRequest:
    """Validates and translates a `/v1/chat/completions` body.

    Args:
        body: the decoded JSON body.

    Returns:
        The request.

    Raises:
        RequestError: a malformed or unsupported field (the message and `param` name it).
    """
    if not isinstance(body, Mapping):
        raise RequestError("the body must be a JSON object")
    _check_unsupported(body)
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise RequestError("messages must be a non-empty list", "messages")
    messages = [_message(m, i) for i, m in enumerate(raw_messages)]
    _check_tool_replies(raw_messages, messages)
    _check_metadata(body.get("metadata"))
    if messages[-1]["role"] == "assistant":
        raise RequestError("the last message is an assistant message: continuing it is not supported", "messages")
    tools = _tools(body.get("tools"))
    if body.get("tool_choice") == "none":
        tools = None  # as SGLang's chat serving: the prompt shows no tool the model may not call, none is parsed
    sampling = _sampling(body)
    max_tokens = _max_tokens(body)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError(f"stop must be a string or a list of strings, got {stop!r:.80}", "stop")
    if body.get("logprobs") not in (None, True, False):
        raise RequestError(f"logprobs must be true or false, got {body['logprobs']!r:.80}", "logprobs")
    return ChatRequest(
        model=str(body.get("model") or "slime-actor"),
        messages=messages,
        keys=[match_key(m) for m in messages],
        tools=tools,
        parse_tools=tools is not None,
        sampling=sampling,
        max_tokens=max_tokens,
        stop=[s for s in stop if s],
        logprobs=bool(body.get("logprobs")),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
    )


def assistant_messages(
    content: str, tool_calls: list[dict[str, Any]], reasoning: str = ""
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The assistant message of a reply in its two shapes: on the wire, and as the chat template takes it.

    Args:
        content: visible text.
        tool_calls: `[{"name": str, "arguments": dict}]`.
        reasoning: `<think>` text, sent as `reasoning_content` when not empty.

    Returns:
        `(wire, template)`: `wire` has `tool_calls[].id` and JSON-string arguments and `content: null` when a
        call comes without text; `template` has dict arguments and no ids, so its `match_key` equals the one of
        the client's echo of `wire`.
    """
    wire: dict[str, Any] = {"role": "assistant", "content": content or (None if tool_calls else "")}
    template: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        wire["reasoning_content"] = template["reasoning_content"] = reasoning
    if tool_calls:
        wire["tool_calls"] = [
            {
                "id": f"call_{secrets.token_hex(12)}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
            }
            for c in tool_calls
        ]
        template["tool_calls"] = [
            {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in tool_calls
        ]
    return wire, template


def completion_body(
    *,
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The `chat.completion` reply.

    Args:
        model: echoed `model`.
        message: the assistant message (`role`, `content`, optional `tool_calls`, `reasoning_content`).
        finish_reason: `stop`, `length` or `tool_calls`.
        prompt_tokens: tokens sent to the engine.
        completion_tokens: tokens the engine generated.
        logprobs: `choices[0].logprobs.content` entries, when asked for.
    """
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs, "refusal": None}
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def error_body(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`.

    `code` is OpenAI's machine-readable code where one applies: agents look for `context_length_exceeded` to
    compact their history.
    """
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
