"""`slime-convert`'s outputs when a conversion fails or is stopped: staged, published whole, never over its inputs."""

import errno
import json
import pathlib
import shutil

import pytest
import torch
from safetensors.torch import load_file

from slime_convert import hf_to_mcore, mcore_to_hf
from slime_convert.cli import main

pytest.importorskip("transformers")


def test_force_keeps_the_old_output_until_the_new_one_is_complete(tiny_hf_model, tmp_path, monkeypatch):
    from slime_convert import hf_io

    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    out = mcore_to_hf(tmp_path / "m", tmp_path / "h", hf_dir, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hf_io, "save_safetensors", full_disk)
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(out), "--origin-hf-dir"]
    assert main([*argv, str(hf_dir), "--no-progress", "--force"]) == 2  # was a traceback (OSError not caught)
    # --force deleted the old output before converting: a failure left no output at all.
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h", "m"]  # no h.tmp / h.old


def test_force_replaces_a_file_at_the_output_path(first_shard, tiny_hf_model, tmp_path, caplog):
    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    (tmp_path / "h").write_text("a file")
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    argv += ["--origin-hf-dir", str(hf_dir), "--no-progress"]
    assert main(argv) == 2
    assert "exists (pass -f/--force to replace it)" in caplog.text
    assert main([*argv, "--force"]) == 0  # was NotADirectoryError from shutil.rmtree
    converted = load_file(str(first_shard(tmp_path / "h")))
    assert converted and all(torch.isfinite(t).all() for t in converted.values())


