"""Trainer-side hooks under `--plugin-timeout-secs` (`slime_core.hook_deadline`).

Issue 27 leftover: a custom loss / advantage / TIS / pg-loss-reducer function that never returned hung the trainer
step with no log and no deadline. Deadlines here are 0.3-0.5 s; the assertions bound elapsed time loosely (a hook
stopped in Python code ends within seconds, not the 60 s a stuck one would take) so a loaded machine cannot fail
them.
"""

import logging
import sys
import threading
import time
import types

import pytest
import torch

from slime_core.algorithms import LossInputs, compute_advantages_and_returns, compute_train_loss
from slime_core.config import SlimeArgs
from slime_core.hook_deadline import HookDeadlineExceeded, call_hook_with_deadline, hook_bounds

_BOUNDS = {"what": "--custom-loss-function-path m.loss", "deadline_s": 0.3, "flag": "--plugin-timeout-secs"}
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _spin(*_args, **_kwargs):
    deadline = time.monotonic() + 60  # never reached: the watchdog stops it
    while time.monotonic() < deadline:
        try:
            pass
        except Exception:  # a hook swallowing errors still stops: the injected exception is no Exception
            pass
    return "finished"


def test_a_hook_looping_in_python_is_stopped_at_its_deadline_and_named(caplog):
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="slime_core.hook_deadline"):
        with pytest.raises(HookDeadlineExceeded) as e:
            call_hook_with_deadline(_spin, **_BOUNDS, warn_every_s=0.1)
    assert time.monotonic() - start < 30
    assert str(e.value).startswith(
        "--custom-loss-function-path m.loss did not finish within 0.3 s (--plugin-timeout-secs): stopped after"
    )
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and errors[0].startswith("--custom-loss-function-path m.loss is still running after")
    assert "past its deadline of 0.3 s (--plugin-timeout-secs): stopping it" in errors[0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "(deadline 0.3 s, --plugin-timeout-secs)" in warnings[0]


def test_a_hook_blocked_in_c_fails_when_it_returns_past_the_deadline():
    with pytest.raises(HookDeadlineExceeded, match=r"m\.loss did not finish within 0\.3 s \(--plugin-timeout-secs\)"):
        call_hook_with_deadline(time.sleep, 0.8, **_BOUNDS, warn_every_s=10)


def test_a_hook_in_time_returns_its_value_and_leaves_nothing_behind():
    for _ in range(50):
        assert call_hook_with_deadline(lambda x, *, y: x + y, 1, y=2, **_BOUNDS, warn_every_s=10) == 3
    time.sleep(0.5)  # past the deadline: a stray exception would now fire in this thread
    assert sum(range(10_000)) == 49_995_000
    # The watchdogs ended with their calls.
    assert not [t for t in threading.enumerate() if t.name.startswith("hook watchdog: --custom-loss")]
    with pytest.raises(ValueError) as e:
        call_hook_with_deadline(lambda: int("x"), **_BOUNDS, warn_every_s=10)
    assert e.value.__notes__ == ["(raised by --custom-loss-function-path m.loss)"]


def _register(monkeypatch, name, **functions):
    module = types.ModuleType(name)
    for key, fn in functions.items():
        setattr(module, key, fn)
    monkeypatch.setitem(sys.modules, name, module)
    return name


def test_custom_loss_and_advantage_functions_are_bounded(monkeypatch):
    module = _register(monkeypatch, "hook_deadline_plugins", loss=_spin, advantages=_spin)
    cfg = _CONFIG.model_copy(update={"plugin_timeout_secs": 0.5, "slow_call_warning_secs": 10.0})
    assert hook_bounds(cfg) == {"deadline_s": 0.5, "flag": "--plugin-timeout-secs", "warn_every_s": 10.0}
    lp = [torch.tensor([-0.5, -1.0]), torch.tensor([-0.25])]
    inputs = LossInputs(
        log_probs=[x.clone().requires_grad_(True) for x in lp], old_log_probs=lp, advantages=None,
        loss_masks=[torch.ones(2), torch.ones(1)], loss_denominators=[2.0, 1.0], entropy=None, total_lengths=[4, 3],
        tokens=[torch.arange(4), torch.arange(3)],
    )  # fmt: skip
    loss_cfg = cfg.model_copy(update={"loss_type": "custom_loss", "custom_loss_function_path": f"{module}.loss"})
    with pytest.raises(HookDeadlineExceeded, match=r"^--custom-loss-function-path hook_deadline_plugins\.loss did not"):
        compute_train_loss(loss_cfg, inputs)
    adv_cfg = cfg.model_copy(update={"custom_advantage_function_path": f"{module}.advantages"})
    with pytest.raises(HookDeadlineExceeded, match=r"^--custom-advantage-function-path hook_deadline_plugins\.adv"):
        compute_advantages_and_returns(adv_cfg, rewards=[1.0, 0.0], loss_masks=[torch.ones(2), torch.ones(1)])
