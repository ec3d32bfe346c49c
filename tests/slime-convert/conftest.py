"""Tiny random HF models of each supported family, saved to disk (shared by the slime-convert tests)."""

from __future__ import annotations

import pathlib

import pytest
import torch

TINY_COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,  # not a multiple of 128: exercises vocab padding
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
)

FAMILIES = {
    "qwen2": dict(tie_word_embeddings=False),
    "qwen3": dict(head_dim=32, tie_word_embeddings=True),
    "llama": dict(tie_word_embeddings=False),
    "qwen3_moe": dict(
        head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, tie_word_embeddings=False
    ),
    # fused gate_up_proj, q/k/v biases, post-sublayer norms
    "glm4": dict(head_dim=16, attention_bias=True, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1),
}


def make_tiny_hf_model(model_type: str, out_dir: pathlib.Path, seed: int = 0):
    """Builds a random tiny model of `model_type`, saves it (safetensors) and returns it in fp32 eval mode."""
    import transformers

    config_cls = transformers.AutoConfig.for_model(model_type, **TINY_COMMON, **FAMILIES[model_type])
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config_cls, dtype=torch.float32).eval()
    with torch.no_grad():
        # Norm weights default to ones; randomize so a swapped norm mapping cannot pass.
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.save_pretrained(out_dir, max_shard_size="100KB")  # several shards: exercises the index
    return model


@pytest.fixture(scope="session")
def tiny_hf_model(tmp_path_factory):
    """Factory: `tiny_hf_model(model_type) -> (model, hf_dir)`, cached per family for the session."""
    cache: dict[str, tuple] = {}

    def make(model_type: str):
        if model_type not in cache:
            out = tmp_path_factory.mktemp(f"hf-{model_type}")
            cache[model_type] = (make_tiny_hf_model(model_type, out), out)
        return cache[model_type]

    return make


@pytest.fixture(scope="session")
def first_shard():
    """`first_shard(hf_dir) -> Path`: the first `model-*.safetensors` shard of a saved HF model, by name."""

    def first(hf_dir: pathlib.Path) -> pathlib.Path:
        return sorted(hf_dir.glob("model-*.safetensors"))[0]

    return first
