import math

import pytest
import torch

from slime_core.algorithms import (
    compute_cispo_loss,
    compute_policy_loss,
    compute_tis_weights,
    get_policy_loss,
    sequence_mean_ppo_kl,
)
from slime_core.config import SlimeArgs

# Tolerance: fp32 elementwise vs hand values, atol 1e-6.
ATOL = 1e-6


# A real, validated run config; tests set fields with model_copy (no re-validation, so invalid combinations
# reach the functions' own checks).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _kl_for_ratio(ratios):
    return -torch.log(torch.tensor(ratios))  # ppo_kl = lp_old - lp = -log ρ


def test_ppo_clip_symmetric_by_hand():
    ppo_kl = _kl_for_ratio([1.5, 0.5, 1.1, 1.5, 0.5])
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0])
    loss, clipfrac = compute_policy_loss(ppo_kl, adv, 0.2, 0.2)
    torch.testing.assert_close(loss, torch.tensor([-1.2, -0.5, -1.1, 1.5, 0.8]), atol=ATOL, rtol=0)
    assert clipfrac.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_ppo_clip_asymmetric():
    ppo_kl = _kl_for_ratio([1.25, 1.25, 0.75])
    adv = torch.tensor([1.0, -1.0, -1.0])
    loss, clipfrac = compute_policy_loss(ppo_kl, adv, 0.2, 0.28)
    # ρ=1.25 < 1.28 unclipped for A>0; A<0: max(1.25, 1.25)=1.25; ρ=0.75 < 0.8 with A<0: max(0.75, 0.8)=0.8 clipped
    torch.testing.assert_close(loss, torch.tensor([-1.25, 1.25, 0.8]), atol=ATOL, rtol=0)
    assert clipfrac.tolist() == [0.0, 0.0, 1.0]
    sym, sym_clip = compute_policy_loss(ppo_kl[:1], adv[:1], 0.2, 0.2)
    assert sym.item() == pytest.approx(-1.2, abs=ATOL) and sym_clip.item() == 1.0


def test_dual_clip_caps_negative_advantage_loss_only():
    ppo_kl = _kl_for_ratio([5.0, 2.0, 5.0])
    adv = torch.tensor([-1.0, -1.0, 1.0])
    loss, clipfrac = compute_policy_loss(ppo_kl, adv, 0.2, 0.2, eps_clip_c=3.0)
    torch.testing.assert_close(loss, torch.tensor([3.0, 2.0, -1.2]), atol=1e-5, rtol=0)
    assert clipfrac.tolist() == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="eps-clip-c"):
        compute_policy_loss(ppo_kl, adv, 0.2, 0.2, eps_clip_c=1.0)


def test_ppo_gradients_zero_when_clipped():
    old = torch.zeros(4)
    lp = torch.log(torch.tensor([1.5, 0.9, 5.0, 2.0])).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, _ = compute_policy_loss(old - lp, adv, 0.2, 0.2, eps_clip_c=3.0)
    loss.sum().backward()
    # d(-ρA)/dlp = -ρA on active unclipped branches; clipped (token 0) and dual-clipped (token 2) → 0
    torch.testing.assert_close(lp.grad, torch.tensor([0.0, -0.9, 0.0, 2.0]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("log_ratio", [20.0, -20.0, 100.0, -100.0])
def test_extreme_log_ratio_is_finite(log_ratio):
    lp = torch.full((2,), log_ratio, requires_grad=True)
    old = torch.zeros(2)
    adv = torch.tensor([1.0, -1.0])
    for fn in (
        lambda: compute_policy_loss(old - lp, adv, 0.2, 0.28),
        lambda: compute_cispo_loss(old - lp, lp, adv, 1, 4),
    ):
        loss, clipfrac = fn()
        (g,) = torch.autograd.grad(loss.sum(), lp)
        assert torch.isfinite(loss).all() and torch.isfinite(g).all() and torch.isfinite(clipfrac).all()
    w, _ = compute_tis_weights(lp.detach(), old, 0.0, 2.0)
    assert torch.isfinite(w).all()


def test_identical_log_probs_ratio_one():
    lp = torch.tensor([-0.3, -2.0, -7.0])
    adv = torch.tensor([0.5, -1.0, 2.0])
    loss, clipfrac = compute_policy_loss(lp - lp, adv, 0.2, 0.2, eps_clip_c=3.0)
    assert torch.equal(loss, -adv) and torch.equal(clipfrac, torch.zeros(3))


def test_cispo_by_hand_and_gradient_only_through_log_probs():
    old = torch.tensor([-1.0, -1.0, -1.0])
    lp = torch.tensor([-1.0 + math.log(6.0), -1.0 + math.log(0.5), -1.0]).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0, 0.5])
    loss, clipfrac = compute_cispo_loss(old - lp, lp, adv, eps_clip=0.2, eps_clip_high=4.0)
    # weights: clip(6, 0.8, 5)=5, clip(0.5)=0.8, 1 → L = -w·A·lp
    w = torch.tensor([5.0, 0.8, 1.0])
    torch.testing.assert_close(loss, -w * adv * lp.detach(), atol=1e-5, rtol=0)
    assert clipfrac.tolist() == [1.0, 1.0, 0.0]
    loss.sum().backward()
    # gradient is exactly -w·A: the weight (which depends on lp) is stop-gradient
    torch.testing.assert_close(lp.grad, -w * adv, atol=1e-5, rtol=0)


