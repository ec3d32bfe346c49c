"""Qwen3-VL-MoE's published checkpoints store fused experts transposed against transformers' module layout.

`Qwen/Qwen3-VL-30B-A3B-*` hold `mlp.experts.gate_up_proj` as `[E, H, 2I]` and `mlp.experts.down_proj` as `[E, I, H]`;
transformers (>= 5) transposes both on load (its `qwen3_vl_moe` conversion mapping) into `[E, 2I, H]` / `[E, H, I]`.
The FSDP trainer reads the safetensors itself: it refused such a checkpoint with a shape error that read as a wrong
checkpoint ("has shape [4, 64, 32], expected [4, 32, 64]"). It now says which layout it is and that it is not
implemented, naming the flag and path (loading, exporting and pushing it in SGLang's layout is not written yet).
"""

import pytest
import torch
from transformers import AutoModelForImageTextToText
from transformers.models.qwen3_vl_moe import Qwen3VLMoeConfig

from slime_train_fsdp.model_loading import _check_shapes

H, INTER, E = (
    64,
    16,
    4,
)  # hidden, expert intermediate, experts: 2 * INTER != H, so a transposed tensor has another shape


@pytest.fixture(scope="module")
def model():
    text = dict(hidden_size=H, intermediate_size=128, moe_intermediate_size=INTER, num_experts=E, num_experts_per_tok=2,
                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=512,
                rope_scaling={"rope_type": "default", "mrope_section": [8, 4, 4]})  # fmt: skip
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=H,
                  deepstack_visual_indexes=[0])  # fmt: skip
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(Qwen3VLMoeConfig(text_config=text, vision_config=vision))


def _state(model, transpose: bool) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.state_dict().items():
        t = torch.empty(p.shape, device="meta")
        out[name] = (
            t.transpose(1, 2) if transpose and name.endswith(("gate_up_proj", "down_proj")) and p.ndim == 3 else t
        )
    return out


def test_the_published_expert_layout_is_refused_as_a_layout_not_a_wrong_checkpoint(model):
    gate_up = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    assert tuple(model.state_dict()[gate_up].shape) == (E, 2 * INTER, H)
    with pytest.raises(ValueError) as err:
        _check_shapes(model, _state(model, transpose=True), "--hf-checkpoint", "/models/Qwen3-VL-30B-A3B")
    message = str(err.value)
    assert message.startswith("--hf-checkpoint /models/Qwen3-VL-30B-A3B: model.language_model.layers.0.mlp.experts.")
    assert "stored as fused experts transposed against transformers' layout" in message
    assert "model_type 'qwen3_vl_moe'" in message and "not implement" in message


def test_transformers_own_layout_still_loads(model):
    _check_shapes(model, _state(model, transpose=False), "--hf-checkpoint", "/m")  # no error
