"""Blockwise FP8 quantizer (`slime_core.fp8`): hand-computed blocks, an independent loop reference, the name rules."""

import json

import pytest
import torch

from slime_core.fp8 import (
    FP8_DTYPE,
    Fp8Config,
    dequantize_blockwise,
    dequantize_named,
    quantize_blockwise,
    quantize_buckets,
    read_fp8_config,
)


def _loop_reference(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Block by block with Python loops: amax → scale = amax/448 → e4m3 of w/scale (the scheme, written again)."""
    bm, bn = block
    m, n = w.shape
    mb, nb = -(-m // bm), -(-n // bn)
    q = torch.empty(m, n, dtype=FP8_DTYPE)
    s = torch.empty(mb, nb)
    for i in range(mb):
        for j in range(nb):
            tile = w[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn].float()
            scale = max(tile.abs().max().item(), 1e-12) / 448.0
            s[i, j] = scale
            rows, cols = slice(i * bm, (i + 1) * bm), slice(j * bn, (j + 1) * bn)
            q[rows, cols] = (tile / torch.tensor(scale)).clamp(-448, 448).to(FP8_DTYPE)
    return q, s


def test_a_block_whose_amax_is_448_keeps_exact_values_with_scale_one():
    w = torch.tensor([[448.0, 1.0], [-224.0, 0.5]])
    q, s = quantize_blockwise(w, (2, 2))
    assert q.dtype == FP8_DTYPE and s.dtype == torch.float32
    assert s.tolist() == [[1.0]]
    assert q.float().tolist() == [[448.0, 1.0], [-224.0, 0.5]]  # all four are e4m3 values


def test_each_block_gets_its_own_scale_and_partial_blocks_are_padded():
    # 3×5 with 2×2 blocks: a 2×3 grid whose last row and column are partial.
    w = torch.arange(15, dtype=torch.float32).reshape(3, 5) - 7.0
    q, s = quantize_blockwise(w, (2, 2))
    assert q.shape == (3, 5) and s.shape == (2, 3)
    # Block (0,0) holds -7,-6,-2,-1 → amax 7; block (1,2) holds only the bottom-right value 7.
    assert s[0, 0].item() == pytest.approx(7.0 / 448.0, rel=1e-7)
    assert s[1, 2].item() == pytest.approx(7.0 / 448.0, rel=1e-7)
    assert s[0, 1].item() == pytest.approx(5.0 / 448.0, rel=1e-7)  # -5,-4,0,1
    ref_q, ref_s = _loop_reference(w, (2, 2))
    assert torch.equal(s, ref_s)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


def test_random_weights_match_the_loop_reference_bit_for_bit():
    torch.manual_seed(0)
    w = (torch.randn(300, 200) * 0.05).to(torch.bfloat16)
    q, s = quantize_blockwise(w, (128, 128))
    ref_q, ref_s = _loop_reference(w, (128, 128))
    assert s.shape == (3, 2)
    assert torch.equal(s, ref_s)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


def test_round_trip_error_is_within_e4m3_precision():
    torch.manual_seed(1)
    w = torch.randn(257, 129) * 0.02
    q, s = quantize_blockwise(w, (128, 128))
    back = dequantize_blockwise(q, s, (128, 128))
    scale = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:257, :129]
    # 3 mantissa bits: half an ulp is 2^-4 of the value in the normal range; subnormals are spaced 2^-9 · scale.
    bound = torch.maximum(w.abs() * 2**-4, scale * 2**-10) * (1 + 1e-6)
    assert ((back - w).abs() <= bound).all()
    assert back.dtype == torch.float32


def test_an_all_zero_block_gives_zeros_not_nan():
    q, s = quantize_blockwise(torch.zeros(4, 4), (2, 2))
    assert not torch.isnan(q.float()).any() and (q.float() == 0).all()
    assert dequantize_blockwise(q, s, (2, 2)).abs().sum().item() == 0.0


def test_dequantize_checks_the_scale_grid():
    q, s = quantize_blockwise(torch.ones(4, 4), (2, 2))
    with pytest.raises(ValueError, match=r"needs scales \(2, 2\)"):
        dequantize_blockwise(q, s[:1], (2, 2))


def test_stacked_experts_keep_their_leading_dim():
    torch.manual_seed(2)
    w = torch.randn(3, 4, 6)
    q, s = quantize_blockwise(w, (2, 4))
    assert q.shape == (3, 4, 6) and s.shape == (3, 2, 2)
    for e in range(3):
        ref_q, ref_s = _loop_reference(w[e], (2, 4))
        assert torch.equal(s[e], ref_s) and torch.equal(q[e].view(torch.uint8), ref_q.view(torch.uint8))


def _named():
    return [
        ("model.embed_tokens.weight", torch.randn(10, 4)),
        ("model.layers.0.input_layernorm.weight", torch.ones(4)),
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(4, 4)),
        ("model.layers.0.self_attn.q_proj.bias", torch.randn(4)),
        ("model.layers.0.self_attn.q_norm.weight", torch.ones(2)),
        ("model.layers.0.mlp.gate.weight", torch.randn(2, 4)),  # MoE router
        ("model.layers.0.mlp.shared_expert_gate.weight", torch.randn(1, 4)),  # Qwen2-MoE: a plain Linear in SGLang
        ("model.layers.0.mlp.gate_proj.weight", torch.randn(8, 4)),
        ("model.layers.1.mlp.experts.3.down_proj.weight", torch.randn(4, 8)),
        ("model.norm.weight", torch.ones(4)),
        ("lm_head.weight", torch.randn(10, 4)),
    ]


def test_only_decoder_layer_linears_are_quantized_and_each_scale_follows_its_weight():
    cfg = Fp8Config(weight_block_size=(2, 2))
    named = _named()
    [bucket] = list(quantize_buckets([named], cfg))
    names = [n for n, _ in bucket]
    quantized = ["q_proj", "gate_proj", "experts.3.down_proj"]
    assert sum(n.endswith(".weight_scale_inv") for n in names) == 3
    for part in quantized:
        i = next(i for i, n in enumerate(names) if part in n and n.endswith(".weight"))
        assert bucket[i][1].dtype == FP8_DTYPE
        assert names[i + 1] == names[i].removesuffix(".weight") + ".weight_scale_inv"
    kept = dict(bucket)
    for name, tensor in named:
        if not any(p in name for p in quantized) or name.endswith(".bias"):
            assert kept[name] is tensor  # passed through untouched


def test_modules_to_not_convert_are_kept_with_or_without_the_model_prefix():
    cfg = Fp8Config(weight_block_size=(2, 2), modules_to_not_convert=("layers.0.self_attn.q_proj",))
    [bucket] = list(quantize_buckets([_named()], cfg))
    assert dict(bucket)["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float32


def test_dequantize_named_joins_pairs_in_either_order_and_refuses_a_lone_half():
    w = torch.randn(4, 6)
    q, s = quantize_blockwise(w, (2, 2))
    expected = dequantize_blockwise(q, s, (2, 2))
    name = "model.layers.0.mlp.up_proj"
    for stream in ([(f"{name}.weight", q), (f"{name}.weight_scale_inv", s)],
                   [(f"{name}.weight_scale_inv", s), ("model.norm.weight", w[0]), (f"{name}.weight", q)]):  # fmt: skip
        out = dict(dequantize_named(stream, (2, 2)))
        assert torch.equal(out[f"{name}.weight"], expected)
        assert not any(k.endswith("_scale_inv") for k in out)
    with pytest.raises(ValueError, match=r"up_proj.weight \(no scale\)"):
        list(dequantize_named([(f"{name}.weight", q)], (2, 2)))
    with pytest.raises(ValueError, match="served unquantized"):
        list(dequantize_named([(f"{name}.weight", q)], None))


def test_read_fp8_config(tmp_path):
    assert read_fp8_config(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert read_fp8_config(tmp_path) is None
    qc = Fp8Config(weight_block_size=(128, 128), modules_to_not_convert=("lm_head",)).to_quantization_config()
    assert qc == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                  "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    assert read_fp8_config(tmp_path) == Fp8Config(weight_block_size=(128, 128), modules_to_not_convert=("lm_head",))
    per_tensor = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": per_tensor}))
    with pytest.raises(ValueError, match="config.json: weight_block_size=None"):
        read_fp8_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "compressed-tensors"}}))
    with pytest.raises(ValueError, match="quant_method='compressed-tensors'"):
        read_fp8_config(tmp_path)


def test_linear_attention_gates_and_conv_stay_unquantized_as_sglang_builds_them():
    # Qwen3-Next / Qwen3.5 gated delta-net: SGLang builds in_proj_ba (in_proj_b + in_proj_a) and conv1d with
    # quant_config=None, and the original quantizes only in_proj_qkv(z), in_proj_z and out_proj of linear_attn; an
    # FP8 weight + scale pushed for them is loaded into a BF16 parameter.
    cfg = Fp8Config(weight_block_size=(2, 2))
    prefix = "model.layers.0.linear_attn."
    named = [
        (prefix + "in_proj_qkv.weight", torch.randn(8, 4)),
        (prefix + "in_proj_qkvz.weight", torch.randn(8, 4)),
        (prefix + "in_proj_z.weight", torch.randn(4, 4)),
        (prefix + "in_proj_b.weight", torch.randn(2, 4)),
        (prefix + "in_proj_a.weight", torch.randn(2, 4)),
        (prefix + "in_proj_ba.weight", torch.randn(4, 4)),
        (prefix + "conv1d.weight", torch.randn(8, 1, 4)),  # [C, 1, kernel]
        (prefix + "out_proj.weight", torch.randn(4, 4)),
    ]
    [bucket] = list(quantize_buckets([named], cfg))
    out = dict(bucket)
    fp8 = sorted(n.removeprefix(prefix) for n, t in out.items() if t.dtype == FP8_DTYPE)
    assert fp8 == ["in_proj_qkv.weight", "in_proj_qkvz.weight", "in_proj_z.weight", "out_proj.weight"]
    for part in ("in_proj_b", "in_proj_a", "in_proj_ba", "conv1d"):
        assert out[prefix + part + ".weight"] is dict(named)[prefix + part + ".weight"]
        assert prefix + part + ".weight_scale_inv" not in out


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_weight_is_refused_naming_it_not_pushed_as_a_nan_block(bad):
    # One inf in a block made its scale inf: q = inf/inf = NaN and 0 elsewhere, and q · scale = NaN for the whole
    # block (the engine served 4 NaN weights for 1 bad one here; 16,384 at the default 128 × 128).
    cfg = Fp8Config(weight_block_size=(2, 2))
    w = torch.ones(4, 4)
    w[1, 0] = bad
    named = [("model.layers.0.self_attn.q_proj.weight", torch.ones(4, 4)), ("model.layers.0.mlp.up_proj.weight", w)]
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight hold\(s\) inf or NaN"):
        list(quantize_buckets([named], cfg))
    from slime_core.fp8 import quantize_named

    with pytest.raises(ValueError, match=r"up_proj\.weight hold\(s\) inf or NaN"):
        list(quantize_named(named, cfg))


def test_modules_to_not_convert_match_on_module_path_boundaries_as_sglang():
    # SGLang keeps a layer unquantized when a `modules_to_not_convert` entry is its path, a parent module of it, or a
    # dotted run of its segments (a template without the layer index, as Qwen3.6-FP8's configs list them), never a
    # mere substring (`self_attn.q` is not `self_attn.q_proj`). Only exact names were kept here, so the trainer
    # pushed e4m3 weights and scales for layers the engine holds in BF16.
    cfg = Fp8Config(
        weight_block_size=(2, 2),
        modules_to_not_convert=("mlp.gate_proj", "model.layers.1.mlp", "self_attn.q", "layers.0.self_attn.q_pro"),
    )
    [bucket] = list(quantize_buckets([_named()], cfg))
    pushed = dict(bucket)
    assert pushed["model.layers.0.mlp.gate_proj.weight"].dtype == torch.float32  # template: every layer's gate_proj
    assert pushed["model.layers.1.mlp.experts.3.down_proj.weight"].dtype == torch.float32  # under a parent module
    assert pushed["model.layers.0.self_attn.q_proj.weight"].dtype == FP8_DTYPE  # partial segments match nothing
    assert sorted(n for n in pushed if n.endswith(".weight_scale_inv")) == [
        "model.layers.0.self_attn.q_proj.weight_scale_inv"
    ]


def test_ignored_layers_wins_over_modules_to_not_convert_as_in_sglangs_fp8_config():
    # SGLang's Fp8Config.from_config reads the first of ["ignored_layers", "modules_to_not_convert"] present; the
    # trainer read modules_to_not_convert first, so a config carrying both pushed another set of layers unquantized
    # than the engine holds unquantized.
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [2, 2],
          "ignored_layers": ["model.layers.0.mlp.gate_proj"], "modules_to_not_convert": ["lm_head"]}  # fmt: skip
    assert Fp8Config.from_quantization_config(qc).modules_to_not_convert == ("model.layers.0.mlp.gate_proj",)
    qc["ignored_layers"] = []  # present, even empty: SGLang takes it
    assert Fp8Config.from_quantization_config(qc).modules_to_not_convert == ()
    del qc["ignored_layers"]
    assert Fp8Config.from_quantization_config(qc).modules_to_not_convert == ("lm_head",)
