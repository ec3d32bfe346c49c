"""`slime-convert` against damaged inputs and failing outputs: one named error (exit 2), no half-written output."""

import errno
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from slime_convert import hf_to_mcore, mcore_to_hf
from slime_convert.cli import main
from slime_convert.hf_io import HFCheckpointReader

pytest.importorskip("transformers")


def _copy(hf_dir, dst):
    shutil.copytree(hf_dir, dst)
    return dst


def _first_shard(hf_dir):
    return sorted(hf_dir.glob("model-*.safetensors"))[0]


@pytest.mark.parametrize("keep", [5, 0.5])  # inside the 8-byte header length / inside the tensor data
def test_a_truncated_shard_is_one_error_naming_the_file(tiny_hf_model, tmp_path, caplog, keep):
    _, hf_dir = tiny_hf_model("qwen3")
    broken = _copy(hf_dir, tmp_path / "broken")
    shard = _first_shard(broken)
    data = shard.read_bytes()
    shard.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    # Was safetensors' SafetensorError traceback, naming no file.
    with pytest.raises(ValueError, match=f"{shard.name}: not a complete safetensors file"):
        HFCheckpointReader(broken)
    argv = ["hf-to-mcore", "--hf-checkpoint", str(broken), "--save", str(tmp_path / "m"), "--no-progress"]
    assert main(argv) == 2
    assert f"{shard}: not a complete safetensors file" in caplog.text
    assert not (tmp_path / "m" / "release").exists()


def test_a_broken_index_names_the_index_file(tiny_hf_model, tmp_path):
    _, hf_dir = tiny_hf_model("qwen3")
    broken = _copy(hf_dir, tmp_path / "broken")
    index = broken / "model.safetensors.index.json"
    good = json.loads(index.read_text())
    for text, message in [
        ("{", "not a safetensors index"),  # was json's 'Expecting property name ...' naming no file
        ("{}", "no 'weight_map' object"),  # was the bare KeyError "'weight_map'"
        ("[]", "not a safetensors index"),
    ]:
        index.write_text(text)
        with pytest.raises(ValueError, match=f"{index}: {message}"):
            HFCheckpointReader(broken)
    # The index puts a tensor into a shard that does not hold it: named when the index is read, not at first use.
    name = next(iter(good["weight_map"]))
    other = next(f for f in sorted(set(good["weight_map"].values())) if f != good["weight_map"][name])
    index.write_text(json.dumps({**good, "weight_map": {**good["weight_map"], name: other}}))
    with pytest.raises(ValueError, match=f"names \\['{name}'\\] in {other}, which does not hold them"):
        HFCheckpointReader(broken)


def test_a_damaged_tracker_file_is_named(tiny_hf_model, tmp_path, caplog):
    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    (tmp_path / "m" / "latest_checkpointed_iteration.txt").write_text("garb\x00age")
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(hf_dir), "--no-progress"]) == 2
    # Was "invalid literal for int() with base 10: 'garbage'", naming no file.
    expected = "latest_checkpointed_iteration.txt: holds 'garb\\x00age', not an iteration number or 'release'"
    assert expected in caplog.text


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


def test_force_replaces_a_file_at_the_output_path(tiny_hf_model, tmp_path, caplog):
    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    (tmp_path / "h").write_text("a file")
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    argv += ["--origin-hf-dir", str(hf_dir), "--no-progress"]
    assert main(argv) == 2
    assert "exists (pass -f/--force to replace it)" in caplog.text
    assert main([*argv, "--force"]) == 0  # was NotADirectoryError from shutil.rmtree
    converted = load_file(str(_first_shard(tmp_path / "h")))
    assert converted and all(torch.isfinite(t).all() for t in converted.values())


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


@pytest.mark.parametrize("vocab", [0, -5])  # 0 wrote a [0, hidden] embedding; -5 kept 379 of 384 padded rows
def test_a_vocab_size_below_one_is_refused(tiny_hf_model, tmp_path, caplog, vocab):
    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(hf_dir), "--no-progress", "--vocab-size", str(vocab)]) == 2
    assert f"--vocab-size must be a positive number of rows, got {vocab}" in caplog.text
    assert not (tmp_path / "h").exists()


