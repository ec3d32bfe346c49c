"""The rows of a prompt file (`--prompt-data path.jsonl|path.parquet[@[start:end]]`), each with its place in the file.

The data source (`slime_rollout.data.source`) builds samples from these rows; preflight and `--dry-run` read them to
name a bad row by its file line (JSONL) or row index (Parquet).
"""

from __future__ import annotations

import itertools
import pathlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from slime_core.jsonl import iter_jsonl, iter_jsonl_lines
from slime_rollout.data.parquet_rows import count_parquet_rows, read_parquet_rows

__all__ = ["PromptRows", "count_rows", "data_dir", "load_prompt_rows"]

_SLICE = re.compile(r"^(?P<path>.+)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")


class PromptRows(list):
    """The rows of a prompt file (after its `@[start:end]` slice): a list of dicts that knows where each row is.

    Messages name a row by its place in the file, not in the slice: `unit` `"line"` with the 1-based line number
    of a JSONL file (blank lines counted, as an editor shows them), or `unit` `"row index"` with the 0-based row
    index of a Parquet file (the index a `@[start:end]` slice uses). A slice or copy of it is a plain list, whose
    rows are named by their 1-based position in it (`"row N"`); `head` keeps the positions.

    Example:
        `PromptRows([{"prompt": "2+2?"}], positions=[4], unit="line")`: the only row is on line 4.
    """

    def __init__(self, rows: Iterable[dict[str, Any]], *, positions: Sequence[int], unit: str) -> None:
        super().__init__(rows)
        if len(positions) != len(self):
            raise ValueError(f"PromptRows: {len(positions)} positions for {len(self)} rows")
        self.positions = list(positions)  # per row: its 1-based line (JSONL) or 0-based row index (Parquet)
        self.unit = unit  # "line", "row index", or "row" (position among plain rows)

    def head(self, n: int) -> PromptRows:
        """The first `n` rows, with their positions."""
        return PromptRows(self[:n], positions=self.positions[:n], unit=self.unit)

    @staticmethod
    def of(rows: Sequence[dict[str, Any]]) -> PromptRows:
        """`rows` as they are if a `PromptRows`; plain rows named by their 1-based position among them."""
        if isinstance(rows, PromptRows):
            return rows
        return PromptRows(rows, positions=range(1, len(rows) + 1), unit="row")


def load_prompt_rows(spec: str) -> PromptRows:
    """Reads the rows of a prompt file, with their positions in the file (see `PromptRows`).

    Args:
        spec: `path.jsonl` or `path.parquet`, optionally with a Python-style row slice
            `path@[start:end]` (negative indices allowed; over rows, JSONL blank lines not counted).

    Returns:
        One dict per row, in file order, each with its line (JSONL) or row index (Parquet).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unknown extension, or a bad JSONL line (message names `file:line`).
    """
    path, start, end = _split_spec(spec)
    if path.suffix == ".jsonl":
        located = list(itertools.islice(iter_jsonl(path), _last_row(start, end)))
        rows, positions, unit = [row for _, row in located], [line for line, _ in located], "line"
    elif path.suffix == ".parquet":
        rows = read_parquet_rows(path)  # a struct's fields that a row lacked are absent, not None
        positions, unit = list(range(len(rows))), "row index"
    else:
        raise ValueError(f"{path}: unsupported format {path.suffix!r} (use .jsonl or .parquet)")
    return PromptRows(rows[start:end], positions=positions[start:end], unit=unit)


def _last_row(start: int | None, end: int | None) -> int | None:
    """How many JSONL rows a slice needs read: `end` when neither bound counts from the end, else all (None).

    As the original's `islice`: `data.jsonl@[0:1000]` read the whole file (a bad line past row 1,000 stopped the run,
    and a large file was held in memory for its first rows).
    """
    if end is not None and end >= 0 and (start is None or start >= 0):
        return end
    return None


def _split_spec(spec: str) -> tuple[pathlib.Path, int | None, int | None]:
    """`path@[start:end]` (slice optional) -> (existing path, start, end).

    Raises:
        FileNotFoundError: the file does not exist.
    """
    start = end = None
    match = _SLICE.match(spec)
    if match:
        spec = match["path"]
        start = int(match["start"]) if match["start"] else None
        end = int(match["end"]) if match["end"] else None
    path = pathlib.Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"--prompt-data file not found: {path}")
    if not path.is_file():  # a folder said "[Errno 21] Is a directory"; a device (/dev/zero) was read forever
        what = "a folder" if path.is_dir() else "not a regular file"
        raise ValueError(f"{path}: {what}; give a .jsonl or .parquet file")
    return path, start, end


def count_rows(spec: str) -> int:
    """Rows of a prompt file (slice applied), without parsing them: as many as `load_prompt_rows` gives.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unknown extension, a JSONL line that is not UTF-8 or is too long (names `file:line`), a Parquet
            file pyarrow cannot read or with a column name given twice.
    """
    path, start, end = _split_spec(spec)
    if path.suffix == ".parquet":
        total = count_parquet_rows(path)
    elif path.suffix == ".jsonl":
        total = sum(1 for _ in itertools.islice(iter_jsonl_lines(path), _last_row(start, end)))  # as load_prompt_rows
    else:
        raise ValueError(f"{path}: unsupported format {path.suffix!r} (use .jsonl or .parquet)")
    return len(range(total)[start:end])


def data_dir(source: str) -> pathlib.Path:
    """Directory of a `--prompt-data` spec (its `@[start:end]` slice removed): where relative image paths start."""
    match = _SLICE.match(source)
    return pathlib.Path(match["path"] if match else source).parent
