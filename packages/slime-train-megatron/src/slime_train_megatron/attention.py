"""Core attention for megatron-core's local layer spec that runs packed (THD) rows without a dense mask.

megatron-core's own local `DotProductAttention` rejects `PackedSeqParams`, so without Transformer Engine the
backend used to run a packed micro-batch as one sequence with a `[T, T]` block-diagonal causal mask: every
layer materializes `[heads, T, T]` scores and probabilities (fp32 softmax), repeats K/V to all heads and
keeps the probabilities for the backward, so cost and memory grow with `T²` of the whole row instead of
`Σ s²` of its sequences. `PackedCoreAttention` takes the row in THD layout (what megatron-core's `Attention`
hands a core attention when `packed_seq_params.qkv_format == "thd"`, after per-sequence RoPE) and runs:

- on CUDA in bf16/fp16: `torch.nn.attention.varlen.varlen_attn` (flash-attention varlen kernel; causal;
  native GQA, K/V are never repeated);
- otherwise (CPU, fp32): an exact fallback, one causal SDPA call per sequence.

It is selected by `--attention-backend auto|flash` with the local spec (see `attention_kind`);
`--attention-backend local` keeps megatron-core's `DotProductAttention` and the dense mask.

Legend: `T` packed row length, `N` sequences, `H`/`Hkv` query/key-value heads of this TP rank, `D` head dim.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

# Re-exported: the check is pure, in settings, where the backend's preflight reads it without megatron-core.
from slime_train_megatron.settings import AttentionKind, attention_kind

logger = logging.getLogger(__name__)

__all__ = ["AttentionKind", "PackedCoreAttention", "attention_kind", "packed_causal_attention"]

_FLASH_DTYPES = (torch.bfloat16, torch.float16)
_FLASH_MAX_HEAD_DIM = 256  # flash-attention's largest head dim


def _sdpa_per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], scale: float):
    """Exact path: causal SDPA on each sequence; `[T, H, D]`, `[T, Hkv, D]` ×2 → `[T, H, D]`."""
    outs = []
    for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True):
        # [n, heads, D] → [1, heads, n, D]
        qs, ks, vs = (t.transpose(0, 1)[None] for t in (qs, ks, vs))
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        outs.append(out[0].transpose(0, 1))
    return torch.cat(outs)


def _flash_applies(query: torch.Tensor) -> bool:
    """Whether `packed_causal_attention` takes the flash varlen kernel for this `[T, H, D]` query."""
    return query.device.type == "cuda" and query.dtype in _FLASH_DTYPES and query.shape[-1] <= _FLASH_MAX_HEAD_DIM


def packed_causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    scale: float,
    lengths: list[int] | None = None,
) -> torch.Tensor:
    """Causal attention inside each sequence of a packed row (no attention across sequences).

    Args:
        query: `[T, H, D]`.
        key: `[T, Hkv, D]` with `H % Hkv == 0` (grouped-query attention, no repetition needed).
        value: `[T, Hkv, D]`.
        cu_seqlens: `[N + 1]` int32 cumulative sequence starts on the row's device, `cu_seqlens[-1] == T`.
        max_seqlen: longest sequence (flash-attention's tile scheduling bound).
        scale: softmax scale (`D ** -0.5` for standard attention).
        lengths: the N sequence lengths on the host when the caller has them (saves a device sync on the
            fallback path); derived from `cu_seqlens` otherwise.

    Returns:
        `[T, H, D]` in the query's dtype. On CUDA with bf16/fp16 and `D ≤ 256`: flash varlen kernel; otherwise
        per-sequence SDPA (exact up to float rounding of the softmax).

    Raises:
        ValueError: mismatched shapes, or `cu_seqlens` not covering the row.
    """
    if query.dim() != 3 or key.shape != value.shape or key.shape[0] != query.shape[0]:
        raise ValueError(
            f"packed attention expects q [T, H, D], k/v [T, Hkv, D]; got {tuple(query.shape)}, "
            f"{tuple(key.shape)}, {tuple(value.shape)}"
        )
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"{query.shape[1]} query heads are not a multiple of {key.shape[1]} key-value heads")
    if _flash_applies(query):
        from torch.nn.attention.varlen import varlen_attn

        q, k, v = (t.contiguous() for t in (query, key, value))
        # window (-1, 0): causal (no look-ahead, unbounded look-back).
        return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scale, window_size=(-1, 0))
    if lengths is None:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    if sum(lengths) != query.shape[0]:
        raise ValueError(f"sequence lengths sum to {sum(lengths)}, but the packed row has {query.shape[0]} tokens")
    return _sdpa_per_sequence(query, key, value, lengths, scale)


class PackedCoreAttention(MegatronModule):
    """Drop-in `core_attention` of megatron-core's local spec that runs THD rows through `packed_causal_attention`.

    Same constructor and forward signature as megatron-core's `DotProductAttention`.

    Supports what slime's models use: causal self-attention, no dropout, no attention bias, no sliding window,
    vanilla softmax, TP (heads split by megatron-core before this module), no context parallelism.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
    ) -> None:
        """Checks the configuration; raises ValueError naming what this attention does not implement."""
        super().__init__(config=config)
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        unsupported = {
            "context parallelism": config.context_parallel_size > 1,
            f"attention dropout {dropout}": bool(dropout),
            f"attention mask type {attn_mask_type.name}": attn_mask_type != AttnMaskType.causal,
            f"{attention_type} attention": attention_type != "self",
            "sliding-window attention": config.window_size is not None,
            f"softmax type {config.softmax_type}": config.softmax_type != "vanilla",
        }
        bad = [name for name, hit in unsupported.items() if hit]
        if bad:
            raise ValueError(
                f"slime's packed core attention does not implement {', '.join(bad)}: use --attention-backend local "
                "(megatron-core's DotProductAttention) or Transformer Engine"
            )
        self.layer_number = max(1, layer_number)
        head_dim = divide(config.kv_channels * config.num_attention_heads, config.num_attention_heads)
        # DotProductAttention divides by the layer number under query-key layer scaling and multiplies it back
        # inside its softmax: the effective scale is the unscaled one.
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        """Attention output, flattened over heads.

        Args:
            query: THD `[T, H, D]` with `packed_seq_params`, else `[s, b, H, D]`.
            key: `[T, Hkv, D]` / `[s, b, Hkv, D]`.
            value: as key.
            attention_mask: ignored for THD rows (the boundaries come from `packed_seq_params`); for `[s, b]`
                inputs a boolean mask broadcastable to `[b, H, s, s]` (True = masked, megatron's convention),
                or None for causal.
            attn_mask_type: unused (causal, fixed by the layer spec).
            attention_bias: must be None.
            packed_seq_params: THD row description: `cu_seqlens_q` (on the device) and `max_seqlen_q`;
                `cu_seqlens_q_padded`, when on the host, gives the lengths to the fallback without a sync.

        Returns:
            `[T, H·D]` for THD rows, `[s, b, H·D]` otherwise.

        Raises:
            ValueError: an attention bias, or a non-THD packed format.
        """
        if attention_bias is not None:
            raise ValueError("slime's packed core attention does not implement an attention bias")
        if packed_seq_params is None:
            return self._dense(query, key, value, attention_mask)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed core attention needs qkv_format 'thd', got {packed_seq_params.qkv_format!r}")
        host_cu = packed_seq_params.cu_seqlens_q_padded
        lengths = None
        # Only the exact fallback reads the lengths; under --megatron-compile-layers a `.tolist()` is a graph break.
        if host_cu is not None and host_cu.device.type == "cpu" and not _flash_applies(query):
            lengths = (host_cu[1:] - host_cu[:-1]).tolist()
        out = packed_causal_attention(
            query,
            key,
            value,
            packed_seq_params.cu_seqlens_q,
            int(packed_seq_params.max_seqlen_q),
            scale=self.softmax_scale,
            lengths=lengths,
        )
        return out.reshape(out.shape[0], -1)

    def _dense(self, query, key, value, attention_mask) -> torch.Tensor:
        """Unpacked `[s, b, heads, D]` inputs through SDPA (causal, or the given mask)."""
        s, b = query.shape[:2]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, D]
        if attention_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=~attention_mask.bool(), scale=self.softmax_scale, enable_gqa=True
            )
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)
