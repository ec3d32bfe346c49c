"""`--reset-optimizer-states` on a megatron-core optimizer: zero the Adam moments in place.

megatron-core's optimizers wrap a torch (or Transformer Engine / apex) Adam whose per-parameter state may
also hold tensors the distributed optimizer keeps views of (fp32 main parameters), so the state is not
dropped as on FSDP (`optimizer.state.clear()`): the moments and step counts are zeroed where they live, which
is what the next step sees after a clear (fresh moments, bias correction restarting at step 1).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["reset_adam_moments"]

_MOMENTS = ("exp_avg", "exp_avg_sq")


def reset_adam_moments(optimizer: Any) -> None:
    """Zeroes `exp_avg`, `exp_avg_sq` and the step counts of every Adam inside `optimizer`.

    Args:
        optimizer: a megatron-core optimizer (chained or not); its torch optimizer is `.optimizer`.
    """
    zeroed = 0
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            continue
        for state in inner.state.values():
            for key in (*_MOMENTS, "step"):
                value = state.get(key)
                if torch.is_tensor(value):
                    value.zero_()
                    zeroed += key != "step"
                elif key == "step" and value is not None:
                    state[key] = 0
        for group in inner.param_groups:
            if "step" in group:  # Transformer Engine / apex fused Adam count steps per group
                group["step"] = 0
    logger.info("--reset-optimizer-states: zeroed %d Adam moment tensors", zeroed)
