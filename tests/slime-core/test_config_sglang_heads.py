"""`slime_core.config.sglang_heads`: which config.json SGLang would serve through an unloaded head."""

import pytest

from slime_core.config.sglang_heads import tied_head_refusal


@pytest.mark.parametrize(
    ("model_type", "cls"), [("qwen3_moe", "Qwen3MoeForCausalLM"), ("qwen2_moe", "Qwen2MoeForCausalLM")]
)
def test_tied_moe_checkpoints_are_refused_with_sglangs_class_named(model_type, cls):
    message = tied_head_refusal({"model_type": model_type, "tie_word_embeddings": True})
    assert message is not None and f"SGLang's {cls} always keeps a separate lm_head" in message
    assert f"model_type {model_type!r}" in message


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "qwen3_moe", "tie_word_embeddings": False},
        {"model_type": "qwen3_moe"},  # transformers' default: untied
        {"model_type": "qwen3", "tie_word_embeddings": True},  # SGLang's dense Qwen3 ties when asked
        {"model_type": "llama", "tie_word_embeddings": True},
    ],
)
def test_untied_or_tieable_models_pass(config):
    assert tied_head_refusal(config) is None
