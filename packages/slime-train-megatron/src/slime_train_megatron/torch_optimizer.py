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
  `torch._foreach_mul_` in their place; megatron-core still reads the total norm once per step (`.item()`).

Both act only on those fallbacks: with TE or Apex megatron-core already uses their fused kernels, and the switches
log that they have nothing to do. The grad-norm one replaces module-level implementations of
`megatron.core.optimizer.clip_grads` (the hooks megatron-core itself chooses among at import), so it holds for
the whole process.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from megatron.core import utils as mcore_utils
from megatron.core.optimizer import clip_grads

__all__ = ["foreach_l2_norm", "foreach_scale", "use_foreach_grad_norm", "use_torch_fused_adam"]

logger = logging.getLogger(__name__)

_LOCAL = {"l2_norm_impl": mcore_utils.local_multi_tensor_l2_norm, "multi_tensor_scale_impl":
          mcore_utils.local_multi_tensor_scale}  # fmt: skip


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


def use_foreach_grad_norm(on: bool) -> bool:
    """Puts `foreach_l2_norm`/`foreach_scale` in megatron-core's grad-norm and clipping (`on`), or its own back.

    Returns:
        Whether megatron-core runs its local fallbacks (else TE/Apex kernels are in use and nothing changes).
    """
    if clip_grads.multi_tensor_applier is not mcore_utils.local_multi_tensor_applier:
        logger.info("--use-foreach-grad-norm: megatron-core uses Transformer Engine's or Apex's kernels; unchanged")
        return False
    clip_grads.l2_norm_impl = foreach_l2_norm if on else _LOCAL["l2_norm_impl"]
    clip_grads.multi_tensor_scale_impl = foreach_scale if on else _LOCAL["multi_tensor_scale_impl"]
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
