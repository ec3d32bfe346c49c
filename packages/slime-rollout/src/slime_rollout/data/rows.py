"""Checks of one prompt row's fields (`--input-key`, `--metadata-key`, `--tool-key`).

Shared by the data source and preflight: each names the flag and the row (`where`), so bad data fails before a
rollout, not inside a tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["prompt_problem", "row_metadata", "row_tools"]


def _maybe_json(value: Any, what: str, where: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: {what} is a string but not valid JSON: {value[:80]!r}") from None
    return value


def prompt_problem(prompt: Any, input_key: str) -> str | None:
    """What is wrong with a row's prompt, or None: a non-empty string, or chat messages with some content.

    Chat messages are `{"role": ..., "content": ...}` dicts (an assistant turn with only tool calls may have no
    content); a number, a dict or a list of strings was let through as "a message list" and failed in the
    tokenizer mid-rollout, and a list of strings was reported as an empty prompt.

    Args:
        prompt: the row's `--input-key` value.
        input_key: the flag's value, for the message.

    Returns:
        The message naming `--input-key`, or None for a usable prompt.
    """
    if isinstance(prompt, str):
        return None if prompt.strip() else f"empty prompt in --input-key {input_key!r}"
    if prompt is None:
        return f"empty prompt in --input-key {input_key!r} (null)"
    if not isinstance(prompt, list):
        return (
            f"--input-key {input_key!r} holds {type(prompt).__name__} {_preview(prompt)}, not a prompt (a string, "
            'or a list of chat messages {"role": ..., "content": ...})'
        )
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or "role" not in message:
            return (
                f"--input-key {input_key!r}: message {i} is {type(message).__name__} {_preview(message)}, not a chat "
                'message {"role": ..., "content": ...}'
            )
    if not any(str(m.get("content") or "").strip() for m in prompt):
        return f"empty prompt in --input-key {input_key!r} (no message has content)"
    return None


def row_metadata(row: dict[str, Any], metadata_key: str | None, where: str) -> dict[str, Any]:
    """A copy of a row's `--metadata-key` value: a dict, or a JSON string of one; {} without the key or value.

    Raises:
        ValueError: the value (or its JSON) is not a dict (a list of pairs was read as a dict, a number failed as
            "'int' object is not iterable" naming no row); the message names `where` and the flag.
    """
    value = _maybe_json(row.get(metadata_key), "metadata", where) if metadata_key else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(
            f"{where}: --metadata-key {metadata_key!r} must hold a dict (or its JSON), got {type(value).__name__} "
            f"{_preview(value)}"
        )
    return dict(value)


def row_tools(row: dict[str, Any], tool_key: str | None, where: str) -> list[dict[str, Any]] | None:
    """A row's `--tool-key` value: a list of tool schemas (dicts), or a JSON string of one; None without it.

    Raises:
        ValueError: anything else (the chat template refused a dict or a list of names naming no row: "Tools
            should either be a JSON schema, ..."; the original asserts a list); the message names `where`.
    """
    tools = _maybe_json(row.get(tool_key), "tools", where) if tool_key else None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError(
            f"{where}: --tool-key {tool_key!r} must hold a list of tool schemas (dicts) or its JSON, got "
            f"{type(tools).__name__} {_preview(tools)}"
        )
    return tools


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
