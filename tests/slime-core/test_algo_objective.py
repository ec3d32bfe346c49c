import math

import pytest
import torch
from slime_core_objective_args import ATOL, config
from slime_core_objective_args import args as _args

from slime_core.algorithms import compute_actor_loss, compute_critic_loss, compute_sft_loss


def _batch(seed=0, lengths=(4, 1, 3, 5, 2)):
    g = torch.Generator().manual_seed(seed)
    n = len(lengths)
    lp = [-(torch.rand(m, generator=g) * 3) for m in lengths]
    old = [x + torch.randn(m, generator=g) * 0.4 for x, m in zip(lp, lengths, strict=True)]
    return dict(
        log_probs=[x.clone().requires_grad_(True) for x in lp],
        old_log_probs=old,
        advantages=[torch.full((m,), float(torch.randn(1, generator=g))) for m in lengths],
        loss_masks=[(torch.rand(m, generator=g) > 0.3).float() for m in lengths],
        loss_denominators=[float(m + i) for i, m in enumerate(lengths)],
        ref_log_probs=[x + torch.randn(m, generator=g) * 0.3 for x, m in zip(old, lengths, strict=True)],
        rollout_log_probs=[x + torch.randn(m, generator=g) * 0.5 for x, m in zip(old, lengths, strict=True)],
        entropy=[torch.rand(m, generator=g) * 2 for m in lengths][:n],
    )


def _reference(args, b):
    """Plain-Python per-token loop, float64, of the default-reducer objective."""
    total = dict(
        pg_loss=0.0, pg_clipfrac=0.0, ppo_kl=0.0, entropy_loss=0.0, kl_loss=0.0, tis=0.0, tis_clipfrac=0.0, ois=0.0
    )
    eh = args.eps_clip_high if args.eps_clip_high is not None else args.eps_clip
    for i, mask in enumerate(b["loss_masks"]):
        d = max(b["loss_denominators"][i], 1.0)
        for t in range(mask.shape[0]):
            m = mask[t].item()
            lp, old = b["log_probs"][i][t].item(), b["old_log_probs"][i][t].item()
            ref, roll = b["ref_log_probs"][i][t].item(), b["rollout_log_probs"][i][t].item()
            a = b["advantages"][i][t].item()
            ratio = math.exp(lp - old)
            l1, l2 = -ratio * a, -min(max(ratio, 1 - args.eps_clip), 1 + eh) * a
            pg = max(l1, l2)
            if args.eps_clip_c is not None and a < 0:
                pg = min(pg, -args.eps_clip_c * a)
            raw_w = math.exp(old - roll)
            w = min(max(raw_w, args.tis_clip_low), args.tis_clip)
            kl = min(max(math.exp(ref - lp) - 1 + (lp - ref), -10), 10)
            for key, val in (
                ("pg_loss", pg * w),
                ("pg_clipfrac", float(l2 > l1)),
                ("ppo_kl", old - lp),
                ("entropy_loss", b["entropy"][i][t].item()),
                ("kl_loss", kl),
                ("tis", raw_w),  # the original's `tis`: the raw ratio, not the applied weight
                ("tis_clipfrac", float(w != raw_w)),
                ("ois", ratio),
            ):
                total[key] += val * m / d
    total["loss"] = total["pg_loss"] - args.entropy_coef * total["entropy_loss"] + args.kl_loss_coef * total["kl_loss"]
    return total


def test_matches_plain_python_reference():
    args, b = _args(), _batch()
    loss, metrics = compute_actor_loss(args, **b)
    expected = _reference(args, b)
    for key, val in expected.items():
        assert metrics[key].item() == pytest.approx(val, abs=ATOL), key
    assert loss.item() == pytest.approx(expected["loss"], abs=ATOL)
    assert loss.requires_grad and all(not v.requires_grad and v.dim() == 0 for v in metrics.values())
    assert set(metrics) == set(expected) | {"train_rollout_logprob_abs_diff", "tis_abs"}


def _split(b, k):
    return {key: v[:k] for key, v in b.items()}, {key: v[k:] for key, v in b.items()}


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("estimator", ["grpo", "gspo", "cispo"])
def test_micro_batch_split_invariance(per_token, estimator):
    args = _args(
        advantage_estimator=estimator, calculate_per_token_loss=per_token, eps_clip=1.0 if estimator == "cispo" else 0.2
    )
    b = _batch(seed=3)
    whole_loss, whole_metrics = compute_actor_loss(args, **b)
    (whole_grads) = torch.autograd.grad(whole_loss, b["log_probs"])
    first, second = _split(b, 2)
    l1, m1 = compute_actor_loss(args, **first)
    l2, m2 = compute_actor_loss(args, **second)
    grads = torch.autograd.grad(l1 + l2, b["log_probs"])
    assert (l1 + l2).item() == pytest.approx(whole_loss.item(), abs=ATOL)
    for key in whole_metrics:
        assert (m1[key] + m2[key]).item() == pytest.approx(whole_metrics[key].item(), abs=ATOL), key
    for g_whole, g_split in zip(whole_grads, grads, strict=True):
        torch.testing.assert_close(g_split, g_whole, atol=ATOL, rtol=0)


