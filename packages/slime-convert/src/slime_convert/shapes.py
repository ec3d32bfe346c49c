"""The tensor shapes a `config.json` implies, and the checks of a checkpoint against them.

A conversion reads the architecture from one `config.json` and the weights from another place (the HF shards of
`--hf-checkpoint`, or a torch_dist checkpoint with `--origin-hf-dir`). When the two disagree (a config field
missing or edited, the config of another model size) the transforms either fail on one tensor with a message that
names no file, or succeed and write a checkpoint no loader accepts (a 2-layer torch_dist exported with a 4-layer
config got two layers of zeros). These checks run before anything is written and name the tensor, the file and
the config fields.

Legend: `H` query heads, `G` key/value heads, `d` head dim, `F` MLP width, `E` experts, `V` vocabulary rows.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import torch

from slime_convert.mapping import TensorMapping, tensor_mappings, to_mcore
from slime_convert.model_args import ModelArgs

__all__ = [
    "check_hf_shapes",
    "check_hf_unused",
    "check_torch_dist_shapes",
    "check_torch_dist_unused",
    "hf_tensor_shape",
]


def _config_summary(args: ModelArgs) -> str:
    fields = [
        f"num_hidden_layers={args.num_layers}",
        f"hidden_size={args.hidden_size}",
        f"num_attention_heads={args.num_attention_heads}",
        f"num_key_value_heads={args.num_query_groups}",
        f"head_dim={args.kv_channels}",
        f"vocab_size={args.vocab_size}",
    ]
    if args.is_moe:
        fields += [f"num_experts={args.num_experts}", f"moe_intermediate_size={args.moe_ffn_hidden_size}"]
    else:
        fields.append(f"intermediate_size={args.ffn_hidden_size}")
    return ", ".join(fields)


def hf_tensor_shape(name: str, args: ModelArgs) -> tuple[int, ...]:
    """The shape `config.json` implies for one HF tensor of a supported model.

    Args:
        name: a HF tensor name (`model.layers.3.self_attn.k_proj.weight`, `lm_head.weight`, ...).
        args: the architecture.

    Returns:
        `[H·d, hidden]` for q_proj, `[G·d, hidden]` for k/v_proj, `[hidden, H·d]` for o_proj, `[F, hidden]` for
        gate/up (`[2F, hidden]` fused), `[hidden, F]` for down (F = the expert width inside `mlp.experts`),
        `[E, hidden]` for the router, `[d]` for q/k norms, `[hidden]` for the other norms, `[V, hidden]` for the
        embedding and LM head; biases are the weight's first dimension.

    Raises:
        ValueError: a name no mapping of a supported model uses.
    """
    h = args.hidden_size
    q_rows, kv_rows = args.num_attention_heads * args.kv_channels, args.num_query_groups * args.kv_channels
    ffn = args.moe_ffn_hidden_size if ".mlp.experts." in name else args.ffn_hidden_size
    table: dict[str, tuple[int, ...]] = {
        "q_proj.weight": (q_rows, h),
        "k_proj.weight": (kv_rows, h),
        "v_proj.weight": (kv_rows, h),
        "q_proj.bias": (q_rows,),
        "k_proj.bias": (kv_rows,),
        "v_proj.bias": (kv_rows,),
        "o_proj.weight": (h, q_rows),
        "q_norm.weight": (args.kv_channels,),
        "k_norm.weight": (args.kv_channels,),
        "gate_up_proj.weight": (2 * (ffn or 0), h),  # before up_proj.weight, which it ends with
        "gate_proj.weight": (ffn or 0, h),
        "up_proj.weight": (ffn or 0, h),
        "down_proj.weight": (h, ffn or 0),
        "mlp.gate.weight": (args.num_experts or 0, h),
        "embed_tokens.weight": (args.vocab_size, h),
        "lm_head.weight": (args.vocab_size, h),
        "layernorm.weight": (h,),
        "model.norm.weight": (h,),
    }
    for suffix, shape in table.items():
        if name.endswith(suffix):
            return shape
    raise ValueError(f"no expected shape for HF tensor {name!r}")


def _mismatch_error(where: str, problems: list[str], config_path: str, args: ModelArgs, hint: str) -> ValueError:
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return ValueError(f"{where}: {'; '.join(problems[:3])}{more}; {config_path} says {_config_summary(args)}. {hint}")


def check_hf_shapes(
    names: Iterable[str],
    shape_of: Callable[[str], tuple[int, ...]],
    args: ModelArgs,
    *,
    hf_dir: str | os.PathLike[str],
    file_of: Callable[[str], str],
    where: str | None = None,
    hint: str | None = None,
    known: Iterable[str] = (),
) -> None:
    """Checks every HF tensor a conversion reads against the shape its `config.json` implies.

    Args:
        names: the HF tensor names the conversion reads (present in the checkpoint).
        shape_of: name → stored shape (a header read, no tensor data).
        args: the architecture from `<hf_dir>/config.json`.
        hf_dir: the HF directory (for the message).
        file_of: name → the shard file holding it (for the message).
        where: how the message names the checkpoint (default: `hf_dir`; a loader passes `"--ref-load DIR"`).
        hint: the message's last sentence (default: which config.json field may be wrong).
        known: problems the caller found first (a missing layer), listed before the shape mismatches.

    Raises:
        ValueError: naming up to three tensors with their files and shapes, and the config fields.
    """
    problems = list(known)
    for name in names:
        stored, expected = tuple(shape_of(name)), hf_tensor_shape(name, args)
        if stored != expected:
            problems.append(f"{name} in {file_of(name)} has shape {list(stored)}, expected {list(expected)}")
    if problems:
        raise _mismatch_error(
            where or str(hf_dir), problems, f"{hf_dir}/config.json", args,
            hint or "A field is missing or wrong in config.json (a missing head_dim is hidden_size / "
            "num_attention_heads, a missing num_key_value_heads is num_attention_heads).",
        )  # fmt: skip


def check_hf_unused(
    stored: Iterable[str],
    needed: Iterable[str],
    args: ModelArgs,
    *,
    hf_dir: str | os.PathLike[str],
    file_of: Callable[[str], str],
) -> list[str]:
    """Refuses HF tensors that `config.json` does not describe, which a conversion would drop without a word.

    A `num_hidden_layers` edited down (or the config of a smaller model) made `hf-to-mcore` keep the first layers and
    drop the others; a tensor of a module the mapping does not know (a bias the config does not enable, a vision
    tower) went the same way. RoPE `inv_freq` buffers (computed from the config) are not weights; a tied model's
    `lm_head.weight` is returned for the caller to compare with the embedding.

    Args:
        stored: every tensor name in the checkpoint.
        needed: the names the conversion reads.
        args: the architecture from `<hf_dir>/config.json`.
        hf_dir: the HF directory (for the message).
        file_of: name → the shard file holding it (for the message).

    Returns:
        The stored names that are not read but allowed (`lm_head.weight` of a tied model).

    Raises:
        ValueError: naming the count, up to three tensors with their files, and the config fields.
    """
    read = set(needed)
    unread = [n for n in stored if n not in read and not n.endswith("rotary_emb.inv_freq")]
    tied_head = [n for n in unread if n == "lm_head.weight" and args.tie_word_embeddings]
    dropped = [n for n in unread if n not in tied_head]
    if dropped:
        named = ", ".join(f"{n} in {file_of(n)}" for n in dropped[:3])
        raise _mismatch_error(
            str(hf_dir), [f"{len(dropped)} tensors that config.json does not describe would be dropped: {named}"],
            f"{hf_dir}/config.json", args,
            "A layer count or another field is wrong in config.json, or the model has modules slime-convert does "
            "not convert.",
        )  # fmt: skip
    return tied_head


def _expected_mcore_shape(mapping: TensorMapping, args: ModelArgs) -> tuple[int, ...]:
    # The HF shapes pushed through the real transform on meta tensors: no data, and no second copy of its layout.
    metas = [torch.empty(hf_tensor_shape(n, args), device="meta") for n in mapping.hf_names(0, 0)]
    return tuple(to_mcore(mapping, metas, args, tp=1).shape)


def check_torch_dist_shapes(
    stored: dict[str, tuple[tuple[int, ...], torch.dtype]],
    args: ModelArgs,
    *,
    ckpt_dir: str | os.PathLike[str],
    origin_hf_dir: str | os.PathLike[str],
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Checks a torch_dist checkpoint against the architecture of `--origin-hf-dir` before exporting it.

    Every mapped key must hold `num_layers` layers (and `num_experts` experts) of the shape the config implies;
    the embedding and LM head may carry padding rows (at least `vocab_size`). A key the checkpoint lacks is left
    to the reader, which names it. A stored `output_layer.weight` under a tied config is refused: Megatron keeps a
    tied head under the embedding's key, so it is an untied head the export would drop.

    Args:
        stored: the checkpoint's tensors, key → (global shape, dtype) (`TorchDistReader.tensor_keys`).
        args: the architecture from `<origin_hf_dir>/config.json` (with `--vocab-size` applied).
        ckpt_dir: the torch_dist directory (for the message).
        origin_hf_dir: the HF directory whose config describes it (for the message).
        where: how the message names the checkpoint (default: `ckpt_dir`; a loader passes `"--load DIR"`).
        hint: the message's last sentence (default: asks whether `--origin-hf-dir` is the right model).

    Raises:
        ValueError: naming up to three keys with stored and expected shapes, and the config fields.
    """
    problems = []
    for mapping in tensor_mappings(args):
        key = mapping.ckpt_keys[0]
        if key not in stored:
            continue
        shape = stored[key][0]
        lead = {"global": (), "layer": (args.num_layers,), "expert": (args.num_layers, args.num_experts or 0)}
        expected = lead[mapping.scope] + _expected_mcore_shape(mapping, args)
        if mapping.kind == "vocab":  # padding rows depend on the TP size it was trained with
            ok = len(shape) == len(expected) and shape[0] >= args.vocab_size and shape[1:] == expected[1:]
            want = f"[>= {args.vocab_size}, {', '.join(map(str, expected[1:]))}]"
        else:
            ok, want = shape == expected, str(list(expected))
        if not ok:
            problems.append(f"{key} has shape {list(shape)}, expected {want}")
    if args.tie_word_embeddings and "output_layer.weight" in stored:
        # Megatron stores a tied head under the embedding's key, so this is an untied (trained) head that a tied
        # export would drop without a word.
        problems.append(
            "output_layer.weight is stored (an output layer of its own, e.g. --untie-embeddings-and-output-weights) "
            "but tie_word_embeddings=true would export only the embedding; set tie_word_embeddings to false"
        )
    if problems:
        raise _mismatch_error(
            where or str(ckpt_dir), problems, f"{origin_hf_dir}/config.json", args,
            hint or "Is --origin-hf-dir the model this checkpoint was made from?",
        )  # fmt: skip


