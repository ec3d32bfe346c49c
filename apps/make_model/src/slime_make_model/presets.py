"""Presets of `slime_make_model`: Qwen3 shapes, dtype names and tokenizer files (no torch, so `--help` is instant).

The checkpoint writer that uses them is `slime_make_model.checkpoint`.
"""

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_TOKENIZER_DIR", "DTYPE_NAMES", "PRESETS", "Preset", "TOKENIZER_FILES"]

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
class Preset:
    """Shape of a Qwen3 dense model (fields are ``Qwen3Config`` keyword arguments)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tie_word_embeddings: bool
    head_dim: int = 128
    max_position_embeddings: int = 40960


PRESETS: dict[str, Preset] = {
    # A few MB with the real vocab: embedding 151936 x 16 dominates (~2.4 M params).
    "qwen3-tiny": Preset(16, 2, 2, 1, 64, True, head_dim=8, max_position_embeddings=4096),
    "qwen3-0.6b": Preset(1024, 28, 16, 8, 3072, True),
    "qwen3-1.7b": Preset(2048, 28, 16, 8, 6144, True),
    "qwen3-4b": Preset(2560, 36, 32, 8, 9728, True),
    "qwen3-8b": Preset(4096, 36, 32, 8, 12288, False),
}