def test_identical_log_probs_exact():
    b = _batch(seed=5)
    b["old_log_probs"] = [x.detach().clone() for x in b["log_probs"]]
    args = _args(use_tis=False, use_kl_loss=False, entropy_coef=0.0)
    loss, metrics = compute_actor_loss(args, **{k: v for k, v in b.items() if k != "entropy"})
    assert metrics["pg_clipfrac"].item() == 0.0 and metrics["ppo_kl"].item() == 0.0
    expected = sum(
        -(a * m).sum().item() / max(d, 1.0)
        for a, m, d in zip(b["advantages"], b["loss_masks"], b["loss_denominators"], strict=True)
    )
    assert loss.item() == pytest.approx(expected, abs=ATOL)
    assert metrics["entropy_loss"].item() == 0.0
    assert "kl_loss" not in metrics and "tis" not in metrics


def test_per_token_mode_and_all_masked():
    args = _args(use_tis=False, use_kl_loss=False, entropy_coef=0.0, calculate_per_token_loss=True)
    lp = [torch.tensor([-1.0, -2.0], requires_grad=True), torch.tensor([-0.5], requires_grad=True)]
    loss, metrics = compute_actor_loss(
        args,
        log_probs=lp,
        old_log_probs=[x.detach() for x in lp],
        advantages=[torch.tensor([2.0, 2.0]), torch.tensor([-1.0])],
        loss_masks=[torch.tensor([1.0, 1.0]), torch.tensor([0.0])],
        loss_denominators=[100.0, 100.0],  # ignored in per-token mode
    )
    assert loss.item() == pytest.approx(-4.0, abs=ATOL)
    loss.backward()
    assert torch.equal(lp[1].grad, torch.zeros(1))  # masked sample: zero gradient, no NaN
    torch.testing.assert_close(lp[0].grad, torch.tensor([-2.0, -2.0]))


def test_rollout_logprobs_replace_old():
    args = _args(use_tis=False, use_kl_loss=False, entropy_coef=0.0, use_rollout_logprobs=True)
    lp = [torch.tensor([-1.0, -1.0], requires_grad=True)]
    roll = [torch.tensor([-1.0, -1.0 - math.log(2.0)])]  # ratio [1, 2] vs rollout
    loss, metrics = compute_actor_loss(
        args,
        log_probs=lp,
        old_log_probs=[torch.tensor([5.0, 5.0])],  # must be ignored
        advantages=[torch.ones(2)],
        loss_masks=[torch.ones(2)],
        loss_denominators=[2.0],
        rollout_log_probs=roll,
    )
    assert loss.item() == pytest.approx((-1.0 - 1.28) / 2, abs=ATOL)  # eps_clip_high 0.28
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.5, abs=ATOL)
    assert metrics["train_rollout_logprob_abs_diff"].item() == pytest.approx(math.log(2.0) / 2, abs=ATOL)


def test_icepop_and_unbiased_kl():
    args = _args(tis_mode="icepop", use_unbiased_kl=True, kl_loss_type="k2", entropy_coef=0.0, eps_clip_c=None)
    lp = [torch.tensor([-1.0, -1.0])]
    old = [torch.tensor([-1.0, -1.5])]
    roll = [torch.tensor([-1.0 - math.log(3.0), -1.5])]  # TIS weights: 3 (outside → 0), 1
    ref = [torch.tensor([-2.0, -1.0])]
    loss, metrics = compute_actor_loss(
        args,
        log_probs=lp,
        old_log_probs=old,
        advantages=[torch.ones(2)],
        loss_masks=[torch.ones(2)],
        loss_denominators=[2.0],
        ref_log_probs=ref,
        rollout_log_probs=roll,
    )
    # pg: token0 weight 0; token1 ratio e^0.5 → clipped 1.28 → -1.28; kl: [0.5·1, 0·e^0.5] (IS = exp(lp-old))
    assert metrics["pg_loss"].item() == pytest.approx(-1.28 / 2, abs=ATOL)
    assert metrics["tis_clipfrac"].item() == pytest.approx(0.5, abs=ATOL)
    assert metrics["kl_loss"].item() == pytest.approx(0.5 / 2, abs=ATOL)
    assert loss.item() == pytest.approx(-0.64 + 0.1 * 0.25, abs=ATOL)


