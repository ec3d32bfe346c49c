import numpy as np
import pytest
import torch

from slime_core.algorithms import (
    apply_whitening,
    compute_advantages_and_returns,
    compute_approx_kl,
    discounted_cumsum,
    whitening_stats,
)
from slime_core.config import SlimeArgs

# Tolerances: serial-loop references in float64, results float32: atol 1e-5 (1e-4 for long scans).


# A real, validated run config; tests set fields with model_copy (no re-validation, so invalid combinations
# reach the functions' own checks).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _args(**kw):
    base = dict(
        advantage_estimator="grpo", kl_coef=0.0, kl_loss_type="k1", gamma=1.0, lambd=1.0, n_samples_per_prompt=2
    )
    base.update(kw)
    return _CONFIG.model_copy(update=base)


def _serial_discounted(x, discount):
    out, running = [0.0] * len(x), 0.0
    for t in reversed(range(len(x))):
        running = x[t] + discount * running
        out[t] = running
    return out


@pytest.mark.parametrize("length", [1, 5, 128, 129, 300])
@pytest.mark.parametrize("discount", [0.0, 0.9, 0.99, 1.0])
def test_discounted_cumsum_vs_serial_loop(length, discount):
    x = torch.randn(length, generator=torch.Generator().manual_seed(length))
    expected = torch.tensor(_serial_discounted(x.double().tolist(), discount), dtype=torch.float64)
    out = discounted_cumsum(x, discount)
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-5)
    # a tiny chunk forces many carries across chunk boundaries
    torch.testing.assert_close(discounted_cumsum(x, discount, chunk_size=7).double(), expected, atol=1e-4, rtol=1e-5)


def test_discounted_cumsum_empty():
    assert discounted_cumsum(torch.zeros(0), 0.9).shape == (0,)


@pytest.mark.parametrize("name", ["grpo", "gspo", "cispo"])
def test_grpo_family_broadcasts_reward_and_ignores_kl(name):
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.0]), torch.zeros(0)]
    lp = [torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-1.0]), torch.zeros(0)]
    ref = [torch.tensor([-2.0, -2.0, -1.0]), torch.tensor([-3.0]), torch.zeros(0)]
    adv, ret = compute_advantages_and_returns(
        _args(advantage_estimator=name, kl_coef=0.5),
        rewards=[0.7, -1.2, 3.0],
        loss_masks=masks,
        log_probs=lp,
        ref_log_probs=ref,
    )
    assert torch.equal(adv[0], torch.full((3,), 0.7))
    assert torch.equal(adv[1], torch.tensor([-1.2]))
    assert adv[2].shape == (0,)
    for a, r in zip(adv, ret, strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, r)


def test_rloo_broadcasts_leave_one_out_rewards():
    # Post-processing already turned raw rewards into leave-one-out ones; the estimator broadcasts them.
    rewards = [1.0, -0.5, -0.5]
    masks = [torch.ones(2), torch.tensor([1.0, 0.0]), torch.ones(1)]
    adv, ret = compute_advantages_and_returns(
        _args(advantage_estimator="rloo", n_samples_per_prompt=3), rewards=rewards, loss_masks=masks
    )
    for a, r, e, m in zip(adv, ret, rewards, masks, strict=True):
        torch.testing.assert_close(a, torch.full(m.shape, e))
        assert torch.equal(a, r)


def test_rloo_with_kl():
    masks = [torch.ones(2), torch.ones(2)]
    lp = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -2.0])]
    ref = [torch.tensor([-1.5, -1.0]), torch.tensor([-1.0, -1.0])]
    adv, _ = compute_advantages_and_returns(
        _args(advantage_estimator="rloo", kl_coef=0.1),
        rewards=[1.0, -1.0],
        loss_masks=masks,
        log_probs=lp,
        ref_log_probs=ref,
    )
    # k1: d = [0.5, 0], [0, -1]; A = ±1 - 0.1·d
    torch.testing.assert_close(adv[0], torch.tensor([1.0 - 0.05, 1.0]))
    torch.testing.assert_close(adv[1], torch.tensor([-1.0, -1.0 + 0.1]))


