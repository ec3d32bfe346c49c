"""Do the checkpoints a run loads hold `--hf-checkpoint`'s architecture? Checked from files, nothing loaded.

The model is built from `--hf-checkpoint`'s config.json; `--ref-load`, `--load` and `--critic-load` then fill it.
A checkpoint of another size otherwise stops the run after start-up with a shape error naming neither flag
(`linear_qkv has 32 rows, expected 256`). Compared, per checkpoint kind:

* an HF directory: its config.json against `--hf-checkpoint`'s (`ARCHITECTURE_FIELDS`: model type, sizes, heads,
  head dim, RoPE base, experts), and its safetensors weights against its own config.json (shapes read from the
  safetensors headers, `safetensors_shapes`), since a config.json copied over other weights says nothing of them;
* a torch_dist or FSDP checkpoint: the global tensor shapes in its `.metadata` (PyTorch Distributed Checkpoint),
  read from Megatron names (`decoder.layers.self_attention.linear_qkv.weight`: `[layers, (H + 2G)·d, hidden]`,
  layers stacked) or HF names (`...layers.{i}.self_attn.q_proj.weight`: `[H·d, hidden]`, one key per layer).

A field either side does not state is not compared, except the experts: a config.json without `num_experts`
(or `num_local_experts`, `n_routed_experts`) describes a dense model (0 experts), and weights with a dense MLP and
no expert tensors hold 0 experts, so a dense checkpoint never passes for a MoE one or the other way round.

Megatron pads the vocabulary (`slime_convert.model_args.padded_vocab_size`, a multiple of
`--make-vocab-size-divisible-by` × TP), so a torch_dist embedding may have more rows than `vocab_size`, never fewer
and never a different padding.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any

from slime_core.config.architecture import config_num_experts

__all__ = [
    "ARCHITECTURE_FIELDS",
    "FIELDS",
    "architecture_mismatches",
    "config_architecture",
    "config_fields",
    "config_mismatches",
    "dcp_shapes",
    "expected_fields",
    "read_config",
    "safetensors_shapes",
    "tensor_fields",
]

# Fields read from shapes, in the order a mismatch lists them.
FIELDS = (
    "num_layers", "hidden_size", "qkv_rows", "head_dim", "num_attention_heads", "num_key_value_heads",
    "ffn_hidden_size", "vocab_rows", "num_experts",
)  # fmt: skip
# The config.json fields that make two checkpoints one architecture (the trainer loads one's tensors into modules
# built from the other's config), in the order a mismatch lists them.
ARCHITECTURE_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "tie_word_embeddings", "rope_theta", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size",
)  # fmt: skip

_HF_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
_MEGATRON_STACKED = "decoder.layers."
_HF_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.")
_VISION = re.compile(r"visual|vision")  # a VLM's image encoder has `layers.{i}` of its own


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config.json (VLM wrappers keep it in `text_config`)."""
    if isinstance(config.get("text_config"), dict):
        text = config["text_config"]
        return {**text, "model_type": text.get("model_type", config.get("model_type"))}
    return config


