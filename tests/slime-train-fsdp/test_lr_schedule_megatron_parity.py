"""The FSDP trainer's learning rate and weight decay, step by step, against megatron-core's `OptimizerParamScheduler`.

The reference is built as the original's Megatron backend builds it (`slime/backends/megatron_utils/model.py`
`get_optimizer_param_scheduler`: steps in samples, `lr_decay_iters × global_batch_size`, a warmup of
`lr_warmup_fraction × lr_decay_steps` unrounded, stepped by `global_batch_size` after each optimizer step) and
compared with what the AdamW of `build_optimizer` holds before each `clip_and_step`, on a tiny model (the trainer's
own optimizer and schedule; FSDP2 sharding does not touch either).
"""

import itertools

import pytest
import torch
from torch import nn

from slime_core.config import SlimeArgs
from slime_train_fsdp.trainer_parts import build_optimizer, clip_and_step

scheduler_module = pytest.importorskip("megatron.core.optimizer_param_scheduler")

_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})
_STEPS = 50
_GBS = 4  # samples per optimizer step


def _megatron_rates(flags: dict, train_iters: int) -> list[tuple[float, float]]:
    """`(lr, weight decay)` of the decayed group at each of `_STEPS` steps, from megatron-core."""
    decay_iters = flags.get("lr_decay_iters") or train_iters
    decay_steps = decay_iters * _GBS
    if flags.get("lr_warmup_fraction") is not None:
        warmup_steps = flags["lr_warmup_fraction"] * decay_steps
    else:
        warmup_steps = flags.get("lr_warmup_iters", 0) * _GBS
    # Megatron-LM's (and the original's): the anneal in samples when --lr-wsd-decay-iters is given, the style always.
    wsd_iters = flags.get("lr_wsd_decay_iters")
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    wd = flags.get("weight_decay", 0.0)
    scheduler = scheduler_module.OptimizerParamScheduler(
        optimizer, init_lr=flags.get("lr_warmup_init", 0.0), max_lr=flags["lr"], min_lr=flags.get("min_lr", 0.0),
        lr_warmup_steps=warmup_steps, lr_decay_steps=decay_steps,
        lr_decay_style=flags.get("lr_decay_style", "constant"),
        start_wd=wd, end_wd=wd, wd_incr_steps=train_iters * _GBS, wd_incr_style="constant",
        wsd_decay_steps=None if wsd_iters is None else wsd_iters * _GBS,
        lr_wsd_decay_style=flags.get("lr_wsd_decay_style", "exponential"),
    )  # fmt: skip
    out = []
    for _ in range(_STEPS):
        group = optimizer.param_groups[0]
        out.append((group["lr"], group["weight_decay"]))
        scheduler.step(increment=_GBS)
    return out


def _cfg(flags: dict, num_rollout: int):
    """The run's config: one prompt per sample, `_GBS` samples a step, `flags` on top."""
    update = {"num_rollout": num_rollout, "rollout_batch_size": _GBS, "n_samples_per_prompt": 1,
              "global_batch_size": _GBS, "lr_decay_iters": None, "lr_warmup_fraction": None, **flags}  # fmt: skip
    return _CONFIG.model_copy(update=update)


def _ours(flags: dict, num_rollout: int) -> list[tuple[float, float]]:
    """`(lr, weight decay)` of the FSDP trainer's decayed group before each of `_STEPS` optimizer steps."""
    cfg = _cfg(flags, num_rollout)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    optimizer, scheduler = build_optimizer(model, cfg, torch.device("cpu"))
    out = []
    for _ in range(_STEPS):
        group = optimizer.param_groups[0]
        out.append((group["lr"], group["weight_decay"]))
        model(torch.ones(2, 3)).square().sum().backward()
        clip_and_step(model, optimizer, scheduler, 1.0)
        optimizer.zero_grad()
    return out


_SCHEDULES = [
    dict(lr_decay_style=style, **extra)
    for style, extra in itertools.product(
        ["constant", "linear", "cosine"],
        [
            {},
            dict(lr_warmup_iters=5),
            dict(lr_warmup_iters=5, lr_warmup_init=1e-7),
            dict(lr_warmup_fraction=0.1),  # 3.0 of 30 steps
            dict(lr_warmup_fraction=0.25),  # 7.5 of 30 steps: fractional
            dict(lr_decay_iters=20),
            dict(lr_decay_iters=20, lr_warmup_iters=3, min_lr=1e-7),
            dict(lr_decay_iters=17, lr_warmup_fraction=0.3, min_lr=2e-7),  # 5.1 warmup steps
            dict(lr_decay_iters=40, min_lr=5e-7),  # decay beyond the run
            dict(min_lr=1e-7, weight_decay=0.1),
            dict(lr_warmup_iters=1),
        ],
    )
]
_SCHEDULES += [  # megatron-core's inverse-square-root: with a warmup, its rate does not hang on the batch size
    dict(lr_decay_style="inverse-square-root", **extra)
    for extra in [
        dict(lr_warmup_iters=5),
        dict(lr_warmup_iters=5, lr_warmup_init=1e-7, min_lr=2e-7),  # reaches --min-lr at step 125: never here
        dict(lr_warmup_iters=2, min_lr=4e-7),  # reaches --min-lr at step 12.5
        dict(lr_warmup_fraction=0.25),
        dict(lr_decay_iters=20, lr_warmup_iters=3, min_lr=1e-7),  # --min-lr after step 20
        dict(lr_warmup_iters=1, weight_decay=0.01),
    ]
]


