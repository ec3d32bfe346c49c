"""`slime-convert` against checkpoints that do not fit their config or dtype: refused or named, never dropped."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from slime_convert import hf_to_mcore, mcore_to_hf
from slime_convert.cli import main
from slime_convert.hf_io import HFCheckpointReader

pytest.importorskip("transformers")


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


def test_mixed_dtypes_name_the_tensor_and_the_flag_that_casts(tiny_hf_model, tmp_path, caplog):
    from safetensors.torch import save_file

    _, hf_dir = tiny_hf_model("qwen3")
    mixed = shutil.copytree(hf_dir, tmp_path / "mixed")
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
    # An absent --save is built whole beside it and renamed in once: nothing of it is left (no release, no .tmp).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed"]
    assert main([*argv, "--dtype", "bf16"]) == 0


def test_the_exported_config_states_the_written_dtype_and_no_quantization(first_shard, tiny_hf_model, tmp_path):
    """The origin's config.json was copied as is: fp32 weights under "bfloat16" (from_pretrained(dtype="auto") then
    loads them in bf16) and an FP8 origin's quantization_config over unquantized weights."""
    _, hf_dir = tiny_hf_model("qwen3")  # fp32 weights
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    origin = shutil.copytree(hf_dir, tmp_path / "fp8-origin")
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
    assert {t.dtype for t in load_file(str(first_shard(out))).values()} == {torch.float16}


def _edit_config(hf_dir, **fields):
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, **fields}))


def test_hf_tensors_the_config_does_not_describe_are_refused_not_dropped(tiny_hf_model, tmp_path, caplog):
    """num_hidden_layers=1 over a 2-layer checkpoint wrote a 1-layer torch_dist (exit 0): layer 1 was dropped."""
    _, hf_dir = tiny_hf_model("qwen3")
    fewer = shutil.copytree(hf_dir, tmp_path / "fewer")
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
    model = shutil.copytree(hf_dir, tmp_path / "with-head")
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
    origin = shutil.copytree(hf_dir, tmp_path / "no-bias")
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
    model = shutil.copytree(hf_dir, tmp_path / "big")
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


def test_nan_and_inf_weights_are_carried_exactly_and_named(tiny_hf_model, tmp_path, caplog):
    """Non-finite weights went through both directions without a word (a run from them trains on NaN)."""
    from safetensors.torch import save_file

    _, hf_dir = tiny_hf_model("qwen3")
    model = shutil.copytree(hf_dir, tmp_path / "nan")
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
