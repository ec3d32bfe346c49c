"""Faster pieces for the optimizer megatron-core runs when neither Transformer Engine nor Apex is installed.

Without them (the GPU image has neither), megatron-core 0.16 falls back to (`megatron/core/optimizer/__init__.py`,
`clip_grads.py`, `utils.py`):

- `torch.optim.AdamW` built without `fused=`: torch's `foreach` implementation, about a dozen multi-tensor passes
  over the fp32 main parameters, moments and gradients per step. `--use-torch-fused-adam` switches its parameter
  groups to torch's fused kernel (one pass; the same update up to float rounding: the kernels are torch's own).
- `local_multi_tensor_l2_norm` for the gradient norm: one `torch.norm` per parameter, then `torch.tensor()` over
  the list of device scalars, which copies each to the host (one device sync per parameter tensor, ~310 on
  qwen3-1.7b, every optimizer step), and `local_multi_tensor_scale` for clipping: `dst.copy_(src * scale)` per
  tensor. `--use-foreach-grad-norm` puts `torch._foreach_norm` (one multi-tensor kernel, no host copy) and
  `torch._foreach_mul_` in their place. megatron-core then still read the total norm to the host once per step
  (`get_grad_norm_fp32` ends in `.item()`, and `clip_grad_by_total_norm_fp32` compares the clip coefficient on the
  host): the host waited for the backward to drain before it could queue the optimizer and the next forward, which
  left the GPU idle through megatron-core's per-parameter Python of the step (~45 % of the wall of a qwen3-1.7b step
  at 0f85a3c, with the per-micro-batch syncs since removed). The switch therefore also puts `device_grad_norm_fp32`
  and `device_clip_grad_by_total_norm_fp32` in megatron-core's optimizer module: the total norm stays a device
  tensor and the clip coefficient `min(1, max_norm / (norm + 1e-6))` multiplies the gradients on the device (a
  multiply by exactly 1.0 where megatron-core skips the scaling: the same numbers). The norm is read with the step's
  other metrics after the last optimizer step (`slime_core.step_metrics`).

Both act only on those fallbacks: with TE or Apex megatron-core already uses their fused kernels, and the switches
log that they have nothing to do.

`use_foreach_param_copy` (always on: the same bytes, fewer launches) replaces the copy of the updated fp32 main
parameters into the bf16 model parameters after each step: megatron-core runs it as one `copy_` per parameter in a
Python loop (its distributed optimizer with a range-map lookup and a view per parameter; its non-distributed one
falls back to that loop for bf16 even with Apex), ~310 launches per step on qwen3-1.7b; here one
`torch._foreach_copy_` over all of them. The grad-norm one replaces module-level implementations of
`megatron.core.optimizer.clip_grads` (the hooks megatron-core itself chooses among at import), so it holds for
the whole process.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from megatron.core import utils as mcore_utils
from megatron.core.optimizer import clip_grads
from megatron.core.optimizer import distrib_optimizer as mcore_distrib_optimizer
from megatron.core.optimizer import optimizer as mcore_optimizer

from slime_train_megatron.module_patch import ModulePatch

__all__ = [
    "device_clip_grad_by_total_norm_fp32",
    "device_grad_norm_fp32",
    "foreach_l2_norm",
    "foreach_copy_this_to_that",
    "foreach_scale",
    "use_foreach_grad_norm",
    "use_foreach_param_copy",
    "use_torch_fused_adam",
]

logger = logging.getLogger(__name__)

#: megatron-core's local multi-tensor fallbacks, its norm and clip, and its parameter copies, where its optimizer
#: modules call them (the switches replace and restore them; our versions call `.original` for what they leave).
_L2_NORM = ModulePatch(clip_grads, "l2_norm_impl")
_SCALE = ModulePatch(clip_grads, "multi_tensor_scale_impl")
_GRAD_NORM = ModulePatch(mcore_optimizer, "get_grad_norm_fp32")
_CLIP = ModulePatch(mcore_optimizer, "clip_grad_by_total_norm_fp32")
_COPY = ModulePatch(mcore_optimizer, "_multi_tensor_copy_this_to_that")
_DISTRIB_COPY = ModulePatch(mcore_distrib_optimizer.DistributedOptimizer, "_copy_main_params_to_model_params")


def foreach_l2_norm(chunk_size: int, noop_flag: Any, tensor_lists: list[list[torch.Tensor]], per_tensor: bool, *args):
    """Drop-in for `amp_C.multi_tensor_l2norm` / megatron-core's local one: the 2-norm of all tensors together.

    Args:
        chunk_size: unused (the multi-tensor applier's chunking).
        noop_flag: unused (overflow buffer).
        tensor_lists: `[tensors]`, the gradients (fp32 main grads).
        per_tensor: must be False (megatron-core's grad norm never asks for per-tensor norms).
        *args: unused (the applier's extra arguments).

    Returns:
        `(norm [1] float32 on the tensors' device, None)`: `sqrt(Σ_t ||t||²)`, without a host copy.

    Raises:
        ValueError: `per_tensor=True`.
    """
    if per_tensor:
        raise ValueError("foreach_l2_norm computes the total norm only (per_tensor=False)")
    norms = torch._foreach_norm(tensor_lists[0])  # one [] tensor per gradient, multi-tensor kernels
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms])).reshape(1), None


def foreach_scale(chunk_size: int, noop_flag: Any, tensor_lists: list[list[torch.Tensor]], scale: float) -> None:
    """Drop-in for `amp_C.multi_tensor_scale`: `dst = src * scale` for each pair, in place when `dst is src`."""
    src, dst = tensor_lists
    if all(s is d for s, d in zip(src, dst, strict=True)):
        torch._foreach_mul_(dst, scale)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def device_grad_norm_fp32(
    grads_for_norm: list[torch.Tensor] | torch.Tensor,
    norm_type: float = 2,
    grad_stats_parallel_group: Any = None,
) -> torch.Tensor | float:
    """megatron-core's `get_grad_norm_fp32` for the 2-norm, without the host read: a `[]` fp32 device tensor.

    `sqrt(Σ_ranks Σ_t ||t||²)` over the local gradients (DTensor shards as their local parts), summed over the
    DTensors' data-parallel group when they have one and over `grad_stats_parallel_group`, as megatron-core
    (`megatron/core/optimizer/clip_grads.py`) does. Every rank of the groups must call it (collectives), also a rank
    without gradients (it adds 0). Other norm types go to megatron-core's own function (a host float).
    """
    if float(norm_type) != 2.0:
        return _GRAD_NORM.original(grads_for_norm, norm_type, grad_stats_parallel_group)
    grads = [grads_for_norm] if isinstance(grads_for_norm, torch.Tensor) else list(grads_for_norm)
    dp_group = None
    for grad in grads:
        dp_group = mcore_utils.get_data_parallel_group_if_dtensor(grad, dp_group)
    grads = [mcore_utils.to_local_if_dtensor(grad) for grad in grads]
    if grads:
        squares = torch.stack([n.float() for n in torch._foreach_norm(grads)]).square().sum()
    else:
        squares = torch.zeros((), dtype=torch.float32, device=_default_device())
    if dp_group is not None:
        torch.distributed.all_reduce(squares, op=torch.distributed.ReduceOp.SUM, group=dp_group)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(squares, op=torch.distributed.ReduceOp.SUM, group=grad_stats_parallel_group)
    return squares.sqrt()


def device_clip_grad_by_total_norm_fp32(
    parameters: list[torch.Tensor] | torch.Tensor,
    max_norm: float,
    total_norm: torch.Tensor | float,
    use_decoupled_grad: bool = False,
) -> None:
    """megatron-core's `clip_grad_by_total_norm_fp32` with the norm on the device: no host read of the coefficient.

    Multiplies each gradient (`.grad`, or `.decoupled_grad` with `use_decoupled_grad`) in place by
    `min(1, max_norm / (total_norm + 1e-6))` (megatron-core's coefficient; it skips the multiply when the
    coefficient is ≥ 1, which here is a multiply by exactly 1.0: the same numbers). A host float `total_norm` (from
    a norm type `device_grad_norm_fp32` leaves to megatron-core) goes to megatron-core's own function.
    """
    if not torch.is_tensor(total_norm):
        _CLIP.original(parameters, max_norm, total_norm, use_decoupled_grad)
        return
    params = [parameters] if isinstance(parameters, torch.Tensor) else parameters
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [mcore_utils.to_local_if_dtensor(g).detach() for p in params if (g := getattr(p, attr, None)) is not None]
    if grads:
        coeff = (max_norm / (total_norm + 1.0e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, coeff.to(grads[0].dtype))


def use_foreach_grad_norm(on: bool, *, device_norm: bool = True) -> bool:
    """Puts the multi-tensor, host-sync-free grad norm and clipping in megatron-core (`on`), or its own back.

    On: `foreach_l2_norm`/`foreach_scale` as megatron-core's local multi-tensor hooks, and `device_grad_norm_fp32`/
    `device_clip_grad_by_total_norm_fp32` as the norm and clip its optimizer module calls (its optimizers' `step()`
    then return the grad norm as a device tensor).

    Args:
        on: install the switch's pieces (True) or megatron-core's own (False).
        device_norm: with `on`, also the device norm and clip; False keeps megatron-core's own norm and clip (one host
            read of the norm per step) under the foreach hooks, what the switch did before 1f79974: the benchmark's
            `all_hostnorm` variant measures that read. Ignored when `on` is False.

    Returns:
        Whether megatron-core runs its local fallbacks (else TE/Apex kernels are in use and nothing changes).
    """
    if clip_grads.multi_tensor_applier is not mcore_utils.local_multi_tensor_applier:
        logger.info("--use-foreach-grad-norm: megatron-core uses Transformer Engine's or Apex's kernels; unchanged")
        return False
    _L2_NORM.use(foreach_l2_norm, on)
    _SCALE.use(foreach_scale, on)
    _GRAD_NORM.use(device_grad_norm_fp32, on and device_norm)
    _CLIP.use(device_clip_grad_by_total_norm_fp32, on and device_norm)
    return True


def use_torch_fused_adam(optimizer: Any, on: bool) -> int:
    """Switches every `torch.optim.Adam`/`AdamW` inside a megatron-core optimizer to torch's fused kernel or back.

    Existing `step` counters move to the parameters' device as fp32 (where the fused kernel reads them). Call it
    again after a checkpoint load: loading restores the saved parameter-group options.

    Args:
        optimizer: a megatron-core optimizer (chained or not); its torch optimizer is `.optimizer`.
        on: fused (True) or torch's default choice, foreach on CUDA (False).

    Returns:
        The number of torch Adam optimizers switched (0 when megatron-core uses TE's or Apex's FusedAdam).
    """
    switched = 0
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if not isinstance(inner, torch.optim.Adam):  # AdamW is an Adam; TE/Apex FusedAdam are not
            continue
        for group in inner.param_groups:
            group["fused"], group["foreach"] = (True, False) if on else (None, None)
            for param in group["params"]:
                state = inner.state.get(param)
                if on and state and torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(device=param.device, dtype=torch.float32)
        switched += 1
    if not switched:
        logger.info("--use-torch-fused-adam: megatron-core's optimizer is not torch's Adam (TE/Apex); unchanged")
    return switched


def foreach_copy_this_to_that(
    this: list[torch.Tensor], that: list[torch.Tensor], overflow_buf: torch.Tensor | None = None
) -> None:
    """megatron-core's `_multi_tensor_copy_this_to_that` as one multi-tensor copy: `that[i] = this[i]` (cast).

    Args:
        this: source tensors (fp32 main parameters, or model parameters when megatron-core initializes the main ones).
        that: destinations of the same shapes, any float dtype (`copy_` semantics: round to the destination dtype).
        overflow_buf: megatron-core's Apex overflow buffer (fp16); zeroed as megatron-core does, otherwise unused.
    """
    if overflow_buf is not None:
        overflow_buf.fill_(0)
    if this:
        torch._foreach_copy_(that, this)


def _distrib_copy_main_params_to_model_params(self: Any) -> None:
    """`DistributedOptimizer._copy_main_params_to_model_params` with the per-parameter copies in one foreach call.

    The cases it does not cover (megatron-FSDP, precision-aware optimizer, FP8 parameters) run megatron-core's own.
    """
    if self.is_stub_optimizer:
        return
    if self.ddp_config.use_megatron_fsdp or self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
        _DISTRIB_COPY.original(self)
        return
    pairs = ((self.shard_fp32_from_float16_groups, self.model_float16_groups),
             (self.shard_fp32_groups, self.model_fp32_groups))  # fmt: skip
    dst, src = [], []
    for shard_main_groups, model_groups in pairs:
        for shard_main_group, model_group in zip(shard_main_groups, model_groups, strict=True):
            for shard_main_param, model_param in zip(shard_main_group, model_group, strict=True):
                if mcore_distrib_optimizer.is_float8tensor(model_param):
                    _DISTRIB_COPY.original(self)
                    return
                world_range = self._get_model_param_range_map(model_param)["gbuf_world_in_bucket"]
                gbuf_index, _, bucket_id = self.model_param_gbuf_map[model_param]
                buffer = self.buffers[gbuf_index].buckets[bucket_id].param_data
                dst.append(buffer.view(-1)[world_range.start : world_range.end])
                src.append(shard_main_param)
    if src:
        torch._foreach_copy_(dst, src)


def use_foreach_param_copy(on: bool) -> None:
    """Puts the multi-tensor main-to-model parameter copy in megatron-core's optimizers (`on`), or its own back.

    Process-wide (module function and class method of megatron-core); the copied values are identical either way.
    """
    _COPY.use(foreach_copy_this_to_that, on)
    _DISTRIB_COPY.use(_distrib_copy_main_params_to_model_params, on)
