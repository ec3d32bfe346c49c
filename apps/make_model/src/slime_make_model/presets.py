"""Presets of `slime_make_model`: Qwen3 and Qwen3-VL shapes, dtype names and tokenizer files.

No torch here, so `--help` is instant. The checkpoint writer that uses them is `slime_make_model.checkpoint`;
the Qwen3-VL files (config, processor, chat template) are `slime_make_model.vl_files`.
"""

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_TOKENIZER_DIR",
    "DTYPE_NAMES",
    "PRESETS",
    "MoePreset",
    "Preset",
    "TOKENIZER_FILES",
    "VisionPreset",
]

# The Qwen3 tokenizer committed with the tests (a source checkout: this file is
# apps/make_model/src/slime_make_model/presets.py); an installed wheel has no such directory, pass --tokenizer.
DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "qwen3-tokenizer"
#: Files copied from the tokenizer dir when present.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)
QWEN3_VOCAB_SIZE = 151936
QWEN3_BOS_ID, QWEN3_EOS_ID = 151643, 151645  # <|endoftext|>, <|im_end|>
#: Checkpoint dtypes `--dtype` accepts.
DTYPE_NAMES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class VisionPreset:
    """Shape of a Qwen3-VL vision tower (fields are ``Qwen3VLVisionConfig`` keyword arguments).

    Images are cut into ``patch_size`` pixel patches (``temporal_patch_size`` frames deep: a still image is repeated),
    and ``spatial_merge_size``² neighbouring patches become one language-model token. The learned position table has
    ``num_position_embeddings`` rows, a square grid (SGLang and transformers take its side as the square root).
    """

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    deepstack_visual_indexes: tuple[int, ...]
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304


@dataclass(frozen=True)
class MoePreset:
    """Mixture-of-experts MLP of a Qwen3-MoE preset (fields are ``Qwen3MoeConfig`` keyword arguments).

    Every layer's MLP is ``num_experts`` SwiGLU experts of width ``moe_intermediate_size``; each token goes to
    the ``num_experts_per_tok`` experts with the largest router logits, combine weights renormalized over them
    (``norm_topk_prob``, as Qwen3-MoE). ``router_std`` is the std of the router weights: larger than the
    other weights' 0.02, so that on random weights the routes clearly depend on the token (routing replay has
    something to replay).
    """

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    router_std: float = 0.5


@dataclass(frozen=True)
class Preset:
    """Shape of a Qwen3 dense model (fields are ``Qwen3Config`` keyword arguments), or of a Qwen3-VL one.

    A preset with ``vision`` is a ``Qwen3VLForConditionalGeneration``: these fields are its ``text_config`` and
    ``vision`` its ``vision_config`` (the vision tower projects to ``hidden_size``). A preset with ``moe`` is a
    ``Qwen3MoeForCausalLM`` (``intermediate_size`` is then unused by its layers: every MLP is the experts).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tie_word_embeddings: bool
    head_dim: int = 128
    max_position_embeddings: int = 40960
    vision: VisionPreset | None = None
    moe: MoePreset | None = None


#: The vision tower of qwen3-vl-tiny: 2 blocks of hidden 256 (4 heads of 64), 16-pixel patches merged 2x2,
#: deepstack features from block 0.
QWEN3_VL_TINY_VISION = VisionPreset(
    depth=2, hidden_size=256, num_heads=4, intermediate_size=1024, deepstack_visual_indexes=(0,)
)

PRESETS: dict[str, Preset] = {
    # A few MB with the real vocab: embedding 151936 x 16 dominates (~2.4 M params).
    "qwen3-tiny": Preset(16, 2, 2, 1, 64, True, head_dim=8, max_position_embeddings=4096),
    "qwen3-0.6b": Preset(1024, 28, 16, 8, 3072, True),
    "qwen3-1.7b": Preset(2048, 28, 16, 8, 6144, True),
    "qwen3-4b": Preset(2560, 36, 32, 8, 9728, True),
    "qwen3-8b": Preset(4096, 36, 32, 8, 12288, False),
    # A Qwen3-MoE for routing replay on CPU (--use-routing-replay, --use-rollout-routing-replay): 2 layers of
    # 8 experts with top-2, hidden 64, 4 q / 2 KV heads of 16; ~9.8 M parameters, 9.7 M of them the embedding.
    "qwen3-moe-tiny": Preset(
        64, 2, 4, 2, 128, True, head_dim=16, max_position_embeddings=4096, moe=MoePreset(8, 2, 32)
    ),
    # qwen3-moe-tiny with heads SGLang has kernels for (its fused rope + KV write refuses head_dim 16): 2 layers of 8
    # experts, top-2, hidden 1024, 16 q / 8 KV heads of 128; the Megatron MoE acceptance lane on one GPU. Untied, as
    # every published Qwen3-MoE: SGLang's Qwen3-MoE never ties its head (`slime_core.config.sglang_heads`).
    "qwen3-moe-small": Preset(1024, 2, 16, 8, 3072, False, max_position_embeddings=32768, moe=MoePreset(8, 2, 768)),
    # A Qwen3-VL that SGLang serves on one GPU: the language model has Qwen3-0.6B's width and head geometry
    # (16 q / 8 KV heads of 128: the shapes the staged GPU stack has kernels for) in 2 layers, and
    # QWEN3_VL_TINY_VISION. ~0.19 B parameters, 0.16 B of them the tied 151936-row embedding.
    "qwen3-vl-tiny": Preset(1024, 2, 16, 8, 3072, True, max_position_embeddings=32768, vision=QWEN3_VL_TINY_VISION),
}
