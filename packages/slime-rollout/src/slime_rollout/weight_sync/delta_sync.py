"""Delta weight pushes (`--update-weight-mode delta`) over the tensor and disk transports.

A push goes in full the first time, after any failed push (a checksum mismatch included), whenever a new
updater is built (a resumed run; `slime_app` also rebuilds it when the engine set changes), and when an engine does
not report the base's weight version before the push (restarted in place, or it missed a push). Otherwise only the
tensors that changed since the last acknowledged push travel, each encoded and checksummed by
`slime_rollout.engines.weight_delta`, and the receiver verifies every checksum before it applies anything:

* **tensor** (`DeltaTensorWeightUpdater`): the compressed payloads go through shared memory to
  `POST /update_weights_from_delta` (`UpdateWeightsFromDeltaReq`), which the reference engine implements
  (`slime_rollout.engines.reference.delta`): it refuses a delta whose base version is not what it holds, rebuilds
  every tensor of the request from its own bytes, checks them all, then loads them. SGLang 0.5.16 has no such
  endpoint, so config validation refuses this pairing with one line.
* **disk** (`DeltaDiskWeightUpdater`): the deltas are written as an HF-style directory `weight_v<N>` under
  `--update-weight-disk-dir` (one safetensors file of uint8 payloads; `model.safetensors.index.json` carries the
  original's metadata: version, base_version, delta_encoding, compression_format, checksum_format, and the
  per-tensor checksums). `apply_delta_dir` then patches the full checkpoint in `--update-weight-local-checkpoint-dir`
  in place (verifying each tensor first), and the engines reload it through the ordinary
  `/update_weights_from_disk`: any engine works, SGLang included. The apply runs in trainer rank 0's process, so
  the local checkpoint directory must be reachable from it and from the engines (the original runs it on each
  engine host behind a patched SGLang's `/pull_weights`).

The first (full) push writes the whole checkpoint, cast to the engine's dtype, into the local checkpoint directory
and the engines load it from there. Memory: the trainer keeps one copy of the model in the engine's dtype in rank
0's CPU memory (`DeltaBase.nbytes`), as the original's pinned-CPU snapshot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import shutil
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.numpy import load_file

from slime_core.hf_checkpoint import read_weight_map
from slime_core.safetensors_io import save_safetensors
from slime_rollout.engines.client import RolloutClient
from slime_rollout.engines.weight_delta import (
    COMPRESSION,
    DeltaBase,
    DeltaChecksumError,
    DeltaTensor,
    UpdateWeightsFromDeltaReq,
    verified_apply,
)
from slime_rollout.engines.wire import serialize_named_tensors
from slime_rollout.weight_sync.check import engine_weight_dtype
from slime_rollout.weight_sync.updaters import Bucket, DiskWeightUpdater, TensorWeightUpdater, write_hf_checkpoint

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = [
    "DeltaDiskWeightUpdater",
    "DeltaTensorWeightUpdater",
    "apply_delta_dir",
    "make_delta_updater",
    "read_local_version",
    "write_delta_dir",
]

logger = logging.getLogger(__name__)

VERSION_FILE = "slime_delta_version.txt"  # in the local checkpoint: the weight version its bytes hold
_INDEX = "model.safetensors.index.json"


class _DeltaMixin:
    """Full-or-delta bookkeeping around `_EngineUpdater.aupdate`: the base is committed only when the push succeeds."""

    base: DeltaBase

    def _init_base(self, cfg: SlimeArgs) -> None:
        self.base = DeltaBase(
            encoding=cfg.update_weight_delta_encoding,
            algorithm=cfg.update_weight_delta_checksum,
            dtype=engine_weight_dtype(cfg),
        )
        self._delta_push = False

    @property
    def delta_stats(self) -> Any:
        """The last push's `DeltaStats` (`perf/update_weights_*`)."""
        return self.base.stats

    async def aupdate(self, buckets: Iterable[Bucket], weight_version: str) -> None:
        """Pushes `buckets` in full or as deltas; any failure drops the base so the next push is full."""
        if self.base.valid:
            await self._check_engines_hold_base()
        self._delta_push = self.base.begin()
        try:
            await super().aupdate(buckets, weight_version)  # type: ignore[misc]
        except BaseException:
            self.base.invalidate()
            raise
        self.base.commit(weight_version)
        s = self.base.stats
        logger.info(
            "weights v%s pushed %s: %d/%d tensors, %.3f GB on the wire of %.3f GB (trainer base copy: %.3f GB)",
            weight_version, "in full" if s.full else "as deltas", s.num_sent, s.num_tensors, s.wire_bytes / 1e9,
            s.total_bytes / 1e9, self.base.nbytes / 1e9,
        )  # fmt: skip

    async def _check_engines_hold_base(self, timeout_s: float = 30.0) -> None:
        """Drops the base (full push) when an engine does not report the base's version (restarted, or missed one)."""
        engines = self.client.engines  # type: ignore[attr-defined]
        versions = await asyncio.gather(
            *(asyncio.wait_for(e.get_weight_version(), timeout_s) for e in engines), return_exceptions=True
        )
        off = [f"{e.url}={v!r}" for e, v in zip(engines, versions, strict=True) if v != self.base.version]
        if off:
            logger.warning("delta push: engines not at base v%s (%s): pushing in full", self.base.version, off)
            self.base.invalidate()