def test_drgrpo_custom_reducer_path():
    args = _args(
        use_tis=False,
        use_kl_loss=False,
        entropy_coef=0.0,
        rollout_max_response_len=10,
        custom_pg_loss_reducer_function_path="slime_core.algorithms.reducers.drgrpo",
    )
    lp = [torch.tensor([-1.0, -1.0, -1.0])]
    loss, metrics = compute_actor_loss(
        args,
        log_probs=lp,
        old_log_probs=lp,
        advantages=[torch.ones(3)],
        loss_masks=[torch.tensor([1.0, 1.0, 0.0])],
        loss_denominators=[2.0],
    )
    assert metrics["pg_loss"].item() == pytest.approx(-2.0 / 10, abs=ATOL)
    assert metrics["pg_clipfrac"].item() == 0.0  # metrics keep the default reducer
    with pytest.raises(ImportError, match="custom-pg-loss-reducer"):
        compute_actor_loss(
            _args(
                use_tis=False,
                use_kl_loss=False,
                entropy_coef=0.0,
                custom_pg_loss_reducer_function_path="no_such_module.fn",
            ),
            log_probs=lp,
            old_log_probs=lp,
            advantages=[torch.ones(3)],
            loss_masks=[torch.ones(3)],
            loss_denominators=[3.0],
        )


def test_opsm_drops_negative_advantage_tokens_of_drifted_sequences():
    args = _args(use_tis=False, use_kl_loss=False, entropy_coef=0.0, eps_clip_c=None, use_opsm=True, opsm_delta=0.1)
    old = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0]), torch.tensor([-1.0])]
    # seq 0: mean(old - lp) = 0.5 > δ with A<0 → dropped; seq 1: drifted but A>0 → kept; seq 2: not drifted → kept
    lp = [torch.tensor([-1.5, -1.5]), torch.tensor([-1.5, -1.5]), torch.tensor([-1.0])]
    adv = [torch.full((2,), -1.0), torch.full((2,), 1.0), torch.tensor([-1.0])]
    loss, metrics = compute_actor_loss(
        args,
        log_probs=lp,
        old_log_probs=old,
        advantages=adv,
        loss_masks=[torch.ones(2), torch.ones(2), torch.ones(1)],
        loss_denominators=[2.0, 2.0, 1.0],
    )
    r = math.exp(-0.5)  # seq 1 ratio; A>0 so max(-r·A, -clip(r, 0.8, 1.28)·A) = -r (unclipped)
    assert metrics["opsm_clipfrac"].item() == pytest.approx(1.0, abs=ATOL)
    assert loss.item() == pytest.approx(0.0 + (-r) + 1.0, abs=ATOL)


def test_builtin_tis_by_path_equals_tis_mode():
    b = _batch(seed=4)
    by_mode = compute_actor_loss(_args(tis_mode="icepop", tis_clip_low=0.8, tis_clip=1.2), **b)
    by_path = compute_actor_loss(
        _args(
            tis_mode="truncate",
            custom_tis_function_path="slime_core.algorithms.tis.icepop_function",
            tis_clip_low=0.8,
            tis_clip=1.2,
        ),
        **b,
    )
    assert by_mode[0].item() == pytest.approx(by_path[0].item(), abs=ATOL)
    assert by_mode[1]["tis_clipfrac"].item() > 0  # the range is tight enough to zero some weights
    with pytest.raises(ValueError, match="tis-mode"):
        compute_actor_loss(_args(tis_mode="bogus"), **b)


def test_empty_micro_batch():
    args = _args()
    empty = dict(
        log_probs=[],
        old_log_probs=[],
        advantages=[],
        loss_masks=[],
        loss_denominators=[],
        ref_log_probs=[],
        rollout_log_probs=[],
        entropy=[],
    )
    loss, metrics = compute_actor_loss(args, **empty)
    assert loss.item() == 0.0 and all(v.item() == 0.0 for v in metrics.values())


def test_option_errors():
    b = _batch()
    with pytest.raises(ValueError, match="mutually exclusive"):
        compute_actor_loss(_args(use_rollout_logprobs=True), **b)
    with pytest.raises(ValueError, match="use-kl-loss"):
        compute_actor_loss(_args(), **{**b, "ref_log_probs": None})
    with pytest.raises(ValueError, match="use-tis"):
        compute_actor_loss(_args(), **{**b, "rollout_log_probs": None})
    with pytest.raises(ValueError, match="entropy"):
        compute_actor_loss(_args(), **{**b, "entropy": None})
    bad = {**b, "advantages": [torch.ones(7)] + b["advantages"][1:]}
    with pytest.raises(ValueError, match=r"advantages\[0\]"):
        compute_actor_loss(_args(), **bad)