def test_reinforce_plus_plus_baseline():
    masks = [torch.tensor([1.0, 1.0, 1.0])]
    lp = [torch.tensor([-1.0, -2.0, -0.5])]
    ref = [torch.tensor([-1.0, -1.0, -1.0])]
    adv, ret = compute_advantages_and_returns(
        _args(advantage_estimator="reinforce_plus_plus_baseline", kl_coef=0.2, kl_loss_type="k2"),
        rewards=[0.5],
        loss_masks=masks,
        log_probs=lp,
        ref_log_probs=ref,
    )
    # k2 = d²/2: [0, 0.5, 0.125]
    torch.testing.assert_close(adv[0], torch.tensor([0.5, 0.5 - 0.1, 0.5 - 0.025]))
    assert torch.equal(adv[0], ret[0])


def test_reinforce_plus_plus_vs_loop():
    gamma, kl_coef = 0.9, 0.3
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    lp = torch.tensor([-1.0, -0.2, -3.0, -0.7, -1.1, -2.0, -0.3])
    ref = torch.tensor([-0.5, -0.4, -1.0, -0.7, -2.0, -1.0, -0.1])
    reward = 2.0
    adv, ret = compute_advantages_and_returns(
        _args(advantage_estimator="reinforce_plus_plus", kl_coef=kl_coef, kl_loss_type="k3", gamma=gamma),
        rewards=[reward],
        loss_masks=[mask],
        log_probs=[lp],
        ref_log_probs=[ref],
    )
    kl = compute_approx_kl(lp, ref, "k3").double().tolist()
    token_rewards = [-kl_coef * k * m for k, m in zip(kl, mask.tolist(), strict=True)]
    token_rewards[4] += reward  # last masked-in token is index 4
    expected = _serial_discounted(token_rewards, gamma)
    torch.testing.assert_close(adv[0].double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=0)
    assert torch.equal(adv[0], ret[0])


def test_reinforce_plus_plus_all_masked_sample_is_zero():
    adv, _ = compute_advantages_and_returns(
        _args(advantage_estimator="reinforce_plus_plus"), rewards=[5.0], loss_masks=[torch.zeros(3)]
    )
    assert torch.equal(adv[0], torch.zeros(3))


def _serial_gae(rewards, values, gamma, lam):
    n = len(rewards)
    adv = [0.0] * n
    last = 0.0
    for t in reversed(range(n)):
        next_v = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0)])
