"""Megatron architecture flags vs config.json: the original's model scripts agree with their checkpoints, and
a script pointed at another checkpoint is caught flag by flag."""

import json
import pathlib

import pytest

from slime_core.config.architecture import check_architecture, parse_moe_layer_freq
from slime_core.config.megatron_flags import MEGATRON_FLAGS

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"


def _config(name):
    return json.loads((FIXTURES / "hf-configs" / f"{name}.json").read_text())


def _megatron_tokens(script):
    tokens = [t for t in (FIXTURES / "original-scripts" / f"{script}.args").read_text().splitlines()[2:] if t]
    out, keep = [], False
    for token in tokens:
        if token.startswith("--"):
            keep = token in MEGATRON_FLAGS
        if keep:
            out.append(token)
    return out


@pytest.mark.parametrize(
    "script, checkpoint",
    [("run-qwen3-4B", "Qwen3-4B"), ("run-qwen3-4B-base-sft", "Qwen3-4B-Base"), ("run-qwen3-32B", "Qwen3-32B"),
     ("run-qwen3-30B-A3B", "Qwen3-30B-A3B"), ("run-qwen3-235B-A22B", "Qwen3-235B-A22B"),
     ("run-qwen2.5-0.5B-reproducibility", "Qwen2.5-0.5B-Instruct"), ("run-glm4-9B", "GLM-Z1-9B-0414")],
)  # fmt: skip
def test_original_model_scripts_agree_with_their_checkpoints(script, checkpoint):
    report = check_architecture(_megatron_tokens(script), _config(checkpoint))
    assert report.mismatches == [] and report.unchecked == []
    assert "--num-layers" in report.checked and "--vocab-size" in report.checked


def test_a_script_for_another_checkpoint_is_caught_flag_by_flag():
    report = check_architecture(_megatron_tokens("run-qwen3-4B"), _config("Qwen3-32B"))
    assert report.mismatches == [
        "--num-layers 36: config.json says 64",
        "--hidden-size 2560: config.json says 5120",
        "--ffn-hidden-size 9728: config.json says 25600",
        "--num-attention-heads 32: config.json says 64",
    ]
    # GLM4's post-norms, interleaved partial RoPE and qkv bias are not Qwen2's.
    report = check_architecture(_megatron_tokens("run-glm4-9B"), _config("Qwen2.5-0.5B-Instruct"))
    for flag in ("--post-self-attn-layernorm", "--post-mlp-layernorm", "--rotary-interleaved", "--rotary-percent 0.5",
                 "--untie-embeddings-and-output-weights", "--norm-epsilon 1e-5", "--rotary-base 10000"):  # fmt: skip
        assert any(m.startswith(flag + ":") for m in report.mismatches), (flag, report.mismatches)
    assert "--add-qkv-bias" in report.checked  # both have q/k/v biases


def test_spec_names_the_layer_the_megatron_backend_builds():
    glm_spec = ["--spec", "slime_plugins.models.glm4", "get_glm_spec"]
    assert check_architecture(glm_spec, _config("GLM-Z1-9B-0414")).checked == ["--spec"]
    report = check_architecture(["--spec", "my_specs", "get_spec"], _config("GLM-Z1-9B-0414"))
    assert report.mismatches == [
        "--spec my_specs get_spec: config.json says a model whose Megatron layer is slime_plugins.models.glm4 "
        "get_glm_spec"
    ]
    report = check_architecture(glm_spec, _config("Qwen3-4B"))
    assert report.mismatches == [
        "--spec slime_plugins.models.glm4 get_glm_spec: config.json says a model whose Megatron layer is "
        "megatron-core's GPT layer (no --spec)"
    ]
    # A model the Megatron backend cannot build: preflight says so first; FSDP runs the HF model, whatever the spec.
    assert check_architecture(glm_spec, {"model_type": "qwen3_next"}).unchecked == ["--spec"]
    fsdp = check_architecture(glm_spec, _config("Qwen3-4B"), megatron_native=False)
    assert (fsdp.checked, fsdp.mismatches, fsdp.unchecked) == ([], [], [])


def test_moe_flags_against_the_moe_config():
    tokens = ["--num-experts", "128", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "768", "--moe-layer-freq",
              "[0]*2+[1]*46", "--moe-router-pre-softmax", "--moe-router-enable-expert-bias"]  # fmt: skip
    report = check_architecture(tokens, _config("Qwen3-30B-A3B"))
    assert report.checked == ["--num-experts", "--moe-ffn-hidden-size"]
    assert [m.split(":")[0] for m in report.mismatches] == [
        "--moe-router-topk 4", "--moe-layer-freq <pattern>", "--moe-router-pre-softmax",
        "--moe-router-enable-expert-bias",
    ]  # fmt: skip


