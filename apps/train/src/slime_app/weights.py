"""Weight sync from the trainer ranks to the engines (runs inside the trainer actors).

All ranks iterate the backend's `named_hf_weights` together (it gathers shards: a collective); rank 0
hands the buckets to the transport chosen by `--weight-sync` (tensor when colocated, NCCL broadcast when
disaggregated on GPU, disk otherwise).
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from typing import Any

from slime_app.fp8_rollout import serving_fp8
from slime_app.registry import WEIGHT_UPDATERS
from slime_core.config import SlimeArgs
from slime_core.fp8 import quantize_buckets

logger = logging.getLogger(__name__)


def make_weight_updater(cfg: SlimeArgs, engine_urls: list[str], *, rank: int) -> Any:
    """The weight updater that `--weight-sync` names, towards `engine_urls`, on rank 0; None on the other ranks.

    Args:
        cfg: the run config (`weight_sync` was resolved from `auto` by validation).
        engine_urls: base URLs of the engines (`http://host:port`).
        rank: this trainer rank (only rank 0 talks to the engines).

    Raises:
        slime_app.registry.UnknownNameError: (a KeyError and a ValueError) `--weight-sync` names no transport.
        ValueError: `--weight-sync tensor` towards an engine on another machine.
    """
    if rank != 0 or not engine_urls:
        return None
    from slime_rollout.weight_sync.push import push_client

    if cfg.weight_sync == "tensor":
        import ray

        check_same_machine(engine_urls, ray.util.get_node_ip_address())

    if cfg.update_weight_mode == "delta":  # validation allowed it for tensor and disk only
        from slime_rollout.weight_sync.delta_sync import make_delta_updater

        return make_delta_updater(cfg, push_client(cfg, engine_urls))
    return WEIGHT_UPDATERS.get(cfg.weight_sync).load()(cfg, push_client(cfg, engine_urls))


def check_same_machine(engine_urls: list[str], node_ip: str) -> None:
    """`--weight-sync tensor` hands over CUDA IPC / shared-memory handles, which only open on the sender's machine.

    Args:
        engine_urls: the engines' base URLs.
        node_ip: the address of trainer rank 0's node.

    Raises:
        ValueError: an engine listens on another address than this node's or loopback (naming it and the flag).
    """
    for url in engine_urls:
        host = urllib.parse.urlsplit(url).hostname or ""
        if host not in (node_ip, "localhost") and not host.startswith("127."):
            raise ValueError(
                f"--weight-sync tensor: engine {url} is not on trainer rank 0's machine ({node_ip}); tensor handles "
                "do not cross machines: use --weight-sync distributed, or disk on a shared filesystem"
            )


def release_weight_updater(updater: Any) -> None:
    """Tears down an updater's engine connection (the broadcast group), tolerating engines that are gone."""
    if updater is None or not hasattr(updater, "adisconnect"):
        return
    from slime_rollout.weight_sync.updaters import run_sync

    try:
        run_sync(updater.adisconnect())
    except Exception:  # noqa: BLE001 - the group dies with its dead member anyway; the new one is what matters
        logger.warning("could not tear down the previous weight-update group", exc_info=True)


def distributed_weight_updater(cfg: SlimeArgs, client: Any) -> Any:
    """`--weight-sync distributed`: a broadcast group rooted at this process (NCCL on GPUs, gloo on CPU).

    The group's rendezvous is this node's address and a free port, which only the trainer process knows.

    Args:
        cfg: the run config.
        client: a `slime_rollout.engines.client.RolloutClient` of the engines that join the group.
    """
    import ray
    import torch

    from slime_app.cluster import free_port
    from slime_rollout.weight_sync.updaters import DistributedWeightUpdater

    return DistributedWeightUpdater(
        cfg,
        client,
        master_address=ray.util.get_node_ip_address(),
        master_port=free_port(),
        backend="nccl" if torch.cuda.is_available() else "gloo",
    )


