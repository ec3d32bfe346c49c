"""The rows of a Parquet prompt file as the dicts they were written from (`read_parquet_rows`).

Parquet stores a column of objects as one struct type, the union of every row's keys, so a key one object lacks comes
back as `None`: tools `[{"name": "a", ... "properties": {"x": ...}}, {"name": "b", ... "properties": {"y": ...}}]`
read back with a property `"y": None` in tool `a` and `"x": None` in tool `b` (the chat template then showed the
model parameters a tool does not have), and a user message gained `"tool_calls": None` (templates that test
`'tool_calls' in message` then iterate None). Pandas and `datasets` read it the same way, so the original did too.

Inside struct values (at any depth, in lists too) a `None` field is therefore read as absent: Parquet cannot tell it
from an explicit null. A message's `content` stays even when null (an assistant turn of only tool calls has
`"content": None`, which templates read). Top-level columns are kept as they are (a null label stays a null label,
which preflight names). The number of fields dropped is logged once per file. A map column (Spark's and Hive's
`MapType`) is read as dicts, not as pyarrow's default lists of `(key, value)` pairs.

Decimal and date/time values (at any depth) are read as their text (`"3.50"`, `"2024-01-02"`): pyarrow gives
`Decimal` and `datetime` objects, which JSON cannot store, so a sample holding one (a decimal label, a date in the
metadata) failed the checkpoint that saves the partial-rollout buffer (or the fully-async held groups) mid-run, and the
rollout debug dump. The number converted is logged once per file.
"""

from __future__ import annotations

import datetime
import decimal
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["count_parquet_rows", "read_parquet_rows"]

# Fields a null value of which means something: a message's `content` (an assistant turn of tool calls only).
_KEEP_NULL = frozenset({"content"})


def _has_struct(data_type: Any) -> bool:
    """Whether a pyarrow type is or holds a struct (lists, large lists, maps of structs included)."""
    import pyarrow as pa

    if pa.types.is_struct(data_type):
        return True
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type):
        return _has_struct(data_type.value_type)
    if pa.types.is_map(data_type):
        return _has_struct(data_type.item_type)
    return False


def _has_textual(data_type: Any) -> bool:
    """Whether a pyarrow type is or holds a decimal or a date/time type (structs, lists and maps searched)."""
    import pyarrow as pa

    if pa.types.is_decimal(data_type) or pa.types.is_temporal(data_type) or pa.types.is_interval(data_type):
        return True
    if pa.types.is_struct(data_type):
        return any(_has_textual(data_type.field(i).type) for i in range(data_type.num_fields))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type):
        return _has_textual(data_type.value_type)
    if pa.types.is_map(data_type):
        return _has_textual(data_type.key_type) or _has_textual(data_type.item_type)
    return False


def _as_text(value: Any, counter: list[int]) -> Any:
    """`value` with every `Decimal` and date/time object as its text, recursively; `counter[0]` counts them."""
    if isinstance(value, dict):
        return {_as_text(key, counter): _as_text(item, counter) for key, item in value.items()}  # map keys too
    if isinstance(value, list):
        return [_as_text(item, counter) for item in value]
    if isinstance(value, decimal.Decimal):
        counter[0] += 1
        return format(value, "f")  # str() writes a zero of scale 10 as "0E-10"
    if isinstance(value, datetime.date | datetime.time):  # datetime is a date
        counter[0] += 1
        return value.isoformat()
    if value is not None and not isinstance(value, str | int | float | bool | bytes):  # timedelta, intervals
        counter[0] += 1
        return str(value)
    return value


def _without_null_fields(value: Any, counter: list[int]) -> Any:
    """`value` with every dict's `None` fields removed (but `_KEEP_NULL`), recursively; `counter[0]` counts them."""
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            if item is None and key not in _KEEP_NULL:
                counter[0] += 1
                continue
            kept[key] = _without_null_fields(item, counter)
        return kept
    if isinstance(value, list):
        return [_without_null_fields(item, counter) for item in value]
    return value


def _checked_file(path: str | os.PathLike[str]) -> Any:
    """The `pyarrow.parquet.ParquetFile` of `path`, its column names checked.

    Raises:
        ValueError: not a Parquet file pyarrow reads (pyarrow's message named no file), or a column name given twice
            (pyarrow failed with "Multiple matches for FieldRef.Name(label)"; a row dict keeps one of them).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a Parquet file pyarrow reads ({e})") from None
    names = parquet.schema_arrow.names
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(
            f"{path}: column {twice[0]!r} appears twice (a row holds one value per name); keep the one you mean"
        )
    return parquet


def count_parquet_rows(path: str | os.PathLike[str]) -> int:
    """Rows of a Parquet file, from its metadata (no row is read).

    Raises:
        ValueError: as `read_parquet_rows` for an unreadable file or a column name given twice (names the file).
    """
    return _checked_file(path).metadata.num_rows


def read_parquet_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Reads a Parquet file's rows: struct fields a row's object lacked left out, decimals and dates as text.

    See the module docstring.

    Args:
        path: the `.parquet` file.

    Returns:
        One dict per row, in file order.

    Raises:
        ValueError: not a Parquet file pyarrow reads, a column name given twice, or a map value holding one key
            twice (each names the file).
    """
    import pyarrow as pa

    try:
        table = _checked_file(path).read()
    except pa.ArrowException as e:  # damaged column chunks past a readable footer
        raise ValueError(f"{path}: not a Parquet file pyarrow reads ({e})") from None
    try:
        # A map column (Spark's and Hive's MapType: a metadata column of string pairs) as the dicts it was written
        # from; pyarrow's default gives lists of (key, value) tuples, which no metadata or tools reader takes.
        rows = table.to_pylist(maps_as_pydicts="strict")
    except (KeyError, ValueError) as e:  # a map holding one key twice
        raise ValueError(f"{path}: a map column holds a key twice in one row ({e}); keep one of them") from None
    struct_columns = [field.name for field in table.schema if _has_struct(field.type)]
    counter = [0]
    for row in rows:
        for name in struct_columns:
            row[name] = _without_null_fields(row[name], counter)
    textual_columns = [field.name for field in table.schema if _has_textual(field.type)]
    converted = [0]
    for row in rows:
        for name in textual_columns:
            row[name] = _as_text(row[name], converted)
    if converted[0]:
        logger.info(
            "%s: %d decimal or date/time values (columns %s) read as their text (JSON, which checkpoints store "
            "samples in, has no such type)",
            path,
            converted[0],
            ", ".join(textual_columns),
        )
    if counter[0]:
        logger.info(
            "%s: %d null fields of struct columns (%s) read as absent (Parquet gives every object of a column the "
            "union of their keys)",
            path,
            counter[0],
            ", ".join(struct_columns),
        )
    return rows
