"""Parquet prompt files: struct fields a row's object lacked are absent, not None (`slime_rollout.data.parquet_rows`).

Parquet gives every object of a column the union of their keys. Before, tool `a` read back with tool `b`'s parameter
as `"y": None`, which the chat template showed the model as a parameter of `a`, and every message gained the keys of
the others (`"tool_calls": None` on a user turn). Also: a tool-call turn with OpenAI's `"content": null` renders
(`slime_rollout.data.chat_template.text_content`).
"""

import json
import logging
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slime_rollout.data.parquet_rows import read_parquet_rows
from slime_rollout.data.source import get_tokenizer, load_prompt_rows, rows_to_samples

_TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Find a word.",
     "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
     "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
]  # fmt: skip
_MESSAGES = [
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "content": "5", "name": "add"},
]  # fmt: skip
_ROWS = [
    {"prompt": _MESSAGES, "label": "5", "tools": _TOOLS, "metadata": {"rm_type": "math"}},
    {"prompt": [{"role": "user", "content": "Spell cat."}], "label": "cat", "tools": _TOOLS[:1],
     "metadata": {"source": "b"}},
]  # fmt: skip


def _write(tmp_path, rows=_ROWS):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_rows_read_back_as_written(tmp_path, caplog):
    path = _write(tmp_path)
    with caplog.at_level(logging.INFO, logger="slime_rollout.data.parquet_rows"):
        rows = read_parquet_rows(path)
    assert rows == _ROWS
    assert load_prompt_rows(str(path)) == _ROWS
    (record,) = caplog.records
    assert str(path) in record.getMessage() and "null fields of struct columns" in record.getMessage()


def test_the_template_shows_each_tool_with_its_own_parameters(tmp_path, qwen3_tokenizer_dir):
    path = _write(tmp_path)
    tok = get_tokenizer(str(qwen3_tokenizer_dir))
    first, second = rows_to_samples(
        load_prompt_rows(str(path)), source=str(path), input_key="prompt", label_key="label", tokenizer=tok,
        apply_chat_template=True,
    )  # fmt: skip
    expected = tok.apply_chat_template(_MESSAGES, tools=_TOOLS, tokenize=False, add_generation_prompt=True)
    assert first.prompt == expected
    assert '"b": null' not in first.prompt and '"word": null' not in first.prompt
    assert json.dumps(_TOOLS[0]) in second.prompt and '"a": null' not in second.prompt
    assert first.metadata == {"rm_type": "math", "tools": _TOOLS} and second.metadata["source"] == "b"


def test_top_level_nulls_and_plain_columns_stay(tmp_path):
    rows = [
        {"prompt": "a", "label": None, "metadata": {"k": [1, None]}},
        {"prompt": "b", "label": "2", "metadata": None},
    ]
    assert read_parquet_rows(_write(tmp_path, rows)) == rows  # list items are values, not fields


def test_a_tool_call_turn_with_null_content_renders(qwen3_tokenizer_dir):
    # OpenAI's format: an assistant turn of tool calls only has `"content": null`; Qwen3's template failed on it
    # ("argument of type 'NoneType' is not iterable"), from JSONL and Parquet alike.
    tok = get_tokenizer(str(qwen3_tokenizer_dir))
    messages = [{**m, "content": None} if m["role"] == "assistant" else m for m in _MESSAGES]
    (sample,) = rows_to_samples([{"q": messages}], source="m", input_key="q", tokenizer=tok, apply_chat_template=True)
    assert sample.prompt == tok.apply_chat_template(_MESSAGES, tokenize=False, add_generation_prompt=True)
    assert messages[1]["content"] is None  # the row itself is left as it is
    (sample,) = rows_to_samples([{"q": messages}], source="m", input_key="q", tokenizer=tok, max_prompt_len=1000)
    assert sample.prompt[1]["content"] == ""  # the default generate renders the messages it is given


