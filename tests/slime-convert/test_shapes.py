"""`slime_convert.shapes`: a config.json that does not describe the weights is one error before anything is written.

Before: a 2-layer torch_dist exported with a 4-layer `--origin-hf-dir` wrote layers 2 and 3 as zeros (exit 0); a
1-layer config dropped a layer, another `hidden_size`/`intermediate_size` wrote tensors no loader accepts (exit 0);
a config without `intermediate_size` converted with a made-up 4·hidden width; a missing `head_dim` failed with
"q has shape (128, 64), expected (64, *(64,))", naming no tensor, file or field.
"""

import json
import shutil

import pytest

from slime_convert.cli import main
from slime_convert.model_args import ModelArgs
from slime_convert.shapes import hf_tensor_shape

pytest.importorskip("transformers")


def _with_config(hf_dir, dst, **changes):
    shutil.copytree(hf_dir, dst)
    config = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def qwen3_torch_dist(tiny_hf_model, tmp_path_factory):
    _, hf_dir = tiny_hf_model("qwen3")
    save = tmp_path_factory.mktemp("mc")
    assert main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(save), "--no-progress"]) == 0
    return hf_dir, save


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (
            {"num_hidden_layers": 4},
            "decoder.layers.self_attention.linear_qkv.weight has shape [2, 256, 64], expected [4, 256, 64]",
        ),
        ({"num_hidden_layers": 1}, "num_hidden_layers=1"),
        ({"hidden_size": 128}, "embedding.word_embeddings.weight has shape [384, 64], expected [>= 300, 128]"),
        ({"intermediate_size": 48}, "decoder.layers.mlp.linear_fc2.weight has shape [2, 64, 96], expected [2, 64, 48]"),
        ({"head_dim": 16}, "head_dim=16"),
    ],
)
def test_mcore_to_hf_with_the_config_of_another_model_size_is_refused(
    qwen3_torch_dist, tmp_path, caplog, changes, named
):
    hf_dir, save = qwen3_torch_dist
    origin = _with_config(hf_dir, tmp_path / "origin", **changes)
    out = tmp_path / "out"
    argv = ["mcore-to-hf", "--input-dir", str(save), "--output-dir", str(out), "--origin-hf-dir", str(origin)]
    assert main([*argv, "--no-progress"]) == 2
    assert named in caplog.text
    assert f"{origin}/config.json says" in caplog.text and "Is --origin-hf-dir the model" in caplog.text
    assert not out.exists() and not (tmp_path / "out.tmp").exists()


def test_mcore_to_hf_with_its_own_config_still_works(qwen3_torch_dist, tmp_path):
    hf_dir, save = qwen3_torch_dist
    argv = [
        "mcore-to-hf",
        "--input-dir",
        str(save),
        "--output-dir",
        str(tmp_path / "o"),
        "--origin-hf-dir",
        str(hf_dir),
    ]
    assert main([*argv, "--no-progress"]) == 0


def test_hf_to_mcore_names_tensor_file_and_config_when_head_dim_is_missing(tiny_hf_model, tmp_path, caplog):
    _, hf_dir = tiny_hf_model("qwen3")  # head_dim 32, hidden 64 / 4 heads = 16
    broken = _with_config(hf_dir, tmp_path / "hf", head_dim=None)
    assert main(["hf-to-mcore", "--hf-checkpoint", str(broken), "--save", str(tmp_path / "m"), "--no-progress"]) == 2
    assert "model.layers.0.self_attn.q_proj.weight in model-" in caplog.text
    assert "has shape [128, 64], expected [64, 64]" in caplog.text
    assert "head_dim=16" in caplog.text and "a missing head_dim is hidden_size / num_attention_heads" in caplog.text
    assert not (tmp_path / "m" / "release").exists()


def test_a_missing_intermediate_size_is_an_error_not_four_times_the_width(tiny_hf_model, tmp_path, caplog):
    _, hf_dir = tiny_hf_model("llama")
    broken = _with_config(hf_dir, tmp_path / "hf", intermediate_size=None)
    assert main(["hf-to-mcore", "--hf-checkpoint", str(broken), "--save", str(tmp_path / "m"), "--no-progress"]) == 2
    assert "config field 'intermediate_size' is missing" in caplog.text
    assert main(["megatron-args", "--hf-checkpoint", str(broken)]) == 2  # printed --ffn-hidden-size 256 before


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("model.layers.1.mlp.gate_up_proj.weight", (2 * 96, 64)),  # not taken for up_proj
        ("model.layers.1.mlp.up_proj.weight", (96, 64)),
        ("model.layers.0.mlp.experts.3.down_proj.weight", (64, 32)),  # the expert width
        ("model.layers.0.mlp.gate.weight", (4, 64)),
        ("model.layers.0.post_self_attn_layernorm.weight", (64,)),
        ("model.layers.0.self_attn.k_norm.weight", (16,)),
        ("model.layers.0.self_attn.v_proj.bias", (32,)),
    ],
)
def test_expected_hf_shapes_by_hand(name, shape):
    args = ModelArgs(
        model_type="qwen3_moe",
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=96,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        vocab_size=300,
        max_position_embeddings=128,
        norm_epsilon=1e-6,
        rotary_base=1e4,
        tie_word_embeddings=False,
        num_experts=4,
        moe_ffn_hidden_size=32,
        moe_router_topk=2,
    )
    assert hf_tensor_shape(name, args) == shape
    with pytest.raises(ValueError, match="no expected shape"):
        hf_tensor_shape("model.layers.0.mystery.weight", args)


def test_an_untied_output_layer_exported_with_a_tied_config_is_refused(tiny_hf_model, tmp_path, caplog):
    """Was exit 0 with the trained output layer silently left out (the export kept only the embedding)."""
    _, hf_dir = tiny_hf_model("qwen2")  # untied: the torch_dist holds output_layer.weight
    save = tmp_path / "m"
    assert main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(save), "--no-progress"]) == 0
    origin = _with_config(hf_dir, tmp_path / "origin", tie_word_embeddings=True)
    out = tmp_path / "out"
    argv = ["mcore-to-hf", "--input-dir", str(save), "--output-dir", str(out), "--origin-hf-dir", str(origin)]
    assert main([*argv, "--no-progress"]) == 2
    assert "output_layer.weight is stored" in caplog.text and "set tie_word_embeddings to false" in caplog.text
    assert not out.exists()
