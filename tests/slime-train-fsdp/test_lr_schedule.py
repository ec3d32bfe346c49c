"""Tests of the Megatron-style LR schedule (hand-computed values, exact up to 1e-12)."""

import math

import pytest
import torch

from slime_core.config import SlimeArgs
from slime_train_fsdp.lr_schedule import build_lr_scheduler, load_scheduler_state, lr_at_step

# A real, validated run config; tests set fields with model_copy (no re-validation, so invalid combinations
# reach the schedule's own checks).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def test_warmup_then_linear_decay():
    kw = dict(lr=1.0, min_lr=0.1, warmup=2, decay_iters=6, style="linear")
    # warmup (megatron-core's): lr * step / warmup up to step `warmup`; then linear from 1.0 to 0.1 over 4 steps; then
    # flat.
    expected = [0.0, 0.5, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1]
    assert [lr_at_step(s, **kw) for s in range(8)] == pytest.approx(expected, abs=1e-12)


def test_cosine_midpoint_and_end():
    kw = dict(lr=2.0, min_lr=0.0, warmup=0, decay_iters=10, style="cosine")
    assert lr_at_step(0, **kw) == pytest.approx(2.0)
    assert lr_at_step(5, **kw) == pytest.approx(1.0)
    assert lr_at_step(2, **kw) == pytest.approx(1.0 + math.cos(math.pi * 0.2))
    assert lr_at_step(10, **kw) == pytest.approx(0.0)
    assert lr_at_step(50, **kw) == pytest.approx(0.0)


def test_constant_and_unknown_style():
    assert lr_at_step(100, lr=0.3, min_lr=0.0, warmup=0, decay_iters=1, style="constant") == 0.3
    with pytest.raises(ValueError, match="--lr-decay-style must be one of"):
        lr_at_step(0, lr=0.3, min_lr=0.0, warmup=0, decay_iters=1, style="polynomial")


def test_wsd_holds_lr_then_anneals_over_its_last_steps():
    # Was refused ("--lr-decay-style must be one of (..., 'inverse-square-root'), got 'WSD'"). A 1-step warmup, --lr
    # until step 6, the anneal over steps 7-10 (to --min-lr 0.2), --min-lr after: megatron-core's get_lr.
    kw = dict(lr=1.0, min_lr=0.2, warmup=1, decay_iters=10, style="WSD", wsd_iters=4)
    coeffs = {"linear": [0.75, 0.5, 0.25, 0.0], "cosine": [(1 + math.cos(math.pi * k / 4)) / 2 for k in (1, 2, 3, 4)],
              "exponential": [2 * 0.5 ** (k / 4) - 1 for k in (1, 2, 3, 4)],
              "minus_sqrt": [1 - math.sqrt(k / 4) for k in (1, 2, 3, 4)]}  # fmt: skip
    for style, coeff in coeffs.items():
        expected = [0.0] + [1.0] * 6 + [0.2 + 0.8 * c for c in coeff] + [0.2]
        assert [lr_at_step(s, wsd_style=style, **kw) for s in range(12)] == pytest.approx(expected, abs=1e-12), style
    assert lr_at_step(3, **kw) == 1.0  # exponential by default (Megatron-LM's --lr-wsd-decay-style)
    with pytest.raises(ValueError, match="^--lr-decay-style WSD needs --lr-wsd-decay-iters"):
        lr_at_step(0, **{**kw, "wsd_iters": None})
    with pytest.raises(ValueError, match=r"got 'square'\)$"):
        lr_at_step(0, wsd_style="square", **kw)


def test_scheduler_drives_optimizer_and_resumes():
    # decay_iters from the run size: 2 rollouts * 4 prompts * 2 samples / 4 = 4 steps.
    args = SlimeArgs.from_dict(
        dict(
            lr=1.0,
            min_lr=0.0,
            lr_warmup_iters=0,
            lr_decay_style="linear",
            lr_decay_iters=None,
            num_rollout=2,
            rollout_batch_size=4,
            n_samples_per_prompt=2,
            global_batch_size=4,
        )
    )
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.lr)
    sched = build_lr_scheduler(opt, args)
    seen = []
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([1.0, 0.75, 0.5])
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.lr)
    sched2 = build_lr_scheduler(opt2, args)
    load_scheduler_state(sched2, sched.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.25)