def test_qwen3_moe_has_no_routed_scaling_groups_or_shared_experts():
    # Were "not checked" (Qwen3-MoE's config.json has no such keys) and the model was built without them: a plain
    # softmax top-k router over routed experts, as transformers' Qwen3MoeSparseMoeBlock.
    tokens = ["--moe-router-topk-scaling-factor", "2.5", "--moe-router-num-groups", "2", "--moe-router-group-topk", "2",
              "--moe-shared-expert-intermediate-size", "768"]  # fmt: skip
    report = check_architecture(tokens, _config("Qwen3-30B-A3B"))
    assert report.mismatches == [
        "--moe-router-topk-scaling-factor 2.5: config.json says 1.0",
        "--moe-router-num-groups 2: config.json says 1",
        "--moe-router-group-topk 2: config.json says 1",
        "--moe-shared-expert-intermediate-size 768: config.json says 0",
    ]
    assert report.unchecked == []
    neutral = ["--moe-router-topk-scaling-factor", "1", "--moe-router-num-groups", "1", "--moe-router-group-topk", "1",
               "--moe-shared-expert-intermediate-size", "0"]  # fmt: skip
    assert check_architecture(neutral, _config("Qwen3-30B-A3B")).checked == neutral[::2]
    # A family this module does not know stays unchecked.
    assert check_architecture(tokens[:2], {"model_type": "some_moe", "num_experts": 8}).unchecked == tokens[:1]


@pytest.mark.parametrize("dense", ["Qwen3-4B", "Qwen3-32B", "GLM-Z1-9B-0414"])
def test_moe_flags_on_a_dense_model_are_mismatches(dense):
    # Were "not checked" (config.json has no expert keys to compare with); a known dense family has no experts.
    tokens = ["--num-layers", "2", "--num-experts", "128", "--moe-router-topk", "8", "--moe-layer-freq", "[1]*48"]
    report = check_architecture(tokens[2:], _config(dense))
    model_type = _config(dense)["model_type"]
    assert report.mismatches == [
        f"--num-experts 128: config.json says a dense model (model_type {model_type!r}, no experts)",
        f"--moe-router-topk 8: config.json says a dense model (model_type {model_type!r}, no experts)",
        f"--moe-layer-freq [1]*48: config.json says a dense model (model_type {model_type!r}, no experts)",
    ]
    assert report.unchecked == []


def test_unknown_families_are_reported_unchecked_not_trusted():
    cfg = {"model_type": "some_new_arch", "num_hidden_layers": 4, "hidden_size": 64}
    report = check_architecture(["--num-layers", "4", "--qk-layernorm", "--post-mlp-layernorm", "--swiglu"], cfg)
    assert report.checked == ["--num-layers", "--swiglu"]  # hidden_act defaults to silu in HF configs
    assert report.unchecked == ["--qk-layernorm", "--post-mlp-layernorm"]


def test_multi_latent_attention_fields():
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "q_lora_rank": 1536, "kv_lora_rank": 512,
           "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_attention_heads": 128,
           "num_key_value_heads": 128, "n_routed_experts": 256, "first_k_dense_replace": 3, "n_shared_experts": 1,
           "moe_intermediate_size": 2048, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
           "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4}  # fmt: skip
    tokens = ["--multi-latent-attention", "--q-lora-rank", "1536", "--kv-lora-rank", "512", "--qk-head-dim", "128",
              "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128", "--kv-channels", "128", "--qk-layernorm",
              "--moe-layer-freq", "[0]*3+[1]*58", "--moe-shared-expert-intermediate-size", "2048",
              "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
              "--moe-router-topk-scaling-factor", "2.5", "--moe-router-num-groups", "8", "--moe-router-group-topk", "4",
              "--moe-router-pre-softmax"]  # fmt: skip
    report = check_architecture(tokens, cfg)
    assert report.mismatches == []
    assert report.unchecked == ["--moe-router-pre-softmax"]  # sigmoid routers: no single HF counterpart


def test_parse_moe_layer_freq():
    assert parse_moe_layer_freq("[0]*3+[1]*2", 5) == [0, 0, 0, 1, 1]
    assert parse_moe_layer_freq("[1,1,0]", 3) == [1, 1, 0]
    assert parse_moe_layer_freq("2", 4) == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="expected an int or terms like"):
        parse_moe_layer_freq("__import__('os')", 4)


def test_config_num_experts_reads_each_familys_key_and_a_vlms_text_config():
    from slime_core.config.architecture import config_num_experts

    assert config_num_experts({"model_type": "qwen3_moe", "num_experts": 128}) == 128
    assert config_num_experts({"model_type": "mixtral", "num_local_experts": 8}) == 8
    assert config_num_experts({"model_type": "deepseek_v3", "n_routed_experts": 256, "n_shared_experts": 1}) == 256
    assert config_num_experts({"model_type": "qwen3_vl_moe", "text_config": {"num_experts": 64}}) == 64
    assert config_num_experts({"model_type": "qwen3", "num_experts": None}) is None
    assert config_num_experts({"model_type": "qwen3", "text_config": {}}) is None
