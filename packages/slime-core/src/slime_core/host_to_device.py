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

from collections.abc import Sequence

import torch

__all__ = ["to_device", "to_device_many"]


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
