"""The local layer spec's norms under `--sequence-parallel` when neither Transformer Engine nor Apex is installed.

megatron-core's local spec then builds its norms with `WrappedTorchNorm` (torch's `RMSNorm`/`LayerNorm`), which
asserts `not config.sequence_parallel` while the model is built ("sequence parallel not supported by torch LayerNorm"):
`--tensor-model-parallel-size 2 --sequence-parallel`, on every original launch script, stopped there on a machine
without TE or Apex (the GPU image and CPU CI have neither). What the assert guards is the gradient: with sequence
parallelism each TP rank normalizes only its share of the positions, so the replicated norm weights get partial
gradients that must be summed over the TP group. megatron-core sums those of every parameter marked
`sequence_parallel` (`finalize_model_grads._allreduce_non_tensor_model_parallel_grads`), which is what TE's and Apex's
norms mark; `SequenceParallelTorchNorm` builds the same torch norm and marks its parameters so.
`sequence_parallel_norms` puts it into a layer spec and the block's final norm.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

__all__ = ["SequenceParallelTorchNorm", "sequence_parallel_norms"]

_NORMS = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}
#: Where a GPT layer spec names its norms (the layer's, then its self-attention's).
_LAYER_NORMS = ("input_layernorm", "pre_mlp_layernorm", "pre_cross_attn_layernorm")
_ATTENTION_NORMS = ("q_layernorm", "k_layernorm")


class SequenceParallelTorchNorm:
    """`WrappedTorchNorm` (megatron-core's torch norm) whose parameters are marked `sequence_parallel`.

    Args:
        config: the transformer config (`normalization`, `sequence_parallel`).
        hidden_size: the normalized size H.
        eps: the variance epsilon.
        persist_layer_norm: unused, as in `WrappedTorchNorm` (Apex's option).
        zero_centered_gamma: must be False, as in `WrappedTorchNorm`.
        normalization: unused: `config.normalization` decides, as in `WrappedTorchNorm`.

    Returns:
        A `torch.nn.RMSNorm` or `torch.nn.LayerNorm` over `[..., H]`.

    Raises:
        ValueError: a normalization torch has no module for, or `layernorm_zero_centered_gamma`.
    """

    def __new__(
        cls,
        config: Any,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "LayerNorm",
    ) -> torch.nn.Module:
        """Builds the norm (see the class docstring)."""
        if config.layernorm_zero_centered_gamma or config.normalization not in _NORMS:
            raise ValueError(
                f"--sequence-parallel without Transformer Engine or Apex runs torch's RMSNorm/LayerNorm; "
                f"{config.normalization} (zero-centered: {config.layernorm_zero_centered_gamma}) needs TE"
            )
        norm = _NORMS[config.normalization](hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel  # summed over TP by megatron-core's finalize
        return norm


def _replace_torch_norms(submodules: Any, names: tuple[str, ...]) -> Any:
    out = copy.copy(submodules)
    for name in names:
        if getattr(out, name, None) is WrappedTorchNorm:
            setattr(out, name, SequenceParallelTorchNorm)
    return out


def sequence_parallel_norms(spec: ModuleSpec, config: Any) -> ModuleSpec | TransformerBlockSubmodules:
    """`spec` with `SequenceParallelTorchNorm` wherever it builds `WrappedTorchNorm`, as a block spec of this stage.

    The block's final norm is not part of a layer spec (megatron-core adds `WrappedTorchNorm` when given one), so the
    result names it: `TransformerBlockSubmodules` with this pipeline stage's layer count. A spec without torch norms
    (Apex installed) comes back unchanged.

    Args:
        spec: a GPT layer spec of the local layer spec (`get_gpt_layer_local_spec`, or GLM4's `sandwich_norm_spec`).
        config: the transformer config (its pipeline layout gives the stage's layer count).

    Returns:
        The layer spec, or a `TransformerBlockSubmodules` over copies of it.
    """
    layer = copy.copy(spec)
    layer.submodules = _replace_torch_norms(spec.submodules, _LAYER_NORMS)
    attention = getattr(layer.submodules, "self_attention", None)
    if isinstance(attention, ModuleSpec):
        layer.submodules.self_attention = copy.copy(attention)
        layer.submodules.self_attention.submodules = _replace_torch_norms(attention.submodules, _ATTENTION_NORMS)
    if layer.params and layer.params.get("norm") is WrappedTorchNorm:  # GLM4's sandwich norms
        layer.params = {**layer.params, "norm": SequenceParallelTorchNorm}
    if spec.submodules.input_layernorm is not WrappedTorchNorm:
        return spec
    return TransformerBlockSubmodules(
        layer_specs=[layer] * get_num_layers_to_build(config), layer_norm=SequenceParallelTorchNorm
    )
