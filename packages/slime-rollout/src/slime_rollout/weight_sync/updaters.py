"""Weight updaters: push trainer weights into the engines (`slime_core.protocols.WeightUpdater`).

Three transports, as in slime (`--update-weight-transport`, `--colocate`):

* `DiskWeightUpdater`: writes an HF safetensors checkpoint atomically to
  `<update_weight_disk_dir>/weight_v<N>` and calls `/update_weights_from_disk` (works across machines).
* `TensorWeightUpdater` (colocated): serializes each bucket with `wire.serialize_named_tensors`
  (SGLang's `MultiprocessingSerializer` format): CUDA tensors become IPC handles, CPU tensors go through shared
  memory (the `file_system` sharing strategy, so an unrelated process can open them). With SGLang installed the
  bucket is flattened (`load_format="flattened_bucket"`, SGLang's `FlattenedTensorBucket`), else it is a
  plain list of `(name, tensor)` (`load_format=None`), which every SGLang version and the reference engine accept.
* `DistributedWeightUpdater` (disaggregated): engines join a process group with the trainer
  (`/init_weights_update_group`), then for each bucket `/update_weights_from_distributed` announces names,
  dtypes and shapes while rank 0 broadcasts the tensors (NCCL on GPUs; gloo works on CPU for tests).

What goes over the wire (request fields, payload format, process group, NCCL setting) is
`slime_rollout.engines.wire`, which the engine side reads too. Each update does pause_generation -> flush_cache ->
send (each bucket with the version) -> update_weight_version -> check `weight_version` -> continue_generation, holding
a per-engine lock throughout (`slime_rollout.weight_sync.push`: pushes to one engine never overlap, every bucket
carries the push's `weight_version`, the fence ends the push, and an engine that fails mid-push is dropped,
relabelled incomplete and reported in `WeightPushError`).
Call `update` on the trainer rank that holds the full HF tensors (rank 0); other ranks still have to drain
their `named_hf_weights` iterator when it is collective.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import threading
from collections.abc import Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing

from slime_core.dir_swap import check_replaceable, mark, swap_in
from slime_core.safetensors_io import save_safetensors
from slime_rollout.engines.client import RolloutClient
from slime_rollout.engines.process import find_free_port
from slime_rollout.engines.transport import EngineError
from slime_rollout.engines.wire import (
    broadcast_buffer,
    deserialize_named_tensors,
    dtype_name,
    init_custom_process_group,
    nccl_cumem_enable,
    serialize_named_tensors,
)
from slime_rollout.runtime.deadlines import in_daemon_thread
from slime_rollout.weight_sync.push import PushSession, WeightPushError, alongside_engines, engine_locks

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = [
    "DiskWeightUpdater",
    "DistributedWeightUpdater",
    "TensorWeightUpdater",
    "WeightPushError",
    "write_hf_checkpoint",
    # The payload codec and the process-group helper live in `slime_rollout.engines.wire`; importable from here too.
    "deserialize_named_tensors",
    "init_custom_process_group",
    "serialize_named_tensors",
]

logger = logging.getLogger(__name__)

Bucket = list[tuple[str, torch.Tensor]]

# How long tearing down a failed broadcast group may take at each end before it is abandoned.
TEARDOWN_TIMEOUT_S = 30.0
# How long a failed push waits for this end's broadcast to return before leaving its group to it.
BROADCAST_GRACE_S = 5.0
# Broadcast groups made by this process, by the name asked for: each after the first gets `<name>-<n>`.
_GROUPS_MADE: dict[str, int] = {}
_GROUPS_LOCK = threading.Lock()


def run_sync(coro: Coroutine) -> Any:
    """Runs a coroutine to completion from sync code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


