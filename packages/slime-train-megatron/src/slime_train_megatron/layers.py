"""Transformer layers megatron-core's GPT specs lack: GLM4's sandwich norms.

GLM4 (`model_type="glm4"`, e.g. GLM-4-9B-0414, GLM-Z1-9B-0414) normalizes the attention output and the MLP
output before each residual add (HF `Glm4DecoderLayer`):

    h = x + post_self_attn_layernorm(attn(input_layernorm(x)))
    y = h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))

megatron-core 0.16's `TransformerLayer` has no norm after a sublayer, so `SandwichNormTransformerLayer` adds the
two (parameter names `decoder.layers.{i}.post_self_attn_layernorm.weight` and `...post_mlp_layernorm.weight`,
the names the original slime's Megatron fork uses) and applies each inside the layer's bias-dropout-add, where
the sublayer output meets the residual. `sandwich_norm_spec` turns a GPT layer spec into one with this layer;
`slime_train_megatron.model.build_gpt_model` uses it when `ModelArgs.sandwich_norm` is set (what the original's
`--spec slime_plugins.models.glm4 get_glm_spec --post-self-attn-layernorm --post-mlp-layernorm` built).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_layer import TransformerLayer

__all__ = ["SandwichNormTransformerLayer", "sandwich_norm_spec"]

BiasDropoutAdd = Callable[[tuple[torch.Tensor, torch.Tensor | None], torch.Tensor, float], torch.Tensor]


def _normed_bda(
    make_bda: Callable[[bool, bool], BiasDropoutAdd], norm: torch.nn.Module
) -> Callable[[bool, bool], BiasDropoutAdd]:
    """Wraps a bias-dropout-add factory so that the sublayer output (plus its bias) is normalized first.

    Args:
        make_bda: the layer's `self_attn_bda` / `mlp_bda` (`(training, fused) -> bda`).
        norm: the post-sublayer norm.

    Returns:
        A factory of the same signature; its `bda((out, bias), residual, p)` is
        `bda((norm(out + bias), None), residual, p)`, with `out`, `residual`: `[s, b, h]`.
    """

    def factory(training: bool, fused: bool) -> BiasDropoutAdd:
        bda = make_bda(training, fused)

        def normed(out_with_bias, residual, prob):
            out, bias = out_with_bias
            out = out if bias is None else out + bias
            return bda((norm(out), None), residual, prob)

        return normed

    return factory


class SandwichNormTransformerLayer(TransformerLayer):
    """A megatron-core `TransformerLayer` with RMSNorms on the attention and MLP outputs (GLM4).

    Args:
        norm: the norm module class (Transformer Engine's `TENorm`, or the local spec's norm), built like the
            layer's own norms (`config.hidden_size`, `config.layernorm_epsilon`).
        *args, **kwargs: `TransformerLayer`'s.
    """

    def __init__(self, *args, norm: type[torch.nn.Module], **kwargs):  # noqa: D107
        super().__init__(*args, **kwargs)
        self.post_self_attn_layernorm = build_module(
            norm, config=self.config, hidden_size=self.config.hidden_size, eps=self.config.layernorm_epsilon
        )
        self.post_mlp_layernorm = build_module(
            norm, config=self.config, hidden_size=self.config.hidden_size, eps=self.config.layernorm_epsilon
        )
        self.self_attn_bda = _normed_bda(self.self_attn_bda, self.post_self_attn_layernorm)
        self.mlp_bda = _normed_bda(self.mlp_bda, self.post_mlp_layernorm)


def sandwich_norm_spec(spec: ModuleSpec, *, use_te: bool) -> ModuleSpec:
    """The same GPT layer spec with `SandwichNormTransformerLayer` as the layer.

    Args:
        spec: a dense GPT layer spec (`get_gpt_layer_*_spec`).
        use_te: the spec is Transformer Engine's (norms: `TENorm`); else the local spec (its input norm class).

    Returns:
        A new spec; `spec` is left unchanged.
    """
    if use_te:
        from megatron.core.extensions.transformer_engine import TENorm

        norm = TENorm
    else:
        norm = spec.submodules.input_layernorm
    out = copy.copy(spec)
    out.module = SandwichNormTransformerLayer
    out.params = {**(spec.params or {}), "norm": norm}
    return out
