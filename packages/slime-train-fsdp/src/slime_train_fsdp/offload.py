"""Colocated swaps of the trainer's state between accelerator and host memory.

While the rollout engines run on the same GPUs (`--colocate`), the trainer moves its sharded parameters
and optimizer states to the host (`sleep`) and back (`wake_up`), every step. Copies between a GPU and
pageable host memory go through a staging buffer and allocate the host side on every sleep; with
page-locked (pinned) buffers kept across steps the copies run at the link's DMA rate and allocate
nothing after the first sleep. The cost is host memory: the pinned copy of the trainer's shard stays
reserved while the trainer is awake (about 12 bytes per parameter of the shard for fp32 master weights
and Adam's two moments) and the first sleep's pinning (7 s for qwen3-0.6b's 7.2 GiB). Opt in with
`--offload-train-pin-memory`: on the H200 machine measured here (`bench_train_fsdp.py --swap`, 98379b2) a
pinned sleep took 0.41 s against 0.43 s pageable and both wake-ups 0.02 s, so pageable copies are the default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def _like(t: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` as the tensor `t` was: a DTensor with t's mesh, placements and global shape, or plain."""
    if isinstance(t, DTensor):
        return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
    return local


class HostOffloader:
    """Moves a module's parameters/buffers and an optimizer's tensor states to host memory and back.

    Args:
        model: the (FSDP2-sharded) module; its parameters may be DTensors (their local shards move).
        optimizer: optimizer whose per-parameter tensor states move with the model (the scalar `step`
            stays where it is).
        pin_memory: keep page-locked host buffers across sleeps (needs CUDA; ignored for CPU models).

    Host buffers are matched to tensors by visiting order (modules, then optimizer states in parameter
    order), which is fixed for a given model and optimizer; a buffer whose shape or dtype no longer
    matches is reallocated.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, pin_memory: bool) -> None:
        self.model = model
        self.optimizer = optimizer
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self._buffers: list[torch.Tensor] = []
        self._cursor = 0

    @property
    def pinned_bytes(self) -> int:
        """Host memory (bytes) held by the pinned buffers."""
        return sum(b.numel() * b.element_size() for b in self._buffers)

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        local = _local(t)
        if local.device.type == "cpu":
            return t
        if not self.pin_memory:
            return _like(t, local.to("cpu", non_blocking=True))
        i = self._cursor
        self._cursor += 1
        if i == len(self._buffers):
            self._buffers.append(torch.empty_like(local, device="cpu", pin_memory=True))
        elif self._buffers[i].shape != local.shape or self._buffers[i].dtype != local.dtype:
            self._buffers[i] = torch.empty_like(local, device="cpu", pin_memory=True)
        buf = self._buffers[i]
        buf.copy_(local, non_blocking=True)  # async D2H on the current stream; synchronized before use
        return _like(t, buf)

    def _apply_all(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self._cursor = 0
        self.model._apply(fn)
        if self.optimizer is None:
            return
        for state in self.optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and k != "step":
                    state[k] = fn(v)

    def to_host(self) -> None:
        """Copies every parameter, buffer and optimizer state to host memory (blocking until done)."""
        self._apply_all(self._to_host)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the pinned copies must land before the GPU blocks are reused

    def to_device(self, device: torch.device) -> None:
        """Copies everything back to `device` (fresh device tensors; the host buffers are kept)."""

        def fn(t: torch.Tensor) -> torch.Tensor:
            local = _local(t)
            if local.device == device:
                return t
            return _like(t, local.to(device, non_blocking=True))

        self._apply_all(fn)
