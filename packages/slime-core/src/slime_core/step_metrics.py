"""The metric sums of one RL train step (`slime_core.train_step`) and the means made from them once reduced.

Every value here is a sum a backend's `reduce_metric_sums` adds up over data-parallel ranks in one reduction after
the last optimizer step; the means divide the reduced sums. Device values are read to the host once (one transfer for
the steps' metrics and grad norms, one for the rollout means), never per micro-batch (`_read_to_host`).

Legend: `N` samples on this rank, `L_i` response length of sample i.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from slime_core.algorithms import sum_of_sample_mean
from slime_core.batch import RolloutBatch
from slime_core.host_to_device import to_device

__all__ = [
    "check_grad_norms",
    "sum_over_ranks",
    "length_means",
    "length_sums",
    "read_steps",
    "rollout_mean_sums",
    "rollout_means",
    "sample_means_sum",
]


def _read_to_host(tensors: list[torch.Tensor]) -> list[float]:
    """0-d (or one-element) tensors read to the host in one transfer, as the Python floats `float(t)` gives.

    Stacked on the first non-CPU tensor's device, so that host tensors join device ones without a sync; read through
    float64, which holds a float32 exactly.
    """
    if not tensors:
        return []
    device = next((t.device for t in tensors if t.device.type != "cpu"), tensors[0].device)
    return torch.stack([to_device(t.detach().reshape(()), device).double() for t in tensors]).tolist()


def sample_means_sum(
    values: list[torch.Tensor], masks: list[torch.Tensor], denominators: Sequence[float]
) -> torch.Tensor:
    """Σ over samples of `Σ_t values·mask / denominator` (`values` `[L_i]`), as a detached 0-d tensor.

    The original's `log_rollout_data`: `sum_of_sample_mean` with the samples' `rollout_mask_sums` (here
    `RolloutBatch.loss_denominators`: a sample's own mask count, or its rollout's when siblings share a
    `rollout_id`, so the siblings add up to their rollout's token mean); clamped at 1, a sample without trainable
    tokens adds 0; a non-finite value at a masked token is left out.
    """
    lengths = [int(v.numel()) for v in values]
    reduce = sum_of_sample_mean(lengths, masks, denominators)
    return reduce(torch.cat([v.detach().reshape(-1).float() for v in values])) if values else torch.zeros(())


def rollout_mean_sums(
    batch: RolloutBatch, series: dict[str, list[torch.Tensor] | dict[int, torch.Tensor] | None]
) -> dict[str, float]:
    """This rank's sums for the original's trainer-side `rollout/*` means (its `log_rollout_data`).

    Per sample its masked token sum over its rollout's mask total (`sum_of_sample_mean` with the
    `loss_denominators`: the sample's own mean when it is its own rollout); `rollout_means` then divides by the
    rollout count once the sums are reduced over data-parallel ranks. The per-series sums stay on the device until
    one transfer for all of them.

    Args:
        batch: this rank's samples (`loss_masks`: N `[L_i]`).
        series: name (e.g. `"log_probs"`) → N `[L_i]` per-token values, or sample position → its mean already
            taken as a 0-d tensor (the old log-probs recorded in the training forward), or None (not computed).

    Returns:
        `{"rollout/<name>.sum": ..., "rollout/<name>.count": ...}` for `StepBackend.reduce_metric_sums`, in the
        order of `series` (Megatron all-reduces the values as one vector in name order).
    """
    names: list[str] = []
    totals: list[torch.Tensor] = []
    counts: list[int] = []
    for name, values in series.items():
        if values is None:
            continue
        if isinstance(values, dict):
            means = list(values.values())
            total = torch.stack(means).sum() if means else torch.zeros(())
        else:
            total = sample_means_sum(values, batch.loss_masks, batch.loss_denominators)
        # Also with no samples on this rank: every rank must reduce the same names (Megatron's all-reduce).
        names.append(name)
        totals.append(total)
        counts.append(len(values))
    if not names:
        return {}
    # Host totals (advantages) join the device ones (recorded log-probs) without a sync; then one read.
    host = _read_to_host([t.float() for t in totals])
    sums: dict[str, float] = {}
    for name, total, count in zip(names, host, counts, strict=True):
        sums[f"rollout/{name}.sum"], sums[f"rollout/{name}.count"] = float(total), float(count)
    return sums


def length_sums(batch: RolloutBatch) -> dict[str, float]:
    """This rank's length sums for the original's length means and for `perf/*_tflops`.

    The means are its `rollout/total_lengths`, `rollout/response_lengths` and `rollout/truncated`; the FLOPs need
    Σ s, Σ s² and Σ response lengths.
    """
    total = batch.total_lengths
    return {
        "lengths/total.sum": float(sum(total)),
        "lengths/total_sq.sum": float(sum(s * s for s in total)),
        "lengths/response.sum": float(sum(batch.response_lengths)),
        "lengths/truncated.sum": float(sum(batch.truncated)),
        "lengths/truncated.count": float(len(batch.truncated)),  # 0 where the batch does not say
        "lengths/samples": float(len(total)),
    }


def length_means(reduced: dict[str, float]) -> dict[str, float]:
    """The original's trainer-side length means over every sample of the rollout (its `log_rollout_data`)."""
    n = reduced.get("lengths/samples", 0.0)
    if not n:
        return {}
    out = {
        "rollout/total_lengths": reduced["lengths/total.sum"] / n,
        "rollout/response_lengths": reduced["lengths/response.sum"] / n,
    }
    if reduced.get("lengths/truncated.count"):
        out["rollout/truncated"] = reduced["lengths/truncated.sum"] / reduced["lengths/truncated.count"]
    return out


def rollout_means(reduced: dict[str, float], num_rollouts: int) -> dict[str, float]:
    """`rollout/<name>` = reduced sum / the rollout count, for the `rollout_mean_sums` entries in `reduced`.

    `num_rollouts` is the batch's global rollout count (`Σ RolloutBatch.step_rollout_counts`, the original's
    `Σ global_batch_sizes`); 0 (no rollout counts in the batch): every sample is its own rollout and the reduced
    sample count divides.
    """
    names = {key.rsplit(".", 1)[0] for key in reduced if key.startswith("rollout/")}
    out = {}
    for n in sorted(names):
        count = reduced[f"{n}.count"]
        if count:
            out[n] = reduced[f"{n}.sum"] / (num_rollouts or count)
    return out


def read_steps(
    steps: list[tuple[dict[str, list], dict[str, float | torch.Tensor]]],
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Every optimizer step's metric sums and its own values (the grad norm) read to the host in one transfer.

    Called after the last step: a read per step waited for that step's optimizer kernels before the host could queue
    the next step's forward (FSDP's grad norm is a device tensor, Megatron's under `--use-foreach-grad-norm`).

    Args:
        steps: per step, `(its micro-batches' metrics by name, in micro-batch order: 0-d tensors or floats, its own
            record: floats and 0-d tensors, e.g. `train/grad_norm`, `train/lr`)`.

    Returns:
        `({"steps/<j>/<name>": Σ over step j's micro-batches}, the records with floats only)`: the sums added in
        micro-batch order as float64 Python floats (the same sums as reading each value with `float()`), the records
        new dicts.
    """
    metrics = [v for values, _ in steps for vs in values.values() for v in vs if isinstance(v, torch.Tensor)]
    own = [v for _, record in steps for v in record.values() if isinstance(v, torch.Tensor)]
    host = iter(_read_to_host(metrics + own))
    sums: dict[str, float] = {}
    for j, (values, _) in enumerate(steps):
        for key, vs in values.items():
            total = 0.0  # float64 sums of the float32 metrics
            for v in vs:
                total += next(host) if isinstance(v, torch.Tensor) else float(v)
            sums[f"steps/{j}/{key}"] = total
    records = [{k: next(host) if isinstance(v, torch.Tensor) else v for k, v in record.items()} for _, record in steps]
    return sums, records


def check_grad_norms(records: Sequence[dict[str, float]], key: str) -> None:
    """Stops the run when an optimizer step's gradient norm is NaN or inf (Megatron-LM's default check).

    Called with the steps' records as `read_steps` returned them, unless `--no-check-for-nan-in-loss-and-grad` (then
    the backend skipped such steps itself). A NaN or inf in the loss or a gradient made the norm so; the step wrote
    it into the weights (FSDP clips by the norm, a NaN factor), so the run stops before they are saved or sent to
    the engines. megatron-core's gradient check stops it earlier, in the backward's gradient reduction.

    Args:
        records: per optimizer step, its own values (floats), e.g. `{"train/grad_norm": 0.7, "train/lr": 1e-6}`.
        key: the grad norm's name in them (`train/grad_norm`; the critic's `grad_norm`).

    Raises:
        RuntimeError: naming the first step whose norm is not finite, and the flag that skips such steps.
    """
    for step, record in enumerate(records):
        norm = record.get(key)
        if norm is not None and not math.isfinite(norm):
            raise RuntimeError(
                f"optimizer step {step} of this rollout had a gradient norm of {norm} (a NaN or inf in the loss or "
                "the gradients): the run stops before these weights are saved or sent to the engines, as the "
                "original's Megatron does; --no-check-for-nan-in-loss-and-grad skips such steps instead"
            )


def sum_over_ranks(sums: dict[str, float], device: torch.device, group=None) -> dict[str, float]:
    """Metric sums added over the ranks of `group` (collective; the default group when None).

    The names are agreed first: a rank whose micro-batches of a step were all empty slots (fewer samples in the step
    than DP ranks) computed no loss there and has none of that step's names; an all-reduce of each rank's own list
    adds vectors of other lengths and names (gloo refuses them; NCCL reads past the shorter one). A missing name is 0.

    Args:
        sums: this rank's metric sums.
        device: where the all-reduce runs (the backend's device).
        group: the process group (the data-parallel group).

    Returns:
        `{name: sum over the group's ranks}` for every name any rank has; `{}` when none has one.
    """
    gathered: list[list[str] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, sorted(sums), group=group)
    names = sorted({k for g in gathered for k in (g or [])})
    if not names:
        return {}
    vec = to_device(torch.tensor([sums.get(k, 0.0) for k in names], dtype=torch.float64), device)
    dist.all_reduce(vec, group=group)
    return dict(zip(names, vec.cpu().tolist(), strict=True))
