"""Tensor transforms between Hugging Face and Megatron-core layouts.

Megatron fuses q/k/v into one `linear_qkv` whose rows are grouped per key/value head: for each of the
G groups, the H/G query heads of that group, then its key head, then its value head
(`[G, H/G + 2, head_dim, ...]`), so that a tensor-parallel split along rows keeps whole groups.
Gate and up projections of SwiGLU are concatenated (`[gate; up]`). Embedding and LM-head rows are
padded to a multiple of 128×TP. Every function is the exact inverse of its partner (bit-identical).
"""

from __future__ import annotations

import torch

__all__ = ["fuse_gate_up", "fuse_qkv", "pad_vocab", "split_gate_up", "split_qkv", "unpad_vocab"]


def fuse_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, num_heads: int, num_groups: int, head_dim: int
) -> torch.Tensor:
    """Interleaves HF q/k/v projections into Megatron's `linear_qkv` layout.

    Works for weights (`[out, hidden]`) and biases (`[out]`).

    Args:
        q: `[H·d, *rest]` query projection.
        k: `[G·d, *rest]` key projection.
        v: `[G·d, *rest]` value projection.
        num_heads: H query heads.
        num_groups: G key/value heads (H % G == 0).
        head_dim: d.

    Returns:
        `[G·(H/G + 2)·d, *rest]`, rows ordered group by group as (q heads of g, k_g, v_g).

    Raises:
        ValueError: shapes inconsistent with H, G, d.
    """
    if num_heads % num_groups:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_groups={num_groups}")
    rest = tuple(q.shape[1:])
    expected = {"q": num_heads * head_dim, "k": num_groups * head_dim, "v": num_groups * head_dim}
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[0] != expected[name] or tuple(t.shape[1:]) != rest:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({expected[name]}, *{rest})")
    per_group = num_heads // num_groups * head_dim
    return torch.cat(
        [
            q.reshape(num_groups, per_group, *rest),
            k.reshape(num_groups, head_dim, *rest),
            v.reshape(num_groups, head_dim, *rest),
        ],
        dim=1,
    ).reshape(-1, *rest)


def split_qkv(
    qkv: torch.Tensor, *, num_heads: int, num_groups: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `fuse_qkv`.

    Args:
        qkv: `[G·(H/G + 2)·d, *rest]` Megatron `linear_qkv` weight or bias.
        num_heads: H.
        num_groups: G.
        head_dim: d.

    Returns:
        `(q [H·d, *rest], k [G·d, *rest], v [G·d, *rest])`, contiguous.

    Raises:
        ValueError: the row count is not `G·(H/G + 2)·d`.
    """
    per_group = num_heads // num_groups * head_dim
    rows = num_groups * (per_group + 2 * head_dim)
    if qkv.shape[0] != rows:
        raise ValueError(
            f"linear_qkv has {qkv.shape[0]} rows, expected {rows} (H={num_heads}, G={num_groups}, d={head_dim})"
        )
    rest = tuple(qkv.shape[1:])
    q, k, v = qkv.reshape(num_groups, per_group + 2 * head_dim, *rest).split([per_group, head_dim, head_dim], dim=1)
    return (
        q.reshape(-1, *rest).contiguous(),
        k.reshape(-1, *rest).contiguous(),
        v.reshape(-1, *rest).contiguous(),
    )


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`[F, hidden]` gate and up projections → Megatron `linear_fc1` `[2F, hidden]` (gate rows first).

    Raises:
        ValueError: different shapes.
    """
    if gate.shape != up.shape:
        raise ValueError(f"gate_proj {tuple(gate.shape)} and up_proj {tuple(up.shape)} differ in shape")
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `fuse_gate_up`: `[2F, hidden]` → `(gate [F, hidden], up [F, hidden])`.

    Raises:
        ValueError: odd row count.
    """
    if fc1.shape[0] % 2:
        raise ValueError(f"linear_fc1 has an odd number of rows ({fc1.shape[0]}); expected [gate; up]")
    gate, up = fc1.chunk(2, dim=0)
    return gate.contiguous(), up.contiguous()


def pad_vocab(weight: torch.Tensor, padded_rows: int) -> torch.Tensor:
    """Appends zero rows so `weight` (`[V, hidden]`) has `padded_rows` rows.

    Padding rows are never indexed by real tokens; zeros make their logits 0 before the model strips them.

    Raises:
        ValueError: `padded_rows` < V.
    """
    rows = weight.shape[0]
    if padded_rows < rows:
        raise ValueError(f"cannot pad {rows} vocabulary rows down to {padded_rows}")
    if padded_rows == rows:
        return weight
    return torch.cat([weight, weight.new_zeros(padded_rows - rows, *weight.shape[1:])], dim=0)


def unpad_vocab(weight: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Keeps the first `vocab_size` rows of a padded `[V_pad, hidden]` embedding or LM head.

    Raises:
        ValueError: fewer than `vocab_size` rows.
    """
    if weight.shape[0] < vocab_size:
        raise ValueError(f"tensor has {weight.shape[0]} rows, fewer than vocab_size={vocab_size}")
    return weight[:vocab_size].contiguous() if weight.shape[0] != vocab_size else weight
