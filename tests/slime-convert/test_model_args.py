import json
import pathlib

import pytest

from slime_convert.model_args import ModelArgs, padded_vocab_size

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"

QWEN3_4B = {
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


@pytest.mark.parametrize(
    ("vocab", "tp", "expected"),
    [(151936, 1, 151936), (151936, 2, 152064), (300, 1, 384), (300, 2, 512), (128, 1, 128), (129, 1, 256)],
)
def test_padded_vocab_size(vocab, tp, expected):
    # 151936 = 1187 * 128; with TP=2 the multiple is 256: ceil(151936/256)=594 -> 152064.
    assert padded_vocab_size(vocab, tp) == expected


def test_qwen3_4b_flags_match_the_original_model_script():
    args = ModelArgs.from_hf_config(QWEN3_4B)
    assert args.kv_channels == 128 and args.num_query_groups == 8 and args.qk_layernorm and not args.add_qkv_bias
    flags = args.megatron_flags()
    pairs = dict(zip(flags[:-1], flags[1:], strict=True))
    # Values of slime's scripts/models/qwen3-4B.sh.
    assert pairs["--num-layers"] == "36"
    assert pairs["--hidden-size"] == "2560"
    assert pairs["--ffn-hidden-size"] == "9728"
    assert pairs["--num-attention-heads"] == "32"
    assert pairs["--num-query-groups"] == "8"
    assert pairs["--kv-channels"] == "128"
    assert pairs["--rotary-base"] == "1000000"  # Megatron-LM parses --rotary-base as int
    assert pairs["--vocab-size"] == "151936"
    assert "--qk-layernorm" in flags and "--swiglu" in flags
    assert "--untie-embeddings-and-output-weights" not in flags


def test_attention_dropout_of_the_config_reaches_megatron():
    # The FSDP backend's HF attention applies config.json's attention_dropout in train mode; Megatron's
    # TransformerConfig got a fixed 0.0 before the fix, so the two backends trained different models.
    args = ModelArgs.from_hf_config({**QWEN3_4B, "attention_dropout": 0.1})
    assert args.attention_dropout == 0.1
    assert args.transformer_config_kwargs()["attention_dropout"] == 0.1
    assert args.transformer_config_kwargs()["hidden_dropout"] == 0.0  # no residual dropout in the HF families
    flags = args.megatron_flags()
    assert flags[flags.index("--attention-dropout") + 1] == "0.1"
    plain = ModelArgs.from_hf_config(QWEN3_4B)  # absent: 0, as HF's default
    assert plain.transformer_config_kwargs()["attention_dropout"] == 0.0
    assert plain.megatron_flags()[plain.megatron_flags().index("--attention-dropout") + 1] == "0.0"


def test_qwen2_llama_moe_variants():
    qwen2 = ModelArgs.from_hf_config(
        {**QWEN3_4B, "model_type": "qwen2", "head_dim": None, "tie_word_embeddings": False}
    )
    assert qwen2.add_qkv_bias and not qwen2.qk_layernorm and qwen2.kv_channels == 2560 // 32
    assert "--untie-embeddings-and-output-weights" in qwen2.megatron_flags()
    moe = ModelArgs.from_hf_config(
        {**QWEN3_4B, "model_type": "qwen3_moe", "num_local_experts": 8, "moe_intermediate_size": 64,
         "num_experts_per_tok": 2, "norm_topk_prob": True}
    )  # fmt: skip
    assert moe.is_moe and moe.num_experts == 8 and not moe.moe_router_pre_softmax
    assert moe.transformer_config_kwargs()["num_moe_experts"] == 8


def test_llama3_rope_scaling_becomes_megatrons():
    # The published Llama-3.1-8B-Instruct config.json's fields.
    rope = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
            "rope_type": "llama3"}  # fmt: skip
    llama = {**QWEN3_4B, "model_type": "llama", "head_dim": None, "rope_theta": 500000.0, "rope_scaling": rope}
    args = ModelArgs.from_hf_config(llama)
    assert args.rope_scaling_factor == 8.0 and args.rotary_base == 500000.0
    assert args.gpt_model_kwargs()["rope_scaling"] is True and args.gpt_model_kwargs()["rope_scaling_factor"] == 8.0
    flags = args.megatron_flags()
    assert flags[flags.index("--use-rope-scaling") :][:3] == ["--use-rope-scaling", "--rotary-scaling-factor", "8"]
    assert "rope_scaling" not in ModelArgs.from_hf_config(QWEN3_4B).gpt_model_kwargs()  # plain RoPE: no scaling


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"model_type": "gpt2"}, "not supported"),
        ({"num_key_value_heads": 5}, "multiple"),
        ({"hidden_act": "gelu"}, "silu"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, r"rope_scaling=\{'rope_type': 'yarn'"),
        # transformers >= 5 writes the scaling as rope_parameters: it was read as plain RoPE.
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4, "rope_theta": 1e6}}, r"rope_parameters=\{'rope_type"),
        # megatron-core's llama3 scaling fixes the other three parameters at Llama 3.1's values.
        (
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 4096,
                }
            },
            "fixes low_freq_factor=1, high_freq_factor=4",
        ),
        ({"hidden_size": None}, "hidden_size"),
    ],
)
def test_bad_configs_raise_clear_errors(patch, match):
    with pytest.raises(ValueError, match=match):
        ModelArgs.from_hf_config({**QWEN3_4B, **patch})