class SyncChecker:
    """Rank 0's weight-content check (`slime_rollout.weight_sync.check`): on the first sync and every N after it.

    Args:
        cfg: reads `check_weight_sync_interval` (N; 0: the first sync only), `check_weight_sync_tensors`, `seed`,
            what `slime_rollout.weight_sync.check.engine_weight_dtype` reads, and `hf_checkpoint`'s expert count
            (per-expert MoE tensors are compared as parts of SGLang's `w13_weight` / `w2_weight`).
        engine_urls: the engines to check.
    """

    def __init__(self, cfg: SlimeArgs, engine_urls: list[str]):
        from slime_rollout.weight_sync.check import checkpoint_num_experts

        self.cfg = cfg
        self.engine_urls = list(engine_urls)
        self.num_syncs = 0
        self._engine_names: set[str] | None = None  # what the first engine holds: asked once, it never changes
        self.num_experts = checkpoint_num_experts(cfg.hf_checkpoint) if cfg.hf_checkpoint else None

    def _engines(self) -> list[Any]:
        from slime_rollout.engines.client import EngineClient

        return [EngineClient(url, timeout=120.0) for url in self.engine_urls]

    def start(self) -> Any:
        """Counts a sync; returns a `PushChecksums` to watch its buckets with when this sync is checked, else None.

        The first engine's parameter names are read before the first checked push (and kept), so that only tensors
        it holds are drawn.
        """
        from slime_rollout.weight_sync.check import PushChecksums, engine_checksums, engine_weight_dtype
        from slime_rollout.weight_sync.updaters import run_sync

        index, self.num_syncs = self.num_syncs, self.num_syncs + 1
        interval = self.cfg.check_weight_sync_interval
        if index != 0 and not (interval and index % interval == 0):
            return None

        async def names():
            engine = self._engines()[0]
            try:
                ranks = await engine_checksums(engine)
            finally:
                await engine.aclose()
            return None if ranks is None else set().union(*ranks)

        if self._engine_names is None:
            self._engine_names = run_sync(names())
        k, seed, dtype = self.cfg.check_weight_sync_tensors, self.cfg.seed + index, engine_weight_dtype(self.cfg)
        if self.cfg.lora_rank:
            # A LoRA push holds the adapter, which the engine loads from files: compare the base it serves instead.
            return PushChecksums.from_checkpoint(
                self.cfg.hf_checkpoint,
                k,
                seed=seed,
                dtype=dtype,
                engine_names=self._engine_names,
                num_experts=self.num_experts,
            )
        return PushChecksums(
            k,
            seed=seed,
            dtype=dtype,
            engine_names=self._engine_names,
            fp32_params=self.cfg.true_on_policy_mode,
            num_experts=self.num_experts,
        )

    def finish(self, sample: Any, weight_version: int) -> dict[str, float]:
        """Compares every engine's checksums with the pushed ones; returns `weight_check/*` and its time.

        Raises:
            slime_rollout.weight_sync.check.WeightSyncMismatch: an engine holds other values (names engine and tensor).
            slime_rollout.weight_sync.check.WeightCheckEmpty: no tensor could be compared (the check proves nothing),
                or some engine listed none of the drawn tensors (its check proves nothing).
        """
        from slime_rollout.weight_sync.check import WeightCheckEmpty, WeightSyncMismatch, check_engines
        from slime_rollout.weight_sync.updaters import run_sync

        t0 = time.perf_counter()

        async def compare():
            engines = self._engines()
            try:
                return await check_engines(engines, sample.checksums)
            finally:
                for engine in engines:
                    await engine.aclose()

        report = run_sync(compare())
        seconds = time.perf_counter() - t0
        if report.mismatches:
            more = f" (+{len(report.mismatches) - 1} more)" if len(report.mismatches) > 1 else ""
            raise WeightSyncMismatch(
                f"weight sync v{weight_version}: the engine does not hold the expected weights (pushed, or for LoRA "
                f"the checkpoint's base): {report.mismatches[0]}"
                f"{more} (--check-weight-sync)"
            )
        if report.blind:
            raise WeightCheckEmpty(
                f"weight sync v{weight_version}: {len(report.blind)} engine(s) list none of the "
                f"{len(sample.checksums)} drawn tensors the first engine holds, so their check compared nothing: "
                f"{', '.join(report.blind)} "
                "(another model or naming there?); pass --no-check-weight-sync to run unchecked"
            )
        if report.missing:
            logger.warning(
                "weight check v%s: %d (engine, tensor) pair(s) not listed by the engine, not compared",
                weight_version, report.missing,
            )  # fmt: skip
        if report.checked == 0:
            raise WeightCheckEmpty(
                f"weight sync v{weight_version}: the weight check compared no tensor on {len(self.engine_urls)} "
                f"engine(s): {report.unsupported} without /weights_checker, {sample.unmatched} pushed tensor(s) the "
                f"engine does not hold under SGLang's names (e.g. {sample.unmatched_example or '-'}), "
                f"{report.sharded} sharded, {report.missing} not listed, incomplete {sample.incomplete}; "
                "pass --no-check-weight-sync to run unchecked"
            )
        logger.info(
            "weight check v%s: %d tensor checksums equal on %d engine(s) (%d sharded, %d unmatched names) in %.2f s",
            weight_version, report.checked, len(self.engine_urls), report.sharded, sample.unmatched, seconds,
        )  # fmt: skip
        return {**report.metrics(), "perf/weight_check_time": seconds}


