"""A tied checkpoint of a model whose SGLang class never ties its output head: refused before the run.

SGLang 0.5.16's `Qwen3MoeForCausalLM` and `Qwen2MoeForCausalLM` always build their own `lm_head` and never read
`tie_word_embeddings` (its dense Qwen2/Qwen3 classes do). A checkpoint saved tied holds no `lm_head.weight`, so the
engine's head keeps whatever memory it was given and every sample is drawn through it, while the trainer ties the
head to the embedding as transformers does. Weight pushes do not mend it: a tied model's export has no
`lm_head.weight` either. Measured on one H100 (2026-12-07), a random 2-layer Qwen3-MoE saved tied: SGLang's
response log-probs were 0.55 from HF fp32's on average (HF bf16: 0.008, Megatron bf16: 0.008), and its Megatron GRPO
run stopped at the first-step check. Every published Qwen2-MoE / Qwen3-MoE is untied, so only a hand-made checkpoint
meets this. This check needs only config.json.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tied_head_refusal"]

# model_type -> SGLang 0.5.16's class for it, which keeps an untied lm_head whatever config.json says.
_NEVER_TIED = {"qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def tied_head_refusal(hf_config: dict[str, Any]) -> str | None:
    """Why SGLang cannot serve this config.json's model as the trainer builds it, or None when it can.

    Args:
        hf_config: the parsed config.json of `--hf-checkpoint`.

    Returns:
        One sentence naming the model type, SGLang's class and the way out, or None (untied, or a model type SGLang
        ties when asked).
    """
    model_type = hf_config.get("model_type")
    if model_type not in _NEVER_TIED or not hf_config.get("tie_word_embeddings", False):
        return None
    return (
        f"config.json ties the output head to the embedding (tie_word_embeddings: true, model_type {model_type!r}), "
        f"but SGLang's {_NEVER_TIED[model_type]} always keeps a separate lm_head that a tied checkpoint never fills: "
        "the engine would sample through an unloaded head while the trainer scores with the embedding. Save the model "
        "untied (an lm_head.weight equal to the embedding and tie_word_embeddings false), as every published "
        f"{model_type} checkpoint is"
    )
