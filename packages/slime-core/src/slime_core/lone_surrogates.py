r"""Lone UTF-16 surrogates: strings Python holds that no tokenizer (or UTF-8) can encode.

JSON may spell a character as `\ud83d\ude00` (a surrogate pair, decoded to one character), and `json.loads` also
accepts half of a pair, `"\ud800"`, as a one-character string. That string cannot be encoded as UTF-8: a tool call
whose name or arguments held one (six ASCII characters a model can write) made the error observation that echoed it
raise `TypeError: TextEncodeInput must be ...` in the Hugging Face tokenizer, ending the rollout instead of the turn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["first_lone_surrogate", "lone_surrogate_index", "replace_lone_surrogates"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_index(text: str) -> int | None:
    """Index of the first lone surrogate of `text`, or None when it encodes as UTF-8."""
    match = _SURROGATE.search(text)
    return None if match is None else match.start()


def first_lone_surrogate(value: Any, where: str = "") -> str | None:
    r"""Where the first lone surrogate of a decoded JSON value is, or None when every string encodes.

    Args:
        value: a JSON value (`str`, `list`, `dict`, numbers, ...); dict keys are searched too.
        where: the path of `value`, prefixed to the answer (e.g. `"arguments"`).

    Returns:
        `"<path>: '\ud800' at character <i>"` (path like `arguments["code"]` or `messages[2].content`), or None.
    """
    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:  # iterative: a value nested 1,000 levels deep must not exhaust the recursion limit
        path, item = stack.pop()
        if isinstance(item, str):
            at = lone_surrogate_index(item)
            if at is not None:
                return f"{path or 'the text'}: {item[at]!r} at character {at}"
        elif isinstance(item, Mapping):
            for key, sub in reversed(list(item.items())):
                stack.append((f"{path}[{key!r}]", sub))
                stack.append((f"{path} key", key))
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}[{i}]", sub) for i, sub in reversed(list(enumerate(item))))
    return None


def replace_lone_surrogates(text: str) -> tuple[str, int]:
    """`text` with each lone surrogate replaced by U+FFFD (as a UTF-8 decoder does), and how many there were."""
    return _SURROGATE.subn("\ufffd", text)
