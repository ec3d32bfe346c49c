"""Full tensors under Hugging Face names, bucket by bucket, from a sharded model.

`iter_hf_buckets` gathers one parameter at a time (`DTensor.full_tensor()`, a collective: every rank must
iterate in lockstep) and groups them into buckets of at most `bucket_bytes` (a tensor larger than the budget
gets a bucket of its own). At no point does a rank hold more than one bucket of full tensors.
`save_hf` writes those buckets from rank 0 as safetensors shards with an index, plus the config/tokenizer
files of the source checkpoint, so `AutoModelForCausalLM.from_pretrained` loads the result.

Names are checkpoint names (`slime_core.hf_names.to_checkpoint_name`): what the source checkpoint holds, what
SGLang loads, e.g. `visual.*` and `model.layers.*` for a Qwen2.5-VL whose modules are `model.visual.*` and
`model.language_model.*`.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from slime_core.dir_swap import prepare_staging, staging_dir, swap_in
from slime_core.hf_names import to_checkpoint_name
from slime_core.weight_buckets import iter_buckets

logger = logging.getLogger(__name__)

__all__ = ["copy_assets", "iter_hf_buckets", "save_hf"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _source_dtype(source_dir: pathlib.Path) -> torch.dtype | None:
    """The dtype the source checkpoint's config.json declares (`dtype`, formerly `torch_dtype`), if any."""
    config = json.loads((source_dir / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype")
    return next((dtype for dtype, n in _DTYPE_NAMES.items() if n == name), None)


def _stamp_dtype(config_path: pathlib.Path, dtype: torch.dtype) -> None:
    """Writes the dtype of the exported tensors into the copied config.json (`dtype`, and `torch_dtype` if present)."""
    config = json.loads(config_path.read_text())
    config["dtype"] = _DTYPE_NAMES[dtype]
    if "torch_dtype" in config:
        config["torch_dtype"] = _DTYPE_NAMES[dtype]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _hf_named_tensors(model: nn.Module, skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters and persistent buffers by checkpoint name; a tied `lm_head.weight` is skipped as HF does."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    model_type = getattr(model.config, "model_type", None)
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if (tied and name == "lm_head.weight") or name in skip:
            continue
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        yield to_checkpoint_name(name, model_type), tensor


def iter_hf_buckets(
    model: nn.Module, bucket_bytes: int, dtype: torch.dtype | None = None, skip: frozenset[str] = frozenset()
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yields buckets of full tensors (collective over the model's mesh).

    Args:
        model: FSDP2-sharded HF causal LM.
        bucket_bytes: maximum bytes of a bucket (`--update-weight-buffer-size`); a single larger tensor is
            yielded alone.
        dtype: cast the full tensors to this dtype (e.g. the checkpoint's bf16); keep the master dtype if None.
        skip: module names of tensors to leave out (a frozen vision tower the engines already hold).

    Yields:
        Lists of `(checkpoint_name, full_tensor)` on this rank's device; identical on every rank.

    Raises:
        ValueError: when `bucket_bytes` is not positive.
    """

    def full_tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in _hf_named_tensors(model, skip):
            full = (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()
            yield name, (full if dtype is None else full.to(dtype))

    return iter_buckets(full_tensors(), bucket_bytes)


def copy_assets(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Copies the config, tokenizer and generation files of an HF checkpoint directory (not its weights)."""
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, dst / f.name)


def save_hf(
    model: nn.Module,
    path: str | pathlib.Path,
    *,
    source_dir: str | pathlib.Path,
    max_shard_bytes: int = 5 * 1024**3,
    dtype: torch.dtype | None = None,
    tensors: Iterator[tuple[str, torch.Tensor]] | None = None,
) -> None:
    """Exports the model as an HF checkpoint directory (collective; rank 0 writes).

    Written to `path.tmp` then renamed. Shards are `model-XXXXX-of-YYYYY.safetensors` with
    `model.safetensors.index.json`, or a single `model.safetensors` when one shard suffices.

    Args:
        model: FSDP2-sharded HF causal LM.
        path: output directory (replaced if it exists and slime wrote it: `slime_core.dir_swap`).
        source_dir: `--hf-checkpoint`, whose config/tokenizer/generation files are copied.
        max_shard_bytes: shard size budget.
        dtype: cast weights to this dtype (default: the source config's `dtype`, else the master dtype). The
            copied config.json records the dtype the tensors were written in.
        tensors: full `(hf_name, tensor)` pairs to write instead of the model's own (e.g. LoRA-merged weights,
            `slime_train_fsdp.lora.iter_merged`); collective like `iter_hf_buckets`.
    """
    from safetensors.torch import save_file

    out = pathlib.Path(path)
    tmp = staging_dir(out)
    rank = dist.get_rank()
    if dtype is None:
        # The checkpoint's own dtype, not the training (master) dtype the model was loaded in.
        dtype = _source_dtype(pathlib.Path(source_dir))
    if rank == 0:
        prepare_staging(out, flag="--save-hf")  # refuses a folder slime did not write, before any work
    shards: list[tuple[str, list[str]]] = []
    total = 0
    written: set[torch.dtype] = set()
    buckets = (
        iter_hf_buckets(model, max_shard_bytes, dtype=dtype)
        if tensors is None
        else iter_buckets(tensors, max_shard_bytes)
    )
    for i, bucket in enumerate(buckets):
        if rank == 0:
            name = f"shard-{i:05d}.safetensors"
            save_file({k: v.cpu().contiguous() for k, v in bucket}, str(tmp / name), metadata={"format": "pt"})
            shards.append((name, [k for k, _ in bucket]))
            total += sum(v.numel() * v.element_size() for _, v in bucket)
            written.update(v.dtype for _, v in bucket if v.is_floating_point())
    if rank == 0:
        _finish_shards(tmp, shards, total)
        copy_assets(pathlib.Path(source_dir), tmp)
        if len(written) == 1 and (tmp / "config.json").is_file():
            _stamp_dtype(tmp / "config.json", written.pop())
        swap_in(tmp, out, flag="--save-hf")  # rename swap: a crash leaves the old or the new export, never none
        logger.info("exported HF checkpoint to %s (%d shards)", out, len(shards))
    dist.barrier()


def _finish_shards(tmp: pathlib.Path, shards: list[tuple[str, list[str]]], total: int) -> None:
    """Renames shards to HF's names and writes the index when there is more than one."""
    if len(shards) == 1:
        os.replace(tmp / shards[0][0], tmp / "model.safetensors")
        return
    weight_map = {}
    for i, (name, keys) in enumerate(shards):
        final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        os.replace(tmp / name, tmp / final)
        weight_map.update(dict.fromkeys(keys, final))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