def test_critic_loss_by_hand():
    args = config().model_copy(update=dict(value_clip=0.2, calculate_per_token_loss=False))
    values = [torch.tensor([1.5, 0.1, 2.0], requires_grad=True)]
    loss, metrics = compute_critic_loss(
        args,
        values=values,
        old_values=[torch.tensor([1.0, 0.0, 0.0])],
        returns=[torch.tensor([2.0, 0.0, 5.0])],
        loss_masks=[torch.tensor([1.0, 1.0, 0.0])],
        loss_denominators=[2.0],
    )
    # token0: Vclip = 1.2 → max(0.64, 0.25) = 0.64; token1: unclipped → 0.01; token2 masked
    assert loss.item() == pytest.approx((0.64 + 0.01) / 2, abs=ATOL)
    assert metrics["value_clipfrac"].item() == pytest.approx(0.5, abs=ATOL)
    loss.backward()
    # token0's active branch is the clipped one (constant in V) → grad 0; token1: 2(V-R)/2 = 0.1
    torch.testing.assert_close(values[0].grad, torch.tensor([0.0, 0.1, 0.0]), atol=ATOL, rtol=0)


def test_sft_loss():
    lp = [torch.tensor([-1.0, -3.0]), torch.tensor([-2.0])]
    loss, metrics = compute_sft_loss(
        config().model_copy(update=dict(calculate_per_token_loss=False)),
        log_probs=lp,
        loss_masks=[torch.tensor([1.0, 0.0]), torch.ones(1)],
        loss_denominators=[1.0, 1.0],
    )
    assert loss.item() == pytest.approx(3.0, abs=ATOL) and metrics["loss"].item() == pytest.approx(3.0, abs=ATOL)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    args, b = _args(advantage_estimator="gspo"), _batch(seed=9)
    cpu_loss, cpu_metrics = compute_actor_loss(args, **b)
    cuda_b = {
        k: [x.detach().cuda().requires_grad_(k == "log_probs") for x in v]
        for k, v in b.items()
        if k != "loss_denominators"
    }
    cuda_loss, cuda_metrics = compute_actor_loss(args, loss_denominators=b["loss_denominators"], **cuda_b)
    assert cuda_loss.item() == pytest.approx(cpu_loss.item(), abs=1e-4)
    for key, val in cpu_metrics.items():
        assert cuda_metrics[key].item() == pytest.approx(val.item(), abs=1e-4), key


def test_tis_metric_is_the_raw_ratio_also_when_clamped_or_zeroed():
    # Ratios exp(old - roll) = [3, 0.5]; truncate clamps 3 → 2, icepop in [0.8, 2] zeroes both.
    lp = [torch.tensor([-1.0, -1.0])]
    roll = [torch.tensor([-1.0 - math.log(3.0), -1.0 + math.log(2.0)])]
    common = dict(
        log_probs=lp,
        old_log_probs=lp,
        advantages=[torch.ones(2)],
        loss_masks=[torch.ones(2)],
        loss_denominators=[2.0],
        rollout_log_probs=roll,
    )
    for mode, low, clipfrac in (("truncate", 0.0, 0.5), ("icepop", 0.8, 1.0)):
        args = _args(use_kl_loss=False, entropy_coef=0.0, tis_mode=mode, tis_clip_low=low, tis_clip=2.0)
        _, metrics = compute_actor_loss(args, **common)
        assert metrics["tis"].item() == pytest.approx((3.0 + 0.5) / 2, abs=ATOL), mode
        assert metrics["tis_abs"].item() == pytest.approx((2.0 + 0.5) / 2, abs=ATOL), mode
        assert metrics["tis_clipfrac"].item() == pytest.approx(clipfrac, abs=ATOL), mode