def test_from_hf_dir_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelArgs.from_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text("{\n  bad")
    with pytest.raises(ValueError, match=r"config.json: invalid JSON at line 2"):
        ModelArgs.from_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_4B, "model_type": "bert"}))
    with pytest.raises(ValueError, match=r"config.json: model_type='bert'"):
        ModelArgs.from_hf_dir(tmp_path)


def _script_flags(name: str) -> dict[str, str | bool]:
    """Flag -> value (True for a switch) of an original launch script's flag set (tests/fixtures)."""
    tokens = (FIXTURES / "original-scripts" / f"{name}.args").read_text().split()
    out: dict[str, str | bool] = {}
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else "--"
            out[token] = True if nxt.startswith("--") else nxt
    return out


def test_glm4_flags_match_the_original_glm4_9b_script():
    config = json.loads((FIXTURES / "hf-configs" / "GLM-Z1-9B-0414.json").read_text())
    args = ModelArgs.from_hf_config(config)
    assert args.rotary_percent == 0.5 and args.rotary_interleaved and args.sandwich_norm and args.fused_gate_up
    assert args.add_qkv_bias and not args.qk_layernorm and args.kv_channels == 128
    script = _script_flags("run-glm4-9B")  # scripts/models/glm4-9B.sh expanded
    flags = args.megatron_flags()
    compared = 0
    for i, flag in enumerate(flags):
        if flag not in script:
            continue
        value = True if i + 1 == len(flags) or flags[i + 1].startswith("--") else flags[i + 1]
        assert value == script[flag] or float(value) == float(script[flag]), flag
        compared += 1
    assert compared >= 17  # every model flag the script passes, --rotary-percent 0.5 and the two post-norms included
    assert {"--rotary-interleaved", "--post-self-attn-layernorm", "--post-mlp-layernorm"} <= set(flags)
    assert args.gpt_model_kwargs()["rotary_percent"] == 0.5
    assert args.transformer_config_kwargs()["rotary_interleaved"] is True
    # transformers ≥ 5 writes partial_rotary_factor under rope_parameters.
    moved = {k: v for k, v in config.items() if k != "partial_rotary_factor"}
    moved["rope_parameters"] = {"rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    assert ModelArgs.from_hf_config(moved).rotary_percent == 0.25


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "llama", "qwen3_moe", "glm4"])
def test_a_field_config_json_leaves_out_takes_transformers_default(model_type):
    transformers = pytest.importorskip("transformers")
    # A trimmed config.json: only what the shapes need. HF fills the rest from its config class's defaults.
    trimmed = {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 300, "intermediate_size": 96}  # fmt: skip
    if model_type == "qwen3_moe":
        trimmed.update(num_experts=4, moe_intermediate_size=32, num_experts_per_tok=2)
    hf = transformers.AutoConfig.for_model(**trimmed)
    args = ModelArgs.from_hf_config(trimmed)
    # Was 1e-6 for glm4 (HF: 1.5625e-07), renormalized top-k and no aux loss for qwen3_moe (HF: neither),
    # and 4096 positions for every family.
    assert args.norm_epsilon == hf.rms_norm_eps
    assert args.max_position_embeddings == hf.max_position_embeddings
    if model_type == "qwen3_moe":
        assert args.moe_router_pre_softmax == (not hf.norm_topk_prob)
        assert args.moe_aux_loss_coeff == hf.router_aux_loss_coef
