"""Attention for packed rows without a dense `S × S` mask: `slime_varlen` and `slime_flex`.

Both are registered with transformers' `AttentionInterface`, so `attn_implementation="slime_varlen"` (or
`"slime_flex"`) selects them like any built-in. Because they are not registered with the mask interface,
transformers builds no mask for them (`masking_utils._preprocess_mask_arguments` returns None for unknown
implementations): the sequence boundaries of the packed row come in as keyword arguments, computed once per
micro-batch by `packed_attention_kwargs` and passed to `model.model(...)`, from where transformers forwards them
to every attention call.

- `slime_varlen`: `torch.nn.attention.varlen.varlen_attn` (flash-attention varlen kernel, causal, native GQA)
  on CUDA.
- `slime_flex`: compiled `flex_attention` with a document-causal `BlockMask` built at block granularity (no
  `S × S` tensor); compiled once per process with dynamic shapes, so new row lengths do not recompile.
- On CPU both run an exact fallback: one causal SDPA call per packed sequence (fp32, what the tests use),
  wrapped in a custom op that takes the same `cu_seqlens` tensor as the CUDA kernel.

With context parallelism (`context_parallel.py`) each rank holds a contiguous slice of the row; the attention
call then exchanges heads for sequence (Ulysses all-to-all) around the same kernels.

Legend: `S` = packed row length, `N` = sequences in the row, `H`/`Hkv` = query/key-value heads, `D` = head dim.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface

from slime_core.host_to_device import to_device

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CUDA_ATTENTION",
    "SLIME_FLEX",
    "SLIME_VARLEN",
    "document_block_mask",
    "packed_attention_kwargs",
    "packed_cu_seqlens",
    "register_attention",
    "slime_attention_forward",
    "varlen_rows",
]

SLIME_VARLEN = "slime_varlen"
SLIME_FLEX = "slime_flex"
# What `--attn-implementation` means on CUDA when unset; pick it from `benchmarks/probe_fsdp_speed.py`.
DEFAULT_CUDA_ATTENTION = SLIME_VARLEN
FLEX_BLOCK = 128  # flex_attention's sparse block size (`_DEFAULT_SPARSE_BLOCK_SIZE`)


def register_attention() -> None:
    """Registers `slime_varlen` and `slime_flex` with transformers (idempotent; process-wide)."""
    AttentionInterface.register(SLIME_VARLEN, functools.partial(slime_attention_forward, kind=SLIME_VARLEN))
    AttentionInterface.register(SLIME_FLEX, functools.partial(slime_attention_forward, kind=SLIME_FLEX))


def packed_cu_seqlens(seq_lengths: list[int], device: torch.device) -> torch.Tensor:
    """`[N + 1]` int32 cumulative starts `[0, L_0, L_0 + L_1, ...]` (flash-attention's `cu_seqlens`)."""
    cu = torch.zeros(len(seq_lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(seq_lengths, dtype=torch.int32).cumsum(0)
    # Pinned: `non_blocking` from pageable memory still waits for the stream (issue 26).
    return to_device(cu, device)


def packed_attention_kwargs(seq_lengths: list[int], device: torch.device, implementation: str) -> dict[str, Any]:
    """Keyword arguments for `model.model(...)` that describe a packed row to the attention calls.

    Computed once per micro-batch (not per layer). `cu_seq_lens_*` / `max_length_*` are transformers'
    `FlashAttentionKwargs`, so `flash_attention_2` uses them too (it then skips deriving them from `position_ids`
    in every layer); `slime_block_mask` serves the flex kernel. Nothing in the dict is a Python value that depends
    on the number of sequences (only the `[N + 1]` tensor's size, dynamic under compile): a tuple of lengths
    here made every compiled layer guard on its length and recompile for each new sequence count per micro-batch
    (8 recompiles, then eager; issue 26).

    Args:
        seq_lengths: lengths of the sequences of the row, in order; they sum to `S` (the full row, also under
            context parallelism).
        device: where the row lives.
        implementation: the model's attention implementation; other values than ours and `flash_attention_*` get
            an empty dict (sdpa/eager derive a dense mask from `position_ids`).

    Returns:
        The kwargs (possibly empty).
    """
    if implementation not in (SLIME_VARLEN, SLIME_FLEX) and not implementation.startswith("flash_attention"):
        return {}
    longest = max(seq_lengths)
    cu = packed_cu_seqlens(seq_lengths, device)
    kwargs: dict[str, Any] = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu}
    kwargs.update(max_length_q=longest, max_length_k=longest)
    if implementation == SLIME_FLEX and device.type == "cuda":
        kwargs["slime_block_mask"] = document_block_mask(seq_lengths, device)
    return kwargs


def _document_ids(seq_lengths: list[int], padded: int, device: torch.device) -> torch.Tensor:
    """`[padded]` int32 sequence index of every position; the tail beyond `S` is one extra document."""
    lengths = torch.tensor([*seq_lengths, padded - sum(seq_lengths)], dtype=torch.int64)
    return to_device(torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lengths), device)


def document_block_mask(seq_lengths: list[int], device: torch.device, block: int = FLEX_BLOCK):
    """Causal-within-document `BlockMask` for flex_attention, built from per-block document ranges.

    Documents are contiguous and increasing along the row, so a `(q block i, kv block j)` tile has an allowed
    pair iff `j == i` (the diagonal) or `j < i` and the last document of block j is the first of block i; it is
    fully allowed iff `j < i` and both blocks lie in one document. That costs `O((S / block)^2)` booleans, never
    an `S × S` mask. The `mask_mod` decides the partial tiles element-wise.

    Args:
        seq_lengths: sequence lengths of the row (sum `S`).
        device: device of the row.
        block: tile size (flex_attention's default sparse block size).

    Returns:
        A `BlockMask` with `Q_LEN = KV_LEN = S`, batch and head dimensions 1 (broadcast).
    """
    from torch.nn.attention.flex_attention import BlockMask

    total = sum(seq_lengths)
    num_blocks = -(-total // block)
    doc = _document_ids(seq_lengths, num_blocks * block, device)  # padded so that mask_mod never reads past it
    tiles = doc.view(num_blocks, block)
    first, last = tiles[:, 0], tiles[:, -1]  # [num_blocks] first/last document of each block
    i = torch.arange(num_blocks, device=device)
    below = i[None, :] < i[:, None]  # [q_block, kv_block] strictly below the diagonal
    any_pair = (below & (last[None, :] == first[:, None])) | torch.eye(num_blocks, dtype=torch.bool, device=device)
    single = first == last
    full = below & single[None, :] & single[:, None] & (first[None, :] == first[:, None])
    partial = any_pair & ~full

    def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Per q block: the count of selected kv blocks and their indices first (stable: ascending order).
        counts = dense.sum(-1, dtype=torch.int32)
        order = torch.argsort((~dense).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[None, None], order[None, None]

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(total, total))  # fmt: skip


def sdpa_per_sequence(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, seq_lengths: tuple[int, ...], scale: float | None
) -> torch.Tensor:
    """Exact reference/CPU path: causal SDPA on each packed sequence separately.

    Args:
        query: `[1, H, S, D]`.
        key: `[1, Hkv, S, D]` (`H % Hkv == 0`).
        value: `[1, Hkv, S, D]`.
        seq_lengths: lengths summing to `S`.
        scale: softmax scale (`D ** -0.5` when None).

    Returns:
        `[1, S, H, D]` (transformers' attention-function output layout).
    """
    outs = []
    start = 0
    for n in seq_lengths:
        sl = slice(start, start + n)
        outs.append(F.scaled_dot_product_attention(query[:, :, sl], key[:, :, sl], value[:, :, sl], is_causal=True,
                                                   scale=scale, enable_gqa=True))  # fmt: skip
        start += n
    return torch.cat(outs, dim=2).transpose(1, 2)


@torch.library.custom_op("slime::packed_sdpa", mutates_args=())
def packed_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """`sdpa_per_sequence` with the row layout as a `[N + 1]` int32 `cu_seqlens` tensor (the CPU fallback).

    A custom op, so a compiled decoder layer sees one opaque call with varlen_attn's inputs: its graph does not
    depend on the number of sequences, as on CUDA (the CPU tests then check the CUDA path's compile behaviour).
    Shapes as `sdpa_per_sequence`: `[1, H, S, D]` query, `[1, Hkv, S, D]` key/value, `[1, S, H, D]` output.
    """
    # Contiguous, as the fake kernel below says: inductor asserts the real output's strides (a transposed view
    # failed `assert_size_stride` under --fsdp-compile-layers on CPU).
    return sdpa_per_sequence(query, key, value, tuple(torch.diff(cu_seqlens).tolist()), scale).contiguous()


@packed_sdpa.register_fake
def _packed_sdpa_fake(query, key, value, cu_seqlens, scale):
    return query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])


