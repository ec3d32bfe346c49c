"""`slime-convert hf-to-fp8`: a BF16 checkpoint becomes the blockwise-FP8 serving checkpoint SGLang loads."""

import json

import torch
from safetensors.torch import load_file, save_file

from slime_convert.cli import main
from slime_core.fp8 import dequantize_blockwise, quantize_blockwise


def _bf16_checkpoint(path):
    torch.manual_seed(0)
    path.mkdir()
    shard1 = {
        "model.embed_tokens.weight": torch.randn(16, 8).bfloat16(),
        "model.layers.0.input_layernorm.weight": torch.ones(8).bfloat16(),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(12, 8).bfloat16(),
    }
    shard2 = {
        "model.layers.0.mlp.down_proj.weight": torch.randn(8, 20).bfloat16(),
        "model.norm.weight": torch.ones(8).bfloat16(),
        "lm_head.weight": torch.randn(16, 8).bfloat16(),
    }
    save_file(shard1, str(path / "model-00001-of-00002.safetensors"))
    save_file(shard2, str(path / "model-00002-of-00002.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 8}))
    (path / "tokenizer.json").write_text("{}")
    return {**shard1, **shard2}


def test_hf_to_fp8_writes_fp8_weights_scales_and_the_quantization_config(tmp_path):
    original = _bf16_checkpoint(tmp_path / "bf16")
    out = tmp_path / "fp8"
    assert main(["hf-to-fp8", "--hf-checkpoint", str(tmp_path / "bf16"), "--save", str(out),
                 "--block-size", "8", "8", "--no-progress"]) == 0  # fmt: skip
    tensors = {**load_file(str(out / "model-00001-of-00002.safetensors")),
               **load_file(str(out / "model-00002-of-00002.safetensors"))}  # fmt: skip
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"):
        q, s = quantize_blockwise(original[f"{name}.weight"], (8, 8))
        assert tensors[f"{name}.weight"].dtype == torch.float8_e4m3fn
        assert torch.equal(tensors[f"{name}.weight"].view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(tensors[f"{name}.weight_scale_inv"], s)
        # 12×8 with 8×8 blocks: a full block and a partial one; 8×20: three column blocks.
        assert s.shape == {"model.layers.0.self_attn.q_proj": (2, 1), "model.layers.0.mlp.down_proj": (1, 3)}[name]
        back = dequantize_blockwise(q, s, (8, 8))
        assert (back - original[f"{name}.weight"].float()).abs().max() <= original[f"{name}.weight"].abs().max() / 16
    for name in ("model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "model.norm.weight",
                 "lm_head.weight"):  # fmt: skip
        assert torch.equal(tensors[name], original[name])
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["quantization_config"] == {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [8, 8],
        "modules_to_not_convert": ["lm_head", "model.embed_tokens"],
    }  # fmt: skip
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(tensors) and len(tensors) == 8
    assert (out / "tokenizer.json").read_text() == "{}"


def test_hf_to_fp8_refuses_a_quantized_input_and_an_existing_output(tmp_path, caplog):
    _bf16_checkpoint(tmp_path / "bf16")
    out = tmp_path / "fp8"
    assert main(["hf-to-fp8", "--hf-checkpoint", str(tmp_path / "bf16"), "--save", str(out), "--no-progress"]) == 0
    assert main(["hf-to-fp8", "--hf-checkpoint", str(tmp_path / "bf16"), "--save", str(out), "--no-progress"]) == 2
    assert "exists (pass -f/--force" in caplog.text
    assert main(["hf-to-fp8", "--hf-checkpoint", str(out), "--save", str(tmp_path / "again"), "--no-progress"]) == 2
    assert "already quantized ('fp8')" in caplog.text


def test_hf_to_fp8_reads_the_shards_the_index_names_not_a_stale_one(tmp_path, caplog):
    """Every *.safetensors was read: a left-over shard of an older save, last in sorted order, won the index."""
    original = _bf16_checkpoint(tmp_path / "bf16")
    src = tmp_path / "bf16"
    weight_map = {
        n: "model-00001-of-00002.safetensors" for n in load_file(str(src / "model-00001-of-00002.safetensors"))
    }
    weight_map |= {
        n: "model-00002-of-00002.safetensors" for n in load_file(str(src / "model-00002-of-00002.safetensors"))
    }
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    stale = {"model.norm.weight": torch.zeros(8).bfloat16()}  # an older save's norm
    save_file(stale, str(src / "model-00003-of-00003.safetensors"))
    out = tmp_path / "fp8"
    assert main(["hf-to-fp8", "--hf-checkpoint", str(src), "--save", str(out), "--block-size", "8", "8",
                 "--no-progress"]) == 0  # fmt: skip
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.norm.weight"] == "model-00002-of-00002.safetensors"
    assert torch.equal(
        load_file(str(out / index["model.norm.weight"]))["model.norm.weight"], original["model.norm.weight"]
    )
    assert not (out / "model-00003-of-00003.safetensors").exists()
    assert "1 safetensors files are not in the index and are not read: ['model-00003-of-00003.safetensors']" in (
        caplog.text
    )
    (src / "model-00002-of-00002.safetensors").unlink()
    assert main(["hf-to-fp8", "--hf-checkpoint", str(src), "--save", str(tmp_path / "x"), "--no-progress"]) == 2
    assert "names ['model-00002-of-00002.safetensors'], which do not exist" in caplog.text
