"""The Megatron backend's LR schedule: warmup fraction/init and decay over the run (hand-computed, exact to 1e-12)."""

import math

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


def test_bad_warmup_and_wsd_without_its_anneal():
    with pytest.raises(ValueError, match="only one of --lr-warmup-iters and --lr-warmup-fraction"):
        _rates(_args(lr_warmup_iters=2, lr_warmup_fraction=0.5), 1)
    # megatron-core asserts an anneal length (a bare AssertionError); validation refuses it before, this is the rest.
    with pytest.raises(ValueError, match="^--lr-decay-style WSD needs --lr-wsd-decay-iters"):
        _rates(_args(lr_decay_style="WSD"), 1)


@pytest.mark.parametrize(
    "style, coeff",
    [("linear", lambda r: 1 - r), ("cosine", lambda r: (1 + math.cos(math.pi * r)) / 2),
     ("exponential", lambda r: 2 * 0.5**r - 1), ("minus_sqrt", lambda r: 1 - math.sqrt(r))],
)  # fmt: skip
def test_wsd_holds_lr_then_anneals_over_the_last_steps(style, coeff):
    # Was refused ("WSD is not supported"). 16 steps in the run, a 2-step warmup from 0.2, the anneal over the last 4
    # (steps 13-16, from 1.0 to --min-lr 0.1), --min-lr after: megatron-core's WSD in optimizer steps.
    seen = _rates(_args(lr_decay_style="WSD", lr_wsd_decay_iters=4, lr_wsd_decay_style=style, min_lr=0.1,
                        lr_warmup_iters=2, lr_warmup_init=0.2), 18)  # fmt: skip
    anneal = [0.1 + 0.9 * coeff(k / 4) for k in (1, 2, 3, 4)]
    assert seen == pytest.approx([0.2, 0.6] + [1.0] * 11 + anneal + [0.1], abs=1e-12)
    assert anneal[-1] == pytest.approx(0.1, abs=1e-12) and anneal[0] < 1.0


def test_wsd_state_holds_the_anneal_and_a_resume_with_another_is_refused():
    # megatron-core's state_dict leaves the anneal out, so a resume with another --lr-wsd-decay-iters or style went on
    # with the new anneal unannounced (every other flag of the schedule is compared).
    def build(**kw):
        args = _args(**{"lr_decay_style": "WSD", "lr_wsd_decay_iters": 4, "min_lr": 0.1, **kw})
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return opt, build_lr_scheduler(opt, MegatronSettings.from_config(args), args)

    _, sched = build()
    for _ in range(13):
        sched.step(increment=1)
    state = sched.state_dict()
    assert (state["wsd_decay_steps"], state["lr_wsd_decay_style"]) == (4, "exponential")
    opt, same = build()
    same.load_state_dict(state)  # mid-anneal: goes on at step 13's rate, then 14's
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 + 0.9 * (2 * 0.5**0.25 - 1), abs=1e-12)
    same.step(increment=1)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 + 0.9 * (2 * 0.5**0.5 - 1), abs=1e-12)
    with pytest.raises(AssertionError, match="class input value 5 and checkpointvalue 4 for --lr-wsd-decay-iters"):
        build(lr_wsd_decay_iters=5)[1].load_state_dict(state)
    with pytest.raises(AssertionError, match="value linear and checkpointvalue exponential for --lr-wsd-decay-style"):
        build(lr_wsd_decay_style="linear")[1].load_state_dict(state)
    # A schedule of another style keeps megatron-core's layout (no WSD entries) and its own refusal.
    cosine = _args(lr_decay_style="cosine", min_lr=0.1)
    plain = build_lr_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
                               MegatronSettings.from_config(cosine), cosine)  # fmt: skip
    assert "wsd_decay_steps" not in plain.state_dict()
    with pytest.raises(AssertionError, match="for learning rate decay style do not match"):
        build()[1].load_state_dict(plain.state_dict())


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