def test_a_vocab_size_other_than_the_configs_is_warned_about(tiny_hf_model, tmp_path, caplog):
    _, hf_dir = tiny_hf_model("qwen3")  # vocab_size=300
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    out = mcore_to_hf(tmp_path / "m", tmp_path / "h", hf_dir, vocab_size=256, progress=False)
    assert "--vocab-size 256 differs from vocab_size=300" in caplog.text
    assert HFCheckpointReader(out).get("model.embed_tokens.weight").shape == (256, 64)


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


def test_mixed_dtypes_name_the_tensor_and_the_flag_that_casts(tiny_hf_model, tmp_path, caplog):
    from safetensors.torch import save_file

    _, hf_dir = tiny_hf_model("qwen3")
    mixed = _copy(hf_dir, tmp_path / "mixed")
    name = "model.layers.1.mlp.down_proj.weight"  # layer 0 stays fp32, layer 1 becomes fp16
    shard = mixed / json.loads((mixed / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name] = tensors[name].half()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    argv = ["hf-to-mcore", "--hf-checkpoint", str(mixed), "--save", str(tmp_path / "m"), "--no-progress"]
    assert main(argv) == 2  # was DCP's CheckpointException (a BaseException) with a rank traceback
    assert (
        "decoder.layers.mlp.linear_fc2.weight at (1, 0, 0): produced dtype torch.float16, expected torch.float32"
        in caplog.text
    )
    assert "pass --dtype to cast every weight to one" in caplog.text
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == []  # no release, no release.tmp
    assert main([*argv, "--dtype", "bf16"]) == 0


@pytest.mark.parametrize("part", ["shard", "metadata"])
def test_a_damaged_torch_dist_checkpoint_is_one_error_naming_it(tiny_hf_model, tmp_path, caplog, part):
    _, hf_dir = tiny_hf_model("qwen3")
    release = hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    damaged = next(release.glob("*.distcp")) if part == "shard" else release / ".metadata"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])  # a partial copy
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    # Was DCP's CheckpointException (a BaseException, a rank traceback) / pickle's UnpicklingError naming no file.
    assert main([*argv, "--origin-hf-dir", str(hf_dir), "--no-progress"]) == 2
    expected = {
        "shard": f"{release}: cannot be read (RuntimeError: PytorchStreamReader failed reading zip archive",
        "metadata": f"{release / '.metadata'}: not readable torch_dist metadata (UnpicklingError",
    }[part]
    assert expected in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_outputs_reach_the_disk_before_the_renames_that_publish_them(tiny_hf_model, tmp_path, fsync_and_rename_log):
    events = fsync_and_rename_log
    _, hf_dir = tiny_hf_model("qwen3")
    release = hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    out = mcore_to_hf(release, tmp_path / "h", hf_dir, progress=False)
    for final in (release, out.absolute()):
        staged = final.with_name(final.name + ".tmp")
        publish = events.index(("replace", str(staged), str(final)))
        flushed = {e[1] for e in events[:publish] if e[0] == "fsync"}
        written = {str(p).replace(str(final), str(staged)) for p in final.rglob("*")} | {str(staged)}
        assert written <= flushed, final  # every file and folder, before the final name exists
        assert ("fsync", str(final.parent)) in events[publish:]  # and the rename itself
    tracker = str(tmp_path / "m" / "latest_checkpointed_iteration.txt")
    commit = events.index(("replace", tracker + ".tmp", tracker))
    assert ("fsync", tracker + ".tmp") in events[:commit]


