"""Megatron's `optimizer_step` with `--no-check-for-nan-in-loss-and-grad`: a non-finite step steps nothing.

The original's `train_step` (slime/backends/megatron_utils/model.py), with the flag: `prepare_grads()` finding an inf,
or a NaN/inf `get_grad_norm()`, skips both `optimizer.step()` and the LR schedule. A stand-in optimizer records the
calls (megatron-core's own needs CUDA); the flag reaches `MegatronSettings` through the Megatron tokens.
"""

import math

import pytest

from slime_core.config import SlimeArgs

pytest.importorskip("megatron.core")

from slime_train_megatron.settings import MegatronSettings  # noqa: E402
from slime_train_megatron.trainer_parts import optimizer_step  # noqa: E402

_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


class _Optimizer:
    def __init__(self, *, found_inf: bool = False, norm: float = 0.5) -> None:
        self.found_inf, self.norm, self.calls = found_inf, norm, []
        self.param_groups = [{"lr": 1e-3}]

    def prepare_grads(self):
        self.calls.append("prepare_grads")
        return self.found_inf

    def get_grad_norm(self):
        self.calls.append("get_grad_norm")
        return self.norm

    def step(self):
        self.calls.append("step")
        return (not self.found_inf), (None if self.found_inf else self.norm), None


class _Scheduler:
    def __init__(self) -> None:
        self.increments = []

    def step(self, increment):
        self.increments.append(increment)


@pytest.mark.parametrize(("found_inf", "norm"), [(True, 0.5), (False, math.nan), (False, math.inf)])
def test_a_non_finite_step_steps_neither_optimizer_nor_schedule_with_the_flag(found_inf, norm):
    optimizer, scheduler = _Optimizer(found_inf=found_inf, norm=norm), _Scheduler()
    got, lr = optimizer_step(optimizer, scheduler, skip_non_finite=True)
    assert not math.isfinite(got) and lr == 1e-3
    assert "step" not in optimizer.calls and scheduler.increments == []


def test_a_finite_step_is_taken_with_and_without_the_flag():
    for skip in (False, True):
        optimizer, scheduler = _Optimizer(norm=0.5), _Scheduler()
        assert optimizer_step(optimizer, scheduler, skip_non_finite=skip) == (0.5, 1e-3)
        assert optimizer.calls[-1] == "step" and scheduler.increments == [1]
    # Without the flag the step is megatron-core's alone (the shared step checks the norm after the last step).
    optimizer = _Optimizer(norm=math.nan)
    assert math.isnan(optimizer_step(optimizer, _Scheduler())[0]) and optimizer.calls == ["step"]


def test_the_flag_reaches_the_settings():
    assert MegatronSettings.from_config(_CONFIG).check_for_nan_in_loss_and_grad is True
    skip = _CONFIG.model_copy(update={"megatron_args": ["--no-check-for-nan-in-loss-and-grad"]})
    assert MegatronSettings.from_config(skip).check_for_nan_in_loss_and_grad is False