_SCHEDULES += [  # WSD (warmup-stable-decay): every anneal style megatron-core has, in every warmup and decay form
    dict(lr_decay_style="WSD", lr_wsd_decay_style=style, **extra)
    for style, extra in itertools.product(
        ["exponential", "linear", "cosine", "minus_sqrt"],
        [
            dict(lr_wsd_decay_iters=10),  # no warmup: --lr for 20 steps, the anneal over the run's last 10
            dict(lr_wsd_decay_iters=10, min_lr=1e-7),
            dict(lr_wsd_decay_iters=6, lr_warmup_iters=5, lr_warmup_init=1e-7, min_lr=2e-7),
            dict(lr_wsd_decay_iters=12, lr_warmup_fraction=0.25),  # 7.5 warmup steps of the run's 30
            dict(lr_wsd_decay_iters=7, lr_decay_iters=20, lr_warmup_iters=3, min_lr=1e-7),  # --min-lr after step 20
            dict(lr_wsd_decay_iters=5, lr_decay_iters=17, lr_warmup_fraction=0.3),  # 5.1 warmup steps
            dict(lr_wsd_decay_iters=25, lr_decay_iters=40, min_lr=5e-7),  # the anneal runs past the 50 steps
            dict(lr_wsd_decay_iters=30, lr_warmup_iters=8),  # the anneal starts inside the warmup
            dict(lr_wsd_decay_iters=40, min_lr=1e-7),  # longer than the decay: starts a quarter of the way in
            dict(lr_wsd_decay_iters=1, weight_decay=0.1),
        ],
    )
]


@pytest.mark.parametrize("flags", _SCHEDULES, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_lr_and_weight_decay_match_megatron_core(flags):
    # Before: step 0 of a warmup ran at lr / warmup (megatron-core: --lr-warmup-init), every warmup step one step
    # ahead, and --lr-warmup-fraction rounded the warmup down (7.5 -> 7 steps), which moved the whole decay.
    flags = dict(lr=1e-6, **flags)
    num_rollout = 30  # 30 optimizer steps in the run (the decay length when --lr-decay-iters is unset); 50 stepped
    expected = _megatron_rates(flags, train_iters=num_rollout)
    got = _ours(flags, num_rollout)
    for step, ((lr, wd), (ref_lr, ref_wd)) in enumerate(zip(got, expected, strict=True)):
        assert lr == pytest.approx(ref_lr, rel=1e-12, abs=1e-20), f"step {step}: lr {lr} vs megatron-core {ref_lr}"
        assert wd == ref_wd, f"step {step}"


def test_inverse_square_root_without_warmup_counts_optimizer_steps():
    # megatron-core clamps the warmup to 1 of its steps, which the original counts in samples: lr / sqrt(k x gbs).
    # Both backends here count optimizer steps: lr / sqrt(k) (MIGRATION.md).
    flags = {"lr": 1.0, "min_lr": 0.0, "lr_decay_style": "inverse-square-root"}
    got = [lr for lr, _ in _ours(flags, 30)[:5]]
    assert got == pytest.approx([1.0, 1.0, 2**-0.5, 3**-0.5, 0.5], rel=1e-12)
    assert _ours(flags, 30)[31][0] == 0.0  # after the decay steps (the run's 30): --min-lr


def test_warmup_longer_than_decay_is_megatron_cores_rate_where_it_has_one():
    # megatron-core asserts warmup < decay; ours warms up to --lr at step `warmup`, then holds --min-lr (the Megatron
    # backend here clamps the decay to warmup + 1, which gives the same rates).
    flags = dict(lr=1.0, min_lr=0.1, lr_decay_style="linear", lr_warmup_iters=4, lr_decay_iters=2)
    got = [lr for lr, _ in _ours(flags, 30)[:7]]
    assert got == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 0.1, 0.1], abs=1e-12)
    with pytest.raises(AssertionError):
        _megatron_rates(flags, 30)