class DeltaTensorWeightUpdater(_DeltaMixin, TensorWeightUpdater):
    """`--weight-sync tensor --update-weight-mode delta`: deltas through shared memory to `/update_weights_from_delta`.

    Args:
        cfg: reads what `TensorWeightUpdater` reads, `update_weight_delta_encoding`, `update_weight_delta_checksum`
            and the engine dtype (`slime_rollout.weight_sync.check.engine_weight_dtype`).
        client: the engines (reference engines: SGLang has no delta endpoint).
        pause_mode: `pause_generation` mode.
    """

    def __init__(self, cfg: SlimeArgs, client: RolloutClient, *, pause_mode: str = "abort"):
        # A plain list: the full pushes go to the same engines, which need no SGLang bucket format.
        super().__init__(cfg, client, load_format=None, pause_mode=pause_mode)
        self._init_base(cfg)

    async def _send(self, buckets: Iterable[Bucket], weight_version: str) -> None:
        if not self._delta_push:
            await super()._send((self.base.record_full(b) for b in buckets), weight_version)
            return
        for bucket in buckets:
            deltas = self.base.encode_bucket(bucket)
            if deltas:
                await self._send_deltas(deltas, weight_version)

    async def _send_deltas(self, deltas: list[DeltaTensor], weight_version: str) -> None:
        named = [(d.name, torch.from_numpy(d.payload.copy())) for d in deltas]
        req = UpdateWeightsFromDeltaReq(
            serialized_named_tensors=[serialize_named_tensors(named)] * self.tp_size,
            checksums={d.name: d.checksum for d in deltas},
            base_version=str(self.base.version),
            delta_encoding=self.base.encoding,
            checksum_format=self.base.algorithm,
            weight_version=weight_version,
        )
        await self.session.each("update_weights_from_delta", tracked=True, req=req)


# ------------------------------------------------------------------------------------------------- disk


def write_delta_dir(deltas: list[DeltaTensor], out_dir: str | os.PathLike, metadata: dict[str, str]) -> int:
    """Writes one delta version: `model-00001.safetensors` (uint8 payloads) and the index with its metadata.

    Args:
        deltas: the changed tensors.
        out_dir: the version directory (replaced).
        metadata: version, base_version, delta_encoding, compression_format, checksum_format.

    Returns:
        Bytes written (the payload file and the index).

    Raises:
        OSError: a write failed (a full disk); the directory is removed (no push reads it, none would clean it up).
    """
    out = pathlib.Path(out_dir)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shard = "model-00001.safetensors"
    written = 0
    try:
        if deltas:
            # The mode open() gives, as every other file of the push (safetensors >= 0.8 writes 0600); a copy: the
            # compressed payloads are read-only arrays, which torch only wraps with a warning.
            save_safetensors({d.name: torch.from_numpy(d.payload.copy()) for d in deltas}, out / shard)
            written += (out / shard).stat().st_size
        index = {
            "metadata": dict(metadata),
            "checksums": {d.name: d.checksum for d in deltas},
            "weight_map": dict.fromkeys((d.name for d in deltas), shard),
        }
        tmp = out / f".{_INDEX}.tmp"
        tmp.write_text(json.dumps(index, indent=1))
        os.replace(tmp, out / _INDEX)  # the index last: a reader never sees a version without its payloads
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return written + (out / _INDEX).stat().st_size


def _safetensors_locations(ckpt_dir: pathlib.Path) -> dict[str, tuple[pathlib.Path, int, int]]:
    """Tensor name -> (file, byte offset, byte count) from the safetensors headers of a checkpoint directory."""
    out = {}
    for path in sorted(ckpt_dir.glob("*.safetensors")):
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        for name, info in header.items():
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                out[name] = (path, 8 + header_len + begin, end - begin)
    return out


def read_local_version(local_dir: str | os.PathLike) -> str | None:
    """The weight version the local checkpoint's bytes hold (None: no version recorded)."""
    path = pathlib.Path(local_dir) / VERSION_FILE
    return path.read_text().strip() if path.exists() else None


