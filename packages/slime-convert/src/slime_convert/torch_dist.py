"""Megatron-core `torch_dist` checkpoints without Megatron: streaming writer and chunk reader.

A `torch_dist` checkpoint directory (what `megatron.core.dist_checkpointing.save` writes) holds a
PyTorch Distributed Checkpoint (`.metadata` + `__0_0.distcp`) whose keys are megatron-core
`ShardedTensor.key`s with global shapes (layer/expert indices as leading axes, tensors unsharded by
TP/PP), `ShardedObject`s under `"<key>/shard_<offset>_<shape>"` serialized with `torch.save([data])`,
plus `common.pt` (non-sharded state) and `metadata.json` (backend names).

The writer plans one write item per chunk (one layer / one expert) and computes each chunk only
when the file writer asks for it, so peak memory is one chunk. The reader loads chosen chunks with
a custom load planner, so a model is read back layer by layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import pathlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from slime_convert.staged import staged_output
from slime_core.checkpoint_dirs import FSDP_MODEL_DIR, REFERENCE_DIR, TRACKER_FILE, iteration_name
from slime_core.error_text import first_rank_error, first_sentence

logger = logging.getLogger(__name__)

__all__ = [
    "LazyChunk",
    "TorchDistReader",
    "resolve_iteration_dir",
    "sharded_object_key",
    "write_torch_dist",
]
_CONFIG = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}


@dataclasses.dataclass(frozen=True, slots=True)
class LazyChunk:
    """One chunk of a global tensor, computed on demand.

    Attributes:
        key: storage key (megatron-core `ShardedTensor.key`).
        global_shape: shape of the whole stored tensor (e.g. `(num_layers, rows, cols)`).
        offsets: where the chunk starts in each dim (e.g. `(layer, 0, 0)`).
        dtype: stored dtype.
        produce: returns the chunk, shaped `global_shape` with the leading `len(offsets)-ndim(chunk)` unit
            axes dropped (e.g. one layer's `[rows, cols]`).
    """

    key: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    dtype: torch.dtype
    produce: Callable[[], torch.Tensor]
    chunk_shape: tuple[int, ...]


def sharded_object_key(key: str, offset: Sequence[int], shape: Sequence[int]) -> str:
    """megatron-core `ShardedObject.unique_key`: `"<key>/shard_<o1.o2>_<s1.s2>"`."""
    return f"{key}/shard_{'.'.join(map(str, offset))}_{'.'.join(map(str, shape))}"


class _LazySavePlanner(DefaultSavePlanner):
    """Save planner whose items are `LazyChunk`s and pre-serialized objects, resolved when written."""

    def __init__(self, chunks: Sequence[LazyChunk], objects: dict[str, Any]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self._chunks = {(c.key, tuple(c.offsets)): c for c in chunks}
        if len(self._chunks) != len(chunks):
            raise ValueError("duplicate (key, offsets) among torch_dist chunks")
        self._objects = objects

    def create_local_plan(self) -> SavePlan:
        items = []
        for chunk in self._chunks.values():
            offsets = torch.Size(chunk.offsets)
            items.append(
                WriteItem(
                    index=MetadataIndex(chunk.key, offsets),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=offsets, sizes=torch.Size(chunk.chunk_shape)),
                        properties=TensorProperties(dtype=chunk.dtype),
                        size=torch.Size(chunk.global_shape),
                    ),
                )
            )
        items += [WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO) for key in self._objects]
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        if write_item.type == WriteItemType.BYTE_IO:
            buffer = io.BytesIO()
            torch.save([self._objects[write_item.index.fqn]], buffer)
            buffer.seek(0)
            return buffer
        chunk = self._chunks[(write_item.index.fqn, tuple(write_item.index.offset))]
        tensor = chunk.produce()
        expected = tuple(chunk.chunk_shape)
        if tensor.numel() != torch.Size(expected).numel():
            raise ValueError(
                f"{chunk.key} at {chunk.offsets}: produced shape {tuple(tensor.shape)}, expected {expected}"
            )
        if tensor.dtype != chunk.dtype:
            raise ValueError(
                f"{chunk.key} at {chunk.offsets}: produced dtype {tensor.dtype}, expected {chunk.dtype} (the first "
                "layer's): the checkpoint mixes dtypes; pass --dtype to cast every weight to one"
            )
        return tensor.reshape(expected).contiguous()


def write_torch_dist(
    out_dir: str | os.PathLike[str],
    chunks: Sequence[LazyChunk],
    objects: dict[str, Any],
    common_state: dict[str, Any],
    *,
    force: bool = False,
    inputs: dict[str, str | os.PathLike[str]] | None = None,
) -> None:
    """Writes a torch_dist checkpoint directory atomically (temp dir, then rename).

    Args:
        out_dir: the iteration directory to create (e.g. `<save>/release`); must not exist.
        chunks: every tensor chunk; together they must tile each global tensor exactly.
        objects: sharded objects by unique key (see `sharded_object_key`).
        common_state: what goes to `common.pt` (megatron's non-sharded state).
        force: replace an existing `out_dir` (`-f/--force`), once the new one is complete.
        inputs: the conversion's input folders by flag; an `out_dir` that is or holds one is refused.

    Raises:
        FileExistsError: `out_dir` exists and not `force`.
        ValueError: chunks overlapping or not covering a tensor, or a producer returning the wrong shape.
    """
    with staged_output(out_dir, force=force, flag="--save", inputs=inputs) as tmp:
        writer = dcp.FileSystemWriter(str(tmp), single_file_per_rank=True, thread_count=1, overwrite=True)
        with _rank_errors(), _single_process():  # a producer's error names the tensor
            dcp.save({}, storage_writer=writer, planner=_LazySavePlanner(chunks, objects), no_dist=True)
        torch.save(common_state, tmp / "common.pt")
        (tmp / "metadata.json").write_text(json.dumps(_CONFIG))


@contextlib.contextmanager
def _single_process() -> Iterator[None]:
    """Silences DCP's warning that it assumes one process (`no_dist=True` asks for exactly that).

    It was the only output of every `hf-to-mcore` besides the progress bar.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


@contextlib.contextmanager
def _rank_errors(describe: Callable[[Exception], Exception] | None = None) -> Iterator[None]:
    """Raises the rank's own error out of DCP's `CheckpointException`, or `describe(error)` made from it.

    DCP reports a failed save or load as a `CheckpointException`, a BaseException holding each rank's error and
    traceback (`slime_core.error_text.first_rank_error`); the rank's error is what names the tensor or the file. A
    rank's Ctrl-C comes out as the `KeyboardInterrupt` it was (so the CLI ends in one line, exit 130), any other
    BaseException stays wrapped.
    """
    try:
        yield
    except CheckpointException as e:
        cause = first_rank_error(e)
        if isinstance(cause, KeyboardInterrupt):
            raise cause from e
        if not isinstance(cause, Exception):
            raise
        raise (cause if describe is None else describe(cause)) from e


class _ChunkLoadPlanner(LoadPlanner):
    """Loads requested chunks `(key, offsets) → target tensor` out of a DCP checkpoint."""

    def __init__(self, requests: dict[tuple[str, tuple[int, ...]], torch.Tensor]) -> None:
        self._requests = requests

    def set_up_planner(self, state_dict: Any, metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        assert metadata is not None
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        items: list[ReadItem] = []
        for (key, offsets), target in self._requests.items():
            md = self.metadata.state_dict_metadata.get(key)
            if not isinstance(md, TensorStorageMetadata):
                raise KeyError(f"tensor {key!r} not in checkpoint")
            chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=target.shape)
            items += create_read_items_for_chunk_list(key, md, [chunk])
        return LoadPlan(items)

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise AssertionError("byte items are never requested")

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        target = self._requests[(read_item.dest_index.fqn, tuple(read_item.dest_index.offset))]
        for dim, (offset, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths, strict=True)):
            target = target.narrow(dim, offset, length)
        return target

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass


class TorchDistReader:
    """Reads chunks of tensors (e.g. one layer of a layer-stacked key) from a torch_dist directory."""

    def __init__(self, ckpt_dir: str | os.PathLike[str]) -> None:
        """Reads the checkpoint metadata.

        Raises:
            FileNotFoundError: not a torch_dist directory (no `.metadata`).
            ValueError: `.metadata` does not read (truncated, not DCP's), naming the file.
        """
        self.dir = pathlib.Path(ckpt_dir)
        if not (self.dir / ".metadata").is_file():
            raise FileNotFoundError(f"{self.dir} is not a torch_dist checkpoint directory (no .metadata)")
        self._reader = dcp.FileSystemReader(str(self.dir))
        try:
            self.metadata = self._reader.read_metadata()
        except Exception as e:  # a truncated or foreign file: pickle's or torch's error, naming no file
            raise ValueError(f"{self.dir / '.metadata'}: not readable torch_dist metadata ({first_sentence(e)})") from e

    def tensor_keys(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Stored tensors: key → (global shape, dtype)."""
        return {
            k: (tuple(md.size), md.properties.dtype)
            for k, md in self.metadata.state_dict_metadata.items()
            if isinstance(md, TensorStorageMetadata)
        }

    def read(self, requests: Sequence[tuple[str, tuple[int, ...]]]) -> list[torch.Tensor]:
        """Reads several sub-tensors in one pass.

        Args:
            requests: `(key, index)` pairs; `index` selects along the leading axes (e.g. `(layer,)` or
                `(layer, expert)`; `()` for the whole tensor).

        Returns:
            One tensor per request, the leading indexed axes dropped, in the stored dtype.

        Raises:
            KeyError: a key is not in the checkpoint.
            ValueError: the stored bytes do not read (a truncated shard), naming the directory and the cause.
        """
        shapes = self.tensor_keys()
        targets: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
        out = []
        for key, index in requests:
            if key not in shapes:
                raise KeyError(f"tensor {key!r} not in torch_dist checkpoint {self.dir}")
            shape, dtype = shapes[key]
            offsets = tuple(index) + (0,) * (len(shape) - len(index))
            target = torch.empty((1,) * len(index) + shape[len(index) :], dtype=dtype)
            targets[(key, offsets)] = target
            out.append(target.reshape(shape[len(index) :]))
        self._reader = dcp.FileSystemReader(str(self.dir))

        def damaged(cause: Exception) -> ValueError:
            return ValueError(
                f"{self.dir}: cannot be read ({first_sentence(cause)}); the checkpoint was damaged after it was "
                "written (a partial copy?)"
            )

        with _rank_errors(damaged), _single_process():
            dcp.load({}, storage_reader=self._reader, planner=_ChunkLoadPlanner(targets), no_dist=True)
        return out

    def common_state(self) -> dict[str, Any]:
        """The `common.pt` contents ({} when absent)."""
        path = self.dir / "common.pt"
        return torch.load(path, map_location="cpu", weights_only=False) if path.is_file() else {}


def resolve_iteration_dir(path: str | os.PathLike[str], iteration: int | None = None) -> pathlib.Path:
    """Finds the torch_dist directory inside a Megatron save dir.

    Accepts an iteration directory (`iter_0000010`, `release`) directly, or a save root holding
    `latest_checkpointed_iteration.txt` (or a chosen `iteration`).

    Raises:
        FileNotFoundError: nothing loadable at `path`.
        ValueError: an FSDP checkpoint (named as such), the tracker file holds neither an iteration number nor
            "release", or the iteration is in Megatron's legacy per-rank layout (`mp_rank_*` folders,
            `--ckpt-format torch`).
    """
    root = pathlib.Path(path)
    _refuse_fsdp_layout(root)
    if (root / ".metadata").is_file():
        return root
    _refuse_legacy_layout(root)
    if iteration is not None:
        candidate = root / iteration_name(iteration)
    else:
        tracker = root / TRACKER_FILE
        if not tracker.is_file():
            raise FileNotFoundError(
                f"{root}: neither a torch_dist directory (.metadata) nor a save dir ({TRACKER_FILE})"
            )
        text = tracker.read_text(errors="replace").strip()
        if text != "release" and not (text.isascii() and text.isdigit()):
            # Megatron writes an iteration number or "release"; anything else is a damaged or foreign file.
            raise ValueError(f"{tracker}: holds {text[:80]!r}, not an iteration number or 'release'")
        candidate = root / ("release" if text == "release" else iteration_name(int(text)))
    if not (candidate / ".metadata").is_file():
        _refuse_fsdp_layout(candidate)
        _refuse_legacy_layout(candidate)
        raise FileNotFoundError(f"{candidate} is not a torch_dist checkpoint directory")
    return candidate


def _refuse_fsdp_layout(path: pathlib.Path) -> None:
    """Names the FSDP trainer's checkpoint (`slime_train_fsdp.checkpoint`), refused with a ValueError.

    That is an iteration folder with `meta.json` and `model_and_optim/`, or one of its DCP folders. Its DCP shards
    hold the HF model's own parameter names, which no torch_dist reader maps (the generic "not a torch_dist
    checkpoint" said nothing of what it was).
    """
    if path.name in (FSDP_MODEL_DIR, REFERENCE_DIR) and (path.parent / "meta.json").is_file():
        iteration_dir = path.parent
    elif (path / "meta.json").is_file() and (path / FSDP_MODEL_DIR).is_dir():
        iteration_dir = path
    else:
        return
    raise ValueError(
        f"{path}: an FSDP checkpoint (--train-backend fsdp: {iteration_dir.name}/{FSDP_MODEL_DIR} holds DCP shards of "
        "the HF model's own parameters), not Megatron torch_dist: export it with `slime-convert fsdp-to-hf "
        f"--input-dir {iteration_dir} --output-dir DIR --origin-hf-dir <the run's --hf-checkpoint>`; "
        f"--train-backend fsdp loads it as it is (--load {iteration_dir.parent})"
    )


def _refuse_legacy_layout(iteration_dir: pathlib.Path) -> None:
    """Names Megatron's legacy per-rank layout (`--ckpt-format torch`: `mp_rank_00[_000]/model_optim_rng.pt`)."""
    ranks = sorted(p.name for p in iteration_dir.glob("mp_rank_*") if p.is_dir()) if iteration_dir.is_dir() else []
    if ranks:
        raise ValueError(
            f"{iteration_dir}: a legacy --ckpt-format torch checkpoint ({len(ranks)} rank folders: {ranks[0]}, ...), "
            "not torch_dist; slime-convert reads torch_dist only: re-save it with Megatron-LM (its training command "
            "with --ckpt-format torch --ckpt-convert-format torch_dist --ckpt-convert-save DIR)"
        )
