"""Byte-capped buckets of `(name, tensor)` pairs: the unit in which trainers push weights to the engines.

Both training backends stream full HF-named tensors through `iter_buckets`, so a rank never holds more than one
bucket of gathered tensors (`--update-weight-buffer-size`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

__all__ = ["iter_buckets"]


def iter_buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Groups `(name, tensor)` pairs, in order, into lists of at most `bucket_bytes` bytes.

    A tensor larger than `bucket_bytes` gets a bucket of its own. `named` is consumed lazily: one bucket is
    materialized at a time.

    Raises:
        ValueError: `bucket_bytes` ≤ 0 (names `--update-weight-buffer-size`).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size (--update-weight-buffer-size) must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