def test_ppo_gae_vs_serial_loop(gamma, lam):
    g = torch.Generator().manual_seed(7)
    lengths = [1, 4, 200]
    masks = [torch.ones(n) for n in lengths]
    masks[1][0] = 0.0  # the mask does not enter GAE
    values = [torch.randn(n, generator=g) for n in lengths]
    lp = [torch.randn(n, generator=g) for n in lengths]
    ref = [torch.randn(n, generator=g) for n in lengths]
    rewards = [1.0, -0.5, 0.25]
    kl_coef = 0.05
    adv, ret = compute_advantages_and_returns(
        _args(advantage_estimator="ppo", kl_coef=kl_coef, kl_loss_type="k1", gamma=gamma, lambd=lam),
        rewards=rewards,
        loss_masks=masks,
        log_probs=lp,
        ref_log_probs=ref,
        values=values,
    )
    for i, n in enumerate(lengths):
        token_rewards = (-kl_coef * (lp[i] - ref[i]).double()).tolist()
        token_rewards[-1] += rewards[i]
        expected = torch.tensor(
            _serial_gae(token_rewards, values[i].double().tolist(), gamma, lam), dtype=torch.float64
        )
        torch.testing.assert_close(adv[i].double(), expected, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(ret[i], adv[i] + values[i])
        assert adv[i].shape == (n,)


def test_ppo_hand_value():
    # L=2, γ=λ=1, values [1, 2], reward 3: δ1 = 3 - 2 = 1, δ0 = 0 + 2 - 1 = 1 → A = [2, 1], R = [3, 3]
    adv, ret = compute_advantages_and_returns(
        _args(advantage_estimator="ppo"), rewards=[3.0], loss_masks=[torch.ones(2)], values=[torch.tensor([1.0, 2.0])]
    )
    torch.testing.assert_close(adv[0], torch.tensor([2.0, 1.0]))
    torch.testing.assert_close(ret[0], torch.tensor([3.0, 3.0]))


def test_input_errors():
    with pytest.raises(ValueError, match="values"):
        compute_advantages_and_returns(_args(advantage_estimator="ppo"), rewards=[1.0], loss_masks=[torch.ones(2)])
    with pytest.raises(ValueError, match="kl-coef"):
        compute_advantages_and_returns(_args(kl_coef=0.1), rewards=[1.0], loss_masks=[torch.ones(2)])
    with pytest.raises(ValueError, match="rewards has 2"):
        compute_advantages_and_returns(_args(), rewards=[1.0, 2.0], loss_masks=[torch.ones(2)])
    # A wrong-shaped entry, and a float where a tensor belongs (was "'float' object has no attribute 'shape'").
    for entry, got in ((torch.ones(3), "shape (3,)"), (0.5, "float")):
        with pytest.raises(ValueError) as e:
            compute_advantages_and_returns(
                _args(kl_coef=0.1),
                rewards=[1.0],
                loss_masks=[torch.ones(2)],
                log_probs=[entry],
                ref_log_probs=[torch.ones(2)],
            )
        assert str(e.value) == (
            "log_probs must be a list of 1 tensors shaped like loss_masks (one value per response token), "
            f"got {got} at sample 0, where its loss mask has shape (2,)"
        )
    with pytest.raises(KeyError, match="known"):
        compute_advantages_and_returns(_args(advantage_estimator="nope"), rewards=[1.0], loss_masks=[torch.ones(2)])


def test_whitening_vs_numpy():
    g = torch.Generator().manual_seed(11)
    adv = [torch.randn(n, generator=g) * 3 + 1 for n in (4, 1, 6)]
    masks = [torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([1.0]), torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 0.0])]
    stats = whitening_stats(adv, masks)
    assert stats.dtype == torch.float64 and stats.shape == (3,)
    out = apply_whitening(adv, masks, stats)
    flat = np.concatenate([a.numpy() for a in adv]).astype(np.float64)
    m = np.concatenate([x.numpy() for x in masks]).astype(bool)
    mu, var = flat[m].mean(), flat[m].var(ddof=1)
    expected = (flat - mu) / np.sqrt(var + 1e-8)
    np.testing.assert_allclose(torch.cat(out).numpy(), expected, atol=1e-5, rtol=0)
    assert torch.cat(out)[torch.from_numpy(m)].mean().abs().item() < 1e-5


def test_whitening_stats_add_across_ranks():
    # two "ranks" summing their stats equals one process holding everything
    g = torch.Generator().manual_seed(12)
    adv = [torch.randn(5, generator=g) for _ in range(4)]
    masks = [torch.ones(5), torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0]), torch.zeros(5), torch.ones(5)]
    total = whitening_stats(adv[:2], masks[:2]) + whitening_stats(adv[2:], masks[2:])
    torch.testing.assert_close(total, whitening_stats(adv, masks))
    whole = apply_whitening(adv, masks, whitening_stats(adv, masks))
    split = apply_whitening(adv[:2], masks[:2], total) + apply_whitening(adv[2:], masks[2:], total)
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b)


def test_whitening_edge_cases():
    # N = 1: no Bessel correction (σ² = 0): (A - μ)/sqrt(1e-8) → 0 for the masked token
    out = apply_whitening(
        [torch.tensor([3.0, 5.0])],
        [torch.tensor([1.0, 0.0])],
        whitening_stats([torch.tensor([3.0, 5.0])], [torch.tensor([1.0, 0.0])]),
    )
    torch.testing.assert_close(out[0], torch.tensor([0.0, 2.0 / 1e-4]))
    # N = 0: unchanged
    a = [torch.tensor([1.0, 2.0])]
    assert torch.equal(apply_whitening(a, [torch.zeros(2)], whitening_stats(a, [torch.zeros(2)]))[0], a[0])
    # constant advantages → all zero, finite
    c = [torch.full((4,), 2.5)]
    assert torch.equal(apply_whitening(c, [torch.ones(4)], whitening_stats(c, [torch.ones(4)]))[0], torch.zeros(4))
    with pytest.raises(ValueError, match=r"\[3\]"):
        apply_whitening(c, [torch.ones(4)], torch.zeros(2))