class _EngineUpdater:
    """Shared pause -> flush -> send -> version fence -> verify -> continue sequence (`weight_sync.push`)."""

    tolerant = True  # a failed engine is dropped from the push (collective transports override)

    def __init__(self, client: RolloutClient, *, pause_mode: str = "abort"):
        self.client = client
        self.pause_mode = pause_mode
        self.session = PushSession(client.engines, tolerant=self.tolerant)

    def update(self, buckets: Iterator[Bucket], weight_version: str) -> None:
        """Sends all buckets, then sets and checks `weight_version` on every engine.

        Raises:
            WeightPushError: some engines did not complete the push (the others did), whichever way an engine
                failed: its call (`EngineError`, a timeout), on a collective transport (every engine of the push is
                named: their buckets stopped with it; the engine's error is the `__cause__`), or another version
                reported after the fence.
            Exception: an error on this side (a bucket the iterator failed to build) is raised as itself, after the
                engines of the push are left paused and relabelled incomplete: restarting engines would not fix it.
        """
        run_sync(self.aupdate(buckets, str(weight_version)))

    async def aupdate(self, buckets: Iterable[Bucket], weight_version: str) -> None:
        """Async form of `update`."""
        pool = self.client.pool
        self.session = session = PushSession(
            self.client.engines,
            tolerant=self.tolerant,
            quick_call_s=pool.probe_timeout_s,
            slow_call_s=self.client.update_weight_timeout_s,
            warn_every_s=pool.slow_warning_s,
        )
        error: BaseException | None = None
        async with engine_locks(self.client.urls):
            try:
                # Bounds, read from SGLang 0.5.16 (tokenizer_manager.py, http_server.py): `pause_generation` in
                # "abort" mode returns only once every in-flight request has left, and the update calls first take
                # `model_update_lock`'s writer side (behind in-flight requests), then load (large checkpoints,
                # collectives): these are bounded by --update-weight-timeout. The scheduler answers a
                # flush at once (refusing it while requests remain: `flush_cache` retries those); the tokenizer
                # manager sets the version without the scheduler and continues by only sending it a message. So a
                # hung engine is cut off after --rollout-health-check-timeout on these.
                await session.each("pause_generation", mode=self.pause_mode)
                await session.each("flush_cache", answer_within_s=pool.probe_timeout_s)
                await self._send(buckets, weight_version)
                # The fence: the version changes only now that every bucket has landed.
                await session.each("update_weight_version", quick=True, new_version=weight_version)
                versions = await session.each("get_weight_version", quick=True)
                for engine, version in zip(session.live, versions, strict=True):  # those that answered
                    if version != weight_version:
                        session.failed[engine.url] = f"reports weight version {version!r} after the push"
            except BaseException as exc:
                # Escaped the session (an engine on a collective transport, a call outside it, or this side): no engine
                # still in the push got all of it; they stay paused and relabelled: none serves a mix as the new one.
                logger.error("weight push %r stopped: %r", weight_version, exc)
                session.end_for_all(exc)
                error = exc
            finally:
                session.tolerant = True  # continuing is per engine, whatever the transport
                await session.each("continue_generation", quick=True)
                await session.mark_incomplete(weight_version)
        if error is not None and not isinstance(error, EngineError | TimeoutError):
            raise error
        self._after_update(weight_version)
        if session.failed:
            raise WeightPushError(session.failed, weight_version) from error

    async def _send(self, buckets: Iterable[Bucket], weight_version: str) -> None:
        raise NotImplementedError

    def _after_update(self, weight_version: str) -> None:
        pass


# ------------------------------------------------------------------------------------------------ disk


def _version_dir_name(weight_version: str) -> str:
    return f"weight_v{int(weight_version):06d}" if weight_version.isdigit() else f"weight_v{weight_version}"


def write_hf_checkpoint(
    buckets: Iterable[Bucket],
    out_dir: str | os.PathLike,
    *,
    assets_from: str | os.PathLike | None = None,
    flag: str = "--update-weight-disk-dir",
) -> pathlib.Path:
    """Writes an HF safetensors checkpoint atomically (temp dir, then rename).

    One shard per bucket (`model-00001.safetensors`, ...) plus `model.safetensors.index.json`; the
    non-weight files of `assets_from` (config, tokenizer, generation config) are copied next to them.

    Args:
        buckets: lists of `(hf_name, tensor)`; any device/dtype, saved as is on CPU.
        out_dir: final directory (replaced if it exists and slime wrote it: `slime_core.dir_swap`).
        assets_from: HF checkpoint whose non-safetensors files are copied.
        flag: the flag that named `out_dir`'s folder, for a refusal.

    Returns:
        `out_dir` as a Path.

    Raises:
        ValueError: a tensor name appears twice.
        slime_core.dir_swap.ReplaceRefused: `out_dir` (or the temp dir) holds something slime did not write.
    """
    out = pathlib.Path(out_dir)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    check_replaceable([out, tmp], flag)  # never delete a folder slime did not write
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    mark(tmp)
    weight_map: dict[str, str] = {}
    total_size = 0
    try:
        for i, bucket in enumerate(buckets):
            shard = f"model-{i + 1:05d}.safetensors"
            tensors = {}
            for name, t in bucket:
                if name in weight_map or name in tensors:
                    raise ValueError(f"write_hf_checkpoint: tensor {name!r} appears twice")
                # copy=True: tied weights must not share storage in a safetensors file.
                tensors[name] = t.detach().to("cpu", copy=True).contiguous()
                total_size += tensors[name].numel() * tensors[name].element_size()
            save_safetensors(tensors, str(tmp / shard), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, shard))
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        if assets_from is not None:
            for f in pathlib.Path(assets_from).iterdir():
                if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
                    shutil.copy2(f, tmp / f.name)
        swap_in(tmp, out, flag=flag)  # a crash leaves the old or the new export, never none
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


