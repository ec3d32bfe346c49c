"""HF ↔ Megatron-core name and tensor mapping tables: the single source of truth.

Used by the converter (`slime_convert.convert`), by the Megatron backend for direct HF loading
(`mcore_tensor_from_hf`) and for weight sync (`mcore_to_hf`). Megatron names are the parameter
names of a megatron-core `GPTModel` built with the Transformer Engine layer spec (the canonical
form); names from the local spec (`input_layernorm`, `pre_mlp_layernorm`, `local_experts`), from
TE grouped experts (`linear_fc1.weight{e}`) and `module.` wrapper prefixes are accepted as aliases.

Templates carry `{layer}` (global layer index) and `{expert}` (global expert index).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterator
from typing import Literal

import torch

from slime_convert.model_args import ModelArgs
from slime_convert.tensors import fuse_gate_up, fuse_qkv, pad_vocab, split_gate_up, split_qkv, unpad_vocab

__all__ = [
    "TensorMapping",
    "expand_mappings",
    "extra_state_keys",
    "mcore_tensor_from_hf",
    "mcore_to_hf",
    "resolve_mcore_name",
    "tensor_mappings",
]

Kind = Literal["copy", "qkv", "gate_up", "vocab"]
Scope = Literal["global", "layer", "expert"]


@dataclasses.dataclass(frozen=True, slots=True)
class TensorMapping:
    """One Megatron tensor and the HF tensor(s) it is made of.

    Attributes:
        mcore: canonical Megatron parameter name template.
        hf: HF tensor name templates, in the order the `kind` transform takes them.
        kind: "copy" (same tensor), "qkv" (q, k, v ↔ `linear_qkv`), "gate_up" (gate, up ↔ `linear_fc1`)
            or "vocab" (rows padded to a multiple of 128×TP on the Megatron side).
        ckpt_keys: keys under which the tensor is stored in a torch_dist checkpoint (first = primary; more
            when the local and TE layer specs disagree). Layer (and expert) indices become leading axes.
        aliases: other Megatron parameter name templates for the same tensor.
    """

    mcore: str
    hf: tuple[str, ...]
    kind: Kind
    ckpt_keys: tuple[str, ...]
    aliases: tuple[str, ...] = ()

    @property
    def scope(self) -> Scope:
        """Per layer and expert ("expert"), per layer ("layer"), or once ("global")."""
        if "{expert}" in self.mcore:
            return "expert"
        return "layer" if "{layer}" in self.mcore else "global"

    def mcore_name(self, layer: int | None = None, expert: int | None = None) -> str:
        """The Megatron name for one layer/expert."""
        return self.mcore.format(layer=layer, expert=expert)

    def hf_names(self, layer: int | None = None, expert: int | None = None) -> list[str]:
        """The HF names for one layer/expert."""
        return [t.format(layer=layer, expert=expert) for t in self.hf]


def _layer_mappings(args: ModelArgs) -> list[TensorMapping]:
    L, H = "decoder.layers.{layer}.", "model.layers.{layer}."  # noqa: N806 (template prefixes)

    def m(
        mcore: str, hf: tuple[str, ...], kind: Kind = "copy", ckpt: tuple[str, ...] = (), aliases=()
    ) -> TensorMapping:
        default_ckpt = (L + mcore).replace(".{layer}", "")
        return TensorMapping(L + mcore, tuple(H + h for h in hf), kind, ckpt or (default_ckpt,), tuple(aliases))

    out = [
        m(
            "self_attention.linear_qkv.layer_norm_weight",
            ("input_layernorm.weight",),
            aliases=(L + "input_layernorm.weight",),
        ),
        m(
            "self_attention.linear_qkv.weight",
            ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
            "qkv",
        ),
    ]
    if args.add_qkv_bias:
        out.append(
            m(
                "self_attention.linear_qkv.bias",
                ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
                "qkv",
            )
        )
    if args.qk_layernorm:
        out += [
            m("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",)),
            m("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",)),
        ]
    out.append(m("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",)))
    if args.sandwich_norm:  # GLM4: norms on the attention and MLP outputs, before the residual adds
        out += [
            m("post_self_attn_layernorm.weight", ("post_self_attn_layernorm.weight",)),
            m("post_mlp_layernorm.weight", ("post_mlp_layernorm.weight",)),
        ]
    if not args.is_moe:
        fc1 = (
            m("mlp.linear_fc1.weight", ("mlp.gate_up_proj.weight",))  # already [gate; up], Megatron's layout
            if args.fused_gate_up
            else m("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "gate_up")
        )
        out += [
            m(
                "mlp.linear_fc1.layer_norm_weight",
                ("post_attention_layernorm.weight",),
                aliases=(L + "pre_mlp_layernorm.weight",),
            ),
            fc1,
            m("mlp.linear_fc2.weight", ("mlp.down_proj.weight",)),
        ]
        return out
    # MoE: the TE spec keeps a separate pre-MLP norm; the local spec stores it under the fused name.
    out += [
        m(
            "pre_mlp_layernorm.weight",
            ("post_attention_layernorm.weight",),
            ckpt=("decoder.layers.pre_mlp_layernorm.weight", "decoder.layers.mlp.linear_fc1.layer_norm_weight"),
        ),
        m("mlp.router.weight", ("mlp.gate.weight",)),
    ]
    E = "mlp.experts.{expert}."  # noqa: N806
    out += [
        m(
            "mlp.experts.local_experts.{expert}.linear_fc1.weight",
            (E + "gate_proj.weight", E + "up_proj.weight"),
            "gate_up",
            ckpt=("decoder.layers.mlp.experts.experts.linear_fc1.weight",),
            aliases=(L + "mlp.experts.linear_fc1.weight{expert}",),
        ),
        m(
            "mlp.experts.local_experts.{expert}.linear_fc2.weight",
            (E + "down_proj.weight",),
            ckpt=("decoder.layers.mlp.experts.experts.linear_fc2.weight",),
            aliases=(L + "mlp.experts.linear_fc2.weight{expert}",),
        ),
    ]
    return out


@functools.cache
def tensor_mappings(args: ModelArgs) -> tuple[TensorMapping, ...]:
    """All mappings of a model, in HF checkpoint order (embedding, per-layer tensors, final norm, head).

    Raises:
        ValueError: via `ModelArgs`; every supported `model_type` has a table.
    """
    head = [
        TensorMapping(
            "embedding.word_embeddings.weight",
            ("model.embed_tokens.weight",),
            "vocab",
            ("embedding.word_embeddings.weight",),
        )
    ]
    tail = [
        TensorMapping(
            "decoder.final_layernorm.weight", ("model.norm.weight",), "copy", ("decoder.final_layernorm.weight",)
        )
    ]
    if not args.tie_word_embeddings:
        tail.append(TensorMapping("output_layer.weight", ("lm_head.weight",), "vocab", ("output_layer.weight",)))
    return tuple(head + _layer_mappings(args) + tail)


def expand_mappings(args: ModelArgs) -> Iterator[tuple[TensorMapping, int | None, int | None]]:
    """Every concrete tensor as `(mapping, layer, expert)` in HF order (layer by layer)."""
    maps = tensor_mappings(args)
    for mp in maps:
        if mp.scope == "global" and not mp.mcore.startswith("decoder.final") and not mp.mcore.startswith("output"):
            yield mp, None, None
    for layer in range(args.num_layers):
        for mp in maps:
            if mp.scope == "layer":
                yield mp, layer, None
            elif mp.scope == "expert":
                for expert in range(args.num_experts or 0):
                    yield mp, layer, expert
    for mp in maps:
        if mp.scope == "global" and (mp.mcore.startswith("decoder.final") or mp.mcore.startswith("output")):
            yield mp, None, None


def extra_state_keys(args: ModelArgs) -> list[tuple[str, Scope]]:
    """torch_dist keys of the `_extra_state` objects megatron-core expects (None for non-FP8 layers).

    Linear layers of both specs (and TE's core attention) register an `_extra_state`; a strict load
    fails if the checkpoint lacks them, so the converter writes them (as `None`).
    """
    keys: list[tuple[str, Scope]] = [
        (f"decoder.layers.self_attention.{name}._extra_state", "layer")
        for name in ("linear_qkv", "linear_proj", "core_attention")
    ]
    if args.is_moe:
        keys += [
            (f"decoder.layers.mlp.experts.experts.{n}._extra_state", "expert") for n in ("linear_fc1", "linear_fc2")
        ]
    else:
        keys += [(f"decoder.layers.mlp.{n}._extra_state", "layer") for n in ("linear_fc1", "linear_fc2")]
    return keys


def to_mcore(mapping: TensorMapping, hf_tensors: list[torch.Tensor], args: ModelArgs, tp: int = 1) -> torch.Tensor:
    """Builds the full (unsharded) Megatron tensor from its HF tensors.

    Args:
        mapping: the mapping.
        hf_tensors: tensors named by `mapping.hf_names(...)`, in that order.
        args: model architecture.
        tp: tensor-parallel size (sets the vocabulary padding).

    Returns:
        The Megatron tensor (`[V_pad, hidden]` for embeddings/head, `[G·(H/G+2)·d, hidden]` for QKV, ...).
    """
    if mapping.kind == "copy":
        return hf_tensors[0]
    if mapping.kind == "vocab":
        return pad_vocab(hf_tensors[0], args.padded_vocab_size(tp))
    if mapping.kind == "gate_up":
        return fuse_gate_up(*hf_tensors)
    q, k, v = hf_tensors
    return fuse_qkv(
        q, k, v, num_heads=args.num_attention_heads, num_groups=args.num_query_groups, head_dim=args.kv_channels
    )


def to_hf(mapping: TensorMapping, tensor: torch.Tensor, args: ModelArgs) -> list[torch.Tensor]:
    """Inverse of `to_mcore`: the HF tensors (order of `mapping.hf`) from a full Megatron tensor."""
    if mapping.kind == "copy":
        return [tensor]
    if mapping.kind == "vocab":
        return [unpad_vocab(tensor, args.vocab_size)]
    if mapping.kind == "gate_up":
        return list(split_gate_up(tensor))
    return list(
        split_qkv(
            tensor, num_heads=args.num_attention_heads, num_groups=args.num_query_groups, head_dim=args.kv_channels
        )
    )


def _template_regex(template: str) -> re.Pattern[str]:
    pattern = re.escape(template).replace(r"\{layer\}", r"(?P<layer>\d+)").replace(r"\{expert\}", r"(?P<expert>\d+)")
    return re.compile(pattern + "$")


@functools.cache
def _name_index(args: ModelArgs) -> tuple[tuple[re.Pattern[str], TensorMapping], ...]:
    return tuple((_template_regex(t), mp) for mp in tensor_mappings(args) for t in (mp.mcore, *mp.aliases))


def resolve_mcore_name(name: str, args: ModelArgs) -> tuple[TensorMapping, int | None, int | None]:
    """Finds the mapping of a Megatron parameter name.

    Args:
        name: e.g. `module.module.decoder.layers.3.self_attention.linear_qkv.weight` (wrapper prefixes,
            local/TE spec spellings accepted; indices must be global).
        args: model architecture.

    Returns:
        `(mapping, layer, expert)`.

    Raises:
        KeyError: the name belongs to no mapping (message lists the canonical templates).
    """
    bare = name
    while bare.startswith("module."):
        bare = bare[len("module.") :]
    for regex, mp in _name_index(args):
        match = regex.match(bare)
        if match:
            groups = match.groupdict()
            layer = int(groups["layer"]) if groups.get("layer") is not None else None
            expert = int(groups["expert"]) if groups.get("expert") is not None else None
            return mp, layer, expert
    known = ", ".join(mp.mcore for mp in tensor_mappings(args))
    raise KeyError(f"no HF mapping for Megatron parameter {name!r} ({args.model_type}); known templates: {known}")


def mcore_to_hf(name: str, tensor: torch.Tensor, args: ModelArgs) -> list[tuple[str, torch.Tensor]]:
    """Converts one full (TP/EP-gathered) Megatron parameter to HF `(name, tensor)` pairs (weight sync).

    Vocabulary padding is stripped; fused QKV and gate/up are split.

    Raises:
        KeyError: unknown parameter name.
    """
    mapping, layer, expert = resolve_mcore_name(name, args)
    return list(zip(mapping.hf_names(layer, expert), to_hf(mapping, tensor, args), strict=True))


def mcore_tensor_from_hf(
    name: str, read_hf: Callable[[str], torch.Tensor], args: ModelArgs, tp: int = 1
) -> torch.Tensor:
    """Builds the full Megatron tensor for parameter `name` from HF tensors (direct HF loading).

    Args:
        name: Megatron parameter name (global layer/expert indices).
        read_hf: returns the HF tensor of a given name.
        args: model architecture.
        tp: tensor-parallel size (vocabulary padding).

    Returns:
        The unsharded tensor; the caller slices its TP/EP part.

    Raises:
        KeyError: unknown parameter name.
    """
    mapping, layer, expert = resolve_mcore_name(name, args)
    return to_mcore(mapping, [read_hf(n) for n in mapping.hf_names(layer, expert)], args, tp)
