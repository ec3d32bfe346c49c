"""`--save-hf` for the Megatron backend: the model as a Hugging Face safetensors checkpoint.

The weights come from `model.iter_hf_weights` (full tensors under HF names on every rank: TP/EP shards
gathered, pipeline stages broadcast), so every rank iterates in lockstep and only rank 0 writes: safetensors
shards with an index (`slime_convert.hf_io.HFShardedWriter`) plus the config/tokenizer/generation files of
`--hf-checkpoint`, into `<path>.tmp`, renamed to `<path>` at the end.
"""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
from collections.abc import Iterable

import torch
import torch.distributed as dist

from slime_convert.hf_io import INDEX_NAME, HFShardedWriter
from slime_core.dir_swap import prepare_staging, staging_dir, swap_in

logger = logging.getLogger(__name__)

__all__ = ["save_hf"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _source_dtype(source_dir: pathlib.Path) -> torch.dtype | None:
    """The dtype the source checkpoint's config.json declares (`dtype`, formerly `torch_dtype`), if any."""
    config = json.loads((source_dir / "config.json").read_text())
    return _DTYPES.get(config.get("dtype") or config.get("torch_dtype"))


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
        path: output directory (replaced if it exists and slime wrote it: `slime_core.dir_swap`).
        source_dir: `--hf-checkpoint`: its config/tokenizer/generation files are copied and its config's
            dtype is the export dtype (the weights' own dtype when it declares none).
        max_shard_bytes: safetensors shard budget.
    """
    source, out = pathlib.Path(source_dir), pathlib.Path(path)
    tmp = staging_dir(out)
    writer = None
    if dist.get_rank() == 0:
        prepare_staging(out, flag="--save-hf")  # refuses a folder slime did not write, before any work
        writer = HFShardedWriter(tmp, max_shard_bytes=max_shard_bytes)
    dtype = _source_dtype(source)
    for name, tensor in weights:  # every rank iterates: the gathers and broadcasts inside are collective
        if writer is not None:
            writer.add(name, tensor if dtype is None else tensor.to(dtype))
    if writer is not None:
        writer.close()
        for f in source.iterdir():
            if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name != INDEX_NAME:
                shutil.copy2(f, tmp / f.name)
        swap_in(tmp, out, flag="--save-hf")  # rename swap: a crash leaves the old or the new export, never none
        logger.info("exported HF checkpoint to %s", out)
    dist.barrier()
