"""The one Hugging Face checkpoint writer of both training backends (`--save-hf`).

A backend gathers its full tensors under checkpoint names (FSDP: `DTensor.full_tensor()`; Megatron: TP/EP
gathered, PP broadcast) and streams them through `write_hf_checkpoint` on every rank in lockstep; only the
writing rank (rank 0) keeps them. The layout is what `transformers`' `save_pretrained` writes, so both
backends' exports of the same weights are identical file for file:

- one shard: `model.safetensors`; several: `model-00001-of-0000N.safetensors` plus
  `model.safetensors.index.json` (`{"metadata": {"total_size": bytes}, "weight_map": {name: file}}`);
- the config/tokenizer/generation files of the source checkpoint (`--hf-checkpoint`), not its weights;
- `config.json`'s `dtype` (and a legacy `torch_dtype`) stating the dtype the tensors were written in.

Everything goes to `<path>.tmp` first and is renamed into place (`slime_core.dir_swap.swap_in`), so a crash leaves
the previous export or the new one, never a half-written directory.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
from collections.abc import Iterable

import torch

from slime_core.dir_swap import prepare_staging, swap_in
from slime_core.fp8 import strip_quantization_config
from slime_core.safetensors_io import save_safetensors

logger = logging.getLogger(__name__)

__all__ = [
    "HFCheckpointWriter",
    "copy_assets",
    "describe_exported_weights",
    "read_weight_map",
    "source_dtype",
    "write_hf_checkpoint",
]

SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def source_dtype(source_dir: str | os.PathLike[str]) -> torch.dtype | None:
    """The dtype an HF checkpoint's config.json declares (`dtype`, formerly `torch_dtype`); None if none or unknown.

    Raises:
        FileNotFoundError: `source_dir` has no config.json.
    """
    config = json.loads((pathlib.Path(source_dir) / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype")
    return next((dtype for dtype, n in _DTYPE_NAMES.items() if n == name), None)


def read_weight_map(index: str | os.PathLike[str]) -> dict[str, str]:
    """The `weight_map` of a `model.safetensors.index.json` (tensor name -> shard file), checked.

    A shard is named relative to the index's folder, as `transformers` writes and reads it. A name that is absolute
    or climbs out with `..` would make the loader read (or, for a delta, patch from) a file elsewhere on the machine,
    so it is refused. Symlinked shards (the Hugging Face cache's snapshots) are fine: only the name is checked.

    Args:
        index: the index file.

    Returns:
        The weight map as written.

    Raises:
        ValueError: the file is not JSON, has no `weight_map` object of str -> str, or a shard name is absolute or
            holds `..` (names the file and the tensor key).
    """
    index = pathlib.Path(index)
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ValueError(f"{index}: not a safetensors index ({e})") from e
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise ValueError(f"{index}: no 'weight_map' object of tensor name -> file name")
    for name, file in weight_map.items():
        # Both separators: an index written on Windows may use backslashes, and `C:` drives are absolute there.
        parts = pathlib.PureWindowsPath(file).parts
        if not file or pathlib.PurePosixPath(file).is_absolute() or pathlib.PureWindowsPath(file).anchor:
            raise ValueError(f"{index}: weight_map[{name!r}] = {file!r} is not a file name inside the folder")
        if ".." in parts:
            raise ValueError(f"{index}: weight_map[{name!r}] = {file!r} leads out of the folder ('..')")
    return weight_map


def copy_assets(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copies the config, tokenizer and generation files of an HF checkpoint directory (not its weights)."""
    for f in pathlib.Path(src).iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, pathlib.Path(dst) / f.name)


def _stamp_dtype(config_path: pathlib.Path, dtype: torch.dtype) -> None:
    """Writes the dtype of the exported tensors into the copied config.json (`dtype`, and `torch_dtype` if present)."""
    config = json.loads(config_path.read_text())
    config["dtype"] = _DTYPE_NAMES[dtype]
    if "torch_dtype" in config:
        config["torch_dtype"] = _DTYPE_NAMES[dtype]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def describe_exported_weights(config_path: str | os.PathLike[str], dtypes: Iterable[torch.dtype]) -> None:
    """Makes a config.json copied next to exported (unquantized) weights describe them.

    A config stating bf16 over fp32 tensors makes `from_pretrained(dtype="auto")` load them in bf16, and a
    `quantization_config` copied from an FP8 source makes a loader read bf16 tensors as FP8.

    Args:
        config_path: the copied config.json (nothing is done if it is absent).
        dtypes: the dtypes of the floating-point tensors written; stamped as `dtype` (and a legacy `torch_dtype`)
            when they are one of bf16/fp16/fp32, left as copied when mixed.
    """
    path = pathlib.Path(config_path)
    if not path.is_file():
        return
    kinds = set(dtypes)
    if len(kinds) == 1 and next(iter(kinds)) in _DTYPE_NAMES:
        _stamp_dtype(path, next(iter(kinds)))
    strip_quantization_config(path)


