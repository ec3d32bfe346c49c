"""`clip_and_step` with `--no-check-for-nan-in-loss-and-grad`: a step whose gradient norm is NaN/inf changes nothing.

The original's `train_step` (slime/backends/megatron_utils/model.py) skips the optimizer and the LR schedule when the
flag is given and the norm is not finite. Before, the FSDP step clipped by the NaN norm and AdamW wrote NaN into every
weight. On a tiny model with the trainer's own AdamW and schedule (FSDP2 sharding changes neither); exact compares.
"""

import math

import pytest
import torch
from torch import nn

from slime_core.config import SlimeArgs
from slime_train_fsdp.trainer_parts import build_optimizer, clip_and_step

_CONFIG = SlimeArgs.from_dict(
    {"rollout_batch_size": 1, "num_rollout": 4, "lr": 1e-2, "lr_decay_style": "linear", "weight_decay": 0.1}
)


def _model_and_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    optimizer, scheduler = build_optimizer(model, _CONFIG, torch.device("cpu"))
    return model, optimizer, scheduler


def _backward(model: nn.Module, scale: float = 1.0) -> None:
    model.zero_grad()
    (model(torch.ones(2, 3)).square().sum() * scale).backward()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_step_is_skipped_with_the_flag(bad):
    model, optimizer, scheduler = _model_and_optimizer()
    _backward(model)
    clip_and_step(model, optimizer, scheduler, 1.0, skip_non_finite=True)  # one good step: Adam state exists
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    lr = optimizer.param_groups[0]["lr"]
    _backward(model, bad)
    norm, step_lr = clip_and_step(model, optimizer, scheduler, 1.0, skip_non_finite=True)
    assert not math.isfinite(float(norm)) and step_lr == lr
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)  # weights untouched
    for state, m in zip(optimizer.state.values(), moments, strict=True):
        torch.testing.assert_close(state["exp_avg"], m, rtol=0, atol=0)
        assert int(state["step"]) == 1  # the skipped step is not counted
    assert scheduler.last_epoch == 1 and optimizer.param_groups[0]["lr"] == lr  # nor is the schedule stepped


def test_a_finite_step_with_the_flag_is_the_step_without_it():
    (m1, o1, s1), (m2, o2, s2) = _model_and_optimizer(), _model_and_optimizer()
    for _ in range(3):
        _backward(m1, 50.0)  # a norm far over the clip: the clipped path is compared
        _backward(m2, 50.0)
        n1, lr1 = clip_and_step(m1, o1, s1, 1.0)
        n2, lr2 = clip_and_step(m2, o2, s2, 1.0, skip_non_finite=True)
        assert float(n1) == float(n2) > 1.0 and lr1 == lr2
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
