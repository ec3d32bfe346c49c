"""A third-party slime extension, installed (dev-only workspace member) so tests see real entry points.

It registers one entry per open extension point: a training backend (`toy_backend`), a rollout engine that
needs a GPU (`toy_gpu_engine`), a reward function (`response_length`) and an advantage estimator
(`toy_centred_x10`). tests/apps/test_plugin_pkg.py shows each is found, validated by the config and used.
"""

from __future__ import annotations

from typing import Any

import torch

from slime_core.estimators import EstimatorSpec
from slime_core.extensions import RewardSpec, RolloutEngineSpec, TrainBackendSpec
from slime_core.registry import Problem

__all__ = ["RESPONSE_LENGTH", "TOY_BACKEND", "TOY_CENTRED_X10", "TOY_GPU_ENGINE", "ToyBackend"]


class ToyBackend:
    """Stands for a training backend; the app's factory builds one with no arguments."""


def toy_backend_preflight(cfg: Any) -> list[Problem]:
    """Owns the check of a flag it cares about: `--lr` must be positive (else an error; a note when it is)."""
    if cfg.lr <= 0:
        return [Problem(message=f"--lr {cfg.lr}: the toy backend needs a positive learning rate")]
    return [Problem(message="toy backend checked --lr", severity="note")]


def response_length(args: Any, sample: Any) -> float:
    """Reward = response length in characters / 10 (a `--custom-rm-path` signature)."""
    return len(sample.response) / 10


def toy_advantages(cfg: Any, *, rewards: list[float], loss_masks: list[torch.Tensor], kl: Any, values: Any):
    """Advantages and returns = 10 × the (group-centred) reward on every response token, float32 `[L_i]`."""
    out = [torch.full(mask.shape, 10.0 * r, dtype=torch.float32) for r, mask in zip(rewards, loss_masks, strict=True)]
    return out, out


TOY_BACKEND = TrainBackendSpec(
    name="toy_backend", factory=ToyBackend, preflight=toy_backend_preflight, needs_gpu=False, supports_lora=True
)
TOY_GPU_ENGINE = RolloutEngineSpec(name="toy_gpu_engine", needs_gpu=True)
RESPONSE_LENGTH = RewardSpec(name="response_length", factory="slime_test_plugin:response_length")
TOY_CENTRED_X10 = EstimatorSpec(
    name="toy_centred_x10", advantages="slime_test_plugin:toy_advantages", rewards="group_mean"
)
