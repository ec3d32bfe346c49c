"""The UTF-8 bytes of each generated token, for OpenAI's `logprobs.content[].bytes`.

OpenAI gives every token's own bytes so that a client can join tokens that split one character (an emoji is often
three Qwen tokens). Decoding a single id gives U+FFFD for such a piece, so its bytes were `[239, 191, 189]` three
times and the joined bytes did not decode to the text. Byte-level BPE vocabularies (GPT-2, Qwen, Llama 3) spell each
byte as one printable character; that table is inverted here. Other tokenizers, and added tokens outside the table,
fall back to the UTF-8 of the decoded id.
"""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = ["token_bytes"]


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-to-character table (its `bytes_to_unicode`), inverted.

    Printable Latin-1 bytes stand for themselves, the other 68 bytes for the characters from U+0100 on, in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    char_of_byte = {b: chr(b) for b in printable}
    others = (b for b in range(256) if b not in char_of_byte)
    char_of_byte.update({b: chr(256 + n) for n, b in enumerate(others)})
    return {c: b for b, c in char_of_byte.items()}


def _is_byte_level(tokenizer: Any) -> bool:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return False
    spec = json.loads(decoder.__getstate__())  # the decoder alone: a few bytes, not the vocabulary
    kinds = [spec.get("type"), *(d.get("type") for d in spec.get("decoders") or [])]
    return "ByteLevel" in kinds


def token_bytes(tokenizer: Any, ids: list[int]) -> list[list[int]]:
    """The bytes each of `ids` stands for; joined, they are the UTF-8 of the decoded text.

    Args:
        tokenizer: a Hugging Face tokenizer.
        ids: `[R]` generated token ids.

    Returns:
        `[R]` lists of byte values (0-255).
    """
    table = _byte_of_char() if _is_byte_level(tokenizer) else {}
    out = []
    for token_id, piece in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True):
        if table and isinstance(piece, str) and piece and all(c in table for c in piece):
            out.append([table[c] for c in piece])
        else:
            out.append(list(tokenizer.decode([token_id]).encode()))
    return out
