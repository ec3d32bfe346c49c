"""Host → accelerator copies that never make the host wait for the GPU.

`cpu_tensor.to("cuda")` (and `torch.tensor(data, device="cuda")`) copies from pageable memory and then
synchronizes the stream: the host waits until every kernel queued so far has finished. Inside a train step that
drains the queue at each call, and the GPU then idles while the host launches the next kernels (issue 26: on
Megatron the loss function's per-sample copies drained the forward of every micro-batch). Copying from pinned
memory with `non_blocking=True` is ordered on the stream like a kernel and returns at once; torch's pinned-memory
cache keeps the staging block until the copy has run, so the source may be dropped right away.

On a CPU-only machine (tests, the demo) these are plain `.to(device)` calls that return the tensor itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["per_sample_on_host", "to_device", "to_device_many"]

#: Per micro-batch: (sample ids, their response lengths, `[R]` values).
Rows = list[tuple[list[int], list[int], torch.Tensor]]


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`, without a host-device synchronization.

    Args:
        tensor: any tensor; returned as is when it already lives on `device`.
        device: the target device.

    Returns:
        The tensor on `device` (same dtype and values). A host → CUDA copy goes through pinned memory,
        non-blocking, so later kernels on the current stream see it and the host does not wait; a copy to the
        host stays blocking (its values are read right after).
    """
    device = torch.device(device)
    if tensor.device == device or (device.type == tensor.device.type and device.index is None):
        return tensor
    if device.type == "cpu":
        # To the host: a non-blocking copy would hand back memory the GPU has not written yet.
        return tensor.to(device)
    if tensor.device.type == "cpu" and device.type == "cuda":
        tensor = tensor.pin_memory() if not tensor.is_pinned() else tensor
    return tensor.to(device, non_blocking=True)


def to_device_many(tensors: Sequence[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """Each of `tensors` on `device`, host ones in one copy.

    Host tensors of one dtype are concatenated, copied once (`to_device`) and split again on the device; tensors
    already on `device` are returned as they are.

    Args:
        tensors: N tensors of any shapes (e.g. the `[L_i]` advantages of a micro-batch's samples).
        device: the target device.

    Returns:
        N tensors on `device` with the shapes, dtypes and values of `tensors`.
    """
    device = torch.device(device)
    out: list[torch.Tensor | None] = [None] * len(tensors)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        moved = to_device(t, device) if t.device.type != "cpu" or device.type == "cpu" else None
        if moved is None:
            by_dtype.setdefault(t.dtype, []).append(i)
        else:
            out[i] = moved
    for positions in by_dtype.values():
        flat = torch.cat([tensors[i].reshape(-1) for i in positions])  # one host buffer, one copy
        pieces = to_device(flat, device).split([tensors[i].numel() for i in positions])
        for i, piece in zip(positions, pieces, strict=True):
            out[i] = piece.view(tensors[i].shape)
    return out  # type: ignore[return-value]


def per_sample_on_host(
    rows: Sequence[tuple[list[int], list[int], torch.Tensor]],
    num_samples: int,
    relay: Callable[[Rows], Rows] | None = None,
) -> list[torch.Tensor]:
    """Per-sample `[L_i]` float32 CPU tensors from each micro-batch's `[R]` values, in one device-to-host copy.

    A copy per micro-batch (or per sample) waited for that micro-batch's forward before the host could queue the
    next one; here every forward has been queued when the one copy runs (issue 26). Used by the FSDP and Megatron
    backends for old/reference log-probs and critic values.

    Args:
        rows: per micro-batch of the schedule `(sample ids, their response lengths, [R] values on any device)`
            (only these, so a micro-batch's device tensors, images included, are freed as the forwards go).
        num_samples: N, the samples of the batch.
        relay: applied to the rows once they are on the host, before they are split (Megatron: the broadcast from
            the last pipeline stage, which alone computed them).

    Returns:
        N tensors, sample i at position i.

    Raises:
        ValueError: a sample in no micro-batch (named by position).
    """
    host_rows: Rows = []
    if rows:
        host = torch.cat([v.detach().reshape(-1).float() for _, _, v in rows]).cpu()
        pieces = host.split([int(v.numel()) for _, _, v in rows])
        host_rows = [(ids, lengths, v) for (ids, lengths, _), v in zip(rows, pieces, strict=True)]
    if relay is not None:
        host_rows = relay(host_rows)
    out: list[torch.Tensor | None] = [None] * num_samples
    for ids, lengths, values in host_rows:
        for i, piece in zip(ids, values.split(lengths) if lengths else (), strict=True):
            out[i] = piece
    missing = [i for i, t in enumerate(out) if t is None]
    if missing:
        raise ValueError(f"samples {missing[:5]} are in no micro-batch of the schedule")
    return out  # type: ignore[return-value]
