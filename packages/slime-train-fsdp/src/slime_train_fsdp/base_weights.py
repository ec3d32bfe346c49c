"""Which base weights a LoRA checkpoint was trained on: a fingerprint of `--hf-checkpoint`'s safetensors files.

A LoRA `--save` checkpoint holds the adapters only; the frozen base is whatever `--hf-checkpoint` names at resume.
Resumed on another base (another model, or the same architecture fine-tuned differently), the adapters load without
a complaint (same names and shapes) and train on weights they were never fitted to. `checkpoint.model_flags_of`
records this fingerprint with the base's path, and a resume whose base has another one is refused naming both
paths; the same weights at another path (a copied model) resume.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib

__all__ = ["weights_fingerprint"]

_SAMPLE_BYTES = 1 << 16  # read at the start, middle and end of each file's tensor data


@functools.cache
def weights_fingerprint(model_dir: str) -> str | None:
    """sha256 over each `*.safetensors` file of `model_dir` (by name): its size, its header and three data samples.

    Cheap at any model size (a few 64 KiB reads per shard). Two different trainings of one architecture differ in
    every sampled tensor; the same files copied elsewhere give the same value.

    Args:
        model_dir: an HF model directory.

    Returns:
        The hex digest, or None when the directory has no safetensors files (nothing to compare).
    """
    files = sorted(pathlib.Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            digest.update(path.name.encode() + size.to_bytes(8, "little") + f.read(min(header_len, size)))
            start = 8 + header_len
            for at in (start, start + max(0, size - start - _SAMPLE_BYTES) // 2, max(start, size - _SAMPLE_BYTES)):
                f.seek(at, os.SEEK_SET)
                digest.update(f.read(_SAMPLE_BYTES))
    return digest.hexdigest()