def apply_delta_dir(delta_dir: str | os.PathLike, local_dir: str | os.PathLike) -> int:
    """Patches a full HF checkpoint in place with one delta version, each tensor verified before it is written.

    Args:
        delta_dir: a directory from `write_delta_dir`.
        local_dir: the full checkpoint (safetensors, in the engine's dtype) holding the delta's base version.

    Returns:
        Tensors patched.

    Raises:
        DeltaChecksumError: the local checkpoint holds another version than the delta's base, a tensor is missing
            from it, or a reconstructed tensor's checksum differs (names the tensor). Tensors before the failing one
            may be patched already; the local checkpoint's version is then cleared, so it is never used as a base.
        ValueError: the delta's index names a shard outside `delta_dir` (absolute, `..`); nothing is patched.
    """
    delta_dir, local_dir = pathlib.Path(delta_dir), pathlib.Path(local_dir)
    index = json.loads((delta_dir / _INDEX).read_text())
    weight_map = read_weight_map(delta_dir / _INDEX)  # no shard outside delta_dir, checked before any byte moves
    meta = index["metadata"]
    held = read_local_version(local_dir)
    if held != meta["base_version"]:
        raise DeltaChecksumError(
            f"{delta_dir}: a delta on top of v{meta['base_version']}, but {local_dir} holds v{held} (out of order)"
        )
    if meta.get("compression_format", COMPRESSION) != COMPRESSION:
        raise DeltaChecksumError(f"{delta_dir}: compression {meta['compression_format']!r}, only zstd is known")
    locations = _safetensors_locations(local_dir)
    (local_dir / VERSION_FILE).unlink()  # mid-apply the bytes are no version at all
    payloads = _load_payloads(delta_dir, weight_map)
    for name, payload in payloads.items():
        if name not in locations:
            raise DeltaChecksumError(f"{delta_dir}: tensor {name!r} is not in the local checkpoint {local_dir}")
        path, offset, nbytes = locations[name]
        with path.open("r+b") as f:
            f.seek(offset)
            base = np.frombuffer(f.read(nbytes), dtype=np.uint8)
            new = verified_apply(
                name, base, payload, encoding=meta["delta_encoding"], algorithm=meta["checksum_format"],
                expected=index["checksums"][name],
            )  # fmt: skip
            f.seek(offset)
            f.write(memoryview(new).cast("B"))
    (local_dir / VERSION_FILE).write_text(meta["version"])
    return len(payloads)


def _load_payloads(delta_dir: pathlib.Path, weight_map: dict[str, str]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        out.update(load_file(str(delta_dir / shard)))
    return out


class DeltaDiskWeightUpdater(_DeltaMixin, DiskWeightUpdater):
    """`--weight-sync disk --update-weight-mode delta`: delta dirs, applied to a local checkpoint the engines reload.

    Args:
        cfg: reads what `DiskWeightUpdater` reads, `update_weight_local_checkpoint_dir` (required),
            `update_weight_delta_encoding`, `update_weight_delta_checksum` and the engine dtype.
        client: the engines (any: they only reload a full checkpoint).
        pause_mode: `pause_generation` mode.

    Raises:
        ValueError: `--update-weight-local-checkpoint-dir` is not set.
    """

    def __init__(self, cfg: SlimeArgs, client: RolloutClient, *, pause_mode: str = "abort"):
        super().__init__(cfg, client, pause_mode=pause_mode)
        if not cfg.update_weight_local_checkpoint_dir:
            raise ValueError("--update-weight-mode delta with disk sync needs --update-weight-local-checkpoint-dir")
        self.local_dir = pathlib.Path(cfg.update_weight_local_checkpoint_dir)
        self._init_base(cfg)

    async def _send(self, buckets: Iterable[Bucket], weight_version: str) -> None:
        self._last_dir = None  # the local checkpoint is never cleaned up; only delta dirs are
        if not self._delta_push:
            full = (self.base.record_full(b) for b in buckets)
            await asyncio.to_thread(
                write_hf_checkpoint, full, self.local_dir, assets_from=self.assets_from,
                flag="--update-weight-local-checkpoint-dir",
            )  # fmt: skip
            (self.local_dir / VERSION_FILE).write_text(weight_version)
        else:
            deltas = [d for bucket in buckets for d in self.base.encode_bucket(bucket)]
            version_dir = self.disk_dir / f"delta_v{weight_version}"
            meta = {
                "version": weight_version,
                "base_version": str(self.base.version),
                "delta_encoding": self.base.encoding,
                "compression_format": COMPRESSION,
                "checksum_format": self.base.algorithm,
            }
            await asyncio.to_thread(write_delta_dir, deltas, version_dir, meta)
            self._last_dir = version_dir
            await asyncio.to_thread(apply_delta_dir, version_dir, self.local_dir)
            if not deltas:
                return  # nothing changed: the engines keep what they hold; the fence relabels it
        await self.session.each(
            "update_weights_from_disk", tracked=True, model_path=str(self.local_dir), weight_version=weight_version
        )


def make_delta_updater(cfg: SlimeArgs, client: RolloutClient) -> Any:
    """The delta updater for `--weight-sync` (validated to be tensor or disk).

    Raises:
        ValueError: another `--weight-sync` (config validation refuses it first).
    """
    if cfg.weight_sync == "tensor":
        return DeltaTensorWeightUpdater(cfg, client)
    if cfg.weight_sync == "disk":
        return DeltaDiskWeightUpdater(cfg, client)
    raise ValueError(f"--update-weight-mode delta: no delta path for --weight-sync {cfg.weight_sync}")
