"""`slime.utils.ppo_utils`: the original's RL tensor functions, checked against reference vectors.

Every expected value below was computed once by running the original's function (THUDM/slime 624b824a8,
`slime/utils/ppo_utils.py`, `torch.compile` removed, CPU fp32) on the inputs stated here. Tolerance: atol 1e-6
(fp32 rounding; GAE 2e-6: the original's chunked matmul scan and this version's differ in summation order).
"""

import pytest
import torch

from slime.utils import ppo_utils

ATOL = 1e-6
LP = torch.tensor([-0.4, -0.5, -0.5, -0.1, -3.0])
OLD = torch.tensor([-0.8, -0.9, -2.5, -0.1, -3.0])
ADV = torch.tensor([1.0, -1.0, -2.0, 0.5, -1.0])
KL_LP = torch.tensor([-1.0, -0.5, -2.0, -0.1, -3.0])
KL_BASE = torch.tensor([-1.2, -0.4, -1.0, -0.1, -0.5])
KL_OLD = torch.tensor([-0.8, -0.9, -2.5, -0.1, -3.0])
MASKS = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0])]


def _close(got, want, atol=ATOL):
    torch.testing.assert_close(torch.as_tensor(got).float(), torch.tensor(want), atol=atol, rtol=0)


@pytest.mark.parametrize(
    "kl_type, want",
    [
        ("k1", [0.2, -0.1, -1.0, 0.0, -2.5]),
        ("k2", [0.02, 0.005, 0.5, 0.0, 3.125]),
        ("k3", [0.0187307596, 0.0051709712, 0.7182817459, 0.0, 8.6824941635]),
        ("low_var_kl", [0.0187307596, 0.0051709712, 0.7182817459, 0.0, 8.6824941635]),
    ],
)
def test_compute_approx_kl_matches_the_original(kl_type, want):
    # The original's keyword is kl_loss_type (slime_core's is kl_type): a plugin written for it calls it so.
    _close(ppo_utils.compute_approx_kl(KL_LP, KL_BASE, kl_loss_type=kl_type), want)


def test_compute_approx_kl_importance_ratio_matches_the_original():
    ratio = torch.exp(KL_LP - KL_OLD)
    got = ppo_utils.compute_approx_kl(KL_LP, KL_BASE, "low_var_kl", importance_ratio=ratio)
    _close(got, [0.0153354490, 0.0077141821, 1.1842463017, 0.0, 8.6824941635])


def test_policy_losses_and_gradients_match_the_original():
    # ratios exp(lp - old) = [1.4918, 1.4918, 7.3891, 1, 1]: token 0 clipped at 1.28 (A > 0), token 2 dual-clipped
    # at c·|A| = 6 (A < 0); CISPO's weight clipped at 1 + 4 = 5 on token 2.
    lp = LP.clone().requires_grad_(True)
    loss, clipfrac = ppo_utils.compute_policy_loss(OLD - lp, ADV, 0.2, 0.28, eps_clip_c=3.0)
    _close(loss.detach(), [-1.28, 1.4918246269, 6.0, -0.5, 1.0])
    _close(clipfrac, [1.0, 0.0, 0.0, 0.0, 0.0])
    loss.sum().backward()
    _close(lp.grad, [0.0, 1.4918246269, 0.0, -0.5, 1.0])

    lp = LP.clone().requires_grad_(True)
    loss, clipfrac = ppo_utils.compute_cispo_loss(OLD - lp, lp, ADV, 1.0, 4.0)
    _close(loss.detach(), [0.5967299342, -0.7459123135, -5.0, 0.05, -3.0])
    _close(clipfrac, [0.0, 0.0, 1.0, 0.0, 0.0])
    loss.sum().backward()
    _close(lp.grad, [-1.4918247461, 1.4918246269, 10.0, -0.5, 1.0])


def test_gspo_kl_matches_the_original():
    per_sample = [KL_LP[:3], KL_LP[3:]], [KL_OLD[:3], KL_OLD[3:]]
    got = ppo_utils.compute_gspo_kl(per_sample[0], per_sample[1], per_sample[0], MASKS)
    _close(got, [-0.15, -0.15, -0.15, 0.0, 0.0])


def test_returns_and_gae_match_the_original():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.5], [1.0, -1.0, 0.0, 2.0]])
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, -0.5, 0.0, 1.0]])
    _close(ppo_utils.chunked_discounted_returns(rewards, 0.9), [[1.1745, 1.305, 1.45, 0.5], [1.558, 0.62, 1.8, 2.0]])
    want_adv = [[1.2418757, 1.2162420, 1.19005, 0.1], [1.2423550, 1.3156353, 1.9305, 1.0]]
    want_ret = [[1.3418757, 1.4162420, 1.49005, 0.5], [1.7423550, 0.8156353, 1.9305, 2.0]]
    for gae in (ppo_utils.chunked_gae, ppo_utils.vanilla_gae):
        adv, ret = gae(rewards, values, 0.99, 0.95)
        _close(adv, want_adv, atol=2e-6)
        _close(ret, want_ret, atol=2e-6)


def test_grpo_and_reinforce_plus_plus_baseline_returns_match_the_original():
    grpo = ppo_utils.get_grpo_returns(torch.tensor([0.5, -1.0]), [KL_LP[:3], KL_LP[3:]])
    _close(torch.cat(grpo), [0.5, 0.5, 0.5, -1.0, -1.0])
    kl = [KL_BASE[:3], KL_BASE[3:]]
    rppb = ppo_utils.get_reinforce_plus_plus_baseline_advantages(torch.tensor([0.5, -1.0]), kl, MASKS, 0.1)
    _close(torch.cat(rppb), [0.62, 0.54, 0.6, -0.99, -0.95])


def test_a_function_not_carried_is_refused_naming_what_replaces_it():
    with pytest.raises(ImportError, match=r"ppo_utils\.compute_opsm_mask is the original slime's .* --use-opsm"):
        from slime.utils.ppo_utils import compute_opsm_mask  # noqa: F401
    with pytest.raises(AttributeError):
        ppo_utils.no_such_function  # noqa: B018
