"""megatron-core 0.16 pieces that dynamo cannot trace, replaced for `--megatron-compile-layers` (same numbers).

A compiled decoder layer breaks its graph wherever megatron-core calls something dynamo cannot trace; each break
splits the layer into more graphs (more to compile, less to fuse, more launches). `use_traceable_layer_pieces`
(called by `model.compile_decoder_layers`) puts two replacements in the megatron-core modules that call them:

- `tp_group_or_default`: `RowParallelLinear.forward` passes `tp_group=None` to the linear function, which resolves
  it on every call through `get_tensor_model_parallel_group_if_none`; megatron-core's version calls `warnings.warn`
  on rank 0 each time (a builtin dynamo does not trace).
- `packed_rotary_pos_emb`: RoPE of packed (THD) rows reads the sequence lengths to the host (`.tolist()`), splits
  the rows per sequence and concatenates each one's slice of the frequencies. Here each row's position in its
  sequence is computed as a tensor (`arange(T) − start of its sequence`) and the frequencies are gathered at those
  positions: the same `[T, 1, 1, D]` frequencies, applied by megatron-core's own `_apply_rotary_pos_emb_bshd`.

CPU, tiny Qwen3, `aot_eager`: the graph breaks of one compiled step went 45 → 23 with the first.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.tensor_parallel import layers as mcore_layers
from megatron.core.transformer import attention as mcore_attention

__all__ = ["packed_rotary_pos_emb", "tp_group_or_default", "use_traceable_layer_pieces"]

from slime_train_megatron.module_patch import ModulePatch

_TP_GROUP = ModulePatch(mcore_layers, "get_tensor_model_parallel_group_if_none")
_ROPE = ModulePatch(mcore_attention, "apply_rotary_pos_emb")


def tp_group_or_default(tp_group: Any, is_expert: bool = False, check_initialized: bool = True) -> Any:
    """megatron-core's `get_tensor_model_parallel_group_if_none` without its deprecation warning.

    Returns:
        None without torch.distributed; `tp_group` as given when parallel_state is not initialized or it is not
        None; else the (expert) tensor-parallel group of parallel_state.
    """
    if not dist.is_initialized():
        return None
    if not parallel_state.is_initialized() or tp_group is not None:
        return tp_group
    if is_expert:
        return parallel_state.get_expert_tensor_parallel_group(check_initialized=check_initialized)
    return parallel_state.get_tensor_model_parallel_group(check_initialized=check_initialized)


def packed_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    config: Any,
    cu_seqlens: torch.Tensor | None = None,
    mscale: float = 1.0,
    cp_group: Any = None,
) -> torch.Tensor:
    """megatron-core's `apply_rotary_pos_emb` with packed rows' positions computed on tensors (no host read).

    Args:
        t: `[T, heads, D]` packed rows (with `cu_seqlens`), else megatron-core's `[s, b, heads, D]`.
        freqs: `[max_s, 1, 1, D]` rotary angles (fp32) of positions 0..max_s-1.
        config: the layer's TransformerConfig (`rotary_interleaved`, `multi_latent_attention`, `apply_rope_fusion`).
        cu_seqlens: `[N + 1]` int32 starts of the packed sequences (`cu_seqlens[-1] == T`), on any device.
        mscale: YaRN's concentration factor (1.0 otherwise).
        cp_group: the context-parallel group.

    Returns:
        `t` with RoPE applied, as megatron-core computes it: position p of a sequence uses `freqs[p]`.

    Unpacked rows, RoPE fusion, context parallelism, frequencies laid out per packed row (megatron-core's
    offset mapping, `freqs.size(0) == T`) and boundaries on another device than the frequencies (the host copies
    an eager run passes: computing there would put host code in a compiled CUDA graph) go to megatron-core's own.
    """
    if cp_group is None:
        cp_group = parallel_state.get_context_parallel_group()
    total = t.shape[0]
    if (
        cu_seqlens is None
        or config.apply_rope_fusion
        or cp_group.size() != 1
        or freqs.shape[0] == total  # megatron-core maps these by offset (the same for one sequence)
        or cu_seqlens.device != freqs.device
    ):
        return _ROPE.original(t, freqs, config, cu_seqlens=cu_seqlens, mscale=mscale, cp_group=cp_group)
    cu = cu_seqlens.long()
    starts = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1], output_size=total)
    positions = torch.arange(total, device=cu.device) - starts
    return rope_utils._apply_rotary_pos_emb_bshd(
        t.unsqueeze(1),
        freqs[positions],
        rotary_interleaved=config.rotary_interleaved,
        multi_latent_attention=config.multi_latent_attention,
        mscale=mscale,
    ).squeeze(1)


def use_traceable_layer_pieces(on: bool = True) -> None:
    """Puts the traceable pieces where megatron-core's layers call them (process-wide), or megatron-core's back.

    `tp_group_or_default` in `megatron.core.tensor_parallel.layers`, `packed_rotary_pos_emb` in
    `megatron.core.transformer.attention`.
    """
    _TP_GROUP.use(tp_group_or_default, on)
    _ROPE.use(packed_rotary_pos_emb, on)
