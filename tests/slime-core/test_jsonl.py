import pytest

from slime_core.jsonl import iter_jsonl


def test_line_numbers_skip_blank_lines_and_errors_name_the_line(tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_text('{"x": 1}\n\n{"x": 2}\n')
    assert list(iter_jsonl(good)) == [(1, {"x": 1}), (3, {"x": 2})]
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"x": 1}\n{"x": \n')
    with pytest.raises(ValueError, match=r"b\.jsonl:2: invalid JSON"):
        list(iter_jsonl(bad))
    arr = tmp_path / "c.jsonl"
    arr.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"c\.jsonl:1: expected a JSON object, got list"):
        list(iter_jsonl(arr))


def test_non_utf8_bytes_name_the_line_and_column(tmp_path):
    # Issue 17: a text-mode read failed with a bare UnicodeDecodeError from a buffered chunk, naming no line.
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"x": "ok"}\n\n{"x": "caf' + b"\xe9" + b'"}\n')
    with pytest.raises(ValueError, match=r"latin1\.jsonl:3: not UTF-8 \(byte 0xe9 at column 11\)"):
        list(iter_jsonl(bad))
    # A BOM-free UTF-8 file with multi-byte characters reads fine.
    good = tmp_path / "utf8.jsonl"
    good.write_text('{"x": "café ∑"}\n', encoding="utf-8")
    assert list(iter_jsonl(good)) == [(1, {"x": "café ∑"})]


def test_a_byte_order_mark_at_the_start_is_skipped(tmp_path):
    # Windows editors and Excel exports write one; json.loads failed on line 1 with "Unexpected UTF-8 BOM".
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"x": 1}\r\n{"x": 2}\r\n')
    assert list(iter_jsonl(path)) == [(1, {"x": 1}), (2, {"x": 2})]
    # Only at the start of the file: a mark inside a later line is a stray character there, named by its line.
    path.write_bytes(b'{"x": 1}\n\xef\xbb\xbf{"x": 2}\n')
    with pytest.raises(ValueError, match=r"bom\.jsonl:2: invalid JSON"):
        list(iter_jsonl(path))


def test_a_key_given_twice_is_an_error_naming_the_line_and_key(tmp_path):
    # json.loads kept the last "label" silently: the row was graded against "3" with no word about the "2".
    path = tmp_path / "dup.jsonl"
    path.write_text('{"prompt": "1+1=", "label": "2"}\n{"prompt": "1+1=", "label": "2", "label": "3"}\n')
    with pytest.raises(ValueError, match=r"dup\.jsonl:2: key 'label' appears twice in one object"):
        list(iter_jsonl(path))
    # In a nested object too; the same key in two different objects is fine.
    path.write_text('{"prompt": "x", "metadata": {"a": 1, "a": 2}}\n')
    with pytest.raises(ValueError, match=r"dup\.jsonl:1: key 'a' appears twice"):
        list(iter_jsonl(path))
    path.write_text('{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}\n')
    assert list(iter_jsonl(path)) == [(1, {"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]})]


def test_a_line_past_the_cap_is_refused_before_it_fills_the_memory(tmp_path, monkeypatch):
    # /dev/zero under a .jsonl name (or a JSON array written in one line) was read as one line until MemoryError.
    from slime_core import jsonl

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 64)
    path = tmp_path / "one-line.jsonl"
    path.write_text('{"x": 1}\n' + '{"x": "' + "a" * 100 + '"}\n')
    rows = jsonl.iter_jsonl(path)
    assert next(rows) == (1, {"x": 1})  # rows before it still read
    with pytest.raises(ValueError, match=r"one-line\.jsonl:2: a line longer than 0 MiB; not a JSONL row"):
        next(rows)
    path.write_text('{"x": "' + "a" * 40 + '"}\n')  # under the cap: read as usual, without a trailing newline too
    assert list(jsonl.iter_jsonl(path)) == [(1, {"x": "a" * 40})]


def test_numbers_and_nesting_python_cannot_read_name_the_line(tmp_path):
    # Issue 27: an integer of 5,000 digits raised Python's int-string ValueError and 100,000 nested arrays a
    # RecursionError, both as bare tracebacks naming no file or line.
    path = tmp_path / "big.jsonl"
    path.write_text('{"x": 1}\n{"label": ' + "1" * 5000 + "}\n")
    with pytest.raises(ValueError, match=r"big\.jsonl:2: a number Python does not read .*write it as a string"):
        list(iter_jsonl(path))
    path = tmp_path / "deep.jsonl"
    path.write_text('{"label": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(ValueError, match=r"deep\.jsonl:1: JSON nested deeper than Python reads"):
        list(iter_jsonl(path))
    path = tmp_path / "fine.jsonl"
    path.write_text('{"label": ' + "1" * 4000 + ', "deep": ' + "[" * 100 + "]" * 100 + "}\n")
    assert list(iter_jsonl(path))[0][1]["label"] == int("1" * 4000)


_PADDING = [("\x0c", ""), ("", "\u00a0"), ("\u3000", ""), ("", "\x1c"), ("\x0b", "\x85")]


@pytest.mark.parametrize(("before", "after"), _PADDING)
def test_whitespace_around_an_object_is_read_past_as_a_blank_line_is(tmp_path, before, after):
    # A line of only these characters is blank (skipped); around an object they failed the file as "invalid JSON
    # (Extra data)", where the original strips the line and reads the row.
    path = tmp_path / "ws.jsonl"
    path.write_text(f'{before}{{"x": 1}}{after}\n{after}\n', encoding="utf-8")
    assert list(iter_jsonl(path)) == [(1, {"x": 1})]


def test_a_bare_carriage_return_ends_a_line_as_a_text_mode_read_says(tmp_path):
    # Old-Mac line ends (CR only), or a CR between two rows: read whole, the file failed at line 1 as "invalid JSON
    # (Extra data)", where the original's text-mode read (universal newlines) gives the rows. CRLF stays one end.
    from slime_core.jsonl import iter_jsonl_lines

    path = tmp_path / "cr.jsonl"
    path.write_bytes(b'{"x": 1}\r{"x": 2}\r\r{"x": "a\\rb"}\r\n{"x": 4}\n')
    assert list(iter_jsonl(path)) == [(1, {"x": 1}), (2, {"x": 2}), (4, {"x": "a\rb"}), (5, {"x": 4})]
    assert [n for n, _ in iter_jsonl_lines(path)] == [1, 2, 4, 5]
    path.write_bytes(b'{"x": 1}\r{"x": \r')
    with pytest.raises(ValueError, match=r"cr\.jsonl:2: invalid JSON"):
        list(iter_jsonl(path))


def test_invalid_json_names_the_column_and_reads_as_a_sentence(tmp_path):
    # A raw tab inside a string (a spreadsheet export): json's message alone was "Invalid control character at".
    bad = tmp_path / "tab.jsonl"
    bad.write_text('{"x": 1}\n{"prompt": "a\tb"}\n')
    with pytest.raises(ValueError) as info:
        list(iter_jsonl(bad))
    assert str(info.value).endswith("tab.jsonl:2: invalid JSON (Invalid control character at column 14)")
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"prompt": \n')
    with pytest.raises(ValueError, match=r"cut\.jsonl:1: invalid JSON \(Expecting value at column 11\)$"):
        list(iter_jsonl(cut))
