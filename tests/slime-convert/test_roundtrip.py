import json

import pytest
import torch
from safetensors.torch import load_file

from slime_convert import hf_to_mcore, mcore_to_hf
from slime_convert.cli import main
from slime_convert.torch_dist import TorchDistReader

pytest.importorskip("transformers")


def _load_hf_dir(path):
    index = json.loads((path / "model.safetensors.index.json").read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(path / file)))
    assert set(out) == set(index["weight_map"])
    return out


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "llama", "qwen3_moe", "glm4"])
def test_hf_to_mcore_to_hf_is_bit_identical(model_type, tiny_hf_model, tmp_path):
    _, hf_dir = tiny_hf_model(model_type)
    original = _load_hf_dir(hf_dir)
    ckpt = hf_to_mcore(hf_dir, tmp_path / "mcore", tensor_model_parallel_size=2, progress=False)
    assert ckpt.name == "release"
    assert (tmp_path / "mcore" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert json.loads((ckpt / "metadata.json").read_text())["sharded_backend"] == "torch_dist"

    # Vocab padded to a multiple of 128 * TP = 256: 300 -> 512 rows.
    keys = TorchDistReader(ckpt).tensor_keys()
    assert keys["embedding.word_embeddings.weight"][0] == (512, 64)
    assert keys["decoder.layers.self_attention.linear_qkv.weight"][0][0] == 2  # layer axis

    out = mcore_to_hf(ckpt, tmp_path / "hf-out", hf_dir, chunk_size=50_000, progress=False)
    converted = _load_hf_dir(out)
    assert set(converted) == set(original)
    for name, tensor in original.items():
        assert converted[name].dtype == tensor.dtype, name
        assert torch.equal(converted[name], tensor), name
    assert (out / "config.json").read_text() == (hf_dir / "config.json").read_text()
    # chunk_size=50kB forces several shards.
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1


def test_cli_round_trip_and_errors(tiny_hf_model, tmp_path, capsys):
    _, hf_dir = tiny_hf_model("qwen3")
    assert main(["megatron-args", "--hf-checkpoint", str(hf_dir)]) == 0
    flags = capsys.readouterr().out.split()
    assert flags[flags.index("--num-layers") + 1] == "2"
    assert "--qk-layernorm" in flags and "--untie-embeddings-and-output-weights" not in flags

    assert main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(tmp_path / "m"), "--no-progress"]) == 0
    # Second conversion into the same --save refuses to overwrite.
    assert main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(tmp_path / "m"), "--no-progress"]) == 2
    args = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    args += ["--origin-hf-dir", str(hf_dir), "--no-progress"]
    assert main(args) == 0
    assert main(args) == 2  # exists, no --force
    assert main([*args, "--force"]) == 0
    assert main(["hf-to-mcore", "--hf-checkpoint", str(tmp_path / "nope"), "--save", str(tmp_path / "x")]) == 2
    assert main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(tmp_path / "y"), "--pp", "3"]) == 2


def test_hf_to_mcore_streams_one_tensor_at_a_time(tiny_hf_model, tmp_path, monkeypatch):
    """Chunks are built only when the DCP writer asks for them and freed after writing."""
    import gc
    import weakref

    from slime_convert import convert

    _, hf_dir = tiny_hf_model("qwen3_moe")
    alive: set[int] = set()
    peak = 0
    original = convert.to_mcore

    def tracking(*args, **kwargs):
        nonlocal peak
        # A chunk dropped by the writer is finalized at once (refcount); one held only by a reference cycle needs a
        # collection. A full collection costs ~1 s in this process (47 chunks: 59 of the test's 71 s), so it runs
        # only when the chunks still alive could raise the peak: the peak is the same as collecting every time.
        if len(alive) + 1 > peak:
            gc.collect()
        tensor = original(*args, **kwargs).clone()  # a fresh storage we can watch
        key = id(tensor)
        alive.add(key)
        weakref.finalize(tensor, alive.discard, key)
        peak = max(peak, len(alive))
        return tensor

    monkeypatch.setattr(convert, "to_mcore", tracking)
    convert.hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    # One chunk being written plus at most one more in flight; never the whole model (> 60 chunks here).
    assert peak <= 2


