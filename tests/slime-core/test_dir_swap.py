"""Rename-swap replacement of a directory (slime_core.dir_swap): a crash at any step leaves a complete copy."""

import os

import pytest

from slime_core import dir_swap
from slime_core.dir_swap import old_dir, recover, staging_dir, swap_in


def _write(d, text):
    d.mkdir(parents=True)
    (d / "weights").write_text(text)


def test_swap_replaces_the_old_directory_and_leaves_no_siblings(tmp_path):
    out = tmp_path / "hf"
    _write(out, "v1")
    _write(staging_dir(out), "v2")
    assert swap_in(staging_dir(out), out) == out
    assert (out / "weights").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_swap_into_a_new_path(tmp_path):
    _write(tmp_path / "x.tmp", "v1")
    swap_in(tmp_path / "x.tmp", tmp_path / "x")
    assert (tmp_path / "x" / "weights").read_text() == "v1" and not (tmp_path / "x.tmp").exists()


def test_a_crash_between_the_renames_keeps_the_old_copy_and_the_next_swap_recovers(tmp_path, monkeypatch):
    out = tmp_path / "hf"
    _write(out, "v1")
    _write(staging_dir(out), "v2")
    real_replace = os.replace

    def crash_on_the_second_rename(src, dst):
        if str(src).endswith(".tmp"):
            raise KeyboardInterrupt  # the process dies after `hf` -> `hf.old`
        real_replace(src, dst)

    monkeypatch.setattr(dir_swap.os, "replace", crash_on_the_second_rename)
    with pytest.raises(KeyboardInterrupt):
        swap_in(staging_dir(out), out)
    monkeypatch.setattr(dir_swap.os, "replace", real_replace)
    assert not out.exists() and (old_dir(out) / "weights").read_text() == "v1"  # never no copy
    recover(out)
    assert (out / "weights").read_text() == "v1" and not old_dir(out).exists()


def test_a_left_over_old_copy_beside_a_finished_swap_is_deleted(tmp_path):
    out = tmp_path / "hf"
    _write(out, "v2")
    _write(old_dir(out), "v1")  # the crash came while deleting the old copy
    _write(staging_dir(out), "v3")
    swap_in(staging_dir(out), out)
    assert (out / "weights").read_text() == "v3" and not old_dir(out).exists()


def test_a_file_in_the_way_is_not_deleted(tmp_path):
    (tmp_path / "hf").write_text("not a checkpoint")
    _write(tmp_path / "hf.tmp", "v1")
    with pytest.raises(NotADirectoryError, match="hf exists and is not a directory"):
        swap_in(tmp_path / "hf.tmp", tmp_path / "hf")
    assert (tmp_path / "hf").read_text() == "not a checkpoint"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        swap_in(tmp_path / "missing", tmp_path / "y")
