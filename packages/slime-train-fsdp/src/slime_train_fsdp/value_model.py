"""The PPO critic's value model: the policy's decoder with a scalar value head, and its packed forward.

`ValueModel` holds the Hugging Face backbone (`AutoModel`: the causal LM without `lm_head`) under the name
`model`, so its parameters keep the causal LM's checkpoint names (`model.layers.0...`), and a
`value_head = Linear(hidden, 1)` (with bias, as the original's critic `output_layer`). Built from any HF
causal-LM checkpoint: the backbone loads from it, the head comes from the checkpoint when it has one
(`value_head.*`, or `score.*` of an HF token-classification / reward model) and is otherwise initialized as the
original does (weight ~ N(0, initializer_range), bias 0).

The value of response token t is read at the position that predicts it (the state before the token is
emitted), the positions the log-probs use; values are computed in fp32 and, unlike log-probs, never divided by
the sampling temperature (the original's `get_values`).

Legend: `S` packed row length, `R` response tokens in it, `H` hidden size.
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import register_fsdp_forward_method
from transformers import AutoModel, PretrainedConfig

from slime_train_fsdp.attention import packed_attention_kwargs
from slime_train_fsdp.context_parallel import gather_response_values, shard_row
from slime_train_fsdp.packing import ForwardOptions, PackedMicroBatch

__all__ = ["ValueModel", "construct_value_model", "fill_value_head", "install_value_forward", "response_values"]

_FORWARD_METHOD = "slime_value_forward"
_OPTIONS_ATTR = "slime_forward_options"
_HEAD_ALIASES = ("value_head", "score")  # our critic checkpoints, HF token-classification / reward models


class ValueModel(nn.Module):
    """Decoder backbone + scalar value head.

    Args:
        backbone: the HF base model (`AutoModel.from_config`), stored as `model`.
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.model = backbone
        self.config: PretrainedConfig = backbone.config
        self.value_head = nn.Linear(self.config.hidden_size, 1, bias=True)
        # What FSDP unit selection and HF-style helpers read on the root module.
        self._no_split_modules = list(getattr(backbone, "_no_split_modules", None) or [])

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        """Activation checkpointing of the backbone's decoder layers (HF's method)."""
        self.model.gradient_checkpointing_enable(**kwargs)


def construct_value_model(config: PretrainedConfig, attn: str) -> ValueModel:
    """`build_fsdp_model`'s `construct` for the critic: the value model of an HF config (fp32)."""
    return ValueModel(AutoModel.from_config(config, attn_implementation=attn, dtype=torch.float32))


def fill_value_head(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`build_fsdp_model`'s `fill_missing` for the critic: the value head from the checkpoint or freshly drawn.

    Args:
        model: the value model.
        state: the checkpoint's tensors (HF names).

    Returns:
        `{"value_head.weight": [1, H], "value_head.bias": [1]}`: the checkpoint's `value_head.*` / `score.*` when it
        has a `[1, H]` head, else weight ~ N(0, `initializer_range` (0.02)) and bias 0.
    """
    hidden = model.config.hidden_size
    for prefix in _HEAD_ALIASES:
        weight = state.get(f"{prefix}.weight")
        if weight is not None and tuple(weight.shape) == (1, hidden):
            bias = state.get(f"{prefix}.bias")
            return {"value_head.weight": weight, "value_head.bias": bias if bias is not None else torch.zeros(1)}
    std = float(getattr(model.config, "initializer_range", None) or 0.02)
    generator = torch.Generator().manual_seed(0)  # rank 0 draws; the others receive it with the weights
    return {
        "value_head.weight": torch.randn(1, hidden, generator=generator) * std,
        "value_head.bias": torch.zeros(1),
    }


def _value_forward(
    self: ValueModel,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    predict_index: torch.Tensor,
    targets: torch.Tensor,
    seq_lengths: list[int] | None = None,
    response_lengths: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward of a packed row: values `[R]` fp32 at the response positions, and a zero anchor on every parameter."""
    opts: ForwardOptions = getattr(self, _OPTIONS_ATTR)
    lengths = list(seq_lengths) if seq_lengths else [int(input_ids.shape[-1])]
    group, shard = opts.cp_group, None
    if group is not None:
        shard = shard_row(input_ids, position_ids, predict_index, targets, lengths, dist.get_rank(group),
                          dist.get_world_size(group), response_lengths)  # fmt: skip
        input_ids, position_ids, predict_index = shard.input_ids, shard.position_ids, shard.predict_index
        lengths = shard.seq_lengths
    attn_kwargs = packed_attention_kwargs(lengths, input_ids.device, self.config._attn_implementation)
    if group is not None:
        attn_kwargs["slime_cp_group"] = group
    out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **attn_kwargs)
    hidden = out.last_hidden_state[0]  # [S, H] (this rank's slice under CP)
    head = self.value_head
    anchor = (hidden[:1, :1].float().sum() + head.weight[:1, :1].float().sum()) * 0.0
    h_resp = hidden.index_select(0, predict_index).float()  # [R, H]
    values = torch.nn.functional.linear(h_resp, head.weight.float(), head.bias.float()).squeeze(-1)  # [R]
    if shard is not None:
        values = gather_response_values(values, shard.counts, group)
    return values, anchor


def install_value_forward(model: nn.Module, options: ForwardOptions) -> None:
    """`build_fsdp_model`'s `install` for the critic: adds `model.slime_value_forward` as an FSDP forward method."""
    setattr(model, _OPTIONS_ATTR, options)
    setattr(model, _FORWARD_METHOD, types.MethodType(_value_forward, model))
    register_fsdp_forward_method(model, _FORWARD_METHOD)


def response_values(model: nn.Module, mb: PackedMicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Values `[R]` fp32 of a packed micro-batch's response tokens (all of them on every CP rank) and the anchor."""
    fn = getattr(model, _FORWARD_METHOD)
    return fn(mb.input_ids, mb.position_ids, mb.predict_index, mb.targets, mb.seq_lengths, mb.response_lengths)
