"""Validation and concatenation of a micro-batch's per-sample tensors (private helper)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def concat_per_sample(name: str, tensors: Sequence[torch.Tensor], lengths: Sequence[int]) -> torch.Tensor:
    """Concatenate N `[L_i]` tensors to `[Σ L_i]` float32, checking each length.

    Raises:
        ValueError: naming `name` and the sample when a count or a length does not match.
    """
    if len(tensors) != len(lengths):
        raise ValueError(f"{name} has {len(tensors)} entries, expected {len(lengths)} (one per sample)")
    for i, (t, n) in enumerate(zip(tensors, lengths, strict=True)):
        if t.dim() != 1 or t.shape[0] != n:
            raise ValueError(f"{name}[{i}] has shape {tuple(t.shape)}, expected [{n}] (its loss mask's length)")
    if not tensors:
        return torch.zeros(0)
    return torch.cat([t.float() for t in tensors])
