"""Delta weight sync codec: per-tensor byte diffs against the last pushed version, and their checksums.

`--update-weight-mode delta` (the original slime's flag) pushes only the tensors that changed since the last push
the engines acknowledged, each encoded against that version's bytes:

* `xor` (default): `new ^ old`, byte by byte. Unchanged bytes are zeros, which zstd crushes. An involution: applied
  twice it reverts, so it must land exactly once on the right base (the base version is checked first).
* `overwrite`: the changed byte positions and their new values, laid out as the original lays them out
  (`<u4` count, `<u4` positions, then the values). Larger, but idempotent.

Both are byte-level and dtype-blind (the bytes are those of the tensor cast to the engine's dtype), and every payload
is zstd-compressed at level 1, as the original always does. Each changed tensor carries a checksum of its *new*
bytes (`--update-weight-delta-checksum`: `xxh3-128` default, `blake3`, `adler32`), which the receiver recomputes on
what it reconstructed before it applies anything: a corrupt payload or a wrong base is a `DeltaChecksumError`
naming the tensor, never weights served silently wrong.

`DeltaBase` is the sender's copy of the last pushed bytes (one copy of the model in the engine's dtype, in CPU
memory of trainer rank 0: e.g. 1.2 GB for a 0.6B model in bf16). It is updated while a push streams past and
dropped when a push fails, so the next push goes in full.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import zlib
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
import torch
import zstandard

from slime_core.fp8 import FP8_DTYPE, SCALE_SUFFIX
from slime_rollout.engines.wire import WeightUpdateRequest

__all__ = [
    "CHECKSUMS",
    "ENCODINGS",
    "DeltaBase",
    "DeltaChecksumError",
    "DeltaStats",
    "UpdateWeightsFromDeltaReq",
    "checksum",
    "decode",
    "encode",
    "tensor_bytes",
    "verified_apply",
]

ENCODINGS = ("xor", "overwrite")
CHECKSUMS = ("xxh3-128", "blake3", "adler32")
COMPRESSION = "zstd"
_ZSTD_LEVEL = 1  # the original's fixed choice: fastest level, and the diffs are mostly zeros anyway
_U4_MAX = 2**32 - 1
# Encoder threads: each diff/compress/hash is a few big GIL-releasing calls, bound by memory bandwidth.
_NUM_WORKERS = max(1, min(16, os.cpu_count() or 1))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class UpdateWeightsFromDeltaReq(WeightUpdateRequest):
    """`POST /update_weights_from_delta` (slime's own endpoint; the reference engine implements it).

    Attributes:
        serialized_named_tensors: one `serialize_named_tensors` payload per engine TP rank: a plain list of
            `(HF name, [m] uint8 compressed delta)`.
        checksums: HF name -> digest of the tensor's new bytes (in the engine's dtype).
        base_version: the weight version the deltas apply to; an engine holding another refuses them.
        delta_encoding: "xor" or "overwrite".
        compression_format: "zstd" (the only one).
        checksum_format: "xxh3-128", "blake3" or "adler32".
        flush_cache: flush the prefix cache after loading.
        weight_version: the version the engine reports afterwards.
    """

    endpoint: ClassVar[str] = "/update_weights_from_delta"

    serialized_named_tensors: list[str]
    checksums: dict[str, str]
    base_version: str
    delta_encoding: str = "xor"
    compression_format: str = COMPRESSION
    checksum_format: str = "xxh3-128"
    flush_cache: bool = False
    weight_version: str | None = None


class DeltaChecksumError(ValueError):
    """A delta did not reconstruct the bytes the sender hashed (corrupt payload, or applied to the wrong base)."""


def tensor_bytes(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> np.ndarray:
    """A tensor's bytes as a flat CPU uint8 array (a copy; cast to `dtype` first when given).

    Args:
        tensor: any shape and device.
        dtype: the dtype the engine holds (None: the tensor's own).

    Returns:
        `[numel * element_size]` uint8, C order.
    """
    t = tensor.detach()
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    t = t.to("cpu", copy=True).contiguous().reshape(-1)
    return t.view(torch.uint8).numpy()


class _Adler32:
    def __init__(self) -> None:
        self.value = 1

    def update(self, data: Any) -> None:
        self.value = zlib.adler32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def _hasher(algorithm: str) -> Any:
    if algorithm == "xxh3-128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "blake3":
        try:
            import blake3
        except ImportError as exc:
            raise ValueError(
                "--update-weight-delta-checksum blake3 needs the blake3 package (`uv pip install blake3`), "
                "or use xxh3-128 / adler32"
            ) from exc
        return blake3.blake3()
    if algorithm == "adler32":
        return _Adler32()
    raise ValueError(f"--update-weight-delta-checksum: unknown algorithm {algorithm!r}; known: {', '.join(CHECKSUMS)}")


def checksum(algorithm: str, data: np.ndarray | bytes) -> str:
    """Hex digest of `data` with `algorithm` (`xxh3-128`: 32 hex digits, `blake3`: 64, `adler32`: 8).

    Raises:
        ValueError: unknown algorithm, or blake3 not installed.
    """
    h = _hasher(algorithm)
    h.update(memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray) else data)
    return h.hexdigest()


def encode(new: np.ndarray, old: np.ndarray, encoding: str) -> tuple[np.ndarray | None, int]:
    """The compressed delta taking `old` to `new`, or None when they are equal.

    Args:
        new: `[n]` uint8, the bytes to push.
        old: `[n]` uint8, the bytes the receiver holds (the last pushed version).
        encoding: "xor" or "overwrite".

    Returns:
        `(payload, changed)`: the zstd-compressed delta as `[m]` uint8 (None if nothing changed) and the number of
        bytes that differ.

    Raises:
        ValueError: sizes differ (a tensor changed shape or dtype), an unknown encoding, or an overwrite delta of a
            tensor over 4 GiB (its positions are `<u4`).
    """
    if new.shape != old.shape:
        raise ValueError(f"delta encode: {new.size} bytes against a base of {old.size} (shape or dtype changed)")
    if encoding == "xor":
        raw = np.bitwise_xor(new, old)
        changed = int(np.count_nonzero(raw))
    elif encoding == "overwrite":
        if new.size > _U4_MAX:
            raise ValueError(f"delta encode: overwrite positions are <u4, a tensor of {new.size} bytes is too large")
        mask = new != old
        pos = np.flatnonzero(mask).astype("<u4")
        changed = int(pos.size)
        raw = np.concatenate([np.array([pos.size], "<u4").view(np.uint8), pos.view(np.uint8), new[mask]])
    else:
        raise ValueError(f"--update-weight-delta-encoding: unknown {encoding!r}; known: {', '.join(ENCODINGS)}")
    if not changed:
        return None, 0
    payload = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(memoryview(raw).cast("B"))
    return np.frombuffer(payload, dtype=np.uint8), changed


def decode(base: np.ndarray, payload: np.ndarray | bytes, encoding: str, *, name: str = "?") -> np.ndarray:
    """Reconstructs the new bytes from the receiver's `base` and a delta from `encode`.

    Args:
        base: `[n]` uint8, what the receiver holds (not modified).
        payload: the compressed delta.
        encoding: the encoding it was made with.
        name: the tensor's name, for errors.

    Returns:
        `[n]` uint8, a new array.

    Raises:
        DeltaChecksumError: the payload does not decompress, or does not fit `base` (a corrupt or foreign delta).
    """
    try:
        raw = np.frombuffer(zstandard.ZstdDecompressor().decompress(bytes(payload)), dtype=np.uint8)
    except zstandard.ZstdError as exc:
        raise DeltaChecksumError(f"delta for {name!r}: payload does not decompress ({exc})") from exc
    if encoding == "xor":
        if raw.size != base.size:
            raise DeltaChecksumError(f"delta for {name!r}: {raw.size} xor bytes for a tensor of {base.size} bytes")
        return np.bitwise_xor(base, raw)
    if encoding == "overwrite":
        if raw.size < 4:
            raise DeltaChecksumError(f"delta for {name!r}: overwrite payload of {raw.size} bytes has no count")
        count = int(raw[:4].view("<u4")[0])
        if raw.size != 4 + 5 * count:
            raise DeltaChecksumError(f"delta for {name!r}: overwrite payload of {raw.size} bytes for {count} positions")
        pos = raw[4 : 4 + 4 * count].view("<u4")
        if count and int(pos.max()) >= base.size:
            raise DeltaChecksumError(f"delta for {name!r}: overwrite position {int(pos.max())} >= {base.size} bytes")
        out = base.copy()
        out[pos] = raw[4 + 4 * count :]
        return out
    raise ValueError(f"delta for {name!r}: unknown encoding {encoding!r}; known: {', '.join(ENCODINGS)}")


def verified_apply(
    name: str, base: np.ndarray, payload: np.ndarray | bytes, *, encoding: str, algorithm: str, expected: str
) -> np.ndarray:
    """`decode`, then checks the result's checksum against the sender's before anything is applied.

    Returns:
        `[n]` uint8, the tensor's new bytes.

    Raises:
        DeltaChecksumError: the reconstructed bytes hash to another value (names the tensor and both digests).
    """
    new = decode(base, payload, encoding, name=name)
    got = checksum(algorithm, new)
    if got != expected:
        raise DeltaChecksumError(
            f"delta for {name!r}: {algorithm} checksum of the reconstructed tensor is {got}, the trainer sent "
            f"{expected} (corrupt payload or wrong base); nothing of this request was applied"
        )
    return new


@dataclasses.dataclass(kw_only=True, slots=True)
class DeltaStats:
    """What one push sent (`perf/update_weights_*` metrics).

    Attributes:
        full: the push sent every tensor whole (first push, after a failure, after a restart).
        num_tensors: tensors in the model.
        num_sent: tensors sent (all for a full push; the changed ones for a delta).
        total_bytes: bytes of the whole model in the engine's dtype.
        changed_bytes: bytes that differ from the last push (`total_bytes` for a full push).
        wire_bytes: bytes put on the transport (compressed payloads; the raw tensors for a full push).
        base_bytes: memory of the sender's copy of the last push (`DeltaBase.nbytes`) after this push.
    """

    full: bool = True
    num_tensors: int = 0
    num_sent: int = 0
    total_bytes: int = 0
    changed_bytes: int = 0
    wire_bytes: int = 0
    base_bytes: int = 0

    def metrics(self) -> dict[str, float]:
        """`perf/update_weights_*` of this push.

        Density and wire bytes (the original's names), the fraction of tensors sent, 1 for a full push, and the
        trainer's base copy in GB.
        """
        return {
            "perf/update_weights_density": self.changed_bytes / max(self.total_bytes, 1),
            "perf/update_weights_wire_bytes": float(self.wire_bytes),
            "perf/update_weights_sent_fraction": self.num_sent / max(self.num_tensors, 1),
            "perf/update_weights_full": float(self.full),
            "perf/update_weights_delta_base_gb": self.base_bytes / 1e9,
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DeltaTensor:
    """One changed tensor of a delta push.

    Attributes:
        name: HF checkpoint name.
        payload: `[m]` uint8, the compressed delta.
        checksum: digest of the tensor's new bytes.
    """

    name: str
    payload: np.ndarray
    checksum: str


class DeltaBase:
    """The sender's copy of the last pushed bytes, and the encoder of the next push against it.

    Args:
        encoding: "xor" or "overwrite" (`--update-weight-delta-encoding`).
        algorithm: checksum algorithm (`--update-weight-delta-checksum`).
        dtype: the dtype the engines hold; tensors are cast to it before diffing (None: pushed as is), except an FP8
            push's e4m3 weights and `weight_scale_inv` scales, which the engines hold as sent.

    Raises:
        ValueError: unknown encoding or checksum (or blake3 not installed).
    """

    def __init__(self, *, encoding: str, algorithm: str, dtype: torch.dtype | None = None):
        if encoding not in ENCODINGS:
            raise ValueError(f"--update-weight-delta-encoding: unknown {encoding!r}; known: {', '.join(ENCODINGS)}")
        checksum(algorithm, b"")  # fails now, not at the first delta, on an unknown or missing algorithm
        self.encoding, self.algorithm, self.dtype = encoding, algorithm, dtype
        self._bytes: dict[str, np.ndarray] = {}
        self.version: str | None = None  # the version the engines acknowledged for `_bytes`; None: push in full
        self.stats = DeltaStats()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=_NUM_WORKERS, thread_name_prefix="delta")

    @property
    def valid(self) -> bool:
        """Whether the next push can be a delta (a full push was acknowledged and nothing failed since)."""
        return self.version is not None

    @property
    def nbytes(self) -> int:
        """Bytes held (the memory this copy costs)."""
        return sum(a.nbytes for a in self._bytes.values())

    def invalidate(self) -> None:
        """Forgets the base: the next push goes in full (after a failed push, a restart or a resume)."""
        self._bytes.clear()
        self.version = None

    def _engine_dtype(self, name: str, tensor: torch.Tensor) -> torch.dtype | None:
        """The dtype `name` is held in on the engine: `self.dtype`, except for an FP8 push's quantized tensors.

        An FP8 weight (e4m3) and its `weight_scale_inv` (float32) are already what an FP8 engine holds; a cast to the
        engine's compute dtype would turn the weight into its unscaled e4m3 values, which an engine reads as an
        unquantized weight (or refuses: its scale arrives without its FP8 weight).
        """
        if tensor.dtype == FP8_DTYPE or name.endswith(SCALE_SUFFIX):
            return None
        return self.dtype

    def begin(self) -> bool:
        """Starts a push; returns True for a delta push, False for a full one."""
        self.stats = DeltaStats(full=not self.valid)
        return self.valid

    def record_full(self, bucket: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """Keeps the bytes of a bucket pushed in full; returns it with every tensor cast to the engine's dtype.

        FP8 weights and their scales keep their dtypes (`_engine_dtype`).
        """
        out = []
        for name, tensor in bucket:
            dtype = self._engine_dtype(name, tensor)
            cast = tensor.detach().to(dtype) if dtype is not None else tensor.detach()
            data = tensor_bytes(cast)
            self._bytes[name] = data
            self._count(data.nbytes, changed=data.nbytes, wire=data.nbytes, sent=True)
            out.append((name, cast))
        return out

    def encode_bucket(self, bucket: Iterable[tuple[str, torch.Tensor]]) -> list[DeltaTensor]:
        """The deltas of a bucket's changed tensors; the base moves to the new bytes as it goes.

        The device-to-host copies run in this thread, in order; diff, compression and checksum run on a thread pool
        (numpy and zstd release the GIL), as the original parallelizes them over tensors.

        Raises:
            ValueError: a tensor the base does not hold, or whose size changed (the caller falls back to full).
        """
        jobs = []
        for name, tensor in bucket:
            old = self._bytes.get(name)
            if old is None:
                raise ValueError(f"delta push: {name!r} was not in the last push; push in full")
            new = tensor_bytes(tensor, self._engine_dtype(name, tensor))
            jobs.append((name, new, self._pool.submit(self._encode_one, new, old)))
        out = []
        for name, new, job in jobs:
            payload, changed, digest = job.result()
            wire = 0 if payload is None else payload.nbytes
            self._count(new.nbytes, changed=changed, wire=wire, sent=payload is not None)
            if payload is not None:
                out.append(DeltaTensor(name=name, payload=payload, checksum=digest))
                self._bytes[name] = new
        return out

    def _encode_one(self, new: np.ndarray, old: np.ndarray) -> tuple[np.ndarray | None, int, str]:
        payload, changed = encode(new, old, self.encoding)
        return payload, changed, "" if payload is None else checksum(self.algorithm, new)

    def commit(self, version: str) -> None:
        """The engines acknowledged `version`: the held bytes are now their base."""
        self.version = str(version)
        self.stats.base_bytes = self.nbytes

    def _count(self, nbytes: int, *, changed: int, wire: int, sent: bool) -> None:
        s = self.stats
        s.num_tensors += 1
        s.num_sent += sent
        s.total_bytes += nbytes
        s.changed_bytes += changed
        s.wire_bytes += wire
