"""What one-line errors quote (`slime_core.error_text`)."""

import pytest
from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

from slime_core.error_text import first_rank_error, first_sentence, int_digits, preview, shape_or_type, shorten


def test_shorten_keeps_short_text_and_cuts_long_text_to_the_limit():
    assert shorten("abc", 5) == "abc"
    assert shorten("abcdef", 5) == "ab..."
    assert len(shorten("x" * 500)) == 80
    with pytest.raises(ValueError, match="limit 3 leaves no room"):
        shorten("abcdef", 3)


def test_preview_is_the_repr_cut_to_the_limit():
    assert preview("x" * 100, 10) == "'xxxxxx..."
    assert preview([1, 2]) == "[1, 2]"
    assert preview(None) == "None"


def _raised(error):
    try:
        raise error
    except BaseException as e:  # noqa: BLE001 - the wrapper needs a raised error (its traceback)
        return _wrap_exception(e)


def test_first_rank_error_is_the_rank_error_inside_dcp_collection():
    full = OSError(28, "No space left on device")
    collected = CheckpointException("write", {0: _raised(full), 1: _raised(RuntimeError("other"))})
    assert first_rank_error(collected) is full


def test_first_rank_error_prefers_an_exception_to_a_base_exception():
    stop = KeyboardInterrupt()
    bad = ValueError("bad shard")
    assert first_rank_error(CheckpointException("read", {0: _raised(stop), 1: _raised(bad)})) is bad
    only = CheckpointException("read", {0: _raised(stop)})
    assert first_rank_error(only) is stop


def test_first_rank_error_of_another_error_is_itself():
    error = ValueError("x")
    assert first_rank_error(error) is error
    empty = CheckpointException("read", {})
    assert first_rank_error(empty) is empty


def test_first_sentence_is_the_type_and_the_first_sentence_cut_to_the_limit():
    # One summary for slime-convert's torch_dist reader and the FSDP checkpoint loader (each had its own copy).
    assert first_sentence(OSError("disk\n  full. Try again later.")) == "OSError: disk full"
    assert first_sentence(RuntimeError("")) == "RuntimeError"
    assert first_sentence(ValueError("x" * 300), 10) == "ValueError: xxxxxxx..."
    assert first_sentence(ValueError("x" * 300)) == "ValueError: " + "x" * 197 + "..."


def test_preview_describes_an_int_past_pythons_int_to_text_limit():
    # repr() of an int of more than 4,300 digits raises ValueError: the error being built (a plugin's label in a
    # grader's message) was replaced by Python's "Exceeds the limit (4300 digits)" naming nothing.
    assert preview(10**5000) == "<an int of 5,001 digits>"
    assert preview(-(10**5000)) == "<an int of 5,001 digits>"
    assert preview([1, 10**5000]) == "<a list holding an int past Python's int-to-text limit>"
    assert preview(10**20) == "100000000000000000000"


def test_int_digits_counts_without_converting_to_text():
    import random

    rng = random.Random(0)
    values = [0, 1, 9, 10, 99, 100, 10**50 - 1, 10**50, 2**100, -7]
    values += [rng.randrange(10 ** rng.randrange(1, 300)) for _ in range(500)]
    assert [int_digits(v) for v in values] == [len(str(abs(v))) for v in values]
    assert int_digits(10**5000) == 5001 and int_digits(10**5000 - 1) == 5000


def test_shape_or_type_names_an_array_by_its_shape_and_anything_else_by_its_type():
    import numpy as np
    import torch

    assert shape_or_type(torch.zeros(3, 4)) == "shape (3, 4)"
    assert shape_or_type(torch.tensor(1.0)) == "shape ()"
    assert shape_or_type(np.zeros((2,))) == "shape (2,)"
    assert shape_or_type(0.5) == "float"
    assert shape_or_type([torch.zeros(1)]) == "list"
    assert shape_or_type(torch.Tensor) == "_TensorMeta"  # the class: a `shape` descriptor, not a shape
