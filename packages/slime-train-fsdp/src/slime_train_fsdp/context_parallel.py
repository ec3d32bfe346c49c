"""Context parallelism for packed rows: DeepSpeed-Ulysses all-to-all attention over the CP group.

`--context-parallel-size C` (the original slime's FSDP flag) splits the world into `world / C` data-parallel
groups of `C` consecutive ranks (`rank = dp_rank * C + cp_rank`, mesh `("dp", "cp")`, as the original's
`create_fsdp_parallel_state`). The `C` ranks of a group hold the same micro-batches; each runs the decoder on
a contiguous `1/C` slice of every packed row (`shard_row`). Everything but attention is per-token, so only
attention communicates: before the kernel an all-to-all turns `[H, S/C]` (all heads, my tokens) into
`[H/C, S]` (my heads, all tokens); the kernel then sees the whole row with its `cu_seqlens`; a second
all-to-all turns the output back (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509). It is exact:
the same attention on the same numbers, only spread over ranks. It needs `H % C == 0` and `Hkv % C == 0`.

Log-probs are computed on each rank for the response positions of its slice, then all-gathered over the
group (`gather_response_values`), so every CP rank holds the micro-batch's full `[R]` log-probs and computes
the same loss. Backward of that gather keeps only this rank's slice of the gradient (not a sum), so the
parameter gradient of a rank is the contribution of its tokens; FSDP (sharded over the whole world) then sums
them. The original slime reaches the same with ring attention (`ring_flash_attn`, CUDA only); all-to-all is
used here because it reuses the single-row kernels unchanged and runs on gloo (`all_to_all_single`).

Legend: `S` = packed row length (padded to a multiple of `C`), `C` = CP size, `R` = response positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

__all__ = ["RowShard", "gather_response_values", "response_counts", "shard_row", "ulysses_attention"]


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` on a `[C, ...]` tensor: chunk i goes to rank i, chunk j comes from rank j.

    The exchange is its own transpose, so backward sends the gradient chunks back the same way.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def _seq_to_head(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """`[1, Hx, S/C, D]` (all heads, my tokens) → `[1, Hx/C, S, D]` (my heads, all tokens)."""
    cp = dist.get_world_size(group)
    _, heads, local, dim = x.shape
    chunks = x[0].reshape(cp, heads // cp, local, dim)  # chunk i: head group i, sent to rank i
    got = _AllToAll.apply(chunks, group)  # chunk j: my head group, token slice j
    return got.transpose(0, 1).reshape(1, heads // cp, cp * local, dim)


def _head_to_seq(out: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """`[1, S, H/C, D]` (my heads, all tokens) → `[1, S/C, H, D]` (all heads, my tokens)."""
    cp = dist.get_world_size(group)
    _, total, heads, dim = out.shape
    chunks = out[0].reshape(cp, total // cp, heads, dim)  # chunk j: token slice j, sent to rank j
    got = _AllToAll.apply(chunks, group)  # chunk i: head group i of my tokens
    return got.transpose(0, 1).reshape(1, total // cp, cp * heads, dim)


def ulysses_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    group: dist.ProcessGroup,
    core: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Runs a full-row attention kernel on this rank's head group.

    Args:
        query: `[1, H, S/C, D]` of this rank's token slice.
        key: `[1, Hkv, S/C, D]`.
        value: `[1, Hkv, S/C, D]`.
        group: the CP group (ranks in token-slice order).
        core: attention over a full row, `[1, h, S, D]` ×3 → `[1, S, h, D]` (GQA inside).

    Returns:
        `[1, S/C, H, D]` attention output of this rank's tokens.

    Raises:
        ValueError: when the head counts are not divisible by the CP size.
    """
    cp = dist.get_world_size(group)
    if query.shape[1] % cp or key.shape[1] % cp:
        raise ValueError(
            f"--context-parallel-size {cp} must divide the attention heads ({query.shape[1]}) and the key-value "
            f"heads ({key.shape[1]})"
        )
    q, k, v = (_seq_to_head(t, group) for t in (query, key, value))
    return _head_to_seq(core(q, k, v), group)


