"""Checkpoint ↔ module names of vision-language models (`slime_core.hf_names`).

The expected names are the ones transformers 5 uses for Qwen2.5-VL: modules `model.language_model.*`,
`model.visual.*`, `lm_head.*`; `save_pretrained` (and the published checkpoints, which SGLang loads)
`model.*`, `visual.*`, `lm_head.*`. tests/slime-train-fsdp/test_vlm.py checks the table against a real
`save_pretrained`.
"""

import pytest

from slime_core.hf_names import is_vision_tower_param, to_checkpoint_name, to_module_name

# (checkpoint name, module name) pairs of a Qwen2.5-VL model.
QWEN2_5_VL = [
    ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight"),
    ("model.layers.3.self_attn.q_proj.bias", "model.language_model.layers.3.self_attn.q_proj.bias"),
    ("model.norm.weight", "model.language_model.norm.weight"),
    ("visual.patch_embed.proj.weight", "model.visual.patch_embed.proj.weight"),
    ("visual.blocks.0.attn.qkv.weight", "model.visual.blocks.0.attn.qkv.weight"),
    ("visual.merger.mlp.2.bias", "model.visual.merger.mlp.2.bias"),
    ("lm_head.weight", "lm_head.weight"),
]


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize(("checkpoint", "module"), QWEN2_5_VL)
def test_qwen2_vl_families_rename_both_ways(model_type, checkpoint, module):
    assert to_module_name(checkpoint, model_type) == module
    assert to_checkpoint_name(module, model_type) == checkpoint
    assert to_module_name(module, model_type) == module  # module names pass unchanged (idempotent)


@pytest.mark.parametrize("model_type", ["qwen3_vl", "qwen3", "llama", None])
def test_other_models_keep_their_names(model_type):
    for name in ("model.language_model.layers.0.mlp.up_proj.weight", "model.visual.blocks.1.mlp.linear_fc1.weight",
                 "model.layers.0.self_attn.k_norm.weight", "lm_head.weight"):  # fmt: skip
        assert to_module_name(name, model_type) == name
        assert to_checkpoint_name(name, model_type) == name


def test_vision_tower_params_are_the_visual_module():
    assert is_vision_tower_param("model.visual.blocks.0.attn.qkv.weight")
    assert is_vision_tower_param("model.visual.merger.linear_fc2.bias")
    assert not is_vision_tower_param("model.language_model.embed_tokens.weight")
    assert not is_vision_tower_param("visual.blocks.0.attn.qkv.weight")  # a checkpoint name, not a module name
    assert not is_vision_tower_param("lm_head.weight")
