import pytest
import torch

from slime_convert.mapping import expand_mappings, mcore_tensor_from_hf, mcore_to_hf, resolve_mcore_name
from slime_convert.model_args import ModelArgs

BASE = dict(
    hidden_size=8, intermediate_size=12, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=10, max_position_embeddings=32,
)  # fmt: skip


def _args(model_type, **kw):
    return ModelArgs.from_hf_config({"model_type": model_type, **BASE, **kw})


def test_expand_covers_every_hf_name_once():
    args = _args("qwen2", tie_word_embeddings=False)
    hf = [n for mp, layer, expert in expand_mappings(args) for n in mp.hf_names(layer, expert)]
    assert len(hf) == len(set(hf))
    assert hf[0] == "model.embed_tokens.weight" and hf[-2:] == ["model.norm.weight", "lm_head.weight"]
    per_layer = [n for n in hf if n.startswith("model.layers.0.")]
    # qwen2: input norm, q/k/v weights, q/k/v biases, o_proj, post norm, gate, up, down = 12
    assert len(per_layer) == 12
    tied = _args("qwen3", tie_word_embeddings=True)
    assert "lm_head.weight" not in [n for mp, la, e in expand_mappings(tied) for n in mp.hf_names(la, e)]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("module.module.decoder.layers.1.input_layernorm.weight", ["model.layers.1.input_layernorm.weight"]),
        ("decoder.layers.0.pre_mlp_layernorm.weight", ["model.layers.0.post_attention_layernorm.weight"]),
        ("decoder.layers.1.mlp.linear_fc1.layer_norm_weight", ["model.layers.1.post_attention_layernorm.weight"]),
        ("decoder.layers.0.self_attention.q_layernorm.weight", ["model.layers.0.self_attn.q_norm.weight"]),
        ("decoder.final_layernorm.weight", ["model.norm.weight"]),
    ],
)
def test_name_aliases(name, expected):
    args = _args("qwen3", head_dim=2)
    out = mcore_to_hf(name, torch.zeros(2), args)
    assert [n for n, _ in out] == expected


def test_weight_sync_splits_and_unpads():
    args = _args("llama", tie_word_embeddings=False)
    emb = torch.arange(128 * 8, dtype=torch.float32).reshape(128, 8)  # padded to 128 rows
    ((name, t),) = mcore_to_hf("module.embedding.word_embeddings.weight", emb, args)
    assert name == "model.embed_tokens.weight" and torch.equal(t, emb[:10])
    fc1 = torch.arange(24 * 8, dtype=torch.float32).reshape(24, 8)
    (gname, gate), (uname, up) = mcore_to_hf("decoder.layers.1.mlp.linear_fc1.weight", fc1, args)
    assert (gname, uname) == ("model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight")
    assert torch.equal(gate, fc1[:12]) and torch.equal(up, fc1[12:])
    with pytest.raises(KeyError, match="no HF mapping"):
        mcore_to_hf("decoder.layers.0.mlp.linear_fc3.weight", fc1, args)


def test_moe_expert_names_local_and_grouped():
    args = _args("qwen3_moe", head_dim=2, num_experts=3, moe_intermediate_size=4, num_experts_per_tok=2)
    local = resolve_mcore_name("decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight", args)
    grouped = resolve_mcore_name("decoder.layers.1.mlp.experts.linear_fc2.weight2", args)
    assert local == grouped and local[1:] == (1, 2)
    out = mcore_to_hf("decoder.layers.0.mlp.router.weight", torch.zeros(3, 8), args)
    assert out[0][0] == "model.layers.0.mlp.gate.weight"


def test_direct_hf_load_builds_fused_tensor():
    args = _args("qwen2")
    hf = {
        "model.layers.0.self_attn.q_proj.bias": torch.tensor([0.0, 1, 2, 3, 4, 5, 6, 7]),  # H=4, d=2
        "model.layers.0.self_attn.k_proj.bias": torch.tensor([10.0, 11, 12, 13]),
        "model.layers.0.self_attn.v_proj.bias": torch.tensor([20.0, 21, 22, 23]),
    }
    fused = mcore_tensor_from_hf("decoder.layers.0.self_attention.linear_qkv.bias", hf.__getitem__, args)
    # group 0: q0 q1 (0..3), k0 (10,11), v0 (20,21); group 1: q2 q3 (4..7), k1, v1
    assert fused.tolist() == [0, 1, 2, 3, 10, 11, 20, 21, 4, 5, 6, 7, 12, 13, 22, 23]
    emb = mcore_tensor_from_hf(
        "embedding.word_embeddings.weight", lambda n: torch.ones(10, 8), args, tp=2
    )  # padded to 256 rows
    assert emb.shape == (256, 8) and emb[10:].abs().sum() == 0
