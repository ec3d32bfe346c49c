"""MoE router losses as `train/*` metrics: megatron-core's own tracker, reduced and averaged as Megatron-LM logs it.

megatron-core's router records, in every training forward with a router loss on (`--moe-aux-loss-coeff` or
`--moe-z-loss-coeff` > 0), each MoE layer's loss divided by its coefficient (`moe_utils.save_to_aux_losses_tracker`:
`load_balancing_loss`, `seq_load_balancing_loss`, `global_load_balancing_loss`, `z_loss`). Megatron-LM's
`track_moe_metrics` logs `Σ_layers value / num_microbatches / num_moe_layers` after megatron-core's reduction over
ranks; the original slime never reads the tracker, so it logs none. Here one value per rollout: the mean over its
training micro-batches (every optimizer step's) and MoE layers, as `train/<megatron-core's name>`.
"""

from __future__ import annotations

import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.moe import moe_utils

__all__ = ["reset_router_losses", "router_loss_metrics"]


def reset_router_losses() -> None:
    """Forgets every tracked router loss, names included (the tracker is megatron-core's process-wide dict)."""
    moe_utils.get_moe_layer_wise_logging_tracker().clear()


def router_loss_metrics(num_moe_layers: int, num_micro_batches: int) -> dict[str, float]:
    """The tracked router losses of the training forwards since the last call, then clears the tracker (collective).

    Args:
        num_moe_layers: MoE layers of the whole model (every pipeline stage's).
        num_micro_batches: training forwards since the last call on this rank (each step's micro-batches, not the
            schedule's empty-slot dummies, whose routers track nothing: `router_gate`).

    Returns:
        `{"train/<name>": mean un-weighted loss}` for each loss megatron-core tracked (none with the losses off).
        Formula: megatron-core's `track_moe_metrics` with `loss_scale = 1 / num_micro_batches`.
    """
    tracker = moe_utils.get_moe_layer_wise_logging_tracker()
    if not tracker or num_micro_batches == 0:
        return {}
    if dist.get_world_size() > 1:
        _reduce_across_ranks(tracker)
    out = {f"train/{name}": float(entry["values"].float().sum()) / num_micro_batches / num_moe_layers
           for name, entry in sorted(tracker.items())}  # fmt: skip
    reset_router_losses()
    return out


def _mean(values, group) -> None:
    # SUM then divide: megatron-core's ReduceOp.AVG, which gloo (CPU worlds) does not have.
    dist.all_reduce(values, group=group)
    values /= dist.get_world_size(group)


def _reduce_across_ranks(tracker: dict) -> None:
    """megatron-core's `reduce_aux_losses_tracker_across_ranks`, in place, on any backend.

    Pipeline stages summed (each holds its layers), each loss's own group summed (ranks holding parts of its sum),
    then DP or the loss's `avg_group` averaged (a loss without either group, the z-loss, over DP). In name order, so
    every rank issues the same collectives.
    """
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    dp_group = parallel_state.get_data_parallel_group(with_context_parallel=False, partial_data_parallel=False)
    for name in sorted(tracker):
        entry = tracker[name]
        values = entry["values"]
        dist.all_reduce(values, group=pp_group)
        if entry.get("reduce_group") is not None:
            dist.all_reduce(values, group=entry["reduce_group"])
            if not entry.get("reduce_group_has_dp", False):
                _mean(values, dp_group)
        if entry.get("avg_group") is not None:
            _mean(values, entry["avg_group"])
        elif entry.get("reduce_group") is None:
            # The z-loss: megatron-core leaves each rank its own (Megatron-LM logs the last rank's); averaged over DP
            # here, so that every rank reports the same value.
            _mean(values, dp_group)
