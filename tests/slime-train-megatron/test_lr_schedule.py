"""The Megatron backend's LR schedule: warmup fraction/init and decay over the run (hand-computed, exact to 1e-12)."""

import pytest
import torch

from slime_core.config import SlimeArgs

pytest.importorskip("megatron.core")

from slime_train_megatron.lr_schedule import build_lr_scheduler, train_steps  # noqa: E402
from slime_train_megatron.settings import MegatronSettings  # noqa: E402

# A real, validated run config; tests set fields with model_copy (no re-validation, so invalid combinations
# reach the schedule's own checks).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _args(**kw):
    base = dict(megatron_args=[], lr=1.0, num_rollout=2, rollout_batch_size=4, n_samples_per_prompt=2,
                global_batch_size=1)  # fmt: skip
    base.update(kw)
    return _CONFIG.model_copy(update=base)


def _rates(args, steps):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_lr_scheduler(opt, MegatronSettings.from_config(args), args)
    seen = []
    for _ in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        sched.step(increment=1)
    return seen


def test_warmup_fraction_from_init_then_linear_decay_over_the_run():
    assert train_steps(_args()) == 16
    # --lr-warmup-fraction 0.25 of 16 steps -> 4; megatron-core: step k uses init + (lr - init) * k / 4.
    seen = _rates(_args(lr_warmup_fraction=0.25, lr_warmup_init=0.2, lr_decay_style="linear"), 7)
    assert seen == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1 - 1 / 12, 1 - 2 / 12], abs=1e-12)


def test_a_warmup_fraction_is_not_rounded():
    # Issue 27 pass 86: 0.3 x 16 steps was rounded down to 4 warmup steps; the original's Megatron warms up over 4.8
    # (`lr_warmup_fraction * lr_decay_steps`), so step 4 is still in the warmup and the decay spans 11.2 steps.
    seen = _rates(_args(lr_warmup_fraction=0.3, lr_decay_style="linear"), 7)
    expected = [k / 4.8 for k in range(5)] + [1 - (k - 4.8) / 11.2 for k in (5, 6)]
    assert seen == pytest.approx(expected, abs=1e-12)


def test_decay_style_applies_without_lr_decay_iters():
    # Previously a constant rate unless --lr-decay-iters was given; now the decay spans the run (16 steps).
    assert _rates(_args(lr_decay_style="cosine"), 9)[8] == pytest.approx(0.5, abs=1e-12)
    assert _rates(_args(lr_decay_style="linear", lr_decay_iters=4), 3) == pytest.approx([1.0, 0.75, 0.5])


def test_bad_warmup_and_wsd():
    with pytest.raises(ValueError, match="only one of --lr-warmup-iters and --lr-warmup-fraction"):
        _rates(_args(lr_warmup_iters=2, lr_warmup_fraction=0.5), 1)
    with pytest.raises(ValueError, match="WSD is not supported"):
        _rates(_args(lr_decay_style="WSD"), 1)


def test_a_resume_with_another_lr_is_refused():
    # megatron-core's default (use_checkpoint_opt_param_scheduler) took the checkpoint's max/min lr on load, so a
    # changed --lr was ignored with no word; Megatron-LM's default, kept here, refuses it (checkpoint.py names it).
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_lr_scheduler(opt, MegatronSettings.from_config(_args()), _args())
    for _ in range(4):
        sched.step(increment=1)
    same = build_lr_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
                              MegatronSettings.from_config(_args(num_rollout=4)), _args(num_rollout=4))  # fmt: skip
    same.load_state_dict(sched.state_dict())  # a constant schedule: a longer run resumes
    assert same.num_steps == 4
    new = _args(lr=0.5)
    sched2 = build_lr_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5),
                                MegatronSettings.from_config(new), new)  # fmt: skip
    with pytest.raises(AssertionError, match="class input value 0.5 and checkpoint"):
        sched2.load_state_dict(sched.state_dict())
