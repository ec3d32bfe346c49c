"""Do the checkpoints a run loads hold `--hf-checkpoint`'s architecture? Checked from files, nothing loaded.

The model is built from `--hf-checkpoint`'s config.json; `--ref-load`, `--load` and `--critic-load` then fill it.
A checkpoint of another size otherwise stops the run after start-up with a shape error naming neither flag
(`linear_qkv has 32 rows, expected 256`). Compared, per checkpoint kind:

* an HF directory: its config.json (`num_hidden_layers`, `hidden_size`, heads, ...);
* a torch_dist or FSDP checkpoint: the global tensor shapes in its `.metadata` (PyTorch Distributed Checkpoint),
  read from Megatron names (`decoder.layers.self_attention.linear_qkv.weight`: `[layers, (H + 2G)·d, hidden]`,
  layers stacked) or HF names (`...layers.{i}.self_attn.q_proj.weight`: `[H·d, hidden]`, one key per layer).

Megatron pads the vocabulary (`slime_convert.model_args.padded_vocab_size`), so a torch_dist embedding may have
more rows than `vocab_size`, never fewer and never a different padding.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any

__all__ = ["architecture_mismatches", "config_fields", "dcp_shapes", "expected_fields", "tensor_fields"]

# Fields compared, in the order a mismatch lists them.
FIELDS = ("num_layers", "hidden_size", "qkv_rows", "ffn_hidden_size", "vocab_rows", "num_experts")

_HF_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
_MEGATRON_STACKED = "decoder.layers."
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
        `num_layers`, `hidden_size`, `qkv_rows` = (H + 2G)·d (query, key and value projection rows), the dense
        `ffn_hidden_size` (None for MoE), `vocab_rows` (= `vocab_size`) and `num_experts` (None when dense).
    """
    c = _text_config(config)
    heads = c.get("num_attention_heads")
    groups = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or (c["hidden_size"] // heads if heads and c.get("hidden_size") else None)
    experts = c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts")
    return {
        "num_layers": c.get("num_hidden_layers"),
        "hidden_size": c.get("hidden_size"),
        "qkv_rows": (heads + 2 * groups) * head_dim if heads and head_dim and c.get("kv_lora_rank") is None else None,
        "ffn_hidden_size": None if experts else c.get("intermediate_size"),
        "vocab_rows": c.get("vocab_size"),
        "num_experts": experts or None,
    }


def config_fields(model_dir: str | os.PathLike[str]) -> dict[str, int | None]:
    """`expected_fields` of `<model_dir>/config.json`."""
    with open(pathlib.Path(model_dir) / "config.json", encoding="utf-8") as f:
        return expected_fields(json.load(f))


def tensor_fields(shapes: dict[str, tuple[int, ...]]) -> dict[str, int | None]:
    """The compared fields read from tensor names and global shapes (Megatron or HF names; see the module doc).

    Args:
        shapes: tensor key -> global shape, e.g. a torch_dist `.metadata`'s tensors.

    Returns:
        The fields found (None where no tensor tells; `num_experts` is never read from tensors).
    """
    out: dict[str, int | None] = dict.fromkeys(FIELDS)
    hf_layers: set[int] = set()
    hf_rows: dict[str, int] = {}
    for key, shape in shapes.items():
        if not shape:
            continue
        if key.endswith("embedding.word_embeddings.weight") or key.endswith("embed_tokens.weight"):
            out["vocab_rows"], out["hidden_size"] = shape[0], shape[-1]
        elif key.endswith(_MEGATRON_STACKED + "self_attention.linear_qkv.weight") and len(shape) == 3:
            out["num_layers"], out["qkv_rows"] = shape[0], shape[1]
        elif key.endswith(_MEGATRON_STACKED + "mlp.linear_fc1.weight") and len(shape) == 3:
            out["ffn_hidden_size"] = shape[1] // 2  # gate and up stacked
        elif (match := _HF_LAYER.search(key)) and key.endswith(".weight") and not _VISION.search(key):
            hf_layers.add(int(match.group(1)))
            for name in ("q_proj", "k_proj", "v_proj", "gate_proj"):
                if match.group(2) == f"self_attn.{name}.weight" or match.group(2) == f"mlp.{name}.weight":
                    hf_rows[name] = shape[0]
    if hf_layers and out["num_layers"] is None:
        out["num_layers"] = max(hf_layers) + 1
    if {"q_proj", "k_proj", "v_proj"} <= hf_rows.keys() and out["qkv_rows"] is None:
        out["qkv_rows"] = hf_rows["q_proj"] + hf_rows["k_proj"] + hf_rows["v_proj"]
    if "gate_proj" in hf_rows and out["ffn_hidden_size"] is None:
        out["ffn_hidden_size"] = hf_rows["gate_proj"]
    return out


def dcp_shapes(ckpt_dir: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Tensor key -> global shape from a PyTorch Distributed Checkpoint directory's `.metadata` (no tensor read)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(ckpt_dir)).read_metadata()
    return {
        key: tuple(md.size) for key, md in metadata.state_dict_metadata.items() if isinstance(md, TensorStorageMetadata)
    }


def _vocab_matches(stored: int, expected: int) -> bool:
    """An embedding of `stored` rows can hold a `expected`-token vocabulary: exact, or Megatron's padding of it."""
    from slime_convert.model_args import padded_vocab_size

    return stored == expected or any(stored == padded_vocab_size(expected, tp) for tp in (1, 2, 4, 8, 16, 32, 64))


def architecture_mismatches(
    expected: dict[str, int | None], found: dict[str, int | None], *, flag: str, path: str, hf_checkpoint: str
) -> list[str]:
    """One line per field where a checkpoint differs from `--hf-checkpoint` (fields either side leaves open: skipped).

    Args:
        expected: `expected_fields` of `--hf-checkpoint`.
        found: the checkpoint's fields (`config_fields` or `tensor_fields`).
        flag: the checkpoint's flag (`--ref-load`).
        path: the checkpoint's path.
        hf_checkpoint: `--hf-checkpoint`'s path.

    Returns:
        Lines like `--ref-load /ckpt vs --hf-checkpoint /Qwen3-4B: num_layers 2 vs 36`.
    """
    lines = []
    for field in FIELDS:
        want, have = expected.get(field), found.get(field)
        if want is None or have is None:
            continue
        if field == "vocab_rows" and _vocab_matches(have, want):
            continue
        if have != want:
            lines.append(f"{flag} {path} vs --hf-checkpoint {hf_checkpoint}: {field} {have} vs {want}")
    return lines
