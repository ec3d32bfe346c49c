"""`--save-hf` for the Megatron backend: the model as a Hugging Face safetensors checkpoint.

The weights come from `model.iter_hf_weights` (full tensors under HF names on every rank: TP/EP shards
gathered, pipeline stages broadcast), so every rank iterates in lockstep and only rank 0 writes, through
`slime_core.hf_checkpoint` (the writer both backends share: safetensors shards, index, the config/tokenizer/
generation files of `--hf-checkpoint`, `<path>.tmp` renamed to `<path>` at the end).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable

import torch
import torch.distributed as dist

from slime_core.hf_checkpoint import source_dtype, write_hf_checkpoint

__all__ = ["save_hf"]


def save_hf(
    weights: Iterable[tuple[str, torch.Tensor]],
    path: str | pathlib.Path,
    *,
    source_dir: str | pathlib.Path,
    max_shard_bytes: int = 5 * 1024**3,
) -> None:
    """Writes an HF checkpoint directory loadable by `AutoModelForCausalLM.from_pretrained` (collective).

    Args:
        weights: `(hf_name, full_tensor)` pairs, the same sequence on every rank (a collective iterator).
        path: output directory (replaced if it exists).
        source_dir: `--hf-checkpoint`: its config/tokenizer/generation files are copied and its config's
            dtype is the export dtype (the weights' own dtype when it declares none).
        max_shard_bytes: safetensors shard budget.
    """
    write_hf_checkpoint(weights, path, source_dir=source_dir, is_writer=dist.get_rank() == 0,
                        max_shard_bytes=max_shard_bytes, dtype=source_dtype(source_dir))  # fmt: skip
    dist.barrier()