@pytest.mark.parametrize("how", ["parent", "absolute"])
def test_an_index_naming_a_shard_outside_the_checkpoint_is_refused(tiny_hf_model, tmp_path, caplog, how):
    # Issue 27: the reader joined the folder with the index's name as given, so `../x` or `/x` read a real
    # safetensors file elsewhere on the machine (here: one of the same model, so nothing else stopped it).
    _, hf_dir = tiny_hf_model("qwen3")
    model = _copy(hf_dir, tmp_path / "models" / "m")
    index = model / "model.safetensors.index.json"
    good = json.loads(index.read_text())
    name, shard = next(iter(good["weight_map"].items()))
    outside = tmp_path / "models" / shard
    shutil.copy(model / shard, outside)  # a complete file that holds the tensor: only the name is wrong
    file = f"../{shard}" if how == "parent" else str(outside)
    index.write_text(json.dumps({**good, "weight_map": {**good["weight_map"], name: file}}))
    why = "leads out of the folder ('..')" if how == "parent" else "is not a file name inside the folder"
    message = f"{index}: weight_map[{name!r}] = {file!r} {why}"
    with pytest.raises(ValueError) as e:
        HFCheckpointReader(model)
    assert str(e.value) == message
    argv = ["hf-to-mcore", "--hf-checkpoint", str(model), "--save", str(tmp_path / "out"), "--no-progress"]
    assert main(argv) == 2
    assert message in caplog.text and not (tmp_path / "out").exists()


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


def test_the_exported_config_states_the_written_dtype_and_no_quantization(tiny_hf_model, tmp_path):
    """The origin's config.json was copied as is: fp32 weights under "bfloat16" (from_pretrained(dtype="auto") then
    loads them in bf16) and an FP8 origin's quantization_config over unquantized weights."""
    _, hf_dir = tiny_hf_model("qwen3")  # fp32 weights
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    origin = _copy(hf_dir, tmp_path / "fp8-origin")
    config = json.loads((origin / "config.json").read_text())
    config.update(dtype="bfloat16", torch_dtype="bfloat16", quantization_config={"quant_method": "fp8"})
    (origin / "config.json").write_text(json.dumps(config))
    (origin / "pytorch_model.bin.index.json").write_text("{}")  # another format's index names no file we write

    out = mcore_to_hf(tmp_path / "m", tmp_path / "h32", origin, progress=False)
    kept = json.loads((out / "config.json").read_text())
    assert (kept["dtype"], kept["torch_dtype"]) == ("float32", "float32")
    assert "quantization_config" not in kept
    assert not (tmp_path / "h32" / "pytorch_model.bin.index.json").exists()

    out = mcore_to_hf(tmp_path / "m", tmp_path / "h16", origin, dtype=torch.float16, progress=False)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    assert {t.dtype for t in load_file(str(_first_shard(out))).values()} == {torch.float16}


def test_a_dangling_link_in_the_origin_dir_is_named_before_writing(tiny_hf_model, tmp_path, caplog):
    """A tokenizer.json linking into a pruned HF cache was skipped without a word: the export had no tokenizer."""
    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    origin = tmp_path / "linked"
    origin.mkdir()
    for f in hf_dir.iterdir():
        (origin / f.name).symlink_to(f)  # the HF cache's snapshot layout: every file a link
    (origin / "tokenizer.json").symlink_to(tmp_path / "blobs" / "gone")
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(origin), "--no-progress"]) == 2
    assert f"--origin-hf-dir {origin}: ['tokenizer.json'] are links to missing files" in caplog.text
    assert not (tmp_path / "h").exists() and not (tmp_path / "h.tmp").exists()
    (origin / "tokenizer.json").unlink()
    out = mcore_to_hf(tmp_path / "m", tmp_path / "h", origin, progress=False)  # linked shards and config are read
    assert (out / "config.json").is_file() and not (out / "config.json").is_symlink()


def _edit_config(hf_dir, **fields):
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, **fields}))


def test_hf_tensors_the_config_does_not_describe_are_refused_not_dropped(tiny_hf_model, tmp_path, caplog):
    """num_hidden_layers=1 over a 2-layer checkpoint wrote a 1-layer torch_dist (exit 0): layer 1 was dropped."""
    _, hf_dir = tiny_hf_model("qwen3")
    fewer = _copy(hf_dir, tmp_path / "fewer")
    _edit_config(fewer, num_hidden_layers=1)
    argv = ["hf-to-mcore", "--hf-checkpoint", str(fewer), "--save", str(tmp_path / "m"), "--no-progress"]
    assert main(argv) == 2
    dropped = sum(1 for n in HFCheckpointReader(hf_dir).keys() if n.startswith("model.layers.1."))
    assert f"{fewer}: {dropped} tensors that config.json does not describe would be dropped: " in caplog.text
    assert "says num_hidden_layers=1," in caplog.text
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


