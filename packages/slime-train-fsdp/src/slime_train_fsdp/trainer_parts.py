"""The pieces an FSDP2 trainer is built from, shared by the actor (`backend.py`) and the critic (`critic_backend.py`).

Each backend owns its model and calls these: AdamW over the trainable parameters with the LR schedule, the clipped
optimizer step, the data-parallel reductions of the shared steps (`slime_core.train_step.StepBackend`,
`slime_core.critic.CriticStepBackend`), the resume from `--load`, and `Residency` (sleep/wake through host memory).
The default process group is the trainer's: data-parallel × context-parallel ranks (1-D mesh `("dp",)`).
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from slime_core.checkpoint_dirs import iteration_name
from slime_core.config import SlimeArgs
from slime_core.host_to_device import to_device
from slime_core.param_filter import frozen_parameter_names
from slime_core.step_metrics import sum_over_ranks
from slime_train_fsdp.checkpoint import load_checkpoint
from slime_train_fsdp.lr_schedule import build_lr_scheduler
from slime_train_fsdp.offload import HostOffloader

logger = logging.getLogger(__name__)

__all__ = [
    "Residency",
    "all_reduce_sum",
    "build_optimizer",
    "clip_and_step",
    "cp_size",
    "reduce_metric_sums",
    "resume",
]


def build_optimizer(
    model: nn.Module, cfg: SlimeArgs, device: torch.device, frozen: set[str] | frozenset[str] = frozenset()
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """Freezes `--*-params-name-list` and `frozen`, then builds AdamW (`--lr`, `--adam-*`) and the LR schedule.

    `--weight-decay` applies to the matrices only, as megatron-core's default parameter groups
    (`megatron/core/optimizer/__init__.py`): biases (names ending `.bias`) and 1-D parameters (norm weights) get
    none; embeddings and the output layer get it. Group 0 decays, group 1 does not (either may be absent).

    Args:
        model: the FSDP2-sharded module.
        cfg: the run (or critic) config.
        device: this rank's device (a fused AdamW on CUDA without `--fsdp-cpu-offload`).
        frozen: further parameter names to freeze (e.g. a `--freeze-vision-tower` tower).

    Returns:
        `(optimizer, scheduler)`; the frozen parameters have `requires_grad=False` and are not in the optimizer.
    """
    names = [n for n, _ in model.named_parameters()]
    frozen = frozen_parameter_names(names, cfg) | set(frozen)
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)  # FSDP2 then neither computes nor reduce-scatters its gradient
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if _skips_weight_decay(name, param) else decay).append(param)
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(
        [group for group in groups if group["params"]],
        lr=float(cfg.lr),
        betas=(float(cfg.adam_beta1), float(cfg.adam_beta2)),
        eps=float(cfg.adam_eps),
        weight_decay=float(cfg.weight_decay),
        # One fused kernel per step on the GPU instead of foreach launches per parameter group and op.
        fused=(device.type == "cuda" and not cfg.fsdp_cpu_offload) or None,
    )
    return optimizer, build_lr_scheduler(optimizer, cfg)


def _skips_weight_decay(name: str, param: torch.Tensor) -> bool:
    """megatron-core's default: no weight decay on biases and 1-D parameters (norms); `shape` is the global one."""
    return name.endswith(".bias") or len(param.shape) == 1


def clip_and_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    clip_grad: float,
    *,
    skip_non_finite: bool = False,
) -> tuple[torch.Tensor, float]:
    """Clips gradients to `clip_grad` (≤ 0: no clipping), steps the optimizer and the schedule.

    With `skip_non_finite` (`--no-check-for-nan-in-loss-and-grad`) a step whose gradient norm is NaN or inf steps
    neither the optimizer nor the schedule (logged), as the original's `train_step`; that costs one host read of the
    norm per step. Without it nothing is read here: the shared step stops the run when it reads the norms after the
    last step (`slime_core.step_metrics.check_grad_norms`), before the weights are saved or sent to the engines.

    Returns:
        `(pre-clip global grad norm, learning rate of this step)`: the norm as a 0-d float32 tensor on the device,
        left unread (the shared step reads every step's at once after the last: `slime_core.step_metrics`).
    """
    lr = float(optimizer.param_groups[0]["lr"])
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = clip_grad if clip_grad > 0 else float("inf")
    if not skip_non_finite:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        full = norm.full_tensor() if isinstance(norm, DTensor) else norm
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        full = norm.full_tensor() if isinstance(norm, DTensor) else norm
        if not bool(torch.isfinite(full)):  # clipping by a NaN factor would write NaN into every weight
            logger.warning(
                "optimizer step skipped: the gradient norm is %s (--no-check-for-nan-in-loss-and-grad); the weights, "
                "the optimizer state and the LR schedule are unchanged",
                full.item(),
            )
            return full.detach(), lr
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)  # as clip_grad_norm_ does with its norm
    optimizer.step()
    scheduler.step()
    return full.detach(), lr


