"""The Hugging Face tokenizer of a run (`--hf-checkpoint`), loaded once per path, refused when empty.

Importable from `slime_rollout.data.source` too, where generate functions and the compat layer import it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
from typing import Any

__all__ = ["TOKENIZER_FILES", "get_tokenizer", "has_tokenizer_files", "prefetch_tokenizer", "vocabulary_fingerprint"]

logger = logging.getLogger(__name__)


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


def prefetch_tokenizer(path: str) -> threading.Thread:
    """Starts loading `get_tokenizer(path)` in a daemon thread; join it before the first `get_tokenizer(path)`.

    For a process that waits on something else meanwhile (the rollout manager while its engines start): the
    transformers import and the tokenizer's files then cost nothing later (5-10 s on the hosts measured). A failure
    here is only logged at debug level: the real call raises it again where the error belongs.
    """

    def load() -> None:
        try:
            get_tokenizer(path)
        except Exception:  # noqa: BLE001 - raised again, in context, by the caller's own get_tokenizer(path)
            logger.debug("tokenizer prefetch of %s failed", path, exc_info=True)

    thread = threading.Thread(target=load, name="tokenizer-prefetch", daemon=True)
    thread.start()
    return thread


# Files a Hugging Face tokenizer is read from; a checkpoint directory holds at least one of them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def has_tokenizer_files(path: str) -> bool:
    """Whether the directory `path` holds any of `TOKENIZER_FILES` (a torch_dist checkpoint holds none)."""
    return any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES)


def vocabulary_fingerprint(path: str) -> tuple[int, str]:
    """`(size, sha256)` of the tokenizer at `path`: its token count and a hash of its `token -> id` mapping.

    Two tokenizers that turn text into the same ids have the same fingerprint; one of the same size with other
    ids (a retrained or permuted vocabulary) does not. Special tokens added on top (`added_tokens`) are part of it.

    Raises:
        ValueError: the tokenizer is empty (`get_tokenizer`).
    """
    vocab = get_tokenizer(path).get_vocab()
    digest = hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()).hexdigest()
    return len(vocab), digest