@dataclasses.dataclass(kw_only=True, slots=True)
class RowShard:
    """This CP rank's slice of a packed row.

    Attributes:
        input_ids: `[1, S/C]` int64 tokens of the slice.
        position_ids: `[1, S/C]` int64.
        predict_index: `[r]` int64 positions, within the slice, that predict a response token.
        targets: `[r]` int64 the tokens predicted there.
        seq_lengths: sequence lengths of the whole padded row (sum `S`; the padding is one extra sequence).
        counts: response positions held by each CP rank (sum `R`), for the gather.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    predict_index: torch.Tensor
    targets: torch.Tensor
    seq_lengths: list[int]
    counts: list[int]


def response_counts(seq_lengths: Sequence[int], response_lengths: Sequence[int], local: int, cp_size: int) -> list[int]:
    """Response-predicting positions in each of the `cp_size` slices of `local` positions, from the lengths alone.

    Sample k of the row (offset `o_k`, length `T_k`, response `L_k`) predicts its response at positions
    `[o_k + T_k - L_k - 1, o_k + T_k - 1)` (`packing.pack_micro_batch`); computed on the host, so no device value
    is read.

    Args:
        seq_lengths: `T_k` of the packed samples, in row order.
        response_lengths: `L_k`, in the same order.
        local: positions per slice.
        cp_size: `C`.

    Returns:
        `C` counts (sum `Σ L_k`).

    Raises:
        ValueError: the two length lists differ in length.
    """
    if len(seq_lengths) != len(response_lengths):
        raise ValueError(f"{len(seq_lengths)} sequence lengths but {len(response_lengths)} response lengths")
    counts = [0] * cp_size
    offset = 0
    for total, resp in zip(seq_lengths, response_lengths, strict=True):
        first, end = offset + total - resp - 1, offset + total - 1
        for c in range(cp_size):
            counts[c] += max(0, min(end, (c + 1) * local) - max(first, c * local))
        offset += total
    return counts


def shard_row(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    predict_index: torch.Tensor,
    targets: torch.Tensor,
    seq_lengths: list[int],
    cp_rank: int,
    cp_size: int,
    response_lengths: Sequence[int] | None = None,
) -> RowShard:
    """Pads a packed row to a multiple of `C` and takes this rank's contiguous slice.

    Padding tokens (id 0, positions from 0) form their own sequence, so they attend only to each other and
    never predict a response token.

    Args:
        input_ids: `[1, S0]` int64 the packed row.
        position_ids: `[1, S0]` int64.
        predict_index: `[R]` int64 increasing positions that predict response tokens.
        targets: `[R]` int64.
        seq_lengths: lengths of the packed sequences (sum `S0`).
        cp_rank: this rank's index in the CP group.
        cp_size: `C`.
        response_lengths: the packed samples' response lengths (as `packing.pack_micro_batch` laid them out): the
            slices' counts then come from the lengths (`response_counts`); without them they are read from
            `predict_index` (one host-device sync on an accelerator).

    Returns:
        The slice.
    """
    total = int(input_ids.shape[-1])
    pad = -total % cp_size
    lengths = list(seq_lengths)
    if pad:
        filler = torch.arange(pad, dtype=input_ids.dtype, device=input_ids.device)[None]
        input_ids = torch.cat([input_ids, torch.zeros_like(filler)], dim=-1)
        position_ids = torch.cat([position_ids, filler], dim=-1)
        lengths.append(pad)
    local = (total + pad) // cp_size
    if response_lengths is not None:
        counts = response_counts(seq_lengths, response_lengths, local, cp_size)
    else:
        bounds = torch.arange(cp_size + 1, device=predict_index.device) * local
        counts = [int(c) for c in torch.bucketize(bounds, predict_index).diff().tolist()]  # one sync
    lo = cp_rank * local
    # `predict_index` increases, so this slice's positions are a contiguous run of it: a slice, where a boolean
    # mask would read its count back from the device.
    first = sum(counts[:cp_rank])
    run = slice(first, first + counts[cp_rank])
    return RowShard(
        input_ids=input_ids[:, lo : lo + local],
        position_ids=position_ids[:, lo : lo + local],
        predict_index=predict_index[run] - lo,
        targets=targets[run],
        seq_lengths=lengths,
        counts=counts,
    )


class _GatherSlices(torch.autograd.Function):
    """All-gather of variable-length `[r_c]` slices into `[R]`; backward returns this rank's slice."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, counts: list[int], group: dist.ProcessGroup) -> torch.Tensor:
        rank = dist.get_rank(group)
        ctx.start, ctx.count = sum(counts[:rank]), counts[rank]
        width = max(counts)
        padded = local.new_zeros(width)
        padded[: local.numel()] = local
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded, group=group)  # equal sizes: gloo's all_gather needs them
        return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Every CP rank computes the same loss from the gathered values, so the gradient of my slice is already
        # complete here; summing over ranks would count it C times.
        return grad[ctx.start : ctx.start + ctx.count], None, None


def gather_response_values(local: torch.Tensor, counts: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """Concatenates every CP rank's `[r_c]` values in rank (= row) order into `[R]` (differentiable).

    Args:
        local: `[r_c]` this rank's values (log-probs or entropies of its response positions).
        counts: `r_c` of every rank (from `shard_row`).
        group: the CP group.

    Returns:
        `[R]`, the same on every rank of the group.
    """
    if sum(counts) == 0:
        return local
    return _GatherSlices.apply(local, counts, group)