def expected_fields(config: dict[str, Any]) -> dict[str, int | None]:
    """The compared fields of the model a config.json describes (None where the config does not say).

    Args:
        config: a parsed config.json.

    Returns:
        `num_layers`, `hidden_size`, `qkv_rows` = (H + 2G)·d (query, key and value projection rows), `head_dim`
        d, `num_attention_heads` H and `num_key_value_heads` G (None for multi-head latent attention), the dense
        `ffn_hidden_size` (None for MoE), `vocab_rows` (= `vocab_size`) and `num_experts` (0 when dense).
    """
    c = _text_config(config)
    heads = c.get("num_attention_heads")
    groups = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or (c["hidden_size"] // heads if heads and c.get("hidden_size") else None)
    experts = _num_experts(c)
    mha = c.get("kv_lora_rank") is None  # MLA's projections are not (H + 2G)·d rows
    return {
        "num_layers": c.get("num_hidden_layers"),
        "hidden_size": c.get("hidden_size"),
        "qkv_rows": (heads + 2 * groups) * head_dim if heads and head_dim and mha else None,
        "head_dim": head_dim if mha else None,
        "num_attention_heads": heads if mha else None,
        "num_key_value_heads": groups if mha else None,
        "ffn_hidden_size": None if experts else c.get("intermediate_size"),
        "vocab_rows": c.get("vocab_size"),
        "num_experts": experts,
    }


def _num_experts(c: dict[str, Any]) -> int:
    """Routed experts a (text) config declares under any of the usual names; 0 for a dense model."""
    return config_num_experts(c) or 0


def config_architecture(config: dict[str, Any]) -> dict[str, Any]:
    """`ARCHITECTURE_FIELDS` of a config.json, with the defaults transformers applies when a field is left out.

    Args:
        config: a parsed config.json (a VLM's `text_config` is used).

    Returns:
        Field -> value; `num_key_value_heads` defaults to the heads, `head_dim` to hidden / heads, `rope_theta` is
        read from `rope_parameters` too (transformers >= 5), `num_experts` is 0 when dense; other fields the config
        leaves out are None (not compared: their default depends on the model type).
    """
    c = _text_config(config)
    heads = c.get("num_attention_heads")
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    out = {k: c.get(k) for k in ARCHITECTURE_FIELDS}
    out["num_key_value_heads"] = c.get("num_key_value_heads") or heads
    out["head_dim"] = c.get("head_dim") or (c["hidden_size"] // heads if heads and c.get("hidden_size") else None)
    out["rope_theta"] = c.get("rope_theta", rope.get("rope_theta"))
    out["num_experts"] = _num_experts(c)
    return out


def config_mismatches(expected: dict[str, Any], found: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """`(field, found, expected)` for each `ARCHITECTURE_FIELDS` entry two config.json files disagree on.

    Args:
        expected: parsed config.json of the model that is built (`--hf-checkpoint`).
        found: parsed config.json of the checkpoint loaded into it.

    Returns:
        The differing fields in `ARCHITECTURE_FIELDS` order; a field one side leaves out is skipped
        (`config_architecture` says which have defaults).
    """
    want, have = config_architecture(expected), config_architecture(found)
    return [
        (k, have[k], want[k])
        for k in ARCHITECTURE_FIELDS
        if want[k] is not None and have[k] is not None and have[k] != want[k]
    ]


def read_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed `<model_dir>/config.json`."""
    with open(pathlib.Path(model_dir) / "config.json", encoding="utf-8") as f:
        return json.load(f)


def config_fields(model_dir: str | os.PathLike[str]) -> dict[str, int | None]:
    """`expected_fields` of `<model_dir>/config.json`."""
    return expected_fields(read_config(model_dir))


def tensor_fields(shapes: dict[str, tuple[int, ...]]) -> dict[str, int | None]:
    """The compared fields read from tensor names and global shapes (Megatron or HF names; see the module doc).

    Besides the projections: `head_dim` from the per-head query norm (Qwen3's `q_norm` / Megatron's
    `q_layernorm`, `[d]` per layer), then the heads from the HF query/key rows; the experts from the router
    (`mlp.gate.weight` `[E, hidden]`, Megatron `mlp.router.weight`) or the expert indices, 0 when the MLP is
    dense and no expert tensor exists.

    Args:
        shapes: tensor key -> global shape, e.g. a torch_dist `.metadata`'s tensors or safetensors headers.

    Returns:
        The fields found (None where no tensor tells).
    """
    out: dict[str, int | None] = dict.fromkeys(FIELDS)
    hf_layers: set[int] = set()
    hf_rows: dict[str, int] = {}
    experts: set[int] = set()
    router = dense = None
    for key, shape in shapes.items():
        if not shape:
            continue
        if key.endswith("embedding.word_embeddings.weight") or key.endswith("embed_tokens.weight"):
            out["vocab_rows"], out["hidden_size"] = shape[0], shape[-1]
        elif key.endswith(_MEGATRON_STACKED + "self_attention.linear_qkv.weight") and len(shape) == 3:
            out["num_layers"], out["qkv_rows"] = shape[0], shape[1]
        elif key.endswith(_MEGATRON_STACKED + "self_attention.q_layernorm.weight") and len(shape) == 2:
            out["head_dim"] = shape[1]
        elif key.endswith(_MEGATRON_STACKED + "mlp.linear_fc1.weight") and len(shape) == 3:
            out["ffn_hidden_size"], dense = shape[1] // 2, True  # gate and up stacked
        elif key.endswith(_MEGATRON_STACKED + "mlp.router.weight") and len(shape) == 3:
            router = shape[1]
        elif (match := _HF_LAYER.search(key)) and key.endswith(".weight") and not _VISION.search(key):
            hf_layers.add(int(match.group(1)))
            rest = match.group(2)
            if expert := _HF_EXPERT.match(rest):
                experts.add(int(expert.group(1)))
            elif rest == "mlp.gate.weight" and len(shape) == 2:
                router = shape[0]
            elif rest == "self_attn.q_norm.weight" and len(shape) == 1:
                out["head_dim"] = shape[0]
            for name in ("q_proj", "k_proj", "v_proj", "gate_proj"):
                if rest == f"self_attn.{name}.weight" or rest == f"mlp.{name}.weight":
                    hf_rows[name] = shape[0]
                    dense = dense or name == "gate_proj"
    if hf_layers and out["num_layers"] is None:
        out["num_layers"] = max(hf_layers) + 1
    if {"q_proj", "k_proj", "v_proj"} <= hf_rows.keys() and out["qkv_rows"] is None:
        out["qkv_rows"] = hf_rows["q_proj"] + hf_rows["k_proj"] + hf_rows["v_proj"]
    if (d := out["head_dim"]) and {"q_proj", "k_proj"} <= hf_rows.keys():
        out["num_attention_heads"], out["num_key_value_heads"] = hf_rows["q_proj"] // d, hf_rows["k_proj"] // d
    if "gate_proj" in hf_rows and out["ffn_hidden_size"] is None:
        out["ffn_hidden_size"] = hf_rows["gate_proj"]
    if router is not None or experts:
        out["num_experts"] = router if router is not None else max(experts) + 1
        out["ffn_hidden_size"] = None  # a MoE model's dense MLP rows (shared experts, first layers) are no FFN size
    elif dense:
        out["num_experts"] = 0
    return out


def safetensors_shapes(model_dir: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Tensor key -> shape of every `*.safetensors` file in an HF directory, from the file headers only.

    Raises:
        ValueError: a file whose header cannot be read (names the file).
    """
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(pathlib.Path(model_dir).glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:  # maps the file; reads the header, no tensor
                shapes.update((key, tuple(f.get_slice(key).get_shape())) for key in f.keys())
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type on a corrupt header
            raise ValueError(f"cannot read the safetensors header of {path} ({type(e).__name__}: {e})") from None
    return shapes


def dcp_shapes(ckpt_dir: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Tensor key -> global shape from a PyTorch Distributed Checkpoint directory's `.metadata` (no tensor read)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(ckpt_dir)).read_metadata()
    return {
        key: tuple(md.size) for key, md in metadata.state_dict_metadata.items() if isinstance(md, TensorStorageMetadata)
    }


def _vocab_matches(stored: int, expected: int, divisor: int = 128) -> bool:
    """An embedding of `stored` rows can hold a `expected`-token vocabulary: exact, or Megatron's padding of it.

    `divisor` is the run's `--make-vocab-size-divisible-by`; the TP size a checkpoint was padded for is not known here
    (the Megatron backend's loader checks the exact rows, `slime_convert.vocab_padding`).
    """
    from slime_convert.model_args import padded_vocab_size

    tps = (1, 2, 4, 8, 16, 32, 64)
    return stored == expected or any(stored == padded_vocab_size(expected, tp, divisor) for tp in tps)


def architecture_mismatches(
    expected: dict[str, int | None],
    found: dict[str, int | None],
    *,
    flag: str,
    path: str,
    hf_checkpoint: str,
    against: str | None = None,
    vocab_divisor: int = 128,
) -> list[str]:
    """One line per field where a checkpoint differs from `--hf-checkpoint` (fields either side leaves open: skipped).

    Args:
        expected: `expected_fields` of `--hf-checkpoint` (or of the checkpoint's own config.json).
        found: the checkpoint's fields (`config_fields` or `tensor_fields`).
        flag: the checkpoint's flag (`--ref-load`).
        path: the checkpoint's path.
        hf_checkpoint: `--hf-checkpoint`'s path.
        against: what `expected` describes, for the message (default `--hf-checkpoint <path>`).
        vocab_divisor: the run's `--make-vocab-size-divisible-by`: a torch_dist embedding padded with it matches.

    Returns:
        Lines like `--ref-load /ckpt vs --hf-checkpoint /Qwen3-4B: num_layers 2 vs 36`.
    """
    against = against or f"--hf-checkpoint {hf_checkpoint}"
    lines = []
    for field in FIELDS:
        want, have = expected.get(field), found.get(field)
        if want is None or have is None:
            continue
        if field == "vocab_rows" and _vocab_matches(have, want, vocab_divisor):
            continue
        if have != want:
            lines.append(f"{flag} {path} vs {against}: {field} {have} vs {want}")
    return lines
