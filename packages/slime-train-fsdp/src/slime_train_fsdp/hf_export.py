"""Full tensors under Hugging Face names, bucket by bucket, from a sharded model.

`iter_hf_buckets` gathers one parameter at a time (`DTensor.full_tensor()`, a collective: every rank must
iterate in lockstep) and groups them into buckets of at most `bucket_bytes` (a tensor larger than the budget
gets a bucket of its own). At no point does a rank hold more than one bucket of full tensors.
`save_hf` streams the same full tensors into `slime_core.hf_checkpoint` (the HF writer both backends share), so
`AutoModelForCausalLM.from_pretrained` loads the result.

Names are checkpoint names (`slime_core.hf_names.to_checkpoint_name`): what the source checkpoint holds, what
SGLang loads, e.g. `visual.*` and `model.layers.*` for a Qwen2.5-VL whose modules are `model.visual.*` and
`model.language_model.*`.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from slime_core.hf_checkpoint import source_dtype, write_hf_checkpoint
from slime_core.hf_names import to_checkpoint_name
from slime_core.moe_experts import split_experts
from slime_core.weight_buckets import iter_buckets

__all__ = ["iter_hf_buckets", "save_hf"]


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


def _full_tensors(
    model: nn.Module, dtype: torch.dtype | None, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full tensors by checkpoint name, cast to `dtype` on the device (collective: one gather per sharded tensor)."""
    for name, tensor in _hf_named_tensors(model, skip):
        full = (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()
        yield from split_experts(name, full if dtype is None else full.to(dtype))  # MoE: per-expert names


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
    return iter_buckets(_full_tensors(model, dtype, skip), bucket_bytes)


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

    The files are written by `slime_core.hf_checkpoint` (the writer both backends share): safetensors shards
    (`model.safetensors`, or `model-XXXXX-of-YYYYY.safetensors` with `model.safetensors.index.json`), the source
    checkpoint's config/tokenizer/generation files, into `path.tmp`, then renamed.

    Args:
        model: FSDP2-sharded HF causal LM.
        path: output directory (replaced if it exists).
        source_dir: `--hf-checkpoint`, whose config/tokenizer/generation files are copied.
        max_shard_bytes: shard size budget.
        dtype: cast weights to this dtype (default: the source config's `dtype`, else the master dtype). The
            copied config.json records the dtype the tensors were written in.
        tensors: full `(hf_name, tensor)` pairs to write instead of the model's own (e.g. LoRA-merged weights,
            `slime_train_fsdp.lora.iter_merged`), written as given; collective like `iter_hf_buckets`.
    """
    if dtype is None:
        # The checkpoint's own dtype, not the training (master) dtype the model was loaded in.
        dtype = source_dtype(source_dir)
    named = _full_tensors(model, dtype) if tensors is None else tensors
    write_hf_checkpoint(named, path, source_dir=source_dir, is_writer=dist.get_rank() == 0,
                        max_shard_bytes=max_shard_bytes)  # fmt: skip
    dist.barrier()