def make_sync_checker(cfg: SlimeArgs, engine_urls: list[str], *, rank: int) -> SyncChecker | None:
    """Rank 0's `SyncChecker` with `--check-weight-sync` and engines to check; None otherwise."""
    if rank != 0 or not engine_urls or not cfg.check_weight_sync:
        return None
    return SyncChecker(cfg, engine_urls)


def push_weights(
    backend: Any, updater: Any, cfg: SlimeArgs, weight_version: int, *, rank: int, checker: SyncChecker | None = None
) -> dict[str, float]:
    """Sends the backend's current weights to the engines; returns `perf/update_weights_time` and GB/s.

    With `--update-weight-mode delta` also `perf/update_weights_density` (changed bytes / model bytes),
    `perf/update_weights_wire_bytes`, `perf/update_weights_sent_fraction` (tensors sent / tensors),
    `perf/update_weights_full` (1 for a full push) and `perf/update_weights_delta_base_gb` (rank 0's base copy).

    Args:
        backend: this rank's `TrainBackend` (its `named_hf_weights` is collective: every rank walks it).
        updater: rank 0's weight updater; None on the other ranks.
        cfg: the run config (`update_weight_buffer_size`, bytes per bucket; an FP8 `--hf-checkpoint`: each bucket
            is quantized blockwise first, `slime_app.fp8_rollout`).
        weight_version: the version the engines report afterwards.
        rank: this trainer rank.
        checker: rank 0's weight-content check (None: no check); when this sync is due, a sample of the pushed
            tensors is read back from the engines afterwards (`weight_check/*`, `perf/weight_check_time`).

    Raises:
        slime_rollout.weight_sync.check.WeightSyncMismatch: the check found other values on an engine.
    """
    sample = checker.start() if checker is not None else None
    t0 = time.perf_counter()
    num_bytes = 0

    def counted(buckets):
        nonlocal num_bytes
        for bucket in buckets:
            num_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
            yield bucket

    buckets = source = backend.named_hf_weights(cfg.update_weight_buffer_size)
    fp8 = serving_fp8(cfg)
    if fp8 is not None and updater is not None:
        # FP8 serving: rank 0 quantizes each bucket blockwise (e4m3 + weight_scale_inv) before any transport sends it.
        buckets = quantize_buckets(buckets, fp8)
    buckets = counted(buckets)
    if sample is not None:
        buckets = sample.watch(buckets)
    if updater is None:
        for _ in buckets:  # the gather is collective: every rank walks it
            pass
    else:
        try:
            updater.update(buckets, str(weight_version))
        finally:
            # A failed push still walks the collective gather to the end with the other ranks: the backend's own
            # generator, since a stage that raised (the FP8 quantizer refusing a weight) ended the wrapped ones.
            for _ in source:
                pass
    seconds = time.perf_counter() - t0
    if rank == 0:
        logger.info("weights v%s pushed: %.2f GB in %.2f s", weight_version, num_bytes / 1e9, seconds)
    metrics = {
        "perf/update_weights_time": seconds,
        "perf/update_weights_gb_per_s": num_bytes / 1e9 / max(seconds, 1e-9),
    }
    stats = getattr(updater, "delta_stats", None)  # --update-weight-mode delta: what this push actually sent
    if stats is not None:
        metrics.update(stats.metrics())
    if sample is not None and updater is not None:
        metrics.update(checker.finish(sample, weight_version))
    return metrics
