"""Attention of a packed row as SGLang computed it: prompt positions by prefill, response positions by decode.

SGLang (triton backend, `--enable-deterministic-inference`) runs a sample's prompt through the unified 1-stage
extend kernel and each generated token through the split-KV decode kernel with a fixed split size. Both are
row-wise: a query's output depends only on its own keys/values, not on what else is batched. So the trainer
reproduces every position exactly by calling the same two kernels on the whole row at once:

* extend: one "request" per sequence whose new tokens are the prompt (prefix length 0; the unified kernel reads
  prefix and new KV through one index list, so a radix-cache hit in the engine gives the same result);
* decode: one "request" per response position `p`, whose KV is the sequence's tokens `0..p` (`kv_indptr` /
  `kv_indices` into the row's K/V), with SGLang's `num_kv_splits = ceil(len / split_tile_size)`.

`MirroredAttention` is a custom autograd function: the forward is those kernels (bit-exact), the backward
recomputes attention and differentiates that (gradients need to be right, not bit-identical): on CUDA with the
flash varlen kernel over the whole row (one call per layer, as the default trainer's attention), on CPU with
`scaled_dot_product_attention` per sequence. On CPU the forward is that same SDPA computation (the wiring stays
testable).

Legend: `T` tokens of the row, `Nq`/`Nkv` query/KV heads, `D` head dim, `B` sequences, `E`/`Q` prompt/response
positions of the row.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from slime_core.host_to_device import to_device_many
from slime_train_fsdp.attention import packed_cu_seqlens, varlen_rows
from slime_train_fsdp.true_on_policy.kernels import SGLangKernels

__all__ = ["AttentionPlan", "MirroredAttention", "plan_attention", "sdpa_packed"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AttentionPlan:
    """Which kernel serves each position of a packed row, with the index tensors the kernels read.

    Attributes:
        seq_lengths: `T_i` per sequence (sum `T`).
        cu_seqlens: `[B+1]` int32 cumulative sequence starts of the row (the varlen backward's layout).
        prompt_lengths: `P_i` per sequence: positions `< P_i` were prefilled, `>= P_i` decoded.
        extend_index: `[E]` int64 row positions of prompt tokens (extend queries, in order).
        extend_indptr: `[B+1]` int32 cumulative prompt lengths (query and KV offsets of each extend request).
        max_extend: `max(P_i)`.
        decode_index: `[Q]` int64 row positions of response tokens (one decode request each).
        decode_kv_indptr: `[Q+1]` int32 offsets into `decode_kv_indices`.
        decode_kv_indices: `[sum of KV lengths]` int64 row positions of each decode request's KV (its prefix).
        num_kv_splits: `[Q]` int32 `ceil(kv_len / split_tile_size)`.
        max_kv_splits: `max(num_kv_splits)` (sizes the split buffers; empty splits contribute nothing).
    """

    seq_lengths: list[int]
    cu_seqlens: torch.Tensor
    prompt_lengths: list[int]
    extend_index: torch.Tensor
    extend_indptr: torch.Tensor
    max_extend: int
    decode_index: torch.Tensor
    decode_kv_indptr: torch.Tensor
    decode_kv_indices: torch.Tensor
    num_kv_splits: torch.Tensor
    max_kv_splits: int


def plan_attention(
    seq_lengths: list[int], prompt_lengths: list[int], device: torch.device, split_tile_size: int = 256
) -> AttentionPlan:
    """Builds the plan of one packed row.

    Args:
        seq_lengths: `T_i` of each packed sequence, in row order.
        prompt_lengths: `P_i` of each (1 <= P_i <= T_i): tokens SGLang prefilled before decoding.
        device: where the index tensors live.
        split_tile_size: SGLang's decode split size (`SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE`).

    Raises:
        ValueError: lengths that disagree or a prompt length outside `[1, T_i]`.
    """
    if len(seq_lengths) != len(prompt_lengths):
        raise ValueError(f"{len(seq_lengths)} sequence lengths but {len(prompt_lengths)} prompt lengths")
    ext, ext_ptr, dec, kv_lens, kv_starts = [], [0], [], [], []
    start = 0
    for i, (t, p) in enumerate(zip(seq_lengths, prompt_lengths, strict=True)):
        if not 1 <= p <= t:
            raise ValueError(f"sequence {i}: prompt length {p} outside [1, {t}]")
        ext.append(torch.arange(start, start + p))
        ext_ptr.append(ext_ptr[-1] + p)
        dec.append(torch.arange(start + p, start + t))
        kv_lens.append(torch.arange(p + 1, t + 1))  # decode at position p sees tokens 0..p of its sequence
        kv_starts.append(torch.full((t - p,), start))
        start += t
    lens = torch.cat(kv_lens) if kv_lens else torch.zeros(0, dtype=torch.int64)
    starts = torch.cat(kv_starts) if kv_starts else torch.zeros(0, dtype=torch.int64)
    kv_ptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    # kv_indices = concat(arange(start_j, start_j + len_j)) without a Python loop over positions.
    offsets = torch.arange(int(kv_ptr[-1])) - torch.repeat_interleave(kv_ptr[:-1], lens)
    kv_idx = torch.repeat_interleave(starts, lens) + offsets
    splits = (lens + split_tile_size - 1) // split_tile_size
    empty = torch.zeros(0, dtype=torch.int64)
    # One non-blocking copy per dtype (`to_device_many`): six blocking copies per micro-batch waited for the GPU.
    extend_index, extend_indptr, decode_index, kv_indptr, kv_indices, kv_splits = to_device_many(
        [torch.cat(ext) if ext else empty, torch.tensor(ext_ptr, dtype=torch.int32), torch.cat(dec) if dec else empty,
         kv_ptr.to(torch.int32), kv_idx, splits.to(torch.int32)], device
    )  # fmt: skip
    return AttentionPlan(
        seq_lengths=list(seq_lengths),
        cu_seqlens=packed_cu_seqlens(seq_lengths, device),
        prompt_lengths=list(prompt_lengths),
        extend_index=extend_index,
        extend_indptr=extend_indptr,
        max_extend=max(prompt_lengths, default=0),
        decode_index=decode_index,
        decode_kv_indptr=kv_indptr,
        decode_kv_indices=kv_indices,
        num_kv_splits=kv_splits,
        max_kv_splits=int(splits.max()) if splits.numel() else 1,
    )


def sdpa_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lengths: list[int], scale: float):
    """Causal attention of each sequence of a packed row with `scaled_dot_product_attention` (GQA aware).

    Args:
        q: `[T, Nq, D]`.
        k: `[T, Nkv, D]`.
        v: `[T, Nkv, D]`.
        seq_lengths: `T_i` per sequence.
        scale: softmax scale (`D ** -0.5`).

    Returns:
        `[T, Nq, D]` in `q`'s dtype.
    """
    outs = []
    for qs, ks, vs in zip(q.split(seq_lengths), k.split(seq_lengths), v.split(seq_lengths), strict=True):
        o = F.scaled_dot_product_attention(
            qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1), is_causal=True, scale=scale, enable_gqa=True
        )
        outs.append(o.transpose(0, 1))
    return torch.cat(outs) if outs else q.new_zeros(q.shape)


def _sglang_forward(q, k, v, plan: AttentionPlan, scale: float, kernels: SGLangKernels) -> torch.Tensor:
    """The engine's kernels on the row (see the module docstring); `[T, Nq, D]` bf16."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    if plan.extend_index.numel():
        q_ext = q.index_select(0, plan.extend_index).contiguous()
        o_ext = torch.empty_like(q_ext)
        kernels.extend_unified(
            q_ext, o_ext, k, v, 1.0, 1.0,
            plan.extend_indptr, plan.extend_indptr, plan.extend_index,
            torch.zeros(len(plan.seq_lengths), dtype=torch.int32, device=q.device), plan.max_extend,
            sm_scale=scale, is_causal=True,
        )  # fmt: skip
        out.index_copy_(0, plan.extend_index, o_ext)
    if plan.decode_index.numel():
        q_dec = q.index_select(0, plan.decode_index).contiguous()
        o_dec = torch.empty_like(q_dec)
        n, heads, dim = q_dec.shape
        logits = torch.empty((n, heads, plan.max_kv_splits, dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((n, heads, plan.max_kv_splits), dtype=torch.float32, device=q.device)
        kernels.decode(
            q_dec, k, v, o_dec, plan.decode_kv_indptr, plan.decode_kv_indices, logits, lse,
            plan.num_kv_splits, plan.max_kv_splits, scale, 1.0, 1.0,
        )  # fmt: skip
        out.index_copy_(0, plan.decode_index, o_dec)
    return out


class MirroredAttention(torch.autograd.Function):
    """Forward: SGLang's prefill/decode kernels (CUDA) or SDPA (CPU); backward: recomputed and differentiated.

    The backward recomputes with flash varlen attention on CUDA (one call for the row; a loop of per-sequence SDPA
    calls there cost ~256 small launches per layer at the e2e shape) and per-sequence SDPA on CPU.

    `apply(q [T,Nq,D], k [T,Nkv,D], v [T,Nkv,D], plan, scale, kernels or None) -> [T,Nq,D]`.
    """

    @staticmethod
    def forward(ctx, q, k, v, plan: AttentionPlan, scale: float, kernels: SGLangKernels | None):  # noqa: D102
        ctx.save_for_backward(q, k, v)
        ctx.plan, ctx.scale = plan, scale
        if kernels is None:
            return sdpa_packed(q, k, v, plan.seq_lengths, scale)
        return _sglang_forward(q, k, v, plan, scale, kernels)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            q_, k_, v_ = (t.detach().requires_grad_(True) for t in (q, k, v))
            if q.device.type == "cuda":
                out = varlen_rows(q_, k_, v_, ctx.plan.cu_seqlens, max(ctx.plan.seq_lengths), ctx.scale)
            else:
                out = sdpa_packed(q_, k_, v_, ctx.plan.seq_lengths, ctx.scale)
            dq, dk, dv = torch.autograd.grad(out, (q_, k_, v_), grad_out)
        return dq, dk, dv, None, None, None