def _packed_sdpa_setup(ctx, inputs, output) -> None:
    query, key, value, cu_seqlens, scale = inputs
    ctx.save_for_backward(query, key, value, cu_seqlens)
    ctx.scale = scale


@torch.library.custom_op("slime::packed_sdpa_backward", mutates_args=())
def packed_sdpa_backward(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of `packed_sdpa` wrt query, key and value: causal attention's backward per sequence, in fp32.

    For one sequence and head, with `P = softmax(scale Q K^T + causal mask)`, `O = P V` and `dO` the incoming
    gradient: `dV = P^T dO`, `dP = dO V^T`, `dS = P * (dP - rowsum(dP * P))`, `dQ = scale dS K`,
    `dK = scale dS^T Q` (FlashAttention, Dao et al. 2022, Algorithm 2); a KV head's gradients sum over the query
    heads that share it (GQA). A custom op, so that a compiled layer's backward sees one opaque call, as flash
    varlen's on CUDA: traced as plain code, the `.tolist()` of the lengths broke the layer's graph on CPU (inductor
    cannot lower `aten._local_scalar_dense`), into smaller graphs the CUDA path does not have.

    Args:
        grad: `[1, S, H, D]`, the gradient of `packed_sdpa`'s output.
        query: `[1, H, S, D]`.
        key: `[1, Hkv, S, D]` (`H % Hkv == 0`).
        value: `[1, Hkv, S, D]`.
        cu_seqlens: `[N + 1]` int32 sequence starts.
        scale: softmax scale (`D ** -0.5` when None).

    Returns:
        Contiguous `(dQ, dK, dV)` of the shapes and dtypes of query, key and value.
    """
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]
    group, scale = heads // kv_heads, dim**-0.5 if scale is None else scale
    q, k, v = query[0].float(), key[0].float(), value[0].float()  # [H, S, D], [Hkv, S, D]
    d_out = grad[0].transpose(0, 1).float()  # [H, S, D]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    bounds = cu_seqlens.tolist()
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        qs, do = q[:, a:b], d_out[:, a:b]  # [H, n, D]
        ks, vs = (t[:, a:b].repeat_interleave(group, dim=0) for t in (k, v))  # [H, n, D], as enable_gqa
        causal = torch.ones(b - a, b - a, dtype=torch.bool, device=q.device).tril()
        p = torch.softmax((qs @ ks.transpose(1, 2) * scale).masked_fill(~causal, float("-inf")), dim=-1)  # [H, n, n]
        dp = do @ vs.transpose(1, 2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        dq[:, a:b] = ds @ ks * scale
        dk[:, a:b] = (ds.transpose(1, 2) @ qs * scale).view(kv_heads, group, b - a, dim).sum(1)
        dv[:, a:b] = (p.transpose(1, 2) @ do).view(kv_heads, group, b - a, dim).sum(1)
    # Contiguous, as the fake kernel promises: inductor asserts the strides (key/value are transposed views).
    return tuple(d.to(t.dtype).unsqueeze(0).contiguous() for d, t in ((dq, query), (dk, key), (dv, value)))


@packed_sdpa_backward.register_fake
def _packed_sdpa_backward_fake(grad, query, key, value, cu_seqlens, scale):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _packed_sdpa_backward(ctx, grad: torch.Tensor):
    # Recompute the forward under autograd (CPU fallback only: exactness matters here, not speed).
    query, key, value, cu_seqlens = ctx.saved_tensors
    return (*packed_sdpa_backward(grad, query, key, value, cu_seqlens, ctx.scale), None, None)


packed_sdpa.register_autograd(_packed_sdpa_backward, setup_context=_packed_sdpa_setup)


def varlen_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
                scale: float | None) -> torch.Tensor:  # fmt: skip
    """Causal flash varlen attention of a packed row (CUDA): `[S, H, D]` out.

    Takes `[S, H, D]` query and `[S, Hkv, D]` key/value (GQA is native), the `[N + 1]` int32 `cu_seqlens` of the
    row (`packed_cu_seqlens`) and its longest sequence `max_len`.
    """
    from torch.nn.attention.varlen import varlen_attn

    # window (-1, 0): causal
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, scale=scale, window_size=(-1, 0))


def varlen_core(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kwargs: dict, scale: float | None):
    """Flash varlen attention over the row (CUDA): `[1, H, S, D]` inputs, `[1, S, H, D]` output."""
    q, k, v = (t.transpose(1, 2)[0].contiguous() for t in (query, key, value))  # [S, heads, D]
    return varlen_rows(q, k, v, kwargs["cu_seq_lens_q"], kwargs["max_length_q"], scale).unsqueeze(0)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # dynamic=True: one graph for every row length (the first call compiles once per process, not per shape).
    return torch.compile(flex_attention, dynamic=True)


def flex_core(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask, scale: float | None,
              compiled: bool = True) -> torch.Tensor:  # fmt: skip
    """flex_attention with a document `BlockMask`: `[1, H, S, D]` inputs, `[1, S, H, D]` output.

    `compiled=False` runs the eager (math) implementation, which is what the CPU tests use to check the mask.
    """
    if compiled:
        fn = _compiled_flex()
    else:
        from torch.nn.attention.flex_attention import flex_attention as fn
    out = fn(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def _lengths_from_positions(position_ids: torch.Tensor) -> tuple[int, ...]:
    """Sequence lengths of a packed row from its `[1, S]` position ids (restart at 0); syncs with the device."""
    starts = torch.nonzero(position_ids[0] == 0).flatten().tolist() + [position_ids.shape[-1]]
    return tuple(b - a for a, b in zip(starts[:-1], starts[1:], strict=True))


def _packed_core(kind: str, query, key, value, kwargs: dict, scale: float | None) -> torch.Tensor:
    """The attention kernel over one full row, by kind and device."""
    if query.device.type != "cuda":
        return packed_sdpa(query, key, value, kwargs["cu_seq_lens_q"], scale)
    if kind == SLIME_FLEX:
        return flex_core(query, key, value, kwargs["slime_block_mask"], scale)
    return varlen_core(query, key, value, kwargs, scale)


def slime_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    *,
    kind: str = SLIME_VARLEN,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention function for packed rows, registered with transformers (the signature of `sdpa_attention_forward`).

    Args:
        module: the attention module (unused beyond transformers' calling convention).
        query: `[1, H, S_local, D]` after rotary embedding (`S_local = S / cp` under context parallelism).
        key: `[1, Hkv, S_local, D]`.
        value: `[1, Hkv, S_local, D]`.
        attention_mask: must be None (a padded batch is not a packed row).
        dropout: must be 0 (no kernel here applies attention dropout).
        scaling: softmax scale.
        kind: `slime_varlen` or `slime_flex`.
        **kwargs: `packed_attention_kwargs(...)` of the row (or `position_ids` to derive the lengths from, one
            device sync per layer), and `slime_cp_group` under context parallelism.

    Returns:
        (`[1, S_local, H, D]` attention output, None).

    Raises:
        ValueError: for a mask, dropout, a sliding window or a batch of more than one row.
    """
    if attention_mask is not None or query.shape[0] != 1:
        raise ValueError(f"{kind} expects one packed row with attention_mask=None (use sdpa for padded batches)")
    if dropout:
        raise ValueError(f"{kind} does not implement attention dropout ({dropout})")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{kind} does not implement sliding-window attention")
    if "cu_seq_lens_q" not in kwargs:
        # Called outside `response_log_probs` (e.g. a plain HF forward): derive the row layout here.
        lengths = _lengths_from_positions(kwargs["position_ids"])
        kwargs = {**kwargs, **packed_attention_kwargs(list(lengths), query.device, kind)}
    group = kwargs.get("slime_cp_group")
    if group is None:
        return _packed_core(kind, query, key, value, kwargs, scaling), None
    from slime_train_fsdp.context_parallel import ulysses_attention

    core = functools.partial(_packed_core, kind, kwargs=kwargs, scale=scaling)
    return ulysses_attention(query, key, value, group, core), None
