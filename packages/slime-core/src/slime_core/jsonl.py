"""JSONL reading with errors that name the file and line (prompt data, corpora, dumps)."""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_LINE_BYTES", "describe_json_error", "iter_jsonl", "iter_jsonl_lines"]

#: The longest line read as one row (64 MiB): far above any prompt, far below what a machine holds as a string.
MAX_LINE_BYTES = 64 << 20


def describe_json_error(e: json.JSONDecodeError, *, line: bool = False) -> str:
    """Says what is wrong in a JSON text and where: `"Expecting value at column 7"`.

    `e.msg` alone ends in a dangling "at" for half of `json`'s errors ("Invalid control character at") and names
    no position, so a row with a raw tab in a string was reported without the column to look at.

    Args:
        e: the error `json.loads` raised.
        line: also name the line (a multi-line document); a JSONL row is one line, named by the caller, and its
            column is then counted over the whole text (`json` counts a row's trailing newline as a line).

    Returns:
        The message and its 1-based position, e.g. `"Invalid control character at line 3 column 12"`.
    """
    where = f"line {e.lineno} column {e.colno}" if line else f"column {e.pos + 1}"
    return f"{e.msg.removesuffix(' at')} at {where}"


class _DuplicateKey(Exception):
    """A key given twice in one JSON object (carries the key)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook`: the object as a dict, refusing a key given twice (`json` keeps the last silently)."""
    row: dict[str, Any] = {}
    for key, value in pairs:
        if key in row:
            raise _DuplicateKey(key)
        row[key] = value
    return row


def iter_jsonl_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, str]]:
    r"""Yields `(line_number, text)` for each non-blank line of a JSONL file (1-based), without parsing it.

    The one reader of a JSONL file's lines: `iter_jsonl` parses what it yields, and a row count (`--num-epoch`)
    counts it, so both see the same rows (a count of its own counted a line holding only the byte-order mark, and
    failed on bad bytes naming no line). Lines end at `\n`, `\r\n` or a bare `\r`, as a text-mode read splits them.

    Raises:
        ValueError: `"{path}:{line}: not UTF-8 (byte 0xff at column 12)"`, or a line longer than `MAX_LINE_BYTES`.
    """
    lineno = 0  # lines before this chunk: a chunk (read up to "\n") holds more than one when bare CRs end lines
    with open(path, "rb") as f:
        for chunk in itertools.count(1):
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                # One line read whole: a JSON array in one line, or a device (/dev/zero), filled the memory.
                raise ValueError(
                    f"{path}:{lineno + 1}: a line longer than {MAX_LINE_BYTES >> 20} MiB; not a JSONL row (one JSON "
                    "object per line)"
                )
            try:
                text = raw.decode("utf-8-sig" if chunk == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{lineno + 1}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                    "re-encode the file as UTF-8"
                ) from None
            # Universal newlines, as a text-mode read (the original's) and editors count lines: a bare CR (old Mac
            # line ends) ends a line too. JSON holds no raw CR inside a string, so no row is cut.
            for line in text.replace("\r\n", "\n").split("\r") if "\r" in text else (text,):
                lineno += 1
                if line.strip():
                    yield lineno, line


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields `(line_number, object)` for each non-blank line of a JSONL file (1-based line numbers).

    Lines are read as bytes and decoded one by one, so bad bytes are reported with their line (a text-mode file
    fails somewhere in a buffered read, naming no line). A UTF-8 byte-order mark at the start of the file (what
    some Windows editors and Excel exports write) is skipped: it is not part of the first object.

    A key given twice in one object (`{"label": "2", "label": "3"}`) is an error: `json` keeps the last one
    silently, so which answer a row holds was a guess.

    Raises:
        ValueError: `"{path}:{line}: invalid JSON (Expecting value at column 7)"`,
            `"{path}:{line}: not UTF-8 (byte 0xff at column 12)"`, `"...: key 'label' appears twice in one
            object ..."`, `"...: expected a JSON object, got list"`, a line longer than `MAX_LINE_BYTES`, an
            integer of more than 4,300 digits (Python's int-string limit) or arrays nested past the recursion
            limit (both escaped as bare tracebacks naming no file).
    """
    for lineno, line in iter_jsonl_lines(path):
        try:
            # Stripped as a blank line is judged (and as the original reads a row): a form feed, a no-break space or
            # an ideographic space around the object is no JSON whitespace, and refused a row the original reads.
            row = json.loads(line.strip(), object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as e:
            lead = len(line) - len(line.lstrip())  # the column as the file counts it
            e = json.JSONDecodeError(e.msg, line, e.pos + lead)
            raise ValueError(f"{path}:{lineno}: invalid JSON ({describe_json_error(e)})") from None
        except ValueError as e:  # Python's own limit: an integer of more than 4,300 digits
            raise ValueError(
                f"{path}:{lineno}: a number Python does not read ({str(e).split(';')[0]}); write it as a string"
            ) from None
        except RecursionError:  # `[[[[...` nested past the interpreter's stack
            raise ValueError(
                f"{path}:{lineno}: JSON nested deeper than Python reads (about {sys.getrecursionlimit()} levels)"
            ) from None
        except _DuplicateKey as e:
            raise ValueError(
                f"{path}:{lineno}: key {e.args[0]!r} appears twice in one object (JSON readers keep one of them "
                "silently); keep the one you mean"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        yield lineno, row
