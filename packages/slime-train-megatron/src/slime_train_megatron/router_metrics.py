"""MoE router losses as `train/*` metrics: megatron-core's own tracker, reduced and averaged as Megatron-LM logs it.

megatron-core's router records, in every training forward with a router loss on (`--moe-aux-loss-coeff` or
`--moe-z-loss-coeff` > 0), each MoE layer's loss divided by its coefficient (`moe_utils.save_to_aux_losses_tracker`:
`load_balancing_loss`, `seq_load_balancing_loss`, `global_load_balancing_loss`, `z_loss`). Megatron-LM's
`track_moe_metrics` logs `Σ_layers value / num_microbatches / num_moe_layers` after megatron-core's reduction over
ranks; the original slime never reads the tracker, so it logs none. Here one value per rollout: the mean over its
training micro-batches (every optimizer step's) and MoE layers, as `train/<megatron-core's name>`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.moe import moe_utils

__all__ = ["reset_router_losses", "router_loss_metrics"]


def reset_router_losses() -> None:
    """Forgets every tracked router loss, names included (the tracker is megatron-core's process-wide dict)."""
    moe_utils.get_moe_layer_wise_logging_tracker().clear()


def router_loss_metrics(num_moe_layers: int, num_micro_batches: int) -> dict[str, float]:
    """The tracked router losses of the training forwards since the last call, then clears the tracker (collective).

    Every rank must call it, also a pipeline stage without MoE layers (`--moe-layer-freq` with dense layers first,
    or uneven stages): its tracker is empty, and it joins the reduction with zeros under the names the other
    stages tracked.

    Args:
        num_moe_layers: MoE layers of the whole model (every pipeline stage's).
        num_micro_batches: training forwards since the last call on this rank (each step's micro-batches, not the
            schedule's empty-slot dummies, whose routers track nothing: `router_gate`).

    Returns:
        `{"train/<name>": mean un-weighted loss}` for each loss megatron-core tracked on any rank (none with the
        losses off), the same on every rank. Formula: megatron-core's `track_moe_metrics` with
        `loss_scale = 1 / num_micro_batches`.
    """
    tracker = moe_utils.get_moe_layer_wise_logging_tracker()
    values = {name: entry["values"] for name, entry in tracker.items()}
    if dist.get_world_size() > 1:
        values = _reduce_across_ranks(tracker)
    reset_router_losses()
    if not values or num_micro_batches == 0:
        return {}
    return {f"train/{name}": float(v.float().sum()) / num_micro_batches / num_moe_layers
            for name, v in sorted(values.items())}  # fmt: skip


def _mean(values, group) -> None:
    # SUM then divide: megatron-core's ReduceOp.AVG, which gloo (CPU worlds) does not have.
    dist.all_reduce(values, group=group)
    values /= dist.get_world_size(group)


def _agreed_layout(tracker: dict) -> dict[str, int]:
    """`{name: per-layer value count}` of the losses tracked on any rank (one `all_gather_object` over the world).

    Raises:
        RuntimeError: two ranks tracked one loss with different layer counts (not one model's tracker).
    """
    local = {name: entry["values"].numel() for name, entry in tracker.items()}
    gathered: list[dict[str, int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    layout: dict[str, int] = {}
    for rank, names in enumerate(gathered):
        for name, count in (names or {}).items():
            if layout.setdefault(name, count) != count:
                raise RuntimeError(
                    f"router loss {name!r}: rank {rank} tracked {count} layers, another rank {layout[name]}"
                )
    return layout


def _reduce_across_ranks(tracker: dict) -> dict[str, torch.Tensor]:
    """megatron-core's `reduce_aux_losses_tracker_across_ranks` on any backend and any layer layout.

    Each loss's own group summed (ranks holding parts of its sum), then DP or the loss's `avg_group` averaged (a
    loss without either group, the z-loss, over DP), then pipeline stages summed (each holds its layers).
    megatron-core sums the stages first; every step is a sum or mean over one axis of the rank grid, so the order
    gives the same values, and this one lets a stage without a loss (no MoE layer there: its tracker is empty, and
    it has no router groups to name) join only the stage sum, with zeros. Names are agreed over the world first and
    reduced in name order, so every rank issues the same collectives.

    Returns:
        `{name: [layers] values summed over stages}` for every name any rank tracked; the same on every rank.
    """
    layout = _agreed_layout(tracker)
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    dp_group = parallel_state.get_data_parallel_group(with_context_parallel=False, partial_data_parallel=False)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    out: dict[str, torch.Tensor] = {}
    for name in sorted(layout):
        entry = tracker.get(name)
        if entry is None:  # a stage without this loss: only the stage sum below, where it adds nothing
            out[name] = torch.zeros(layout[name], device=device)
        else:
            out[name] = values = entry["values"]
            if entry.get("reduce_group") is not None:
                dist.all_reduce(values, group=entry["reduce_group"])
                if not entry.get("reduce_group_has_dp", False):
                    _mean(values, dp_group)
            if entry.get("avg_group") is not None:
                _mean(values, entry["avg_group"])
            elif entry.get("reduce_group") is None:
                # The z-loss: megatron-core leaves each rank its own (Megatron-LM logs the last rank's); averaged
                # over DP here, so that every rank reports the same value.
                _mean(values, dp_group)
        dist.all_reduce(out[name], group=pp_group)
    return out
