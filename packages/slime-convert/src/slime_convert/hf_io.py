"""Streaming Hugging Face safetensors I/O: a lazy reader over (sharded) checkpoints and a sharded writer.

The reader opens each `.safetensors` file once and reads single tensors on demand, so converting a
model never holds more than the tensors being transformed. The writer buffers tensors until a shard
reaches `max_shard_bytes`, writes it, and at the end renames the shards to `model-0000k-of-0000n`
and writes `model.safetensors.index.json`.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Iterable

import torch
from safetensors import SafetensorError, safe_open

from slime_core.hf_checkpoint import read_weight_map
from slime_core.safetensors_io import save_safetensors

logger = logging.getLogger(__name__)

__all__ = ["HFCheckpointReader", "HFShardedWriter", "INDEX_NAME"]

INDEX_NAME = "model.safetensors.index.json"
_SINGLE_NAME = "model.safetensors"


class HFCheckpointReader:
    """Lazy access to the tensors of a HF safetensors checkpoint directory.

    Example:
        >>> reader = HFCheckpointReader("/models/Qwen3-0.6B")  # doctest: +SKIP
        >>> reader.get("model.norm.weight").shape  # doctest: +SKIP
        torch.Size([1024])
    """

    def __init__(self, hf_dir: str | os.PathLike[str]) -> None:
        """Indexes the checkpoint (reads only headers; every shard's header is checked once).

        Raises:
            FileNotFoundError: neither `model.safetensors.index.json` nor any `*.safetensors` in `hf_dir`.
            ValueError: the index does not parse, names a shard outside `hf_dir` (absolute, `..`), a missing file
                or a tensor its file lacks, or a shard is not a complete safetensors file (truncated copy); each
                names the file; without an index, a tensor stored in two files. Tensors and shards the index does
                not list are not read, with a warning naming them.
        """
        self.dir = pathlib.Path(hf_dir)
        index = self.dir / INDEX_NAME
        self._where: dict[str, pathlib.Path] = {}
        self._handles: dict[pathlib.Path, object] = {}
        if index.is_file():
            by_file: dict[pathlib.Path, list[str]] = {}
            for name, file in read_weight_map(index).items():
                path = self.dir / file
                if not path.is_file():
                    raise ValueError(f"{index}: tensor {name!r} is in {file}, which does not exist")
                self._where[name] = path
                by_file.setdefault(path, []).append(name)
            for path in sorted(by_file):
                stored = set(self._open(path).keys())  # type: ignore[attr-defined]
                missing = sorted(set(by_file[path]) - stored)
                if missing:
                    raise ValueError(f"{index}: names {missing[:3]} in {path.name}, which does not hold them")
                unlisted = sorted(stored - set(self._where))
                if unlisted:  # the index decides what the checkpoint holds (as for transformers): said, not hidden
                    logger.warning(
                        "%s: %d tensors in %s are not in the index and are not read: %s",
                        index, len(unlisted), path.name, unlisted[:3],
                    )  # fmt: skip
            stray = sorted(p.name for p in self.dir.glob("*.safetensors") if p not in by_file)
            if stray:  # a left-over shard of an older save, or one the index forgot
                logger.warning("%s: %d safetensors files are not in the index and are not read: %s",
                               index, len(stray), stray[:3])  # fmt: skip
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                pickles = sorted(p.name for p in self.dir.glob("*.bin"))
                hint = (  # the original's conversion read safetensors only too; a pickle is not loaded here
                    f"; it holds {pickles[:3]} (PyTorch pickles): re-save them as safetensors first, e.g. "
                    "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(out, safe_serialization=True)"
                    if pickles
                    else ""
                )
                raise FileNotFoundError(f"no {INDEX_NAME} or *.safetensors in {self.dir}{hint}")
            for path in files:
                for name in self._open(path).keys():  # type: ignore[attr-defined]  # noqa: SIM118
                    if name in self._where:  # the later file silently won (a left-over shard of an older save)
                        raise ValueError(
                            f"{self.dir}: tensor {name!r} is in both {self._where[name].name} and {path.name}, and "
                            f"there is no {INDEX_NAME} to say which one the checkpoint holds"
                        )
                    self._where[name] = path

    def _open(self, path: pathlib.Path) -> object:
        handle = self._handles.get(path)
        if handle is None:
            try:
                handle = self._handles[path] = safe_open(str(path), framework="pt")
            except SafetensorError as e:  # header too small / file not fully covered: a truncated copy
                raise ValueError(f"{path}: not a complete safetensors file ({e})") from e
        return handle

    def keys(self) -> list[str]:
        """All tensor names."""
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of tensor `name`, from its shard's header (no data read).

        Raises:
            KeyError: the checkpoint has no tensor `name`.
        """
        return tuple(self._open(self.file(name)).get_slice(name).get_shape())  # type: ignore[attr-defined]

    def file(self, name: str) -> pathlib.Path:
        """The shard file holding tensor `name`.

        Raises:
            KeyError: the checkpoint has no tensor `name`.
        """
        path = self._where.get(name)
        if path is None:
            raise KeyError(f"tensor {name!r} not found in HF checkpoint {self.dir}")
        return path

    def get(self, name: str) -> torch.Tensor:
        """Reads one tensor (CPU, stored dtype).

        Raises:
            KeyError: the checkpoint has no tensor `name`.
            ValueError: its bytes do not read (the file changed after it was indexed).
        """
        path = self._where.get(name)
        if path is None:
            raise KeyError(f"tensor {name!r} not found in HF checkpoint {self.dir}")
        try:
            return self._open(path).get_tensor(name)  # type: ignore[attr-defined]
        except SafetensorError as e:
            raise ValueError(f"{path}: tensor {name!r} does not read ({e})") from e

    def close(self) -> None:
        """Drops the open file handles."""
        self._handles.clear()


class HFShardedWriter:
    """Writes named tensors into size-capped safetensors shards plus an index, atomically.

    Tensors are written into `<out_dir>` under temporary names; `close()` renames them to the final
    `model-0000k-of-0000n.safetensors` names and writes the index last (its presence marks completion).
    """

    def __init__(self, out_dir: str | os.PathLike[str], max_shard_bytes: int = 5 * 1024**3) -> None:
        """Creates `out_dir`.

        Raises:
            ValueError: `max_shard_bytes` ≤ 0.
        """
        if max_shard_bytes <= 0:
            raise ValueError(f"--chunk-size must be positive, got {max_shard_bytes}")
        self.dir = pathlib.Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_shard_bytes = max_shard_bytes
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffer_bytes = 0
        self._shards: list[tuple[pathlib.Path, list[str]]] = []
        self.total_bytes = 0
        #: dtypes of the floating-point tensors added (what the copied config.json must state).
        self.dtypes: set[torch.dtype] = set()

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Queues one tensor; flushes a shard when the cap would be exceeded.

        Raises:
            ValueError: duplicate name.
        """
        if name in self._buffer or any(name in names for _, names in self._shards):
            raise ValueError(f"tensor {name!r} written twice")
        size = tensor.numel() * tensor.element_size()
        if self._buffer and self._buffer_bytes + size > self.max_shard_bytes:
            self._flush()
        self._buffer[name] = tensor.detach().cpu().contiguous()
        self._buffer_bytes += size
        self.total_bytes += size
        if tensor.is_floating_point():
            self.dtypes.add(tensor.dtype)

    def add_all(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        """`add` for each `(name, tensor)`."""
        for name, tensor in items:
            self.add(name, tensor)

    def _flush(self) -> None:
        if not self._buffer:
            return
        path = self.dir / f".shard-{len(self._shards):05d}.safetensors.tmp"
        save_safetensors(self._buffer, str(path), metadata={"format": "pt"})
        self._shards.append((path, list(self._buffer)))
        self._buffer, self._buffer_bytes = {}, 0

    def close(self) -> list[pathlib.Path]:
        """Writes the last shard, renames shards and writes the index; returns the shard paths."""
        self._flush()
        total = len(self._shards)
        weight_map: dict[str, str] = {}
        final_paths = []
        for i, (tmp, names) in enumerate(self._shards):
            final = self.dir / f"model-{i + 1:05d}-of-{total:05d}.safetensors"
            os.replace(tmp, final)
            final_paths.append(final)
            weight_map.update(dict.fromkeys(names, final.name))
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        tmp_index = self.dir / (INDEX_NAME + ".tmp")
        tmp_index.write_text(json.dumps(index, indent=2) + "\n")
        os.replace(tmp_index, self.dir / INDEX_NAME)
        logger.info("wrote %d tensors in %d shards to %s", len(weight_map), total, self.dir)
        return final_paths
