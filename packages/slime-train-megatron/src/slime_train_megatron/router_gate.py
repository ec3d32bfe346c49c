"""Keeps the schedule's empty-slot dummies out of megatron-core's MoE router losses.

An empty schedule slot runs a 2-token dummy (`pipeline.PipelineRunner`) whose loss is `0 · logits`, so its policy
gradient is zero; megatron-core's routers do not see that loss. In a training forward each router attaches its
load-balancing and z-losses to its activations through `MoEAuxLossAutoScaler`, whose backward feeds a constant
`main_loss_backward_scale` (not the gradient that arrives) into the router and every layer below it; it also adds
them to the tracker `router_metrics` logs and, with `--moe-router-enable-expert-bias`, counts the tokens the expert
bias is updated from. And megatron-core divides each micro-batch's router losses by the step's micro-batch count,
dummies included. So a dummy slot moved the router's gradient and its metrics.

`RouterLossGate` runs every router of a dummy as in evaluation (no router loss attached or tracked, its token counts
put back), also when activation recompute runs the dummy's forward again during its backward, and sets each real
micro-batch's router-loss backward scale to `loss scale · CP / real micro-batches` (megatron-core's
`forward_step` uses all micro-batches). A step then has the router gradient and metrics it has without the dummy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
from megatron.core.transformer.moe.router import Router

__all__ = ["RouterLossGate"]


class RouterLossGate:
    """The routers of one model stage, run without router losses while the micro-batch in flight is a dummy.

    Args:
        module: the unwrapped model stage (`GPTModel`); its `Router` submodules are wrapped in place.
    """

    def __init__(self, module: Any) -> None:
        """Wraps each router's `forward` (an instance attribute: the class and other models are left alone)."""
        self.config = getattr(module, "config", None)
        self.routers = [m for m in module.modules() if isinstance(m, Router)]
        #: Whether the micro-batch whose forward (or backward, with its recompute) runs now is a dummy.
        self.dummy = False
        for router in self.routers:
            router.forward = self._gated(router, router.forward)

    def _gated(self, router: Router, forward: Callable[..., Any]) -> Callable[..., Any]:
        def gated_forward(*args: Any, **kwargs: Any) -> Any:
            if not self.dummy:
                return forward(*args, **kwargs)
            # megatron-core attaches, tracks and counts router losses only in training mode; the routing itself is
            # the same (the dummy's outputs get a zero gradient either way).
            training, counts = router.training, getattr(router, "local_tokens_per_expert", None)
            saved = None if counts is None else counts.clone()
            router.training = False
            try:
                return forward(*args, **kwargs)
            finally:
                router.training = training
                if saved is not None:
                    counts.copy_(saved)

        return gated_forward

    def begin_forward(self, dummy: bool) -> None:
        """Says whether the micro-batch about to run its forward is a dummy."""
        self.dummy = dummy

    def watch_backward(self, output: torch.Tensor, dummy: bool, num_real: int) -> None:
        """Makes `output`'s backward (the micro-batch's, recompute included) run gated and with its router scale.

        The hook on the stage's output fires when that micro-batch's backward starts, before any router's backward
        node: megatron-core runs one micro-batch's backward at a time, in whatever order its schedule picks.

        Args:
            output: the stage's output of the micro-batch (logits on the last stage, hidden states elsewhere).
            dummy: whether the micro-batch is an empty slot's dummy.
            num_real: the step's micro-batches that are not dummies (the router losses' divisor).
        """
        if not self.routers or not output.requires_grad:
            return

        def begin_backward(grad: torch.Tensor) -> None:
            self.dummy = dummy
            if not dummy:
                MoEAuxLossAutoScaler.set_loss_scale(self._real_scale(grad.device, num_real))

        output.register_hook(begin_backward)

    def _real_scale(self, device: torch.device, num_real: int) -> torch.Tensor:
        """megatron-core's `forward_step` router-loss scale, divided by the real micro-batches instead of all."""
        one = torch.ones(1, device=device)
        grad_scale = getattr(self.config, "grad_scale_func", None)
        scale = grad_scale(one) if grad_scale is not None else one
        if getattr(self.config, "calculate_per_token_loss", False):
            return scale
        return scale * parallel_state.get_context_parallel_world_size() / max(num_real, 1)