def test_gspo_sequence_ratio():
    # two sequences: [a, b, (masked) c] and [d]; masked token excluded from the mean
    ppo_kl = torch.tensor([0.1, 0.3, 5.0, -0.4])
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    seq = sequence_mean_ppo_kl(ppo_kl, mask, [3, 1])
    torch.testing.assert_close(seq, torch.tensor([0.2, 0.2, 0.2, -0.4]), atol=ATOL, rtol=0)
    # all-masked and empty sequences → 0, not NaN
    seq2 = sequence_mean_ppo_kl(torch.tensor([1.0, 2.0]), torch.zeros(2), [2, 0])
    assert torch.equal(seq2, torch.zeros(2))


def test_gspo_registered_loss_and_gradient():
    args = _CONFIG.model_copy(update=dict(eps_clip=0.2, eps_clip_high=None, eps_clip_c=None))
    old = torch.tensor([-1.0, -1.0, -2.0])
    lp = torch.tensor([-0.9, -1.1, -2.0], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0])
    mask = torch.tensor([1.0, 1.0, 1.0])
    loss, clipfrac, ppo_kl = get_policy_loss("gspo")(
        args, log_probs=lp, old_log_probs=old, advantages=adv, loss_mask=mask, response_lengths=[2, 1]
    )
    # seq 0 mean log-ratio = 0 → ρ = 1 for both tokens even though per-token ratios differ
    torch.testing.assert_close(ppo_kl.detach(), torch.tensor([0.0, 0.0, 0.0]), atol=ATOL, rtol=0)
    torch.testing.assert_close(loss.detach(), torch.tensor([-1.0, -1.0, 1.0]), atol=ATOL, rtol=0)
    assert clipfrac.tolist() == [0.0, 0.0, 0.0]
    loss.sum().backward()
    # d/dlp_t of -exp(mean(lp - old))·A summed over the 2 tokens of seq 0: each token gets 2·(-1/2) = -1
    torch.testing.assert_close(lp.grad, torch.tensor([-1.0, -1.0, 1.0]), atol=ATOL, rtol=0)


def test_tis_truncate_and_icepop():
    roll = torch.zeros(4)
    old = torch.log(torch.tensor([0.5, 1.5, 3.0, 1e-3]))
    w, cf = compute_tis_weights(old, roll, 0.1, 2.0, "truncate")
    torch.testing.assert_close(w, torch.tensor([0.5, 1.5, 2.0, 0.1]), atol=1e-6, rtol=1e-6)
    assert cf.tolist() == [0.0, 0.0, 1.0, 1.0]
    w, cf = compute_tis_weights(old, roll, 0.1, 2.0, "icepop")
    torch.testing.assert_close(w, torch.tensor([0.5, 1.5, 0.0, 0.0]), atol=1e-6, rtol=1e-6)
    assert cf.tolist() == [0.0, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="tis-mode"):
        compute_tis_weights(old, roll, 0.0, 2.0, "bogus")


@pytest.mark.parametrize("bad", [float("-inf"), float("inf"), float("nan")])
def test_gspo_and_opsm_ignore_a_non_finite_log_prob_on_a_masked_token(bad):
    # Issue 27 (pass 53): `ppo_kl·mask` made inf·0 = NaN at a masked (tool) token, so the sequence's mean
    # log-ratio, its GSPO loss, every gradient of the step and the OPSM mask were NaN (the original's
    # compute_gspo_kl does the same). A masked token must add 0, as in the loss reducers.
    from slime_core.algorithms.policy_loss import compute_opsm_mask

    args = _CONFIG.model_copy(update=dict(eps_clip=0.2, eps_clip_high=None, eps_clip_c=None))
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0])
    adv = torch.tensor([-1.0, -1.0, -1.0, 2.0])

    def run(old_masked):
        old = torch.tensor([-1.0, old_masked, -2.0, -0.5])
        lp = torch.tensor([-0.9, -3.0, -2.3, -0.5], requires_grad=True)
        loss, _, ppo_kl = get_policy_loss("gspo")(
            args, log_probs=lp, old_log_probs=old, advantages=adv, loss_mask=mask, response_lengths=[3, 1]
        )
        (loss * mask).sum().backward()
        dropped = compute_opsm_mask(old - lp.detach(), adv, mask, [3, 1], 0.05)
        return ppo_kl.detach(), lp.grad, dropped

    ppo_kl, grad, dropped = run(bad)
    # seq 0: mean of (lp_old - lp) over its 2 trainable tokens = ((-1 + 0.9) + (-2 + 2.3)) / 2 = 0.1
    torch.testing.assert_close(ppo_kl, torch.tensor([0.1, 0.1, 0.1, 0.0]), atol=ATOL, rtol=0)
    clean_kl, clean_grad, clean_dropped = run(-1.0)
    torch.testing.assert_close(ppo_kl, clean_kl, atol=0, rtol=0)
    torch.testing.assert_close(grad, clean_grad, atol=0, rtol=0)
    assert torch.isfinite(grad).all()
    # seq 0 drifted (0.1 > 0.05) with A < 0: all 3 tokens dropped; seq 1 has A > 0
    assert dropped.tolist() == clean_dropped.tolist() == [1.0, 1.0, 1.0, 0.0]