def cp_size(model: nn.Module) -> int:
    """Context-parallel group size of a model built by `build_fsdp_model` (1 without context parallelism)."""
    group = model.slime_forward_options.cp_group
    return 1 if group is None else dist.get_world_size(group)


def all_reduce_sum(tensor: torch.Tensor, device: torch.device, cp: int) -> torch.Tensor:
    """Sum of `tensor` over the data-parallel ranks (collective over all ranks), returned on CPU.

    The `cp` context-parallel ranks of a DP group hold the same samples, so the sum over all ranks is divided by
    `cp` (as `reduce_metric_sums`): counted `cp` times, the whitening statistics of `--normalize-advantages` took a
    token count `cp` times too large into the variance's Bessel factor `N/(N-1)` (the original reduces over DP×CP
    ranks that each hold their own tokens, `distributed_masked_whiten`).
    """
    reduced = to_device(tensor, device).clone()  # clone: on CPU `to_device` hands back the caller's tensor
    dist.all_reduce(reduced)
    return reduced.cpu() / cp


def reduce_metric_sums(sums: dict[str, float], device: torch.device, cp: int) -> dict[str, float]:
    """Metric sums over data-parallel ranks (collective).

    Names are agreed first (`slime_core.step_metrics.sum_over_ranks`). The `cp` context-parallel
    ranks of a DP group all compute the group's full sums, so the sum over all ranks is divided by `cp`.
    """
    return {k: v / cp for k, v in sum_over_ranks(sums, device).items()}


def resume(
    cfg: SlimeArgs,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    model_flags: dict[str, Any] | None,
    flag: str = "--load",
) -> tuple[int, int, pathlib.Path | None]:
    """Restores `--load` when it holds a checkpoint (`--ckpt-step`, `--no-load-optim`, `--no-load-rng`).

    `model_flags` (`checkpoint.model_flags_of`; None for a model they do not shape) are compared with the saved ones.
    `flag` is the flag the messages name (`--critic-load` when the critic's folder was given by it).

    Returns:
        `(rollout id to start from, global optimizer step, iteration folder loaded)`: the checkpoint's
        `next_rollout_id`, its step and its folder (`save_checkpoint` names it by its `next_rollout_id`), else
        `(--start-rollout-id or 0, 0, None)`.
    """
    start, step = cfg.start_rollout_id or 0, 0
    if cfg.load:
        meta = load_checkpoint(cfg.load, model=model, optimizer=optimizer, scheduler=scheduler,
                               ckpt_step=cfg.ckpt_step, load_optim=not cfg.no_load_optim,
                               load_rng=not cfg.no_load_rng, model_flags=model_flags, flag=flag)  # fmt: skip
        if meta is not None:
            start, step = int(meta["next_rollout_id"]), int(meta["global_step"])
            return start, step, pathlib.Path(cfg.load) / iteration_name(start)
    return start, step, None


class Residency:
    """Where a trainer's state lives: on its device (awake) or in host memory (asleep, `--colocate`).

    Args:
        model: the FSDP2-sharded module.
        optimizer: its optimizer (tensor states move with the model).
        device: this rank's device.
        cpu_offload: `--fsdp-cpu-offload` (the state stays on the host: waking moves nothing back).
        pin_memory: `--offload-train-pin-memory` (pinned host buffers kept across steps; see `offload.py`).
    """

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, *, cpu_offload: bool,
        pin_memory: bool,
    ) -> None:  # fmt: skip
        """Starts awake; the host buffers are made on the first sleep."""
        self.model, self.optimizer, self.device = model, optimizer, device
        self.cpu_offload, self.pin_memory = cpu_offload, pin_memory
        self.asleep = False
        self._host: HostOffloader | None = None

    def require_awake(self, what: str) -> None:
        """Raises `RuntimeError` naming `what` while asleep (collectives on host shards would fail deep in FSDP)."""
        if self.asleep:
            raise RuntimeError(f"{what}() called while the backend is asleep; call wake_up() first")

    def _offloader(self) -> HostOffloader:
        if self._host is None:
            self._host = HostOffloader(self.model, self.optimizer, pin_memory=self.pin_memory)
        return self._host

    def sleep(self) -> None:
        """Drops gradients, moves parameters, buffers and optimizer states to host memory, frees the cache."""
        if self.asleep:
            return
        self.model.zero_grad(set_to_none=True)  # a sleep comes after a finished optimizer step
        self._offloader().to_host()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.asleep = True

    def wake_up(self) -> None:
        """Moves what `sleep` offloaded back to the device (nothing moves under `--fsdp-cpu-offload` on CUDA)."""
        if not self.asleep:
            return
        if not (self.device.type == "cuda" and self.cpu_offload):
            self._offloader().to_device(self.device)
        self.asleep = False
