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
        "model.layers.0.self_attn.o_proj.weight": torch.randn(12, 8).bfloat16(),
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
    for name in ("model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj"):
        q, s = quantize_blockwise(original[f"{name}.weight"], (8, 8))
        assert tensors[f"{name}.weight"].dtype == torch.float8_e4m3fn
        assert torch.equal(tensors[f"{name}.weight"].view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(tensors[f"{name}.weight_scale_inv"], s)
        # 12×8 with 8×8 blocks: a full block and a partial one; 8×20: three column blocks.
        assert s.shape == {"model.layers.0.self_attn.o_proj": (2, 1), "model.layers.0.mlp.down_proj": (1, 3)}[name]
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


def _qwen3_tiny_layer(path):
    """One decoder layer with qwen3-tiny's shapes (hidden 16, 2 heads and 1 KV head of 8, intermediate 64)."""
    path.mkdir()
    shapes = {"self_attn.q_proj": (16, 16), "self_attn.k_proj": (8, 16), "self_attn.v_proj": (8, 16),
              "self_attn.o_proj": (16, 16), "mlp.gate_proj": (64, 16), "mlp.up_proj": (64, 16),
              "mlp.down_proj": (16, 64)}  # fmt: skip
    tensors = {f"model.layers.0.{m}.weight": torch.randn(*s).bfloat16() for m, s in shapes.items()}
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 16}))
    return path


def test_hf_to_fp8_refuses_blocks_sglang_cannot_serve_before_writing(tmp_path, caplog):
    # Reproducer: qwen3-tiny with the default 128 x 128 blocks was written, then refused by the run with a message
    # about the weight check (also with --no-check-weight-sync); SGLang cannot load it at all: it fuses q/k/v_proj
    # and gate/up_proj, and each part's rows must be a multiple of the block's.
    src = _qwen3_tiny_layer(tmp_path / "bf16")
    out = tmp_path / "fp8"
    assert main(["hf-to-fp8", "--hf-checkpoint", str(src), "--save", str(out), "--no-progress"]) == 2
    assert (
        f"--hf-checkpoint {src}: 5 weight(s) cannot be served in 128x128 FP8 blocks (--block-size 128 128): SGLang "
        "fuses q/k/v_proj and gate/up_proj, and each part's row count must be a multiple of the block's 128 rows "
        "(model.layers.0.mlp.gate_proj.weight [64, 16], model.layers.0.mlp.up_proj.weight [64, 16], "
        "model.layers.0.self_attn.k_proj.weight [8, 16] and 2 more); nothing was written. Pass a --block-size that "
        "divides them, e.g. --block-size 8 8"
    ) in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bf16"]  # no fp8, no fp8.tmp
    assert main(["hf-to-fp8", "--hf-checkpoint", str(src), "--save", str(out), "--block-size", "8", "8",
                 "--no-progress"]) == 0  # fmt: skip
    scales = load_file(str(out / "model.safetensors"))
    assert scales["model.layers.0.self_attn.k_proj.weight_scale_inv"].shape == (1, 2)  # 8 x 16 in 8 x 8 blocks


def test_hf_to_fp8_keeps_a_checkpoint_sglang_serves_and_warns_of_the_weight_check(tmp_path, caplog):
    # Fused parts whose rows fit the block, columns that do not (16 of 32): SGLang serves it, only the run's weight
    # check cannot dequantize it as SGLang's checker does, so it is written and the warning says what the run needs.
    src = _qwen3_tiny_layer(tmp_path / "bf16")
    out = tmp_path / "fp8"
    argv = ["hf-to-fp8", "--hf-checkpoint", str(src), "--save", str(out), "--block-size", "8", "32", "--no-progress"]
    assert main(argv) == 0
    assert load_file(str(out / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"].dtype == torch.float8_e4m3fn
    assert (
        "6 weight(s) have a column count that is not a multiple of the 32-column block "
        "(model.layers.0.mlp.gate_proj.weight [64, 16], model.layers.0.mlp.up_proj.weight [64, 16], "
        "model.layers.0.self_attn.k_proj.weight [8, 16] and 3 more): SGLang serves them"
    ) in caplog.text
    assert "such a run needs --no-check-weight-sync, or convert with --block-size 8 8" in caplog.text
