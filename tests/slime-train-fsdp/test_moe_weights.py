"""Per-expert checkpoint matrices <-> transformers' fused MoE expert parameters (`slime_core.moe_experts`), which the
FSDP backend uses to load and export MoE checkpoints and the reference engine to take pushed expert matrices."""

import torch
from safetensors.torch import load_file

from slime_core.moe_experts import expert_slice, fuse_experts, split_experts


def _tiny_moe(tmp_path):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                               moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2,
                                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                               head_dim=8))  # fmt: skip
    model.save_pretrained(tmp_path)
    return model, load_file(str(tmp_path / "model.safetensors"))


def test_fuse_and_split_invert_transformers_layout(tmp_path):
    model, checkpoint = _tiny_moe(tmp_path)
    state = model.state_dict()
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in checkpoint  # the checkpoint is per expert
    fused = fuse_experts(checkpoint, set(state))
    assert set(fused) == set(state) - {"lm_head.weight"} | ({"lm_head.weight"} & set(checkpoint))
    for name, tensor in fused.items():
        assert torch.equal(tensor, state[name]), name  # what from_pretrained built
    split = dict(kv for name, t in fused.items() for kv in split_experts(name, t))
    assert split.keys() == checkpoint.keys()
    assert all(torch.equal(split[k], checkpoint[k]) for k in checkpoint)
    # A model without fused parameters keeps the checkpoint as it is.
    assert fuse_experts(checkpoint, set(checkpoint)).keys() == checkpoint.keys()


def test_expert_slice_names_the_rows():
    names = {"m.layers.1.mlp.experts.gate_up_proj", "m.layers.1.mlp.experts.down_proj"}
    assert expert_slice("m.layers.1.mlp.experts.3.up_proj.weight", names) == (
        "m.layers.1.mlp.experts.gate_up_proj",
        3,
        1,
    )
    assert expert_slice("m.layers.1.mlp.experts.2.down_proj.weight", names) == (
        "m.layers.1.mlp.experts.down_proj",
        2,
        None,
    )
    assert expert_slice("m.layers.1.mlp.gate.weight", names) is None
    assert expert_slice("m.layers.0.mlp.experts.3.up_proj.weight", names) is None  # no fused parameter there