def test_whitening_without_mean_shift_and_custom_epsilon_by_hand():
    # A = [1, 3, 5] all trainable: μ = 3, σ² (unbiased) = 4. The original's shift_mean=False keeps the mean:
    # (A - μ)/sqrt(σ² + ε) + μ. With ε = 5: sqrt(9) = 3 → [-2/3, 0, 2/3] (+ 3 without the shift).
    a, m = [torch.tensor([1.0, 3.0, 5.0])], [torch.ones(3)]
    stats = whitening_stats(a, m)
    torch.testing.assert_close(apply_whitening(a, m, stats, epsilon=5.0)[0], torch.tensor([-2 / 3, 0.0, 2 / 3]))
    torch.testing.assert_close(
        apply_whitening(a, m, stats, shift_mean=False, epsilon=5.0)[0], torch.tensor([3 - 2 / 3, 3.0, 3 + 2 / 3])
    )
    # Default ε = 1e-8 as the original: sqrt(4 + 1e-8) → [-1, 0, 1] (atol 1e-6).
    torch.testing.assert_close(apply_whitening(a, m, stats)[0], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="epsilon"):
        apply_whitening(a, m, stats, epsilon=0.0)


def test_opd_term_subtracted_from_advantages():
    args = _args(use_opd=True, opd_kl_coef=0.5)
    lp = [torch.tensor([-1.0, -2.0])]
    teacher = [torch.tensor([-1.5, -1.0])]
    adv, ret = compute_advantages_and_returns(
        args, rewards=[1.0], loss_masks=[torch.ones(2)], log_probs=lp, teacher_log_probs=teacher
    )
    # A = 1 - 0.5·(lp - teacher) = 1 - 0.5·[0.5, -1] = [0.75, 1.5]; returns unchanged
    torch.testing.assert_close(adv[0], torch.tensor([0.75, 1.5]))
    torch.testing.assert_close(ret[0], torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match="use-opd"):
        compute_advantages_and_returns(args, rewards=[1.0], loss_masks=[torch.ones(2)], log_probs=lp)


def test_custom_advantage_function(tmp_path, monkeypatch):
    (tmp_path / "my_adv.py").write_text(
        "import torch\n"
        "def adv(args, rollout_data):\n"
        "    rollout_data['advantages'] = [torch.full((n,), 2.0 * r) for n, r in\n"
        "                                  zip(rollout_data['response_lengths'], rollout_data['rewards'])]\n"
        "    rollout_data['returns'] = [torch.zeros(n) for n in rollout_data['response_lengths']]\n"
        "def broken(args, rollout_data):\n"
        "    rollout_data['advantages'] = []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    adv, ret = compute_advantages_and_returns(
        _args(custom_advantage_function_path="my_adv.adv"),
        rewards=[1.5, -1.0],
        loss_masks=[torch.ones(3), torch.ones(1)],
    )
    torch.testing.assert_close(adv[0], torch.full((3,), 3.0))
    torch.testing.assert_close(adv[1], torch.tensor([-2.0]))
    assert torch.equal(ret[1], torch.zeros(1))
    with pytest.raises(ValueError, match=r"must be a list of 1 tensors shaped like .*, got list \[\]$"):
        compute_advantages_and_returns(
            _args(custom_advantage_function_path="my_adv.broken"), rewards=[1.0], loss_masks=[torch.ones(1)]
        )


