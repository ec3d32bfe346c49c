"""The Hugging Face tokenizer of a run (`--hf-checkpoint`), loaded once per path, refused when empty.

Importable from `slime_rollout.data.source` too, where generate functions and the compat layer import it.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["TOKENIZER_FILES", "get_tokenizer"]


@functools.cache
def get_tokenizer(path: str) -> Any:
    """The Hugging Face tokenizer at `path` (cached; `--hf-checkpoint` or a tokenizer dir).

    Raises:
        ValueError: the tokenizer has fewer than 2 tokens: a directory without tokenizer files gives an empty one
            (transformers builds it from config.json alone), which encoded every prompt as 0 tokens.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    if len(tokenizer) < 2:
        raise ValueError(
            f"--hf-checkpoint {path}: its tokenizer is empty ({len(tokenizer)} token): no tokenizer files there "
            f"({', '.join(TOKENIZER_FILES)}); copy them from the model the checkpoint came from"
        )
    return tokenizer


# Files a Hugging Face tokenizer is read from; a checkpoint directory holds at least one of them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