def test_a_map_column_is_read_as_dicts(tmp_path):
    # Spark and Hive write a dict column as a map; pyarrow's to_pylist gives it as [(key, value), ...], which the
    # data source refused: "--metadata-key 'metadata' must hold a dict (or its JSON), got list [('rm_type', 'math')...".
    metadata = pa.array([[("rm_type", "math"), ("src", "gsm8k")], []], type=pa.map_(pa.string(), pa.string()))
    path = tmp_path / "spark.parquet"
    pq.write_table(pa.table({"input": ["1+2?", "2+2?"], "label": ["3", "4"], "metadata": metadata}), path)
    samples = rows_to_samples(load_prompt_rows(str(path)), source=str(path), input_key="input", label_key="label")
    assert [s.metadata for s in samples] == [{"rm_type": "math", "src": "gsm8k"}, {}]
    twice = pa.array([[("k", "1"), ("k", "2")]], type=pa.map_(pa.string(), pa.string()))
    pq.write_table(pa.table({"input": ["q"], "metadata": twice}), path)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: a map column holds a key twice in one row .*'k'"):
        load_prompt_rows(str(path))


def test_decimal_and_date_values_are_read_as_text_a_checkpoint_can_store(tmp_path, caplog):
    # pyarrow gives Decimal and datetime objects; a sample holding one (a decimal label, a date in the metadata) failed
    # the --save of the partial-rollout buffer mid-run: "field 'label' holds a value of type Decimal, which JSON
    # cannot store".
    import datetime
    import decimal

    from slime_core.sample_json import dumps_with_samples

    table = pa.table({
        "input": ["1+2.5?", "0?"],
        "label": pa.array([decimal.Decimal("3.50"), decimal.Decimal(0)], pa.decimal128(12, 2)),
        "metadata": [{"day": datetime.date(2024, 1, 2), "at": datetime.datetime(2024, 1, 2, 3, 4, 5), "k": 1},
                     {"day": None, "at": None, "k": 2}],
        "tiny": pa.array([decimal.Decimal("0E-10"), None], pa.decimal128(12, 10)),
        "days": pa.array([[datetime.date(2024, 5, 6)], []], pa.list_(pa.date32())),
    })  # fmt: skip
    path = tmp_path / "typed.parquet"
    pq.write_table(table, path)
    with caplog.at_level(logging.INFO, logger="slime_rollout.data.parquet_rows"):
        rows = load_prompt_rows(str(path))
    assert [r["label"] for r in rows] == ["3.50", "0.00"]
    assert rows[0]["metadata"] == {"day": "2024-01-02", "at": "2024-01-02T03:04:05", "k": 1}
    assert [r["tiny"] for r in rows] == ["0.0000000000", None] and [r["days"] for r in rows] == [["2024-05-06"], []]
    assert any("6 decimal or date/time values" in r.getMessage() for r in caplog.records)
    samples = rows_to_samples(rows, source=str(path), input_key="input", label_key="label")
    restored = json.loads(dumps_with_samples([s.to_dict() for s in samples], samples, what="test"))
    assert restored[0]["label"] == "3.50" and restored[0]["metadata"]["day"] == "2024-01-02"


def test_a_column_named_twice_or_an_unreadable_file_is_one_error_naming_the_file(tmp_path):
    # pyarrow failed with "Multiple matches for FieldRef.Name(label) in q: string ..." naming no file (the JSONL
    # reader refuses a key given twice), and --num-epoch's row count with "Parquet magic bytes not found in footer".
    from slime_rollout.data.prompt_rows import count_rows

    path = tmp_path / "twice.parquet"
    table = pa.Table.from_arrays([pa.array(["q1"]), pa.array(["1"]), pa.array(["2"])], names=["q", "label", "label"])
    pq.write_table(table, path)
    for read in (load_prompt_rows, count_rows):
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: column 'label' appears twice"):
            read(str(path))
    path = tmp_path / "not.parquet"
    path.write_text('{"q": "a jsonl row"}\n')
    for read in (load_prompt_rows, count_rows):
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: not a Parquet file pyarrow reads \(.*magic"):
            read(str(path))