@pytest.mark.parametrize(
    ("body", "got"),
    [
        # Was "'float' object has no attribute 'shape'": the common slip of one advantage per sample.
        ("list(rollout_data['rewards'])", "float at sample 0, where its loss mask has shape (3,)"),
        ("torch.tensor(rollout_data['rewards'])", "Tensor tensor([ 1.5000, -1.0000])"),
        ("[torch.ones(1), torch.ones(1)]", "shape (1,) at sample 0, where its loss mask has shape (3,)"),
    ],
)
def test_custom_advantages_of_the_wrong_form_are_one_error_naming_the_plugin(tmp_path, monkeypatch, body, got):
    module = f"form_adv_{abs(hash(body))}"  # one module per case: plugins are loaded once per path
    (tmp_path / f"{module}.py").write_text(
        f"import torch\ndef adv(args, rollout_data):\n    rollout_data['advantages'] = {body}\n"
        "    rollout_data['returns'] = [torch.zeros(n) for n in rollout_data['response_lengths']]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as e:
        compute_advantages_and_returns(
            _args(custom_advantage_function_path=f"{module}.adv"),
            rewards=[1.5, -1.0],
            loss_masks=[torch.ones(3), torch.ones(1)],
        )
    assert str(e.value) == (
        f"--custom-advantage-function-path {module}.adv: rollout_data['advantages'] must be a list of 2 tensors shaped "
        f"like loss_masks (one value per response token), got {got}"
    )


def test_custom_advantage_function_gets_the_reward_kl_as_in_the_original(tmp_path, monkeypatch):
    # The original (megatron_utils/loss.py: compute_advantages_and_returns) sets rollout_data["kl"] before it
    # calls --custom-advantage-function-path: compute_approx_kl(log_probs, ref_log_probs, --kl-loss-type) when
    # --kl-coef != 0, else zeros. A plugin shaping its own reward with it got a KeyError here.
    # By hand, k1 = lp - ref = [-0.5 + 1.0, -2.0 + 1.5] = [0.5, -0.5]; A = r - 0.1·kl = [1 - 0.05, 1 + 0.05].
    (tmp_path / "kl_adv.py").write_text(
        "def adv(args, rollout_data):\n"
        "    rollout_data['advantages'] = [r - args.kl_coef * k for r, k in\n"
        "                                  zip(rollout_data['rewards'], rollout_data['kl'])]\n"
        "    rollout_data['returns'] = [a.clone() for a in rollout_data['advantages']]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    lp, ref = [torch.tensor([-0.5, -2.0])], [torch.tensor([-1.0, -1.5])]
    cfg = _args(custom_advantage_function_path="kl_adv.adv", kl_coef=0.1)
    adv, _ = compute_advantages_and_returns(
        cfg, rewards=[1.0], loss_masks=[torch.ones(2)], log_probs=lp, ref_log_probs=ref
    )
    torch.testing.assert_close(adv[0], torch.tensor([0.95, 1.05]))
    # --kl-coef 0: zeros of each sample's shape.
    adv, _ = compute_advantages_and_returns(
        _args(custom_advantage_function_path="kl_adv.adv"), rewards=[2.0], loss_masks=[torch.ones(3)]
    )
    torch.testing.assert_close(adv[0], torch.full((3,), 2.0))


def test_custom_advantage_function_gets_total_lengths_and_the_engines_log_probs(tmp_path, monkeypatch):
    # The original's rollout_data holds every batch field; a plugin reading total_lengths or rollout_log_probs
    # (e.g. an importance weight against the sampler) got a KeyError here.
    (tmp_path / "len_adv.py").write_text(
        "def adv(args, rollout_data):\n"
        "    rollout_data['advantages'] = [lp.exp() * n for lp, n in\n"
        "                                  zip(rollout_data['rollout_log_probs'], rollout_data['total_lengths'])]\n"
        "    rollout_data['returns'] = [a.clone() for a in rollout_data['advantages']]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    engine = [torch.log(torch.tensor([0.5, 0.25]))]
    adv, _ = compute_advantages_and_returns(
        _args(custom_advantage_function_path="len_adv.adv"), rewards=[1.0], loss_masks=[torch.ones(2)],
        total_lengths=[6], rollout_log_probs=engine,
    )  # fmt: skip
    torch.testing.assert_close(adv[0], torch.tensor([3.0, 1.5]))  # exp(lp) · 6
