"""`load_hf_weights_into` checks every tensor's shape before loading and names the flag and the config fields.

Before: a `--ref-load` of another width failed inside torch's `set_model_state_dict` with a size error naming
neither the flag nor the config; a shallower one said "checkpoint lacks N parameters" without the flag.
"""

import pytest
import torch
import torch.distributed as dist

from slime_train_fsdp.model_loading import load_hf_weights_into

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, tie_word_embeddings=True)  # fmt: skip


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model(**changes):
    config = transformers.Qwen3Config(**{**TINY, **changes, "layer_types": None})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def test_a_narrower_ref_load_is_refused_before_any_tensor_is_loaded(one_rank, tmp_path):
    _model(intermediate_size=20).save_pretrained(tmp_path / "narrow")
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError) as info:
        load_hf_weights_into(model, tmp_path / "narrow", flag="--ref-load")
    message = str(info.value)
    assert message.startswith(
        f"--ref-load {tmp_path / 'narrow'}: model.layers.0.mlp.gate_proj.weight has shape [20, 16], expected [24, 16]"
    ), message
    assert "(and 3 more)" in message  # up and down of layer 0, gate/up/down of layer 1
    assert "num_hidden_layers=2, hidden_size=16" in message and "intermediate_size=24" in message
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_shallower_ref_load_names_the_flag(one_rank, tmp_path):
    _model(num_hidden_layers=1).save_pretrained(tmp_path / "one")
    with pytest.raises(ValueError, match=r"^--ref-load .*/one: checkpoint lacks 11 parameters.*num_hidden_layers=2"):
        load_hf_weights_into(_model(), tmp_path / "one", flag="--ref-load")


def test_the_same_architecture_loads(one_rank, tmp_path):
    source = _model(vocab_size=64)
    with torch.no_grad():
        source.model.norm.weight.fill_(3.0)
    source.save_pretrained(tmp_path / "same")
    model = _model()
    load_hf_weights_into(model, tmp_path / "same")
    assert torch.equal(model.model.norm.weight, torch.full((16,), 3.0))