def _run_args(**kw):
    base = dict(lr=1.0, min_lr=0.0, lr_warmup_iters=0, lr_decay_style="linear", lr_decay_iters=None, num_rollout=2,
                rollout_batch_size=4, n_samples_per_prompt=2, global_batch_size=1)  # fmt: skip
    base.update(kw)
    return _CONFIG.model_copy(update=base)


def _rates(args, steps):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.lr)
    sched = build_lr_scheduler(opt, args)
    seen = []
    for _ in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


def test_warmup_fraction_and_init():
    # 16 steps in the run; --lr-warmup-fraction 0.25 -> 4 warmup steps from --lr-warmup-init 0.2 (step 0) to 1.0
    # (step 4), then a linear decay over the remaining 12 steps.
    seen = _rates(_run_args(lr_warmup_fraction=0.25, lr_warmup_init=0.2), 6)
    assert seen == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1 - 1 / 12], abs=1e-12)
    # The fraction is of --lr-decay-iters when given, not rounded (the original's Megatron): 0.6 * 4 -> 2.4 warmup
    # steps, then the decay over the remaining 1.6: step 3 at 1 - 0.6 / 1.6.
    assert _rates(_run_args(lr_warmup_fraction=0.6, lr_decay_iters=4), 4) == pytest.approx(
        [0.0, 1 / 2.4, 2 / 2.4, 0.625], abs=1e-12
    )
    # --lr-warmup-init also applies to --lr-warmup-iters.
    assert _rates(_run_args(lr_warmup_iters=2, lr_warmup_init=0.5, lr_decay_style="constant"), 3) == pytest.approx(
        [0.5, 0.75, 1.0]
    )


def test_warmup_iters_and_fraction_are_exclusive():
    with pytest.raises(ValueError, match="only one of --lr-warmup-iters and --lr-warmup-fraction"):
        _rates(_run_args(lr_warmup_iters=2, lr_warmup_fraction=0.1), 1)


def test_a_resume_with_another_schedule_is_refused_naming_the_flags():
    # A resume with --lr 0.5 kept training at the checkpoint's 1.0 (LambdaLR.load_state_dict restored base_lrs) under
    # the new decay, with no word. The original's Megatron refuses such a change; so does this backend now.
    old = _run_args(lr=1.0)  # linear decay to 0 over 16 steps
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=old.lr)
    sched = build_lr_scheduler(opt, old)
    for _ in range(4):
        opt.step()
        sched.step()
    saved = sched.state_dict()

    def resume(**changed):
        args = _run_args(**changed)
        opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.lr)
        sched2 = build_lr_scheduler(opt2, args)
        load_scheduler_state(sched2, saved)
        return opt2.param_groups[0]["lr"]

    assert resume() == pytest.approx(12 / 16)  # the same flags: step 4 of the saved schedule
    with pytest.raises(ValueError) as e:
        resume(lr=0.5, num_rollout=4)
    assert str(e.value) == (
        "--load: the checkpoint's learning-rate schedule differs from this run's flags (--lr 0.5 here vs 1.0 saved; "
        "--lr-decay-iters (or the run's length) 32 here vs 16 saved); a resumed run continues the checkpoint's "
        "schedule: give the saved values (the run's length is --num-rollout x --rollout-batch-size x "
        "--n-samples-per-prompt / --global-batch-size optimizer steps; --lr-decay-iters 16 keeps the saved decay), or "
        "--no-load-optim to start the optimizer and its schedule afresh"
    )
    # Issue 27 pass 27: a resume with another --global-batch-size (or a longer --num-rollout) was refused naming only
    # "the run's length": the hint names the flags that make it, and the --lr-decay-iters that resumes.
    with pytest.raises(ValueError, match=r"--global-batch-size optimizer steps; --lr-decay-iters 16 keeps"):
        resume(global_batch_size=2)
    assert resume(num_rollout=8, lr_decay_iters=16) == pytest.approx(12 / 16)
    # A scheduler without the flags (not built here) meets a checkpoint with them: compared by --lr, and the error
    # holds no run-length hint (it was added whenever the checkpoint kept a run length, to an --lr-only difference).
    plain = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5),
                                              lambda step: 1.0)  # fmt: skip
    with pytest.raises(ValueError) as e:
        load_scheduler_state(plain, saved)
    assert str(e.value) == (
        "--load: the checkpoint's learning-rate schedule differs from this run's flags (--lr 0.5 here vs 1 saved); a "
        "resumed run continues the checkpoint's schedule: give the saved values, or --no-load-optim to start the "
        "optimizer and its schedule afresh"
    )
    # A checkpoint written before the flags were kept: compared by --lr.
    saved.pop("slime_schedule")
    with pytest.raises(ValueError, match=r"\(--lr 0\.5 here vs 1 saved\)"):
        resume(lr=0.5)
    # A constant schedule does not depend on the run's length: a longer run resumes.
    constant = _run_args(lr_decay_style="constant")
    sched3 = build_lr_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), constant)
    saved = sched3.state_dict()
    assert resume(lr_decay_style="constant", num_rollout=8) == 1.0