def test_a_tied_models_stored_head_must_be_its_embedding(tiny_hf_model, tmp_path, caplog):
    from safetensors.torch import save_file

    _, hf_dir = tiny_hf_model("qwen3")  # tied: transformers stores no lm_head.weight
    model = _copy(hf_dir, tmp_path / "with-head")
    embed = HFCheckpointReader(hf_dir).get("model.embed_tokens.weight")
    index = model / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    index.write_text(json.dumps({"weight_map": {**weight_map, "lm_head.weight": "head.safetensors"}}))
    save_file({"lm_head.weight": embed.clone()}, str(model / "head.safetensors"))
    hf_to_mcore(model, tmp_path / "same", progress=False)  # the same matrix: nothing is lost
    save_file({"lm_head.weight": embed + 1}, str(model / "head.safetensors"))
    argv = ["hf-to-mcore", "--hf-checkpoint", str(model), "--save", str(tmp_path / "m"), "--no-progress"]
    assert main(argv) == 2
    assert "lm_head.weight in head.safetensors differs from model.embed_tokens.weight" in caplog.text


def test_torch_dist_tensors_the_origin_config_has_no_name_for_are_refused(tiny_hf_model, tmp_path, caplog):
    """A q/k/v bias stored in the checkpoint under an origin config without one was left out of the export (exit 0)."""
    _, hf_dir = tiny_hf_model("glm4")  # attention_bias=True: linear_qkv.bias is stored
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    origin = _copy(hf_dir, tmp_path / "no-bias")
    _edit_config(origin, attention_bias=False)
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(origin), "--no-progress"]) == 2
    expected = "1 model tensors have no HF name under this config and would be dropped: "
    assert f"{expected}decoder.layers.self_attention.linear_qkv.bias;" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "no-bias"]


def test_a_dtype_cast_that_overflows_is_refused_naming_the_tensor(tiny_hf_model, tmp_path, caplog):
    """--dtype fp16 turned a weight of 1e5 into inf without a word (exit 0), in both directions."""
    from safetensors.torch import save_file

    _, hf_dir = tiny_hf_model("qwen3")
    model = _copy(hf_dir, tmp_path / "big")
    name = "model.layers.1.mlp.down_proj.weight"
    shard = model / json.loads((model / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name][3, 5] = 1e5  # finite in fp32 and bf16; fp16's largest is 65504
    save_file(tensors, str(shard), metadata={"format": "pt"})
    message = f"--dtype float16: {name} holds values up to 100000, beyond float16's range (max 65504)"

    argv = ["hf-to-mcore", "--hf-checkpoint", str(model), "--save", str(tmp_path / "m16"), "--no-progress"]
    assert main([*argv, "--dtype", "fp16"]) == 2
    assert message in caplog.text and not (tmp_path / "m16" / "release").exists()
    assert main([*argv, "--dtype", "bf16"]) == 0  # bf16 reaches 3.4e38: 1e5 is rounded, not lost
    caplog.clear()
    hf_to_mcore(model, tmp_path / "m", progress=False)
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(model), "--dtype", "fp16", "--no-progress"]) == 2
    assert message in caplog.text and not (tmp_path / "h").exists() and not (tmp_path / "h.tmp").exists()


@pytest.mark.parametrize("given", ["root", "iteration"])
def test_the_legacy_per_rank_layout_is_named(tiny_hf_model, tmp_path, caplog, given):
    """A TP=2 `--ckpt-format torch` save (mp_rank_00/, mp_rank_01/) was "not a torch_dist checkpoint directory"."""
    _, hf_dir = tiny_hf_model("qwen3")
    iteration = tmp_path / "save" / "iter_0000010"
    for rank in ("mp_rank_00", "mp_rank_01"):
        (iteration / rank).mkdir(parents=True)
        torch.save({"model": {}}, iteration / rank / "model_optim_rng.pt")
    (tmp_path / "save" / "latest_checkpointed_iteration.txt").write_text("10")
    given_dir = tmp_path / "save" if given == "root" else iteration
    argv = ["mcore-to-hf", "--input-dir", str(given_dir), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(hf_dir), "--no-progress"]) == 2
    assert f"{iteration}: a legacy --ckpt-format torch checkpoint (2 rank folders: mp_rank_00, ...)" in caplog.text
    assert "--ckpt-convert-format torch_dist" in caplog.text and not (tmp_path / "h").exists()


