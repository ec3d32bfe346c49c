"""Checkpoints of another size than `--hf-checkpoint` fail before start-up, each differing field naming both flags."""

import json
import pathlib
import re

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from slime_app.checkpoint_shapes import config_mismatches, expected_fields, tensor_fields
from slime_app.checkpoints import check_checkpoints
from slime_core.config import parse_args

# dcp.save without a process group (one writer) says so in a warning.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf-configs"
QWEN3_4B = json.loads((FIXTURES / "Qwen3-4B.json").read_text())
# A 2-layer Qwen3: hidden 16, 2 query heads and 1 key/value head of 8 dims, MLP 24, vocabulary 256.
TINY = {**QWEN3_4B, "num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 8, "intermediate_size": 24, "vocab_size": 256}  # fmt: skip


def _hf_dir(path: pathlib.Path, config: dict) -> pathlib.Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({}, str(path / "model.safetensors"))  # a header and no tensor: nothing to check against config.json
    return path


def _megatron_tiny(path: pathlib.Path) -> pathlib.Path:
    """A torch_dist save dir of TINY in Megatron's names: layers stacked on the leading axis."""
    state = {
        "embedding.word_embeddings.weight": torch.zeros(256, 16),
        "decoder.layers.self_attention.linear_qkv.weight": torch.zeros(2, (2 + 2 * 1) * 8, 16),  # [L, (H+2G)d, h]
        "decoder.layers.mlp.linear_fc1.weight": torch.zeros(2, 2 * 24, 16),  # gate and up
    }
    dcp.save(state, checkpoint_id=str(path / "iter_0000010"), no_dist=True)
    (path / "latest_checkpointed_iteration.txt").write_text("10")
    return path


def _cfg(model, *extra):
    return parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--hf-checkpoint", str(model), *extra])


@pytest.fixture
def big(tmp_path):
    return _hf_dir(tmp_path / "Qwen3-4B", QWEN3_4B)


def test_expected_fields_by_hand():
    assert expected_fields(QWEN3_4B) == {
        "num_layers": 36, "hidden_size": 2560, "qkv_rows": (32 + 2 * 8) * 128, "head_dim": 128,
        "num_attention_heads": 32, "num_key_value_heads": 8, "ffn_hidden_size": 9728, "vocab_rows": 151936,
        "num_experts": 0,
    }  # fmt: skip
    moe = json.loads((FIXTURES / "Qwen3-30B-A3B.json").read_text())
    fields = expected_fields(moe)
    assert (fields["qkv_rows"], fields["ffn_hidden_size"], fields["num_experts"]) == ((32 + 2 * 4) * 128, None, 128)


def test_tensor_fields_from_megatron_and_hf_names():
    megatron = {"embedding.word_embeddings.weight": (384, 16), "decoder.layers.self_attention.linear_qkv.weight":
                (2, 32, 16), "decoder.layers.mlp.linear_fc1.weight": (2, 48, 16)}  # fmt: skip
    assert tensor_fields(megatron) == {"num_layers": 2, "hidden_size": 16, "qkv_rows": 32, "head_dim": None,
                                       "num_attention_heads": None, "num_key_value_heads": None,
                                       "ffn_hidden_size": 24, "vocab_rows": 384, "num_experts": 0}  # fmt: skip
    hf = {f"model.model.layers.{i}.{name}": shape for i in range(3) for name, shape in (
        ("self_attn.q_proj.weight", (16, 16)), ("self_attn.k_proj.weight", (8, 16)),
        ("self_attn.v_proj.weight", (8, 16)), ("mlp.gate_proj.weight", (24, 16)))}  # fmt: skip
    hf["model.model.embed_tokens.weight"] = (256, 16)
    hf["optim.state.model.model.layers.7.self_attn.q_proj.weight.exp_avg"] = (16, 16)  # optimizer state: no layer
    hf["model.visual.blocks.0.layers.9.attn.weight"] = (4, 4)  # an image encoder's layers are not the LM's
    assert tensor_fields(hf) == {"num_layers": 3, "hidden_size": 16, "qkv_rows": 32, "head_dim": None,
                                 "num_attention_heads": None, "num_key_value_heads": None, "ffn_hidden_size": 24,
                                 "vocab_rows": 256, "num_experts": 0}  # fmt: skip


def test_a_two_layer_torch_dist_ref_load_is_not_the_4b_model(big, tmp_path):
    ref = _megatron_tiny(tmp_path / "ref")
    with pytest.raises(ValueError) as info:
        check_checkpoints(_cfg(big, "--train-backend", "megatron", "--ref-load", str(ref)))
    message = str(info.value)
    # One clause per checkpoint, naming both paths once (they were repeated before each of the 5 fields).
    assert message.endswith(
        f": --ref-load {ref} vs --hf-checkpoint {big}: num_layers 2 vs 36, hidden_size 16 vs 2560, qkv_rows 32 vs "
        "6144, ffn_hidden_size 24 vs 9728, vocab_rows 256 vs 151936"
    ), message
    assert message.count(str(ref)) == 1
    assert "the initial and reference weights" not in message


def test_the_same_architecture_passes_with_a_note(tmp_path):
    model = _hf_dir(tmp_path / "tiny", TINY)
    ref = _megatron_tiny(tmp_path / "ref")
    notes = check_checkpoints(_cfg(model, "--train-backend", "megatron", "--ref-load", str(ref)))
    assert f"--ref-load {ref}: torch_dist, the initial and reference weights" in notes
    compared = "num_layers, hidden_size, qkv_rows, ffn_hidden_size, vocab_rows, num_experts"
    compared += " compared with --hf-checkpoint"
    assert f"--ref-load {ref}: {compared}" in notes


def test_megatron_vocabulary_padding_is_not_a_mismatch(tmp_path):
    model = _hf_dir(tmp_path / "tiny", {**TINY, "vocab_size": 250})  # Megatron pads 250 rows to 256 (TP 1)
    ref = _megatron_tiny(tmp_path / "ref")
    check_checkpoints(_cfg(model, "--train-backend", "megatron", "--ref-load", str(ref)))
    model_300 = _hf_dir(tmp_path / "tiny300", {**TINY, "vocab_size": 300})  # 256 rows cannot hold 300 tokens
    with pytest.raises(ValueError, match=r"vocab_rows 256 vs 300"):
        check_checkpoints(_cfg(model_300, "--train-backend", "megatron", "--ref-load", str(ref)))


def test_hf_ref_load_and_fsdp_load_are_compared(big, tmp_path):
    ref = _hf_dir(tmp_path / "ref-hf", TINY)
    kl = ("--train-backend", "fsdp", "--use-kl-loss", "--kl-loss-coef", "0.01")
    expected = rf"--ref-load {ref} vs --hf-checkpoint {big}: [^;]*num_layers 2 vs 36"
    with pytest.raises(ValueError, match=expected) as info:
        check_checkpoints(_cfg(big, *kl, "--ref-load", str(ref)))
    # A size config.json states is not repeated from the weights: "config.json hidden_size 16 vs 2560" only.
    assert str(info.value).count("hidden_size 16 vs 2560") == 1 and str(info.value).count(str(ref)) == 1
    # An FSDP --load: HF parameter names in the DCP state of its iteration.
    load = tmp_path / "save"
    state = {f"model.model.layers.{i}.self_attn.q_proj.weight": torch.zeros(16, 16) for i in range(2)}
    dcp.save(state, checkpoint_id=str(load / "iter_0000003" / "model_and_optim"), no_dist=True)
    (load / "iter_0000003" / "meta.json").write_text("{}")
    (load / "latest_checkpointed_iteration.txt").write_text("3")
    with pytest.raises(ValueError, match=rf"--load {load} vs --hf-checkpoint {big}: [^;]*num_layers 2 vs 36"):
        check_checkpoints(_cfg(big, "--train-backend", "fsdp", "--load", str(load), "--no-load-optim"))  # no optimizer


def test_critic_load(big, tmp_path):
    critic = _hf_dir(tmp_path / "critic-hf", TINY)
    ppo = ("--advantage-estimator", "ppo", "--critic-load", str(critic))
    # Megatron builds the value model from --hf-checkpoint and loads the critic's HF weights into it.
    with pytest.raises(ValueError, match=rf"--critic-load {critic} vs --hf-checkpoint {big}: [^;]*num_layers 2 vs 36"):
        check_checkpoints(_cfg(big, "--train-backend", "megatron", *ppo))
    # FSDP builds it from the critic's own config.json: another size is allowed.
    notes = check_checkpoints(_cfg(big, "--train-backend", "fsdp", *ppo))
    assert f"--critic-load {critic}: HF, the FSDP value model is built from its own config.json" in notes


def test_a_truncated_metadata_names_the_flag(big, tmp_path):
    ref = _megatron_tiny(tmp_path / "ref")
    (ref / "iter_0000010" / ".metadata").write_bytes(b"")
    with pytest.raises(ValueError, match=rf"--ref-load {ref}: cannot read .*\.metadata \(EOFError"):
        check_checkpoints(_cfg(big, "--train-backend", "megatron", "--ref-load", str(ref)))


def test_the_hf_checkpoint_itself_as_ref_load_is_not_compared(tmp_path):
    model = _hf_dir(tmp_path / "tiny", TINY)
    notes = check_checkpoints(_cfg(model, "--train-backend", "megatron", "--ref-load", str(model)))
    assert notes == [f"--ref-load {model}: hf, the initial and reference weights"]


def test_tensor_fields_read_heads_and_experts():
    # Qwen3 names: q_norm is [head_dim]; 4 query heads and 2 key/value heads of 8 dims; a router of 6 experts.
    layer = "model.layers.0."
    hf = {layer + "self_attn.q_norm.weight": (8,), layer + "self_attn.q_proj.weight": (32, 16),
          layer + "self_attn.k_proj.weight": (16, 16), layer + "self_attn.v_proj.weight": (16, 16),
          layer + "mlp.gate.weight": (6, 16), layer + "mlp.experts.0.gate_proj.weight": (12, 16)}  # fmt: skip
    fields = tensor_fields(hf)
    assert (fields["head_dim"], fields["num_attention_heads"], fields["num_key_value_heads"]) == (8, 4, 2)
    assert (fields["num_experts"], fields["ffn_hidden_size"]) == (6, None)
    # Expert indices alone (no router tensor) count the experts; Megatron's router is stacked [L, E, hidden].
    assert (
        tensor_fields({f"model.layers.0.mlp.experts.{j}.up_proj.weight": (12, 16) for j in range(3)})["num_experts"]
        == 3
    )
    megatron = {"decoder.layers.mlp.router.weight": (2, 5, 16), "decoder.layers.self_attention.q_layernorm.weight":
                (2, 8)}  # fmt: skip
    assert (tensor_fields(megatron)["num_experts"], tensor_fields(megatron)["head_dim"]) == (5, 8)
    # No MLP tensor at all: the experts are unknown, not 0.
    assert tensor_fields({"model.embed_tokens.weight": (256, 16)})["num_experts"] is None


def test_config_mismatches_use_transformers_defaults_and_treat_dense_as_zero_experts():
    qwen3_moe = json.loads((FIXTURES / "Qwen3-30B-A3B.json").read_text())
    assert ("num_experts", 128, 0) in config_mismatches(QWEN3_4B, qwen3_moe)
    assert ("model_type", "qwen3_moe", "qwen3") in config_mismatches(QWEN3_4B, qwen3_moe)
    # 8 heads of 16 dims against 4 of 32: the same projection shapes, another attention.
    heads = {**TINY, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4}
    assert config_mismatches(TINY, heads) == [("num_attention_heads", 4, 2), ("num_key_value_heads", 2, 1),
                                              ("head_dim", 4, 8)]  # fmt: skip
    # rope_theta at the top level (transformers 4) or in rope_parameters (transformers 5) is one field.
    v5 = {k: v for k, v in TINY.items() if k != "rope_theta"} | {"rope_parameters": {"rope_theta": 1e6}}
    assert config_mismatches({**TINY, "rope_theta": 1e4}, v5) == [("rope_theta", 1e6, 1e4)]
    assert config_mismatches({**TINY, "rope_theta": 1e6}, v5) == []
    # Left-out fields with a model-independent default are filled in; others are not compared.
    implicit = {k: v for k, v in TINY.items() if k not in ("head_dim", "tie_word_embeddings")}
    assert config_mismatches({**TINY, "head_dim": 8}, {**implicit, "hidden_size": 16}) == []


def _weights(path, hidden, layers=2):
    """A complete Qwen3-named safetensors file of `layers` layers of width `hidden` (2 heads, 1 kv head of hidden/2)."""
    d = hidden // 2
    tensors = {"model.embed_tokens.weight": torch.zeros(256, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {p + "self_attn.q_proj.weight": torch.zeros(2 * d, hidden), p + "self_attn.q_norm.weight":
                    torch.zeros(d), p + "self_attn.k_proj.weight": torch.zeros(d, hidden),
                    p + "self_attn.v_proj.weight": torch.zeros(d, hidden), p + "mlp.gate_proj.weight":
                    torch.zeros(24, hidden)}  # fmt: skip
        # The rest of a layer, which the field comparison does not read but the key-by-key check does.
        tensors |= {p + "self_attn.o_proj.weight": torch.zeros(hidden, 2 * d), p + "self_attn.k_norm.weight":
                    torch.zeros(d), p + "mlp.up_proj.weight": torch.zeros(24, hidden), p + "mlp.down_proj.weight":
                    torch.zeros(hidden, 24), p + "input_layernorm.weight": torch.zeros(hidden),
                    p + "post_attention_layernorm.weight": torch.zeros(hidden)}  # fmt: skip
    tensors["model.norm.weight"] = torch.zeros(hidden)
    save_file(tensors, str(path / "model.safetensors"))


def test_hf_config_json_over_weights_of_another_size_is_refused(tmp_path):
    model = _hf_dir(tmp_path / "tiny", TINY)
    _weights(model, hidden=16)  # what TINY describes
    ref = _hf_dir(tmp_path / "ref", TINY)
    _weights(ref, hidden=64)  # the config.json was copied over other weights
    kl = ("--train-backend", "fsdp", "--use-kl-loss", "--kl-loss-coef", "0.01")
    with pytest.raises(ValueError) as info:
        check_checkpoints(_cfg(model, *kl, "--ref-load", str(ref)))
    assert f"--ref-load {ref} (weights) vs its own config.json: hidden_size 64 vs 16" in str(info.value)
    assert "head_dim 32 vs 8" in str(info.value)
    _weights(ref, hidden=16)
    check_checkpoints(_cfg(model, *kl, "--ref-load", str(ref)))
    # --hf-checkpoint's own weights are held to its config.json too.
    _weights(model, hidden=64)
    with pytest.raises(ValueError, match=re.escape(f"--hf-checkpoint {model} (weights) vs its own config.json")):
        check_checkpoints(_cfg(model, *kl))


def test_an_hf_ref_load_of_another_attention_layout_or_model_type_is_refused(tmp_path):
    model = _hf_dir(tmp_path / "tiny", TINY)
    kl = ("--train-backend", "fsdp", "--use-kl-loss", "--kl-loss-coef", "0.01")
    cases = {
        "heads": ({"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4}, "num_attention_heads 4 vs 2"),
        "llama": ({"model_type": "llama"}, "model_type 'llama' vs 'qwen3'"),
        "rope": ({"rope_theta": TINY["rope_theta"] * 10}, "rope_theta"),
        "moe": ({"model_type": "qwen3_moe", "num_experts": 4, "moe_intermediate_size": 12}, "num_experts 4 vs 0"),
    }
    for name, (change, fragment) in cases.items():
        ref = _hf_dir(tmp_path / name, {**TINY, **change})
        with pytest.raises(ValueError, match=re.escape(f"--ref-load {ref} vs --hf-checkpoint {model}: config.json")):
            check_checkpoints(_cfg(model, *kl, "--ref-load", str(ref)))
        with pytest.raises(ValueError, match=re.escape(fragment)):
            check_checkpoints(_cfg(model, *kl, "--ref-load", str(ref)))


def test_an_unreadable_safetensors_header_names_the_flag(tmp_path):
    model = _hf_dir(tmp_path / "tiny", TINY)
    ref = _hf_dir(tmp_path / "ref", TINY)
    (ref / "model.safetensors").write_bytes(b"\x05")
    kl = ("--train-backend", "fsdp", "--use-kl-loss", "--kl-loss-coef", "0.01")
    with pytest.raises(ValueError, match=re.escape(f"--ref-load {ref}: cannot read the safetensors header of {ref}")):
        check_checkpoints(_cfg(model, *kl, "--ref-load", str(ref)))
