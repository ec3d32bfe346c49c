"""Colocated-mode memory release: move every tensor storage of model and optimizer to CPU and back.

Storages are resized to 0 in place (not replaced), so every view into them, including megatron-core's
parameter views into its contiguous DDP buffers and the optimizer's references, stays valid after
`reload_from_cpu` resizes and refills them.

The host copies are page-locked (pinned) buffers. By default each sleep allocates them and the wake-up frees
them; `--offload-train-pin-memory` keeps them across steps (`host_buffers`), so a sleep after the first one pins
nothing (the price: host memory the size of the offloaded state, held for the whole run).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["host_buffer", "host_buffers", "offload_to_cpu", "reload_from_cpu"]


def _tensors(model: Any, optimizer: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = list(model.parameters())
    buffers = getattr(model, "buffers", None)
    buffers = (buffers if isinstance(buffers, list) else []) + list(getattr(model, "expert_parallel_buffers", []) or [])
    for buffer in buffers:
        found += [t for t in (getattr(buffer, "param_data", None), getattr(buffer, "grad_data", None)) if t is not None]
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            found += list(group["params"])
        for state in inner.state.values():
            found += [v for v in state.values() if torch.is_tensor(v)]
    return found


def host_buffer(size: int, kept: torch.Tensor | None) -> torch.Tensor:
    """A pinned `[size]` uint8 host buffer: `kept` when it is one of that size, else a new one."""
    if kept is not None and kept.numel() == size:
        return kept
    return torch.empty(size, dtype=torch.uint8, pin_memory=True)


def host_buffers(state: list[tuple[torch.UntypedStorage, torch.Tensor | None]]) -> list[torch.Tensor]:
    """The host buffers of an `offload_to_cpu` state, in its order: what the next sleep may reuse."""
    return [backup for _, backup in state if backup is not None]


def offload_to_cpu(
    model: Any, optimizer: Any, kept: list[torch.Tensor] | None = None
) -> list[tuple[torch.UntypedStorage, torch.Tensor | None]]:
    """Copies each distinct accelerator storage to pinned CPU memory and frees it.

    Args:
        model: the DDP-wrapped model.
        optimizer: the megatron optimizer (chained or not).
        kept: the previous sleep's host buffers (`host_buffers`), reused in order where the sizes match
            (`--offload-train-pin-memory`); None allocates every buffer.

    Returns:
        The state `reload_from_cpu` needs.
    """
    seen: set[int] = set()
    state = []
    kept = list(kept or [])
    for t in _tensors(model, optimizer):
        if not t.is_cuda:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.size() == 0:
            continue
        seen.add(storage.data_ptr())
        backup = host_buffer(storage.size(), kept[len(state)] if len(state) < len(kept) else None)
        backup.untyped_storage().copy_(storage)
        storage.resize_(0)
        state.append((storage, backup))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    logger.info("offloaded %.2f GiB to CPU", sum(b.numel() for _, b in state) / 1024**3)
    return state


def reload_from_cpu(state: list[tuple[torch.UntypedStorage, torch.Tensor | None]]) -> None:
    """Reallocates the storages freed by `offload_to_cpu` and copies their contents back."""
    for storage, backup in state:
        storage.resize_(backup.numel())
        storage.copy_(backup.untyped_storage(), non_blocking=True)
    torch.cuda.synchronize()