def test_hf_to_mcore_offers_and_takes_force_like_the_other_subcommands(tiny_hf_model, tmp_path, caplog):
    # It refused an existing <save>/release with "remove it or choose another --save" and had no -f/--force.
    _, hf_dir = tiny_hf_model("qwen3")
    save = tmp_path / "m"
    argv = ["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(save), "--no-progress"]
    assert main(argv) == 0
    (save / "release" / "stale").write_text("from the previous conversion")
    assert main(argv) == 2
    assert f"--save {save / 'release'} exists (pass -f/--force to replace it)" in caplog.text
    assert main([*argv, "-f"]) == 0
    assert not (save / "release" / "stale").exists()  # replaced whole
    assert sorted(p.name for p in save.iterdir()) == [".slime_export", "latest_checkpointed_iteration.txt", "release"]
    out = mcore_to_hf(save, tmp_path / "h", hf_dir, progress=False)  # the replacement loads
    assert any(out.glob("*.safetensors"))


def test_hf_to_fp8_writes_nothing_when_it_fails_midway(tmp_path, monkeypatch, caplog):
    from slime_convert import fp8

    src = tmp_path / "bf16"
    src.mkdir()
    from safetensors.torch import save_file

    save_file({"model.layers.0.mlp.down_proj.weight": torch.ones(8, 8).bfloat16()}, str(src / "a.safetensors"))
    save_file({"model.layers.1.mlp.down_proj.weight": torch.ones(8, 8).bfloat16()}, str(src / "b.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    argv = ["hf-to-fp8", "--hf-checkpoint", str(src), "--save", str(tmp_path / "fp8"), "--no-progress"]
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "fp8").iterdir()}

    # A truncated second shard: the first was already written into the output (left half-written before).
    data = (src / "b.safetensors").read_bytes()
    (src / "b.safetensors").write_bytes(data[: len(data) // 2])
    assert main([*argv, "--force"]) == 2
    assert f"{src / 'b.safetensors'}: not a complete safetensors file" in caplog.text
    assert {p.name: p.read_bytes() for p in (tmp_path / "fp8").iterdir()} == before  # --force kept the old one
    (tmp_path / "fp8").rename(tmp_path / "old")
    assert main(argv) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bf16", "old"]  # no empty fp8 left to block a rerun

    (src / "b.safetensors").write_bytes(data)
    calls = []

    def full_disk(tensors, path, metadata=None):
        calls.append(path)
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(fp8, "save_safetensors", full_disk)
    assert main(argv) == 2  # was an OSError traceback
    assert "No space left on device" in caplog.text and len(calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bf16", "old"]


def test_hf_to_mcore_into_the_empty_working_directory_writes_in_place(tiny_hf_model, tmp_path, monkeypatch):
    # An empty --save is staged whole and renamed in; the working directory must not be renamed away under the process.
    from slime_convert.torch_dist import resolve_iteration_dir

    _, hf_dir = tiny_hf_model("qwen3")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", ".", "--no-progress"]) == 0
    assert pathlib.Path.cwd() == here and here.is_dir()
    assert resolve_iteration_dir(here) == here / "release"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]  # no here.tmp / here.old


def test_hf_to_mcore_into_a_training_run_folder_is_refused(tiny_hf_model, tmp_path, caplog):
    # The tracker was re-pointed at "release": the next --load of the run resumed from the HF weights, silently.
    _, hf_dir = tiny_hf_model("qwen3")
    run = tmp_path / "run"
    (run / "iter_0000100").mkdir(parents=True)
    (run / "latest_checkpointed_iteration.txt").write_text("100")
    assert main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(run), "--no-progress"]) == 2
    assert "latest_checkpointed_iteration.txt names iteration '100'" in caplog.text
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "100"
    assert sorted(p.name for p in run.iterdir()) == ["iter_0000100", "latest_checkpointed_iteration.txt"]


def test_outputs_reach_the_disk_before_the_renames_that_publish_them(tiny_hf_model, tmp_path, fsync_and_rename_log):
    events = fsync_and_rename_log
    _, hf_dir = tiny_hf_model("qwen3")
    release = hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    out = mcore_to_hf(release, tmp_path / "h", hf_dir, progress=False)
    # hf-to-mcore publishes its whole save root (release/ and the tracker) by one rename; mcore-to-hf its output.
    for final in (release.parent.absolute(), out.absolute()):
        staged = final.with_name(final.name + ".tmp")
        publish = events.index(("replace", str(staged), str(final)))
        flushed = {e[1] for e in events[:publish] if e[0] == "fsync"}
        written = {str(p).replace(str(final), str(staged)) for p in final.rglob("*")} | {str(staged)}
        assert written <= flushed, final  # every file and folder, before the final name exists
        assert ("fsync", str(final.parent)) in events[publish:]  # and the rename itself
    tracker = str(tmp_path / "m.tmp" / "latest_checkpointed_iteration.txt")
    commit = events.index(("replace", tracker + ".tmp", tracker))
    assert ("fsync", tracker + ".tmp") in events[:commit]


class _Killed(BaseException):
    """The process dies here (no handler runs after it)."""


@pytest.mark.parametrize("root", ["absent", "empty", "holds_a_file"])
def test_hf_to_mcore_killed_at_any_rename_leaves_the_old_state_or_the_new(tiny_hf_model, tmp_path, monkeypatch, root):
    """A kill between publishing release/ and writing the tracker left release/ without it: no reader loaded it, and
    the next hf-to-mcore refused ("release exists"). Each rename (and DCP's own) is made the kill point in turn: a
    reader finds the old state or the new, an absent or empty root is published whole, and a rerun always finishes."""
    import os

    from slime_convert.torch_dist import resolve_iteration_dir

    _, hf_dir = tiny_hf_model("qwen3")
    save = tmp_path / "m"
    if root != "absent":
        save.mkdir()
    if root == "holds_a_file":  # cannot be replaced whole: written in place, the tracker last
        (save / "README").write_text("converted from Qwen3")
    before = sorted(p.name for p in save.iterdir()) if save.exists() else None
    real = {"replace": os.replace, "rename": os.rename}
    calls = {"n": 0, "kill_at": 0}

    def dying(name):
        def call(src, dst, **kw):
            calls["n"] += 1
            if calls["n"] == calls["kill_at"]:
                raise _Killed(f"killed at {name}({src}, {dst})")
            return real[name](src, dst, **kw)

        return call

    for kill_at in range(1, 20):
        calls.update(n=0, kill_at=kill_at)

        monkeypatch.setattr(os, "replace", dying("replace"))
        monkeypatch.setattr(os, "rename", dying("rename"))
        try:
            hf_to_mcore(hf_dir, save, progress=False)
        except BaseException as e:  # DCP wraps a kill inside its writer in a CheckpointException
            if calls["n"] < kill_at or "_Killed" not in f"{e!r}{e}":
                raise
            killed = True
        else:
            killed = False
        monkeypatch.undo()
        if not killed:
            break
        # The old state: a reader finds no checkpoint, and the folder holds what it held.
        with pytest.raises(FileNotFoundError):
            resolve_iteration_dir(save)
        if root != "holds_a_file":
            assert not save.exists() or sorted(p.name for p in save.iterdir()) == before, kill_at
        # The next run finishes (it removes the kill's left-overs), and the state is the new one.
        assert hf_to_mcore(hf_dir, save, progress=False) == save / "release"
        assert resolve_iteration_dir(save) == save / "release"
        shutil.rmtree(save)
        if root != "absent":
            save.mkdir()
        if root == "holds_a_file":
            (save / "README").write_text("converted from Qwen3")
    assert not killed and kill_at > 3  # DCP's rename, release/'s, the tracker's, then the root's
    assert resolve_iteration_dir(save) == save / "release"
    assert sorted(p.name for p in save.iterdir()) == sorted(
        [*(before or []), ".slime_export", "latest_checkpointed_iteration.txt", "release"]
        if root != "holds_a_file"
        else [*before, "latest_checkpointed_iteration.txt", "release"]
    )


@pytest.mark.parametrize("command", ["hf-to-mcore", "mcore-to-hf"])
def test_ctrl_c_mid_conversion_ends_in_one_line(tiny_hf_model, tmp_path, monkeypatch, caplog, command):
    """Ctrl-C inside DCP's writer/reader came out as its CheckpointException (a BaseException traceback)."""
    from slime_convert import convert

    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    calls = {"n": 0}

    def interrupt_on_third_call(real, skip=0):
        # hf-to-mcore first converts layer 0 of each mapping for the shapes: skip those so the Ctrl-C lands in DCP.
        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == skip + 3:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        return wrapped

    if command == "hf-to-mcore":
        skip = len(convert.tensor_mappings(convert.ModelArgs.from_hf_dir(hf_dir)))
        monkeypatch.setattr(convert, "to_mcore", interrupt_on_third_call(convert.to_mcore, skip))
        out = tmp_path / "m2"
        argv = ["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(out)]
    else:
        monkeypatch.setattr(convert, "to_hf", interrupt_on_third_call(convert.to_hf))
        out = tmp_path / "h"
        argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(out), "--origin-hf-dir"]
        argv.append(str(hf_dir))
    assert main([*argv, "--no-progress"]) == 130
    assert "interrupted: nothing was written" in caplog.text
    assert not (out / "release").exists() and not (out / "release.tmp").exists()
    assert not (tmp_path / "h").exists() and not (tmp_path / "h.tmp").exists()
    monkeypatch.undo()
    assert main([*argv, "--no-progress"]) == 0  # a rerun starts clean


@pytest.mark.parametrize("output", ["input", "origin", "fp8"])
def test_force_never_replaces_the_checkpoint_being_read(tiny_hf_model, tmp_path, caplog, output):
    """`--output-dir` naming the torch_dist save (or --origin-hf-dir) with -f replaced it by the export: input gone."""
    _, hf_dir = tiny_hf_model("qwen3")
    origin = shutil.copytree(hf_dir, tmp_path / "origin")
    hf_to_mcore(origin, tmp_path / "m", progress=False)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    if output == "fp8":
        argv = ["hf-to-fp8", "--hf-checkpoint", str(origin), "--save", str(origin), "-f", "--no-progress"]
        argv += ["--block-size", "32", "32"]  # blocks the tiny model's fused q/k/v and gate/up rows fit
        flags = ("--save", "--hf-checkpoint")
    else:
        out = tmp_path / ("m" if output == "input" else "origin")
        argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(out)]
        argv += ["--origin-hf-dir", str(origin), "-f", "--no-progress"]
        flags = ("--output-dir", "--input-dir" if output == "input" else "--origin-hf-dir")
    assert main(argv) == 2
    assert f"{flags[0]} {tmp_path / ('m' if output == 'input' else 'origin')} holds {flags[1]} " in caplog.text
    assert f"replacing it would delete the input; choose another {flags[0]}" in caplog.text
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_an_output_name_without_room_for_the_staging_suffix_is_named(tiny_hf_model, tmp_path, caplog):
    """A legal 253-byte --output-dir failed with "[Errno 36] File name too long: '<out>.old'" (a path never given)."""
    import os

    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--origin-hf-dir", str(hf_dir), "--no-progress"]
    long = tmp_path / ("h" * (limit - 2))
    assert main([*argv, "--output-dir", str(long)]) == 2
    assert f"its name is {limit - 2} bytes; it needs room for a 4-byte '.tmp' / '.old' suffix" in caplog.text
    assert f"choose a name of at most {limit - 4}" in caplog.text and "Errno" not in caplog.text
    assert main([*argv, "--output-dir", str(tmp_path / ("h" * (limit - 4)))]) == 0
