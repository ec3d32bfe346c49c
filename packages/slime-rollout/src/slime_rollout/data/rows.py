"""Checks of one prompt row's fields (`--input-key`, `--metadata-key`, `--tool-key`).

Shared by the data source and preflight: each names the flag and the row (`where`), so bad data fails before a
rollout, not inside a tokenizer. An eval dataset's keys come from other flags (`--eval-input-key`, an
`--eval-config` dataset's `input_key`): `KeyFlags` says which, so its messages blame the flag that set the key.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from slime_core.error_text import preview
from slime_core.lone_surrogates import lone_surrogate_index

__all__ = [
    "TRAINING_KEY_FLAGS",
    "KeyFlags",
    "has_message_prompts",
    "message_texts",
    "messages_from_json",
    "prompt_problem",
    "row_metadata",
    "row_tools",
]


@dataclasses.dataclass(frozen=True, slots=True)
class KeyFlags:
    """The flag (or config field) that set each key of a data file, as messages name it.

    Example: `KeyFlags(input_key="--eval-input-key")` for an eval dataset read with `--eval-input-key q`.

    Attributes:
        input_key: sets the prompt column (`--input-key`).
        label_key: sets the label column (`--label-key`).
        metadata_key: sets the metadata column (`--metadata-key`).
        tool_key: sets the tools column (`--tool-key`).
    """

    input_key: str = "--input-key"
    label_key: str = "--label-key"
    metadata_key: str = "--metadata-key"
    tool_key: str = "--tool-key"


TRAINING_KEY_FLAGS = KeyFlags()  # `--prompt-data`'s keys


def _maybe_json(value: Any, what: str, where: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            # ValueError: JSONDecodeError, or an integer past Python's 4,300-digit limit; RecursionError: nested past
            # the decoder's ~1,000 levels. Both escaped naming no row.
            raise ValueError(f"{where}: {what} holds a string that is not valid JSON: {value[:80]!r}") from None
    return value


def messages_from_json(prompt: Any) -> list[dict[str, Any]] | None:
    """The chat messages a string prompt holds as JSON text, or None (any other prompt, text included).

    Data tools that cannot store a list of objects in a column (CSV exports, some Parquet writers, pandas' `to_json`
    of a stringified column) write the messages as their JSON text. Read as text, that text was the prompt: with
    `--apply-chat-template` the model saw `<|im_start|>user` and then `[{"role": "user", "content": ...}]` as the text.
    Only a whole JSON array of objects that each have a `role` and a `content` is taken as messages.
    """
    if not isinstance(prompt, str):
        return None
    text = prompt.strip()
    if not (text.startswith("[") and text.endswith("]") and '"role"' in text):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an integer past Python's digit limit
        return None
    is_messages = isinstance(value, list) and value and all(isinstance(m, dict) and m.keys() >= _MESSAGE for m in value)
    return value if is_messages else None


_MESSAGE = frozenset({"role", "content"})


def has_message_prompts(rows: Iterable[Mapping[str, Any]], input_key: str) -> bool:
    """Whether some row's `input_key` holds chat messages (a list, or their JSON text: `messages_from_json`).

    Such a prompt is rendered with the tokenizer's chat template even without `--apply-chat-template` (the default
    generate function does), so the data source needs the tokenizer to check it while it reads the rows.
    """
    return any(isinstance(v := row.get(input_key), list) or messages_from_json(v) is not None for row in rows)


def prompt_problem(prompt: Any, input_key: str, flag: str = "--input-key") -> str | None:
    """What is wrong with a row's prompt, or None: a non-empty string, or chat messages with some content.

    Chat messages are `{"role": ..., "content": ...}` dicts (an assistant turn with only tool calls may have no
    content); a number, a dict or a list of strings was let through as "a message list" and failed in the
    tokenizer mid-rollout, and a list of strings was reported as an empty prompt.

    Args:
        prompt: the row's `--input-key` value.
        input_key: the flag's value, for the message.
        flag: the flag that set `input_key` (`KeyFlags.input_key`).

    Returns:
        The message naming `flag`, or None for a usable prompt.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            return f"empty prompt in {flag} {input_key!r}"
        return _unencodable(prompt, f"{flag} {input_key!r}")
    if prompt is None:
        return f"empty prompt in {flag} {input_key!r} (null)"
    if not isinstance(prompt, list):
        return (
            f"{flag} {input_key!r} holds {type(prompt).__name__} {preview(prompt, 60)}, not a prompt (a string, "
            'or a list of chat messages {"role": ..., "content": ...})'
        )
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or "role" not in message:
            return (
                f"{flag} {input_key!r}: message {i} is {type(message).__name__} {preview(message, 60)}, not a chat "
                'message {"role": ..., "content": ...}'
            )
    if not any(str(m.get("content") or "").strip() for m in prompt):
        return f"empty prompt in {flag} {input_key!r} (no message has content)"
    for i, message in enumerate(prompt):
        for text in message_texts(message.get("content")):
            problem = _unencodable(text, f"{flag} {input_key!r} message {i}")
            if problem:
                return problem
    return None


def message_texts(content: Any) -> list[str]:
    """The text of a message's content: a string, or the `text` of its parts (`[{"type": "text", ...}]`).

    Args:
        content: a chat message's `content` (a string, a list of OpenAI-style parts, or anything else).

    Returns:
        The strings it holds (none for other types or parts without a string `text`).
    """
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
    return []


def _unencodable(text: str, what: str) -> str | None:
    r"""Why `text` cannot be tokenized: a lone surrogate (a JSON `\ud800` escape of half a UTF-16 pair), or None.

    `json` reads such an escape into a `str` that no UTF-8 encoder takes: the tokenizer failed mid-rollout with
    `UnicodeEncodeError` (or a `TypeError` about `TextEncodeInput`) naming no file or row.
    """
    at = lone_surrogate_index(text)
    if at is None:
        return None
    return (
        f"{what} holds a lone surrogate {text[at]!r} at character {at} (a JSON \\u escape of half a "
        "UTF-16 pair), which no tokenizer can encode"
    )


def row_metadata(
    row: dict[str, Any], metadata_key: str | None, where: str, flag: str = "--metadata-key"
) -> dict[str, Any]:
    """A copy of a row's `--metadata-key` value: a dict, or a JSON string of one; {} without the key or value.

    Raises:
        ValueError: the value (or its JSON) is not a dict (a list of pairs was read as a dict, a number failed as
            "'int' object is not iterable" naming no row); the message names `where` and `flag`.
    """
    value = _maybe_json(row.get(metadata_key), f"{flag} {metadata_key!r}", where) if metadata_key else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(
            f"{where}: {flag} {metadata_key!r} must hold a dict (or its JSON), got {type(value).__name__} "
            f"{preview(value, 60)}"
        )
    return dict(value)


def row_tools(
    row: dict[str, Any], tool_key: str | None, where: str, flag: str = "--tool-key"
) -> list[dict[str, Any]] | None:
    """A row's `--tool-key` value: a list of tool schemas (dicts), or a JSON string of one; None without it.

    Raises:
        ValueError: anything else (the chat template refused a dict or a list of names naming no row: "Tools
            should either be a JSON schema, ..."; the original asserts a list); the message names `where` and
            `flag`.
    """
    tools = _maybe_json(row.get(tool_key), f"{flag} {tool_key!r}", where) if tool_key else None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError(
            f"{where}: {flag} {tool_key!r} must hold a list of tool schemas (dicts) or its JSON, got "
            f"{type(tools).__name__} {preview(tools, 60)}"
        )
    return tools