@pytest.mark.parametrize("per_token", [False, True])
def test_opsm_clipfrac_counts_each_sample_over_its_own_tokens(per_token):
    # Two siblings of one rollout share the denominator 5 (2 + 3 trainable tokens); sample 0 is dropped
    # (A < 0, mean old - lp = 0.5 > δ), sample 1 is not. Sample 0 has a masked (tool) token that must not count:
    # Σ_i (dropped trainable)_i / own mask sum_i = 2/2 + 0 = 1 (one sequence); ours before: 2/5 (rollout
    # denominator). The original's code counts the masked token too: 3/2 (test_opsm_clipfrac_vs_original).
    args = _args(
        use_tis=False,
        use_kl_loss=False,
        entropy_coef=0.0,
        eps_clip_c=None,
        use_opsm=True,
        opsm_delta=0.1,
        calculate_per_token_loss=per_token,
    )
    lp = [torch.tensor([-1.5, -1.5, -1.5]), torch.tensor([-1.0, -1.0, -1.0])]
    old = [torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([-1.0, -1.0, -1.0])]
    _, metrics = compute_actor_loss(
        args,
        log_probs=lp,
        old_log_probs=old,
        advantages=[torch.full((3,), -1.0), torch.full((3,), -1.0)],
        loss_masks=[torch.tensor([1.0, 0.0, 1.0]), torch.ones(3)],
        loss_denominators=[5.0, 5.0],
    )
    # Per-token mode: every metric is a token sum (divided by the step's token count later): 2 dropped tokens.
    assert metrics["opsm_clipfrac"].item() == pytest.approx(2.0 if per_token else 1.0, abs=ATOL)


def _original_opsm_clipfrac(lp, old, adv, masks, delta):
    # The original's formula, written out (slime/utils/ppo_utils.py: compute_opsm_mask at 624b824a8).
    total = 0.0
    for lp_i, old_i, adv_i, m_i in zip(lp, old, adv, masks, strict=True):
        seq_kl = ((old_i - lp_i) * m_i).sum() / m_i.sum().clamp(min=1)
        total += float(((adv_i < 0) & (seq_kl > delta)).float().sum() / m_i.sum().clamp(min=1))
    return total


@pytest.mark.parametrize(
    ("masks", "ours", "original"),
    [
        # Every token trainable: both count the dropped sequence once.
        ([torch.ones(2)], 1.0, 1.0),
        # Mask [1, 0], both tokens dropped (issue 27): we count the trainable share (1.0); the original also counts
        # the masked token (2.0), which is not a fraction.
        ([torch.tensor([1.0, 0.0])], 1.0, 2.0),
        ([torch.tensor([1.0, 0.0]), torch.ones(2)], 2.0, 3.0),
    ],
)
def test_opsm_clipfrac_vs_original(masks, ours, original):
    args = _args(use_tis=False, use_kl_loss=False, entropy_coef=0.0, eps_clip_c=None, use_opsm=True, opsm_delta=0.1)
    n = len(masks)
    lp, old = [torch.tensor([-1.5, -1.5])] * n, [torch.tensor([-1.0, -1.0])] * n  # mean old - lp = 0.5 > δ
    adv = [torch.full((2,), -1.0)] * n
    _, metrics = compute_actor_loss(
        args, log_probs=lp, old_log_probs=old, advantages=adv, loss_masks=masks, loss_denominators=[2.0] * n
    )
    assert metrics["opsm_clipfrac"].item() == pytest.approx(ours, abs=ATOL)
    assert _original_opsm_clipfrac(lp, old, adv, masks, 0.1) == pytest.approx(original, abs=ATOL)


def test_opsm_clipfrac_with_per_token_advantages_counts_the_share_of_a_sample_dropped():
    # PPO/GAE: per-token advantages. Sample 0 drifted (mean old - lp = 0.5 > δ) and has A < 0 on 2 of its 4
    # tokens: only those are dropped, so it counts 2/4 = 0.5, not 1 (not "a dropped sequence"). Sample 1 did not
    # drift (mean 0 ≤ δ): nothing dropped whatever its advantages. Sum 0.5 + 0 = 0.5 (per-sample mode); per-token
    # mode sums the 2 dropped trainable tokens.
    lp = [torch.full((4,), -1.5), torch.full((4,), -1.0)]
    old = [torch.full((4,), -1.0), torch.full((4,), -1.0)]
    adv = [torch.tensor([-1.0, 1.0, -1.0, 1.0]), torch.tensor([-1.0, -1.0, -1.0, -1.0])]
    for per_token, expected in ((False, 0.5), (True, 2.0)):
        args = _args(
            use_tis=False,
            use_kl_loss=False,
            entropy_coef=0.0,
            eps_clip_c=None,
            use_opsm=True,
            opsm_delta=0.1,
            calculate_per_token_loss=per_token,
        )
        _, metrics = compute_actor_loss(
            args,
            log_probs=lp,
            old_log_probs=old,
            advantages=adv,
            loss_masks=[torch.ones(4), torch.ones(4)],
            loss_denominators=[8.0, 8.0],
        )
        assert metrics["opsm_clipfrac"].item() == pytest.approx(expected, abs=ATOL), per_token