class HFCheckpointWriter:
    """Writes named tensors to `<path>.tmp` in byte-capped safetensors shards; `commit` renames it to `path`.

    Tensors are moved to CPU as they arrive and a shard is written as soon as the next tensor would take it past
    `max_shard_bytes` (a larger tensor gets a shard of its own), so at most one shard is held in host memory.

    Example:
        >>> writer = HFCheckpointWriter("/ckpt/hf", source_dir="/models/Qwen3-0.6B")  # doctest: +SKIP
        >>> writer.add("model.norm.weight", torch.ones(1024))  # doctest: +SKIP
        >>> writer.commit()  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        source_dir: str | os.PathLike[str],
        max_shard_bytes: int = 5 * 1024**3,
        flag: str = "--save-hf",
    ) -> None:
        """Creates an empty `<path>.tmp` (a stale one from a killed run is removed).

        Args:
            path: the export directory (replaced on `commit` if it exists and slime wrote it: `slime_core.dir_swap`).
            source_dir: `--hf-checkpoint`, whose config/tokenizer/generation files are copied.
            max_shard_bytes: safetensors shard budget in bytes.
            flag: the flag that named `path`, for a refusal's message.

        Raises:
            ValueError: `max_shard_bytes` ≤ 0.
            ReplaceRefused: `path` (or its `.tmp`/`.old`) is a folder slime did not write, before any work.
        """
        if max_shard_bytes <= 0:
            raise ValueError(f"HF export shard size must be > 0 bytes, got {max_shard_bytes}")
        self.path, self.source_dir = pathlib.Path(path), pathlib.Path(source_dir)
        self.max_shard_bytes = max_shard_bytes
        self.flag = flag
        self.tmp = prepare_staging(self.path, flag=flag)
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffer_bytes = 0
        self._shards: list[list[str]] = []
        self._names: set[str] = set()
        self._dtypes: set[torch.dtype] = set()
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Queues one full tensor under its checkpoint name.

        Raises:
            ValueError: `name` was added before.
        """
        if name in self._names:
            raise ValueError(f"HF export: tensor {name!r} written twice")
        nbytes = tensor.numel() * tensor.element_size()
        if self._buffer and self._buffer_bytes + nbytes > self.max_shard_bytes:
            self._flush()
        self._names.add(name)
        self._buffer[name] = tensor.detach().cpu().contiguous()
        self._buffer_bytes += nbytes
        self.total_bytes += nbytes
        if tensor.is_floating_point():
            self._dtypes.add(tensor.dtype)

    def _flush(self) -> None:
        if not self._buffer:
            return
        save_safetensors(
            self._buffer, str(self.tmp / f"shard-{len(self._shards):05d}.safetensors"), metadata={"format": "pt"}
        )
        self._shards.append(list(self._buffer))
        self._buffer, self._buffer_bytes = {}, 0

    def commit(self) -> pathlib.Path:
        """Writes the last shard, names the shards as HF does, writes the index, copies the assets, then renames.

        Returns:
            The export directory.
        """
        self._flush()
        if len(self._shards) == 1:
            os.replace(self.tmp / "shard-00000.safetensors", self.tmp / SINGLE_NAME)
        elif self._shards:
            weight_map: dict[str, str] = {}
            for i, names in enumerate(self._shards):
                final = f"model-{i + 1:05d}-of-{len(self._shards):05d}.safetensors"
                os.replace(self.tmp / f"shard-{i:05d}.safetensors", self.tmp / final)
                weight_map.update(dict.fromkeys(names, final))
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.tmp / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        copy_assets(self.source_dir, self.tmp)
        describe_exported_weights(self.tmp / "config.json", self._dtypes)
        swap_in(self.tmp, self.path, flag=self.flag)  # a crash leaves the old or the new export, never none
        logger.info("exported HF checkpoint to %s (%d shards)", self.path, len(self._shards))
        return self.path


def write_hf_checkpoint(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    path: str | os.PathLike[str],
    *,
    source_dir: str | os.PathLike[str],
    is_writer: bool,
    max_shard_bytes: int = 5 * 1024**3,
    dtype: torch.dtype | None = None,
) -> None:
    """Drains `named_tensors` on every rank; the writing rank exports them as an HF checkpoint (module doc).

    Every rank must call this with the same sequence: producing a full tensor is a collective in both backends,
    so non-writing ranks iterate too and drop what they get. The caller adds its barrier afterwards.

    Args:
        named_tensors: `(checkpoint name, full tensor)` pairs in write order.
        path: the export directory.
        source_dir: `--hf-checkpoint` (config/tokenizer/generation files).
        is_writer: whether this rank writes (rank 0).
        max_shard_bytes: safetensors shard budget in bytes.
        dtype: cast floating-point tensors to this dtype before writing (None: as given).
    """
    writer = HFCheckpointWriter(path, source_dir=source_dir, max_shard_bytes=max_shard_bytes) if is_writer else None
    for name, tensor in named_tensors:
        if writer is not None:
            cast = dtype is not None and tensor.is_floating_point()
            writer.add(name, tensor.to(dtype) if cast else tensor)
    if writer is not None:
        writer.commit()
