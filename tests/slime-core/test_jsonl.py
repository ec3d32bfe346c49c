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
