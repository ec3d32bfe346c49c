"""Weight sync from the trainer ranks to the engines (runs inside the trainer actors).

All ranks iterate the backend's `named_hf_weights` together (it gathers shards: a collective); rank 0
hands the buckets to the transport chosen by `--weight-sync` (tensor when colocated, NCCL broadcast when
disaggregated on GPU, disk otherwise).
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


def make_weight_updater(args: Any, engine_urls: list[str], *, rank: int) -> Any:
    """The `WeightUpdater` for `args.weight_sync` on rank 0; None on the other ranks."""
    if rank != 0 or not engine_urls:
        return None
    from slime_rollout.client import RolloutClient
    from slime_rollout.weight_sync import DiskWeightUpdater, DistributedWeightUpdater, TensorWeightUpdater

    client = RolloutClient(list(engine_urls))
    mode = args.weight_sync
    if mode == "tensor":
        return TensorWeightUpdater(args, client)
    if mode == "disk":
        return DiskWeightUpdater(args, client)
    if mode == "distributed":
        import ray
        import torch

        from slime_app.cluster import free_port

        return DistributedWeightUpdater(
            args,
            client,
            master_address=ray.util.get_node_ip_address(),
            master_port=free_port(),
            backend="nccl" if torch.cuda.is_available() else "gloo",
        )
    raise ValueError(f"--weight-sync: unknown transport {mode!r} (tensor, disk, distributed)")


def push_weights(backend: Any, updater: Any, args: Any, weight_version: int, *, rank: int) -> dict[str, float]:
    """Sends the backend's current weights to the engines; returns `perf/update_weights_time` and GB/s."""
    t0 = time.perf_counter()
    num_bytes = 0

    def counted(buckets):
        nonlocal num_bytes
        for bucket in buckets:
            num_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
            yield bucket

    buckets = counted(backend.named_hf_weights(args.update_weight_buffer_size))
    if updater is None:
        for _ in buckets:  # the gather is collective: every rank walks it
            pass
    else:
        updater.update(buckets, str(weight_version))
    seconds = time.perf_counter() - t0
    if rank == 0:
        logger.info("weights v%s pushed: %.2f GB in %.2f s", weight_version, num_bytes / 1e9, seconds)
    return {
        "perf/update_weights_time": seconds,
        "perf/update_weights_gb_per_s": num_bytes / 1e9 / max(seconds, 1e-9),
    }
