"""Rename-swap replacement of a directory (slime_core.dir_swap): a crash at any step leaves a complete copy."""

import os

import pytest

from slime_core import dir_swap
from slime_core.dir_swap import MARKER, ReplaceRefused, mark, old_dir, prepare_staging, recover, staging_dir, swap_in


def _write(d, text, *, ours=True):
    d.mkdir(parents=True)
    (d / "weights").write_text(text)
    if ours:
        mark(d)


def test_swap_replaces_the_old_directory_and_leaves_no_siblings(tmp_path):
    out = tmp_path / "hf"
    _write(out, "v1")
    _write(staging_dir(out), "v2")
    assert swap_in(staging_dir(out), out) == out
    assert (out / "weights").read_text() == "v2" and (out / MARKER).is_file()
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
    with pytest.raises(ReplaceRefused, match="hf: exists and is not a directory; refusing"):
        swap_in(tmp_path / "hf.tmp", tmp_path / "hf")
    assert (tmp_path / "hf").read_text() == "not a checkpoint"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        swap_in(tmp_path / "missing", tmp_path / "y")


def test_a_folder_slime_did_not_write_is_never_replaced_nor_deleted(tmp_path):
    """The hostile repro: `--save-hf` pointing at the folder holding the prompt data."""
    data = tmp_path / "data"
    _write(data, "precious", ours=False)
    _write(staging_dir(data), "export")
    with pytest.raises(ReplaceRefused) as info:
        swap_in(staging_dir(data), data, flag="--save-hf")
    message = str(info.value)
    assert message.startswith(f"--save-hf {data}: is a non-empty folder that slime did not write (no {MARKER}")
    assert "\n" not in message
    assert (data / "weights").read_text() == "precious" and not old_dir(data).exists()
    with pytest.raises(ReplaceRefused, match="--save-hf .*data: is a non-empty folder"):
        prepare_staging(data, flag="--save-hf")  # refused before any export work


@pytest.mark.parametrize("sibling", [staging_dir, old_dir])
def test_a_user_folder_named_like_a_staging_or_old_copy_is_not_deleted(tmp_path, sibling):
    out = tmp_path / "hf"
    _write(out, "v1")
    _write(sibling(out), "user's", ours=False)
    with pytest.raises(ReplaceRefused, match=f"{sibling(out)}: is a non-empty folder"):
        prepare_staging(out, flag="--save-hf")
    if sibling is old_dir:
        _write(staging_dir(out), "v2")
        with pytest.raises(ReplaceRefused):
            swap_in(staging_dir(out), out)
    assert (sibling(out) / "weights").read_text() == "user's" and (out / "weights").read_text() == "v1"


def test_empty_absent_and_marked_folders_are_replaced_and_links_are_not(tmp_path):
    (tmp_path / "empty").mkdir()
    for name in ("empty", "absent"):
        tmp = prepare_staging(tmp_path / name)
        (tmp / "weights").write_text(name)
        swap_in(tmp, tmp_path / name)
        assert (tmp_path / name / "weights").read_text() == name and (tmp_path / name / MARKER).is_file()
    tmp = prepare_staging(tmp_path / "absent")  # the export of the next rollout replaces the marked one
    (tmp / "weights").write_text("v2")
    swap_in(tmp, tmp_path / "absent")
    assert (tmp_path / "absent" / "weights").read_text() == "v2"
    os.symlink(tmp_path / "empty", tmp_path / "link")
    with pytest.raises(ReplaceRefused, match="link: is a symbolic link"):
        prepare_staging(tmp_path / "link")
    assert (tmp_path / "empty" / "weights").read_text() == "empty"


def test_swap_flushes_the_new_files_before_the_renames_and_the_renames_after(tmp_path, fsync_and_rename_log):
    out = tmp_path / "hf"
    _write(out, "v1")
    new = staging_dir(out)
    _write(new / "shards", "v2")
    events = fsync_and_rename_log
    swap_in(new, out)
    first_rename = next(i for i, e in enumerate(events) if e[0] == "replace")
    flushed = {e[1] for e in events[:first_rename]}
    assert {str(new / "shards" / "weights"), str(new / "shards" / MARKER), str(new / "shards"), str(new / MARKER),
            str(new)} <= flushed  # fmt: skip
    assert events[-1] == ("fsync", str(tmp_path))  # the renames in the parent folder, after both
    assert (out / "shards" / "weights").read_text() == "v2"


def test_write_text_atomic_flushes_the_text_then_the_rename(tmp_path, fsync_and_rename_log):
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    tracker.write_text("1")
    events = fsync_and_rename_log
    dir_swap.write_text_atomic(tracker, "2")
    tmp = str(tracker) + ".tmp"
    assert events == [("fsync", tmp), ("replace", tmp, str(tracker)), ("fsync", str(tmp_path))]
    assert tracker.read_text() == "2" and sorted(os.listdir(tmp_path)) == [tracker.name]