def test_tensors_and_shards_the_index_does_not_list_are_named(tiny_hf_model, tmp_path, caplog):
    """The index decides what a checkpoint holds (as for transformers); what it leaves out was skipped unsaid."""
    from safetensors.torch import save_file

    _, hf_dir = tiny_hf_model("qwen3")
    model = _copy(hf_dir, tmp_path / "m")
    shard = _first_shard(model)
    tensors = load_file(str(shard))
    save_file({**tensors, "model.extra.weight": torch.ones(3)}, str(shard), metadata={"format": "pt"})
    save_file({"model.stale.weight": torch.ones(2)}, str(model / "model-00009-of-00009.safetensors"))
    reader = HFCheckpointReader(model)
    assert "model.extra.weight" not in reader and "model.stale.weight" not in reader
    index = model / "model.safetensors.index.json"
    assert f"{index}: 1 tensors in {shard.name} are not in the index and are not read: ['model.extra.weight']" in (
        caplog.text
    )
    expected = (
        f"{index}: 1 safetensors files are not in the index and are not read: ['model-00009-of-00009.safetensors']"
    )
    assert expected in caplog.text


@pytest.mark.parametrize("output", ["input", "origin", "fp8"])
def test_force_never_replaces_the_checkpoint_being_read(tiny_hf_model, tmp_path, caplog, output):
    """`--output-dir` naming the torch_dist save (or --origin-hf-dir) with -f replaced it by the export: input gone."""
    _, hf_dir = tiny_hf_model("qwen3")
    origin = _copy(hf_dir, tmp_path / "origin")
    hf_to_mcore(origin, tmp_path / "m", progress=False)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    if output == "fp8":
        argv = ["hf-to-fp8", "--hf-checkpoint", str(origin), "--save", str(origin), "-f", "--no-progress"]
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


def test_nan_and_inf_weights_are_carried_exactly_and_named(tiny_hf_model, tmp_path, caplog):
    """Non-finite weights went through both directions without a word (a run from them trains on NaN)."""
    from safetensors.torch import save_file

    _, hf_dir = tiny_hf_model("qwen3")
    model = _copy(hf_dir, tmp_path / "nan")
    weight_map = json.loads((model / "model.safetensors.index.json").read_text())["weight_map"]
    bad = {"model.layers.0.self_attn.o_proj.weight": float("nan"), "model.norm.weight": float("inf")}
    for name, value in bad.items():
        tensors = load_file(str(model / weight_map[name]))
        tensors[name][0] = value
        save_file(tensors, str(model / weight_map[name]), metadata={"format": "pt"})
    release = hf_to_mcore(model, tmp_path / "m", progress=False)
    assert f"{model}: 2 tensors hold NaN or inf (converted as they are): {sorted(bad)}" in caplog.text
    out = mcore_to_hf(release, tmp_path / "h", model, progress=False)
    assert f"{release}: 2 tensors hold NaN or inf (converted as they are): {sorted(bad)}" in caplog.text
    for name in bad:  # bit for bit, NaN included
        stored = load_file(str(model / weight_map[name]))[name]
        exported = HFCheckpointReader(out).get(name)
        assert torch.equal(stored.view(torch.int32), exported.view(torch.int32)), name


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


def test_without_an_index_a_tensor_in_two_files_is_refused(tmp_path, caplog):
    """With no index every *.safetensors was read and the later file silently won a name both hold."""
    from safetensors.torch import save_file

    model = tmp_path / "model"
    model.mkdir()
    save_file({"model.norm.weight": torch.ones(4)}, str(model / "model.safetensors"))
    save_file({"model.norm.weight": torch.zeros(4)}, str(model / "old-model.safetensors"))
    with pytest.raises(ValueError) as e:
        HFCheckpointReader(model)
    assert str(e.value) == (
        f"{model}: tensor 'model.norm.weight' is in both model.safetensors and old-model.safetensors, and there is "
        "no model.safetensors.index.json to say which one the checkpoint holds"
    )
