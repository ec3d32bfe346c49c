"""JSONL reading with errors that name the file and line (prompt data, corpora, dumps)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["iter_jsonl"]


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields `(line_number, object)` for each non-blank line of a JSONL file (1-based line numbers).

    Raises:
        ValueError: `"{path}:{line}: invalid JSON (...)"` or `"...: expected a JSON object, got list"`.
    """
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row