def test_weight_decay_skips_biases_and_norms_as_megatron_core():
    # Before: AdamW decayed every parameter, the LayerNorm's weight and both biases too; megatron-core's default
    # parameter groups leave biases and 1-D parameters undecayed (embeddings are decayed).
    model = nn.ModuleDict(dict(embed=nn.Embedding(5, 3), proj=nn.Linear(3, 3), norm=nn.LayerNorm(3)))
    cfg = _CONFIG.model_copy(update=dict(weight_decay=0.1, lr=1.0))
    optimizer, _ = build_optimizer(model, cfg, torch.device("cpu"))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [(g["weight_decay"], sorted(names[id(p)] for p in g["params"])) for g in optimizer.param_groups]
    assert groups == [(0.1, ["embed.weight", "proj.weight"]), (0.0, ["norm.bias", "norm.weight", "proj.bias"])]
    # And the step does what the groups say: with a zero gradient, only decayed weights shrink (by lr × wd).
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for n, p in model.named_parameters():
        factor = 0.9 if n in ("embed.weight", "proj.weight") else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, rtol=0, atol=1e-7, msg=n)


@pytest.mark.parametrize(
    "flags",
    [
        {"lr": 1e-6, "min_lr": 1e-7, "lr_decay_style": "cosine", "lr_warmup_iters": 5, "weight_decay": 0.1},
        # WSD saved mid-anneal (the anneal is steps 5-12; saved after step 6, resumed over steps 7-11).
        {"lr": 1e-6, "min_lr": 1e-7, "lr_decay_style": "WSD", "lr_wsd_decay_iters": 8, "lr_decay_iters": 12,
         "lr_wsd_decay_style": "minus_sqrt", "lr_warmup_iters": 2, "weight_decay": 0.1},
    ],
    ids=["cosine", "wsd"],
)  # fmt: skip
def test_a_resume_from_load_continues_the_schedule_and_the_weight_decay_groups(tmp_path, flags):
    # The trainer's own optimizer (two groups) through save_checkpoint / load_checkpoint: a resume after 7 steps goes
    # on at megatron-core's rate of step 7, not from the warmup's start, with the groups' weight decay kept.
    import torch.distributed as dist

    from slime_train_fsdp.checkpoint import load_checkpoint, save_checkpoint

    cfg = _cfg(flags, 30)
    expected = [lr for lr, _ in _megatron_rates(flags, train_iters=30)]

    def parts():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
        return (model, *build_optimizer(model, cfg, torch.device("cpu")))

    def train(model, optimizer, scheduler, steps):
        seen = []
        for _ in range(steps):
            seen.append([group["lr"] for group in optimizer.param_groups])
            model(torch.ones(2, 3)).square().sum().backward()
            clip_and_step(model, optimizer, scheduler, 1.0)
            optimizer.zero_grad()
        return seen

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model, optimizer, scheduler = parts()
        train(model, optimizer, scheduler, 7)
        save_checkpoint(tmp_path / "save", rollout_id=6, global_step=7, model=model, optimizer=optimizer,
                        scheduler=scheduler, save_optim=True)  # fmt: skip
        model, optimizer, scheduler = parts()
        load_checkpoint(tmp_path / "save", model=model, optimizer=optimizer, scheduler=scheduler)
        assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]
        resumed = train(model, optimizer, scheduler, 5)
    finally:
        dist.destroy_process_group()
    for step, rates in enumerate(resumed, start=7):
        assert rates == pytest.approx([expected[step]] * 2, rel=1e-12), f"step {step}"


def test_a_checkpoint_of_the_one_group_optimizer_is_refused_naming_no_load_optim(tmp_path):
    # A checkpoint saved before the weight-decay groups (one AdamW group) was called "damaged after it was written"
    # (DCP: missing key optim.param_groups.1.weight_decay); it is intact, only its optimizer has one group.
    import torch.distributed as dist

    from slime_train_fsdp.checkpoint import load_checkpoint, save_checkpoint
    from slime_train_fsdp.lr_schedule import build_lr_scheduler

    cfg = _CONFIG.model_copy(update={"weight_decay": 0.1})

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        old = model()
        betas = (cfg.adam_beta1, cfg.adam_beta2)
        optimizer = torch.optim.AdamW(old.parameters(), lr=cfg.lr, weight_decay=0.1, betas=betas, eps=cfg.adam_eps)
        scheduler = build_lr_scheduler(optimizer, cfg)
        old(torch.ones(2, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
        root = tmp_path / "save"
        save_checkpoint(root, rollout_id=0, global_step=1, model=old, optimizer=optimizer, scheduler=scheduler)
        new = model()
        optimizer, scheduler = build_optimizer(new, cfg, torch.device("cpu"))
        with pytest.raises(ValueError) as e:
            load_checkpoint(root, model=new, optimizer=optimizer, scheduler=scheduler)
        assert str(e.value) == (
            f"--load {root}: iter_0000001: the checkpoint's optimizer has 1 parameter group(s), this run's 2 "
            "(--weight-decay skips biases and norms, as megatron-core, since issue 27 pass 86; a checkpoint saved "
            "before decayed every parameter): resume it with --no-load-optim to start the optimizer and its schedule "
            "afresh"
        )
        load_checkpoint(root, model=new, optimizer=optimizer, scheduler=scheduler, load_optim=False)
        torch.testing.assert_close(new[0].weight, old[0].weight, rtol=0, atol=0)
    finally:
        dist.destroy_process_group()