def test_a_wsd_resume_goes_on_mid_anneal_and_another_anneal_is_refused():
    # The saved schedule holds the anneal's flags (compared on resume, as the other flags of the schedule are).
    wsd = dict(lr_decay_style="WSD", lr_wsd_decay_iters=8, lr_wsd_decay_style="cosine", min_lr=0.1)
    expected = _rates(_run_args(**wsd), 16)
    assert expected[:9] == [1.0] * 9 and expected[12] == pytest.approx(0.55, abs=1e-12)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_lr_scheduler(opt, _run_args(**wsd))
    for _ in range(11):  # three steps into the anneal
        opt.step()
        sched.step()
    saved = sched.state_dict()

    def resume(**changed):
        args = _run_args(**{**wsd, **changed})
        opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.lr)
        sched2 = build_lr_scheduler(opt2, args)
        load_scheduler_state(sched2, saved)
        seen = []
        for _ in range(5):
            seen.append(opt2.param_groups[0]["lr"])
            opt2.step()
            sched2.step()
        return seen

    assert resume() == pytest.approx(expected[11:16], rel=1e-12)
    with pytest.raises(ValueError) as e:
        resume(lr_wsd_decay_iters=6, lr_wsd_decay_style="linear")
    assert str(e.value) == (
        "--load: the checkpoint's learning-rate schedule differs from this run's flags (--lr-wsd-decay-iters 6 here "
        "vs 8 saved; --lr-wsd-decay-style linear here vs cosine saved); a resumed run continues the checkpoint's "
        "schedule: give the saved values, or --no-load-optim to start the optimizer and its schedule afresh"
    )
    with pytest.raises(ValueError, match=r"\(--lr-decay-style cosine here vs WSD saved; --lr-wsd-decay-iters \(unused"):
        resume(lr_decay_style="cosine")


@pytest.mark.parametrize("critic_warmup", [0, 4])
def test_the_critics_own_warmup_steps_win_over_the_actors_warmup_fraction(critic_warmup):
    # Issue 27, hostile pass 31: the critic kept the actor's --lr-warmup-fraction, which both backends' schedules take
    # first: --critic-lr-warmup-iters 0 still warmed the critic up over half the run, and 4 stopped the critic's ranks
    # with "give only one of --lr-warmup-iters and --lr-warmup-fraction", a flag the user had not given.
    from slime_core.critic import critic_config

    def first_lr(cfg):
        """The rate of the second step (the first step of a warmup runs at --lr-warmup-init, 0, as megatron-core's)."""
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
        scheduler = build_lr_scheduler(optimizer, cfg)
        optimizer.step()
        scheduler.step()
        return optimizer.param_groups[0]["lr"]

    actor = _CONFIG.model_copy(update={
        "advantage_estimator": "ppo", "num_rollout": 16, "lr": 1.0, "lr_warmup_fraction": 0.5, "critic_lr": 2.0,
        "critic_lr_warmup_iters": critic_warmup,
    })  # fmt: skip
    assert first_lr(actor) == pytest.approx(1.0 / 8)  # the actor: warm-up over half of its 16 steps
    assert first_lr(critic_config(actor)) == pytest.approx(2.0 / critic_warmup if critic_warmup else 2.0)
    # Without its own steps the critic follows the actor's fraction.
    assert first_lr(critic_config(actor.model_copy(update={"critic_lr_warmup_iters": None}))) == pytest.approx(2.0 / 8)
