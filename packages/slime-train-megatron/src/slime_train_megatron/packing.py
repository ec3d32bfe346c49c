"""THD packing of variable-length samples for megatron-core (`qkv_format="thd"`).

Samples of a micro-batch are concatenated into one row `[1, T]` (no padding waste) and described by
cumulative sequence lengths for the attention kernel; positions restart at 0 for each sample. Each
sample is padded to a multiple of `pad_multiple` (TP for sequence parallelism; 2×CP for context
parallelism's load-balanced split). Padding follows the real tokens, so causal attention keeps it
from influencing them.

Legend: `N` samples, `T_i` real length, `P_i` padded length, `T = Σ P_i`, `R = Σ L_i` response tokens.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["PackedBatch", "cp_zigzag_indices", "pack_thd"]


@dataclasses.dataclass(kw_only=True, slots=True)
class PackedBatch:
    """One packed micro-batch.

    Attributes:
        tokens: `[1, T]` int64 token ids (pad id 0 after each sample).
        position_ids: `[1, T]` int64, restarting at 0 per sample.
        cu_seqlens: `[N + 1]` int32 cumulative padded lengths (`cu_seqlens[i]` = start of sample i).
        total_lengths: N ints `T_i`.
        response_lengths: N ints `L_i`.
        logit_index: `[R]` int64 positions whose logits predict the response tokens (sample order).
        targets: `[R]` int64 the response token ids.
    """

    tokens: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    total_lengths: list[int]
    response_lengths: list[int]
    logit_index: torch.Tensor
    targets: torch.Tensor

    @property
    def max_seqlen(self) -> int:
        """Longest padded sample."""
        return int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max()) if len(self.cu_seqlens) > 1 else 0


def pack_thd(tokens: list[torch.Tensor], response_lengths: list[int], *, pad_multiple: int = 1) -> PackedBatch:
    """Packs samples into one THD row.

    Args:
        tokens: N tensors `[T_i]` int64 (prompt + response).
        response_lengths: N ints `L_i` with 1 ≤ L_i < T_i (the first token is never predicted).
        pad_multiple: each sample is padded to a multiple of this.

    Returns:
        The packed batch; response logits of sample i are at `cu_seqlens[i] + T_i - L_i - 1 + t`, t < L_i.

    Raises:
        ValueError: mismatched lists, or a response length outside [1, T_i).
    """
    if len(tokens) != len(response_lengths):
        raise ValueError(f"{len(tokens)} token tensors but {len(response_lengths)} response lengths")
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple must be ≥ 1, got {pad_multiple}")
    pieces, positions, logit_index, targets = [], [], [], []
    cu = [0]
    for i, (t, resp) in enumerate(zip(tokens, response_lengths, strict=True)):
        total = int(t.numel())
        if not 0 < resp < total:
            raise ValueError(f"sample {i}: response length {resp} must be in [1, {total})")
        padded = -(-total // pad_multiple) * pad_multiple
        start = cu[-1]
        pieces += [t.long().reshape(-1), torch.zeros(padded - total, dtype=torch.long)]
        positions.append(torch.arange(padded, dtype=torch.long))
        logit_index.append(torch.arange(start + total - resp - 1, start + total - 1, dtype=torch.long))
        targets.append(t.long().reshape(-1)[total - resp :])
        cu.append(start + padded)

    def cat(xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs) if xs else torch.zeros(0, dtype=torch.long)

    return PackedBatch(
        tokens=cat(pieces)[None],
        position_ids=cat(positions)[None],
        cu_seqlens=torch.tensor(cu, dtype=torch.int32),
        total_lengths=[int(t.numel()) for t in tokens],
        response_lengths=list(response_lengths),
        logit_index=cat(logit_index),
        targets=cat(targets),
    )


def cp_zigzag_indices(cu_seqlens: torch.Tensor, cp_rank: int, cp_size: int) -> torch.Tensor:
    """Positions of the packed row that context-parallel rank `cp_rank` holds.

    Megatron/TE's load-balanced THD split: each sample (padded length divisible by 2·CP) is cut into
    2·CP equal chunks and rank r keeps chunks r and 2·CP−1−r, so causal attention work is even.

    Args:
        cu_seqlens: `[N + 1]` cumulative padded lengths.
        cp_rank: this rank in the CP group.
        cp_size: CP degree.

    Returns:
        `[T / CP]` int64 indices into the packed row, in the order the rank's local row is laid out.

    Raises:
        ValueError: a sample length not divisible by 2·CP.
    """
    out = []
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        length = end - start
        if length % (2 * cp_size):
            raise ValueError(f"packed sample length {length} is not divisible by 2×CP = {2 * cp_size}")
        chunk = length // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            out.append(torch.arange(start + c * chunk, start + (c + 1) * chunk, dtype=torch.long))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)
