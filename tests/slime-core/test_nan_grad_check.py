"""`--no-check-for-nan-in-loss-and-grad` (Megatron-LM's switch, in 3 of the original's launch scripts) is read.

The original: without the flag megatron-core's gradient check stops the run on a NaN/inf gradient (Megatron-LM passes
`check_for_nan_in_grad=args.check_for_nan_in_loss_and_grad` to its DDP); with it, `train_step` skips an optimizer step
whose gradient norm is not finite (slime/backends/megatron_utils/model.py). Here the flag was listed as "no effect":
both backends stepped on, and FSDP's clip by a NaN norm wrote NaN into every weight, with no word.
The shared step's check runs on the norms it reads after the last step (no host read per step); the FSDP and
Megatron skips are tested in their packages.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib

import pytest

from slime_core.config import SlimeArgs, parse_args
from slime_core.step_metrics import check_grad_norms
from slime_core.train_step import train_on_rollout

_spec = importlib.util.spec_from_file_location(
    "slime_core_test_train_step_fakes", pathlib.Path(__file__).with_name("test_train_step.py")
)
_fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fakes)

_BASE = {"rollout_batch_size": 1, "num_rollout": 1}
_SKIP = ["--no-check-for-nan-in-loss-and-grad"]


class _NanAtStep(_fakes.FakeBackend):
    """The fake backend of `test_train_step.py` whose optimizer reports a non-finite grad norm at one step."""

    def __init__(self, batch, bad_step: int, norm: float) -> None:
        super().__init__(batch)
        self.bad_step, self.norm = bad_step, norm

    def optimizer_step(self):
        step = self.steps
        grad_norm, lr = super().optimizer_step()
        return (self.norm if step == self.bad_step else grad_norm), lr


def test_the_flag_reaches_the_config_under_both_backends():
    for backend in ("fsdp", "megatron"):
        flags = ["--train-backend", backend, "--rollout-batch-size", "1", "--num-rollout", "1"]
        assert parse_args(flags).check_for_nan_in_loss_and_grad is True
        assert parse_args([*flags, *_SKIP]).check_for_nan_in_loss_and_grad is False
    # The plugin view keeps Megatron-LM's attribute name, as the original's args namespace has it.
    cfg = SlimeArgs.from_dict({**_BASE, "megatron_args": _SKIP})
    assert cfg.check_for_nan_in_loss_and_grad is False


@pytest.mark.parametrize("norm", [math.nan, math.inf, -math.inf])
def test_a_non_finite_norm_stops_the_run_naming_the_step_and_the_flag(norm):
    records = [{"train/grad_norm": 0.5, "train/lr": 1e-6}, {"train/grad_norm": norm, "train/lr": 1e-6}]
    with pytest.raises(RuntimeError, match=r"optimizer step 1 of this rollout had a gradient norm of (nan|-?inf)") as e:
        check_grad_norms(records, "train/grad_norm")
    assert "--no-check-for-nan-in-loss-and-grad skips such steps" in str(e.value)
    check_grad_norms(records[:1], "train/grad_norm")  # finite norms pass
    check_grad_norms([{"lr": 1.0}], "grad_norm")  # a record without the norm passes


def test_the_shared_step_stops_on_a_nan_norm_by_default_and_not_with_the_flag():
    batch = _fakes._batch(2)
    with pytest.raises(RuntimeError, match="optimizer step 0 of this rollout had a gradient norm of nan"):
        train_on_rollout(SlimeArgs.from_dict(_BASE), _NanAtStep(batch, 0, math.nan), 0, batch)
    backend = _NanAtStep(batch, 0, math.nan)
    metrics, steps = train_on_rollout(SlimeArgs.from_dict({**_BASE, "megatron_args": _SKIP}), backend, 0, batch)
    # The backend skipped the step (its business); the shared step reports its norm and goes on.
    assert math.isnan(steps[0]["train/grad_norm"]) and math.isfinite(steps[1]["train/grad_norm"])
    assert backend.calls.count("optimizer_step") == 2