#: torch_dist key prefixes of a GPTModel's own tensors (optimizer state, RNG and the like are stored under others).
_MODEL_KEY_PREFIXES = ("embedding.", "decoder.", "output_layer.", "mtp.")


def check_torch_dist_unused(
    stored: Iterable[str], args: ModelArgs, *, ckpt_dir: str | os.PathLike[str], origin_hf_dir: str | os.PathLike[str]
) -> None:
    """Refuses model tensors of a torch_dist checkpoint that `--origin-hf-dir`'s config has no HF name for.

    The export reads only the keys the config's mapping names, so a q/k/v bias trained with `--add-qkv-bias` under a
    config without one, a router's `expert_bias` or an MTP layer were left out of the HF checkpoint without a word.

    Args:
        stored: the checkpoint's tensor keys (`TorchDistReader.tensor_keys`).
        args: the architecture from `<origin_hf_dir>/config.json`.
        ckpt_dir: the torch_dist directory (for the message).
        origin_hf_dir: the HF directory whose config describes it (for the message).

    Raises:
        ValueError: naming the count, up to three keys, and the config fields.
    """
    known = {key for mapping in tensor_mappings(args) for key in mapping.ckpt_keys}
    dropped = sorted(k for k in stored if k.startswith(_MODEL_KEY_PREFIXES) and k not in known)
    if dropped:
        raise _mismatch_error(
            str(ckpt_dir), [f"{len(dropped)} model tensors have no HF name under this config and would be dropped: "
                            + ", ".join(dropped[:3])],
            f"{origin_hf_dir}/config.json", args,
            "Is --origin-hf-dir the model this checkpoint was made from (the same bias, norm and MoE settings)?",
        )  # fmt: skip