class DiskWeightUpdater(_EngineUpdater):
    """`--update-weight-transport disk`: HF checkpoint on a shared filesystem, then `/update_weights_from_disk`.

    Args:
        cfg: the trainer's run config; reads `update_weight_disk_dir` (required), `update_weight_disk_keep_files`
            and `hf_checkpoint` (assets copied into each version directory).
        client: the engines to update.
        pause_mode: `pause_generation` mode ("abort" as slime sends it).

    Raises:
        ValueError: `--update-weight-disk-dir` is not set.
    """

    def __init__(self, cfg: SlimeArgs, client: RolloutClient, *, pause_mode: str = "abort"):
        super().__init__(client, pause_mode=pause_mode)
        if not cfg.update_weight_disk_dir:
            raise ValueError("--update-weight-transport disk needs --update-weight-disk-dir")
        self.disk_dir = pathlib.Path(cfg.update_weight_disk_dir)
        self.keep_files = cfg.update_weight_disk_keep_files
        self.assets_from = cfg.hf_checkpoint
        self._last_dir: pathlib.Path | None = None

    async def _send(self, buckets: Iterable[Bucket], weight_version: str) -> None:
        path = await asyncio.to_thread(
            write_hf_checkpoint,
            buckets,
            self.disk_dir / _version_dir_name(weight_version),
            assets_from=self.assets_from,
        )
        self._last_dir = path
        await self.session.each(
            "update_weights_from_disk", tracked=True, model_path=str(path), weight_version=weight_version
        )

    def _after_update(self, weight_version: str) -> None:
        if not self.keep_files and self._last_dir is not None:
            shutil.rmtree(self._last_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- tensor


def _sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None


class TensorWeightUpdater(_EngineUpdater):
    """Colocated update through `/update_weights_from_tensor` (CUDA IPC on GPU, shared memory on CPU).

    Args:
        cfg: the trainer's run config; reads `rollout_num_gpus_per_engine`: one serialized entry is sent per
            engine TP rank.
        client: the engines to update.
        load_format: "auto" (flattened bucket when SGLang is importable, else a plain list), "flattened_bucket"
            or None (plain list).
        pause_mode: `pause_generation` mode.
    """

    def __init__(
        self, cfg: SlimeArgs, client: RolloutClient, *, load_format: str | None = "auto", pause_mode: str = "abort"
    ):
        super().__init__(client, pause_mode=pause_mode)
        self.tp_size = cfg.rollout_num_gpus_per_engine
        if load_format == "auto":
            load_format = "flattened_bucket" if _sglang_available() else None
        if load_format not in (None, "flattened_bucket"):
            raise ValueError(
                f"TensorWeightUpdater: load_format must be None or 'flattened_bucket', got {load_format!r}"
            )
        self.load_format = load_format
        # Shared-memory files by name: the engine is not our child, so fd passing is not an option.
        torch.multiprocessing.set_sharing_strategy("file_system")

    def _payloads(self, bucket: Bucket) -> list[Any]:
        """What to serialize for one bucket: one plain list, or one flattened bucket per dtype."""
        # Detached copies: sharing moves a CPU tensor's storage into shared memory, which must not touch the
        # trainer's own parameters.
        tensors = [(n, t.detach().clone() if t.device.type == "cpu" else t.detach()) for n, t in bucket]
        if self.load_format is None:
            return [tensors]
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        if getattr(FlattenedTensorBucket, "supports_multi_dtypes", False):
            groups = [tensors]  # byte-flattened: one bucket holds every dtype
        else:
            by_dtype: dict[torch.dtype, Bucket] = {}
            for n, t in tensors:
                by_dtype.setdefault(t.dtype, []).append((n, t))
            groups = list(by_dtype.values())
        out = []
        for group in groups:
            flat = FlattenedTensorBucket(named_tensors=group)
            out.append({"flattened_tensor": flat.get_flattened_tensor(), "metadata": flat.get_metadata()})
        return out

    async def _send(self, buckets: Iterable[Bucket], weight_version: str) -> None:
        for bucket in buckets:
            for payload in self._payloads(bucket):
                serialized = serialize_named_tensors(payload)
                await self.session.each(
                    "update_weights_from_tensor",
                    tracked=True,
                    serialized_named_tensors=[serialized] * self.tp_size,
                    load_format=self.load_format,
                    flush_cache=False,
                    weight_version=weight_version,  # on every bucket: engines that guard refuse a mixed push
                )
                del payload  # the engine has copied it; let the shared memory / IPC handle go
            if torch.cuda.is_available():
                torch.cuda.ipc_collect()


# ----------------------------------------------------------------------------------------- distributed


class DistributedWeightUpdater(_EngineUpdater):
    """Disaggregated update: broadcast from trainer rank 0 to every engine rank (NCCL on GPUs).

    The broadcast is collective: an engine failing mid-push fails the whole push (`tolerant = False`), and its group
    is destroyed on both ends; the next push makes a new group named `<group_name>-<n>` on a free port above the
    last one (`group_name`, `master_port` hold the current group's). Names are counted per process: a later updater
    asking for the same name gets the next `<group_name>-<n>`.

    Args:
        cfg: the trainer's run config; reads `rollout_num_gpus_per_engine` for the engines' ranks.
        client: the engines to update.
        master_address: address the engines can reach this process at.
        master_port: free port for the first group's TCP store.
        group_name: name of the first process group (slime uses `slime-pp_<pp_rank>`).
        backend: "nccl" on GPUs; "gloo" works with CPU tensors (tests, reference engine).
        pause_mode: `pause_generation` mode.
    """

    tolerant = False

    def __init__(
        self,
        cfg: SlimeArgs,
        client: RolloutClient,
        *,
        master_address: str,
        master_port: int,
        group_name: str = "slime-pp_0",
        backend: str = "nccl",
        pause_mode: str = "abort",
    ):
        super().__init__(client, pause_mode=pause_mode)
        # Same value as the engines got at launch (`engine_env`); read by NCCL when this process makes its
        # first communicator, so it must be set before the group's first broadcast.
        os.environ["NCCL_CUMEM_ENABLE"] = nccl_cumem_enable()
        self.gpus_per_engine = cfg.rollout_num_gpus_per_engine
        # The rendezvous of the current (or next) group; each group after the first gets a fresh name and port.
        self.master_address, self.master_port = master_address, master_port
        self.group_name, self.backend = group_name, backend
        self._base_name = group_name
        self._num_groups = 0
        self._group: torch.distributed.ProcessGroup | None = None

    def _next_rendezvous(self) -> None:
        """Picks the name and port of a new group: the given ones first, then fresh ones.

        A failed group may live on at either end (an engine that missed the teardown; this end's rendezvous thread,
        abandoned while its TCP store holds the port), and c10d refuses a name already registered. Names count per
        process, so the updater that replaces this one (`slime_app.weights.release_weight_updater`) gets a fresh one.
        """
        with _GROUPS_LOCK:
            made = _GROUPS_MADE.get(self._base_name, 0)
            _GROUPS_MADE[self._base_name] = made + 1
        self.group_name = f"{self._base_name}-{made}" if made else self._base_name
        if self._num_groups:
            self.master_port = find_free_port("", start=self.master_port + 1)
        self._num_groups += 1

    async def aconnect(self) -> None:
        """Creates the group: rank 0 is this process, engine i holds ranks `1 + i*gpus_per_engine ...`.

        On a failure (an engine refused to join) the group is torn down on both ends before the error is raised.
        """
        self._next_rendezvous()
        world_size = 1 + len(self.client.urls) * self.gpus_per_engine
        joins = [
            engine.init_weights_update_group(
                master_address=self.master_address,
                master_port=self.master_port,
                rank_offset=1 + i * self.gpus_per_engine,
                world_size=world_size,
                group_name=self.group_name,
                backend=self.backend,
            )
            for i, engine in enumerate(self.client.engines)
        ]
        own = in_daemon_thread(
            init_custom_process_group,
            name="weight sync: init_custom_process_group",
            backend=self.backend,
            init_method=f"tcp://{self.master_address}:{self.master_port}",
            world_size=world_size,
            rank=0,
            group_name=self.group_name,
        )
        try:
            self._group = await alongside_engines(own, joins, self.client.engines, "/init_weights_update_group")
        except BaseException:
            formed = own.done() and not own.cancelled() and own.exception() is None
            await self._teardown(own.result() if formed else None, failed=True)
            raise

    async def adisconnect(self) -> None:
        """Destroys the group on both ends, concurrently (nothing when there is none).

        Raises:
            Exception: this end's `destroy_process_group` failed (an engine's failure is logged).
        """
        if self._group is not None:
            await self._teardown(self._group, failed=False)

    async def _teardown(self, group: torch.distributed.ProcessGroup | None, *, failed: bool) -> None:
        """Destroys `group` here (None: nothing to destroy here) and the current group on every engine, concurrently.

        NCCL's communicator teardown on the engine does not return until this end tears down too, so awaiting the
        engine's reply first deadlocks. After a failure (`failed`) each side gets `TEARDOWN_TIMEOUT_S`, this end's
        teardown runs in an abandonable daemon thread, and nothing is raised: the next group has its own name and
        port whatever is left of this one.
        """
        name, engines = self.group_name, self.client.engines
        self._group = None
        calls = [e.destroy_weights_update_group(name, timeout=TEARDOWN_TIMEOUT_S, max_retries=0) for e in engines]
        own: Any = None  # no group formed here (its rendezvous failed): nothing to destroy on this end
        if group is not None:
            own = in_daemon_thread(torch.distributed.destroy_process_group, group, name="weight sync: destroy group")
            own = asyncio.wait_for(own, TEARDOWN_TIMEOUT_S) if failed else own
        results = await asyncio.gather(own or asyncio.sleep(0), *calls, return_exceptions=True)
        if isinstance(results[0], BaseException):
            if not failed:
                raise results[0]
            logger.warning("weight sync: destroying the failed group %r here: %r", name, results[0])
        for engine, result in zip(engines, results[1:], strict=True):
            if isinstance(result, BaseException):
                # A dead engine, one that refused to join or a restarted one that never joined has no group.
                logger.warning("destroy_weights_update_group %r on %s: %s", name, engine.url, result)

    async def _send(self, buckets: Iterable[Bucket], weight_version: str) -> None:
        if self._group is None:
            await self.aconnect()
        for bucket in buckets:
            names = [n for n, _ in bucket]
            dtypes = [dtype_name(t.dtype) for _, t in bucket]
            shapes = [list(t.shape) for _, t in bucket]
            engines = self.session.live
            announces = [
                self.session.track(  # counted: an engine left mid-push is relabelled incomplete
                    engine.url,
                    self.session.bounded(
                        engine,
                        "update_weights_from_distributed",
                        engine.update_weights_from_distributed(
                            names=names,
                            dtypes=dtypes,
                            shapes=shapes,
                            group_name=self.group_name,
                            flush_cache=False,
                            weight_version=weight_version,
                        ),
                    ),
                )
                for engine in engines
            ]
            own = in_daemon_thread(self._broadcast, bucket, name="weight sync: broadcast")
            try:
                # Shielded: an engine that refuses after receiving may answer before this end's broadcast returns.
                await alongside_engines(asyncio.shield(own), announces, engines, "/update_weights_from_distributed")
            except BaseException:
                # The group is never used again. A broadcast still waiting keeps this end's group: destroying it would
                # block this whole process until the broadcast times out.
                await asyncio.wait({own}, timeout=BROADCAST_GRACE_S)
                ended = own.done() and not own.cancelled() and own.exception() is None
                own.cancel()  # a broadcast still waiting is abandoned with its (daemon) thread
                await self._teardown(self._group if ended else None, failed=True)
                raise

    def _broadcast(self, bucket: Bucket) -> None:
        handles = [
            torch.distributed.broadcast(
                broadcast_buffer(t.detach().contiguous(), self.backend), group=self._group, group_src=0, async_op=True
            )
            for _, t in bucket
        ]
        for h in handles:
            h.wait()
