"""slime-convert's staged output (`slime_convert.staged.staged_output`): the swap of `slime_core.dir_swap`, recovery
of an interrupted one included, and `write_torch_dist` staging through it."""

import os

import pytest
import torch

from slime_convert import staged
from slime_convert.staged import staged_output
from slime_convert.torch_dist import LazyChunk, TorchDistReader, write_torch_dist
from slime_core import dir_swap
from slime_core.dir_swap import MARKER, old_dir


def _convert(out, text, *, force):
    with staged_output(out, force=force, flag="--output-dir") as tmp:
        (tmp / "model.safetensors").write_text(text)


def _crash_between_the_renames(monkeypatch, out, text):
    """A forced conversion whose process dies after `<out>` -> `<out>.old`, before `<out>.tmp` -> `<out>`."""
    real_replace = os.replace

    def crash(src, dst):
        if str(src).endswith(".tmp"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(dir_swap.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        _convert(out, text, force=True)
    monkeypatch.setattr(dir_swap.os, "replace", real_replace)


def test_an_interrupted_swap_is_recovered_before_the_next_conversion_looks_at_the_output(tmp_path, monkeypatch):
    # Was: `out` missing and `out.old` holding the previous output, the next conversion without --force ran as if
    # nothing were there and left `out.old` behind for good; its own swap had no recovery.
    out = tmp_path / "hf"
    _convert(out, "v1", force=False)
    _crash_between_the_renames(monkeypatch, out, "v2")
    assert not out.exists() and (old_dir(out) / "model.safetensors").read_text() == "v1"

    with pytest.raises(FileExistsError, match=f"--output-dir {out} exists \\(pass -f/--force to replace it\\)"):
        _convert(out, "v3", force=False)
    assert (out / "model.safetensors").read_text() == "v1"  # the previous output is back under its name
    assert not old_dir(out).exists()  # (the crashed run's hf.tmp stays until a conversion that proceeds)


def test_a_forced_conversion_after_an_interrupted_one_replaces_the_output_and_leaves_no_siblings(tmp_path, monkeypatch):
    out = tmp_path / "hf"
    _convert(out, "v1", force=False)
    _crash_between_the_renames(monkeypatch, out, "v2")
    _convert(out, "v3", force=True)
    assert (out / "model.safetensors").read_text() == "v3" and (out / MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_force_replaces_what_slime_did_not_write_and_only_force_does(tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists"):
        _convert(user, "v1", force=False)
    assert (user / "notes.txt").read_text() == "mine"
    _convert(user, "v1", force=True)  # the user asked for it (-f/--force)
    assert sorted(p.name for p in user.iterdir()) == [MARKER, "model.safetensors"]
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    _convert(tmp_path / "link", "v2", force=True)  # a link is replaced as itself; its target is untouched
    assert (tmp_path / "link").is_dir() and not (tmp_path / "link").is_symlink() and target.is_dir()


def test_staged_output_swaps_with_dir_swap():
    # One mechanism: the module holds no rename logic of its own.
    assert staged.swap_in is dir_swap.swap_in and staged.recover is dir_swap.recover


def _chunk(value):
    return LazyChunk("w", (2,), (0,), torch.float32, lambda: torch.full((2,), value), (2,))


def test_write_torch_dist_stages_through_the_shared_helper(tmp_path, monkeypatch):
    out = tmp_path / "release"
    write_torch_dist(out, [_chunk(1.0)], {}, {"iteration": 0})
    assert TorchDistReader(out).read([("w", ())])[0].tolist() == [1.0, 1.0]
    assert (out / MARKER).is_file()  # marked: its interrupted swap is recognised as slime's
    with pytest.raises(FileExistsError, match=f"--save {out} exists \\(pass -f/--force to replace it\\)"):
        write_torch_dist(out, [_chunk(2.0)], {}, {})

    def broken():
        raise ValueError("w at (0,): produced shape (3,), expected (2,)")

    bad = LazyChunk("w", (2,), (0,), torch.float32, broken, (2,))
    with pytest.raises(ValueError, match=r"^w at \(0,\): produced shape"):  # the rank's own error, unwrapped
        write_torch_dist(tmp_path / "other", [bad], {}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release"]  # no other.tmp left behind