def test_a_failed_conversion_leaves_no_temporary_directory(tiny_hf_model, tmp_path, monkeypatch):
    from slime_convert import convert, torch_dist

    _, hf_dir = tiny_hf_model("qwen3")
    convert.hf_to_mcore(hf_dir, tmp_path / "m", progress=False)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(convert, "_write_hf", broken)
    with pytest.raises(OSError, match="disk full"):
        convert.mcore_to_hf(tmp_path / "m", tmp_path / "h", hf_dir, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no h.tmp left behind

    monkeypatch.setattr(torch_dist.dcp, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        convert.hf_to_mcore(hf_dir, tmp_path / "m2", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no m2 (staged whole), no m2.tmp left behind


def test_help_and_megatron_args_start_without_torch(tiny_hf_model):
    import subprocess
    import sys

    _, hf_dir = tiny_hf_model("qwen3")
    code = (
        "import sys\nfrom slime_convert.cli import main\n"
        f"assert main(['megatron-args', '--hf-checkpoint', {str(hf_dir)!r}]) == 0\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "False"
    out = subprocess.run([sys.executable, "-m", "slime_convert.cli", "--help"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0 and "mcore-to-hf" in out.stdout
    # The usage's shell line continuation was joined into one line with a run of spaces.
    assert "--output-dir /models/out \\\n        --origin-hf-dir /models/Qwen3-4B\n" in out.stdout


def test_untied_model_without_lm_head_is_an_error(tiny_hf_model, tmp_path):
    # Issue 17: used to warn and convert the embedding as the output layer (a different model).
    import shutil

    from safetensors.torch import save_file

    _, hf_dir = tiny_hf_model("qwen2")  # tie_word_embeddings=False
    broken = tmp_path / "no-head"
    shutil.copytree(hf_dir, broken)
    tensors = {k: v for k, v in _load_hf_dir(broken).items() if k != "lm_head.weight"}
    for f in broken.glob("*.safetensors*"):
        f.unlink()
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="tie_word_embeddings=false but the checkpoint has no 'lm_head.weight'"):
        hf_to_mcore(broken, tmp_path / "mcore", progress=False)
    assert not (tmp_path / "mcore" / "release").exists()


def test_the_originals_flags_are_refused_saying_where_their_information_comes_from(tiny_hf_model, tmp_path, capsys):
    """The original's launch lines (`convert_hf_to_torch_dist.py ${MODEL_ARGS[@]} ...`, `--model-name`) got only
    argparse's 'unrecognized arguments'."""
    _, hf_dir = tiny_hf_model("qwen3")
    model_args = ["--swiglu", "--num-layers", "2"]
    with pytest.raises(SystemExit) as e:
        main(["hf-to-mcore", *model_args, "--hf-checkpoint", str(hf_dir), "--save", str(tmp_path / "m")])
    err = capsys.readouterr().err.splitlines()[-1]
    assert e.value.code == 2 and err.startswith(
        "slime-convert: error: unrecognized arguments: --swiglu --num-layers 2;"
    )
    assert "read from --hf-checkpoint's config.json: drop them (`slime-convert megatron-args`" in err
    with pytest.raises(SystemExit):
        main(["mcore-to-hf", "--model-name", "qwen3", "--input-dir", "x", "--output-dir", str(tmp_path / "h"),
              "--origin-hf-dir", str(hf_dir)])  # fmt: skip
    assert "read from --origin-hf-dir's config.json (no --model-name)" in capsys.readouterr().err
    assert not (tmp_path / "m").exists() and not (tmp_path / "h").exists()


def test_a_conversion_prints_no_warning_about_torch_distributed(tiny_hf_model, tmp_path, recwarn):
    """Every hf-to-mcore printed DCP's 'torch.distributed is disabled ... assuming ... a single process' warning."""
    _, hf_dir = tiny_hf_model("qwen3")
    release = hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    mcore_to_hf(release, tmp_path / "h", hf_dir, progress=False)
    assert [str(w.message) for w in recwarn if "torch.distributed" in str(w.message)] == []
