"""Tensor-parallel sharding of full Megatron tensors and its inverse.

Megatron splits column-parallel weights (QKV, fc1, embedding, LM head) along dim 0 and row-parallel
ones (proj, fc2) along dim 1. The SwiGLU `linear_fc1` is special: rank r holds `[gate_r; up_r]`, so the
full `[gate; up]` is not a plain concatenation of the shards. QKV rows are grouped per KV head, so a
dim-0 split keeps whole groups and plain concatenation inverts it.
"""

from __future__ import annotations

import torch

__all__ = ["merge_tp_shards", "shard_for_tp"]


def shard_for_tp(full: torch.Tensor, rank: int, size: int, *, partition_dim: int, gated: bool = False) -> torch.Tensor:
    """This TP rank's slice of a full Megatron tensor.

    Args:
        full: the unsharded tensor (e.g. from `slime_convert.mapping.mcore_tensor_from_hf`).
        rank: TP rank.
        size: TP degree.
        partition_dim: 0 for column-parallel, 1 for row-parallel.
        gated: the tensor is a fused `[gate; up]` fc1 (each rank gets `[gate_r; up_r]`).

    Returns:
        The contiguous shard.

    Raises:
        ValueError: the partitioned dim is not divisible by `size` (×2 when gated).
    """
    dim_size = full.shape[partition_dim]
    if dim_size % (size * (2 if gated else 1)):
        raise ValueError(
            f"dim {partition_dim} of size {dim_size} is not divisible by TP={size}{' ×2 (gated)' if gated else ''}"
        )
    if gated:
        gate, up = full.chunk(2, dim=partition_dim)
        return torch.cat(
            [gate.chunk(size, dim=partition_dim)[rank], up.chunk(size, dim=partition_dim)[rank]], dim=partition_dim
        ).contiguous()
    return full.chunk(size, dim=partition_dim)[rank].contiguous()


def merge_tp_shards(shards: list[torch.Tensor], *, partition_dim: int, gated: bool = False) -> torch.Tensor:
    """Inverse of `shard_for_tp`: the full tensor from all ranks' shards (rank order)."""
    if not gated:
        return torch.cat(shards, dim=partition_dim)
    halves = [s.chunk(2, dim=partition_dim) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=partition_dim)
