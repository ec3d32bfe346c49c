"""The RL math against the original slime, flag by flag, on fixed uneven inputs.

Each `_orig_*` function is a transcription, by hand, of the original's code at THUDM/slime 624b824a8 (file and
function named on each); the tests feed both sides the same seeded tensors (uneven response lengths, loss masks
with zeros, prompt groups) and compare. Tolerance: float32 against the float32 reference, atol 1e-5 (rtol 1e-5
where values are large).
"""

import pytest
import torch

from slime_core.algorithms import (
    apply_whitening,
    compute_actor_loss,
    compute_advantages_and_returns,
    compute_critic_loss,
    whitening_stats,
)
from slime_core.algorithms.kl import compute_approx_kl
from slime_core.config import SlimeArgs
from slime_core.sample import Sample
from slime_core.train_data import postprocess_rewards

ATOL = 1e-5
LENGTHS = [3, 5, 1, 4]
MASKS = [
    torch.tensor([1.0, 1.0, 0.0]),
    torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]),
    torch.tensor([1.0]),
    torch.tensor([0.0, 1.0, 1.0, 1.0]),
]

_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _cfg(**kw) -> SlimeArgs:
    base = dict(
        advantage_estimator="grpo",
        eps_clip=0.2,
        eps_clip_high=0.28,
        eps_clip_c=None,
        entropy_coef=0.0,
        use_kl_loss=False,
        kl_loss_coef=0.0,
        kl_loss_type="k1",
        kl_coef=0.0,
        use_tis=False,
        use_unbiased_kl=False,
        calculate_per_token_loss=False,
        use_rollout_logprobs=False,
        use_opsm=False,
        get_mismatch_metrics=False,
        custom_pg_loss_reducer_function_path=None,
        custom_tis_function_path=None,
    )
    base.update(kw)
    return _CONFIG.model_copy(update=base)


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def per_sample(scale, shift=0.0):
        return [(torch.randn(n, generator=g) * scale + shift) for n in LENGTHS]

    return {
        "lp": per_sample(0.3, -1.0),
        "old": per_sample(0.3, -1.0),
        "ref": per_sample(0.3, -1.0),
        "roll": per_sample(0.3, -1.0),
        "ent": [t.abs() for t in per_sample(1.0)],
        "adv": per_sample(1.0),
        "values": per_sample(0.5),
        "rewards": [1.0, -0.5, 0.25, 2.0],
    }


# --- transcriptions of the original -------------------------------------------------------------------------


def _orig_kl(log_probs, log_probs_base, kl_loss_type, importance_ratio=None):
    # slime/utils/ppo_utils.py: compute_approx_kl
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = log_ratio**2 / 2.0
    else:
        log_ratio = -log_ratio
        kl = log_ratio.exp() - 1 - log_ratio
    if importance_ratio is not None:
        kl = importance_ratio * kl
    if kl_loss_type == "low_var_kl":
        kl = torch.clamp(kl, min=-10, max=10)
    return kl


def _orig_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c=None):
    # slime/utils/ppo_utils.py: compute_policy_loss
    ratio = (-ppo_kl).exp()
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clipfrac = torch.gt(pg_losses2, pg_losses1).float()
    if eps_clip_c is not None:
        pg_losses3 = -eps_clip_c * advantages
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    else:
        pg_losses = clip_pg_losses1
    return pg_losses, clipfrac


def _orig_cispo(ppo_kl, log_probs, advantages, eps_clip, eps_clip_high):
    # slime/utils/ppo_utils.py: compute_cispo_loss
    ratio = (-ppo_kl).exp()
    ratio_truncated = torch.clamp(ratio, min=1.0 - eps_clip, max=1.0 + eps_clip_high)
    return -ratio_truncated.detach() * advantages * log_probs, (ratio_truncated != ratio).float()


def _orig_gspo_kl(log_probs, old_log_probs, loss_masks):
    # slime/utils/ppo_utils.py: compute_gspo_kl
    kl = [
        ((o - lp) * m).sum() / torch.clamp_min(m.sum(), 1)
        for lp, o, m in zip(log_probs, old_log_probs, loss_masks, strict=True)
    ]
    return torch.cat([k.expand_as(lp) for k, lp in zip(kl, log_probs, strict=True)])


def _orig_sum_of_sample_mean(loss_masks, per_token):
    # slime/backends/megatron_utils/cp_utils.py: get_sum_of_sample_mean (cp_size == 1, sample_denoms=None)
    lengths = [m.numel() for m in loss_masks]
    if per_token:
        return lambda x: sum((xi * m).sum() for xi, m in zip(x.split(lengths), loss_masks, strict=True))
    return lambda x: sum(
        (xi * m).sum() / torch.clamp_min(m.sum(), 1) for xi, m in zip(x.split(lengths), loss_masks, strict=True)
    )


def _orig_policy_loss_function(args, lp_list, old_list, adv_list, masks, ent_list, ref_list, roll_list):
    # slime/backends/megatron_utils/loss.py: policy_loss_function (CP 1, no OPSM, vanilla TIS)
    reduce = _orig_sum_of_sample_mean(masks, args.calculate_per_token_loss)
    advantages = torch.cat(adv_list)
    if args.use_rollout_logprobs:
        old_list = roll_list
    if args.advantage_estimator == "gspo":
        ppo_kl = _orig_gspo_kl(lp_list, old_list, masks)
    else:
        ppo_kl = torch.cat(old_list) - torch.cat(lp_list)
    log_probs, old_log_probs = torch.cat(lp_list), torch.cat(old_list)
    if args.advantage_estimator == "cispo":
        pg_loss, clipfrac = _orig_cispo(ppo_kl, log_probs, advantages, args.eps_clip, args.eps_clip_high)
    else:
        pg_loss, clipfrac = _orig_policy_loss(ppo_kl, advantages, args.eps_clip, args.eps_clip_high, args.eps_clip_c)
    metrics = {}
    if args.use_tis:
        # loss.py: vanilla_tis_function, train_log_probs = batch["log_probs"] (the old ones)
        tis = torch.exp(old_log_probs - torch.cat(roll_list))
        weights = torch.clamp(tis, min=args.tis_clip_low, max=args.tis_clip)
        pg_loss = pg_loss * weights
        metrics["tis"] = reduce(tis)
        metrics["tis_clipfrac"] = reduce((weights != tis).float())
        metrics["tis_abs"] = reduce((tis - 1).abs())
        metrics["ois"] = reduce((-ppo_kl).exp())
    pg = reduce(pg_loss)
    entropy_loss = reduce(torch.cat(ent_list))
    loss = pg - args.entropy_coef * entropy_loss
    if args.use_kl_loss:
        ratio = torch.exp(log_probs - old_log_probs) if args.use_unbiased_kl else None
        kl_loss = reduce(_orig_kl(log_probs, torch.cat(ref_list), args.kl_loss_type, ratio))
        loss = loss + args.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss
    metrics.update(
        loss=loss, pg_loss=pg, pg_clipfrac=reduce(clipfrac), ppo_kl=reduce(ppo_kl), entropy_loss=entropy_loss
    )
    return loss, metrics


def _orig_discounted(rewards_row, discount):
    # slime/utils/ppo_utils.py: chunked_discounted_returns, as its serial recurrence S_t = r_t + d·S_{t+1}
    out, running = torch.zeros_like(rewards_row), torch.zeros(())
    for t in reversed(range(rewards_row.numel())):
        running = rewards_row[t] + discount * running
        out[t] = running
    return out


def _orig_advantages(args, rewards, kl, loss_masks, values):
    # slime/backends/megatron_utils/loss.py: compute_advantages_and_returns (CP 1)
    est = args.advantage_estimator
    if est in ("grpo", "gspo", "cispo"):
        returns = [torch.ones_like(k) * r for k, r in zip(kl, rewards, strict=True)]  # get_grpo_returns
        return list(returns), returns
    if est == "ppo":
        advantages, returns = [], []
        for r, k, v in zip(rewards, kl, values, strict=True):
            token_rewards = k * -args.kl_coef
            token_rewards[-1] += r
            # vanilla_gae on one row: next value 0 after the last token
            lastgaelam, adv = torch.zeros(()), torch.zeros_like(v)
            for t in reversed(range(v.numel())):
                next_value = v[t + 1] if t < v.numel() - 1 else 0.0
                delta = token_rewards[t] + args.gamma * next_value - v[t]
                lastgaelam = delta + args.gamma * args.lambd * lastgaelam
                adv[t] = lastgaelam
            advantages.append(adv)
            returns.append(adv + v)
        return advantages, returns
    if est == "reinforce_plus_plus":
        returns = []
        for r, k, m in zip(rewards, kl, loss_masks, strict=True):  # get_reinforce_plus_plus_returns
            rewards_for_seq = -args.kl_coef * (k * m)
            rewards_for_seq[m.nonzero(as_tuple=True)[0][-1]] += r
            returns.append(_orig_discounted(rewards_for_seq, args.gamma))
        return list(returns), returns
    if est == "reinforce_plus_plus_baseline":
        adv = [torch.ones_like(k) * r - args.kl_coef * k for k, r in zip(kl, rewards, strict=True)]
        return adv, adv
    raise AssertionError(est)


def _orig_whiten(advantages, loss_masks):
    # slime/utils/distributed_utils.py: distributed_masked_whiten (one rank, shift_mean=True, epsilon=1e-8)
    values, mask = torch.cat(advantages), torch.cat(loss_masks)
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = ((values**2) * mask).sum() / n - mean**2
    if n >= 2:
        var = var * n / (n - 1)
    out = (values - mean) * torch.rsqrt(var + 1e-8)
    return list(out.split([a.numel() for a in advantages]))


def _orig_post_process_rewards(args, raw_rewards, n_samples_per_prompt):
    # slime/ray/rollout.py: RolloutManager._post_process_rewards (even groups)
    if args.advantage_estimator in ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline") and (
        not args.disable_rewards_normalization
    ):
        rewards = torch.tensor(raw_rewards, dtype=torch.float).reshape(-1, n_samples_per_prompt)
        rewards = rewards - rewards.mean(dim=-1, keepdim=True)
        if args.advantage_estimator in ("grpo", "gspo", "cispo") and not args.disable_grpo_std_normalization:
            rewards = rewards / (rewards.std(dim=-1, keepdim=True) + 1e-6)
        return rewards.flatten().tolist()
    return list(raw_rewards)


# --- tests ---------------------------------------------------------------------------------------------------


def _ours_loss(cfg, x, *, lp=None):
    lp = lp if lp is not None else [t.clone().requires_grad_(True) for t in x["lp"]]
    denominators = [float(max(m.sum().item(), 1.0)) for m in MASKS]
    loss, metrics = compute_actor_loss(
        cfg,
        log_probs=lp,
        old_log_probs=x["old"],
        advantages=x["adv"],
        loss_masks=MASKS,
        loss_denominators=denominators,
        ref_log_probs=x["ref"],
        rollout_log_probs=x["roll"],
        entropy=x["ent"],
    )
    return loss, metrics, lp


POLICY_CASES = [
    dict(),
    dict(eps_clip_c=3.0),
    dict(advantage_estimator="gspo", eps_clip=3e-4, eps_clip_high=4e-4),
    dict(advantage_estimator="cispo", eps_clip=1.0, eps_clip_high=4.0),
    dict(entropy_coef=0.01),
    dict(entropy_coef=-0.01),  # an entropy penalty: the original accepts any sign
    dict(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k1"),
    dict(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k2"),
    dict(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k3"),
    dict(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl", use_unbiased_kl=True),
    dict(use_tis=True, tis_clip=1.1, tis_clip_low=0.9),
    dict(use_rollout_logprobs=True),
    dict(calculate_per_token_loss=True, entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.1),
]


@pytest.mark.parametrize("fields", POLICY_CASES, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "ppo")
def test_policy_loss_value_metrics_and_gradient_match_the_original(fields):
    cfg = _cfg(**fields)
    x = _inputs(seed=1)
    # Spread the ratios so both clip branches and the TIS bounds are hit.
    x["old"] = [o + torch.linspace(-0.6, 0.6, o.numel()) for o in x["old"]]
    loss, metrics, lp = _ours_loss(cfg, x)
    loss.backward()

    lp_ref = [t.clone().requires_grad_(True) for t in x["lp"]]
    ref_loss, ref_metrics = _orig_policy_loss_function(
        cfg, lp_ref, x["old"], x["adv"], MASKS, x["ent"], x["ref"], x["roll"]
    )
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), abs=ATOL)
    for key, value in ref_metrics.items():
        assert metrics[key].item() == pytest.approx(value.item(), abs=ATOL), key
    for ours, theirs in zip(lp, lp_ref, strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_estimators_match_the_original(kl_type):
    g = torch.Generator().manual_seed(3)
    lp, base = torch.randn(64, generator=g) * 3, torch.randn(64, generator=g) * 3  # low_var_kl clamps some
    ratio = torch.rand(64, generator=g) * 2
    for r in (None, ratio):
        torch.testing.assert_close(compute_approx_kl(lp, base, kl_type, r), _orig_kl(lp, base, kl_type, r))


ADVANTAGE_CASES = [
    dict(advantage_estimator="grpo"),
    dict(advantage_estimator="gspo", kl_coef=0.05),
    dict(advantage_estimator="reinforce_plus_plus", kl_coef=0.05, gamma=0.9, kl_loss_type="k3"),
    dict(advantage_estimator="reinforce_plus_plus", kl_coef=0.0, gamma=1.0),
    dict(advantage_estimator="reinforce_plus_plus_baseline", kl_coef=0.05, kl_loss_type="k2"),
    dict(advantage_estimator="ppo", kl_coef=0.05, gamma=0.95, lambd=0.9),
    dict(advantage_estimator="ppo", kl_coef=0.0, gamma=1.0, lambd=1.0),
]


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("fields", ADVANTAGE_CASES, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_advantages_and_whitening_match_the_original(fields, normalize):
    cfg = _cfg(normalize_advantages=normalize, **fields)
    x = _inputs(seed=2)
    adv, ret = compute_advantages_and_returns(
        cfg,
        rewards=x["rewards"],
        loss_masks=MASKS,
        log_probs=x["old"],
        ref_log_probs=x["ref"],
        values=x["values"],
    )
    if normalize:
        adv = apply_whitening(adv, MASKS, whitening_stats(adv, MASKS))
    if cfg.kl_coef != 0:
        kl = [_orig_kl(o, r, cfg.kl_loss_type) for o, r in zip(x["old"], x["ref"], strict=True)]
    else:
        kl = [torch.zeros(n) for n in LENGTHS]
    ref_adv, ref_ret = _orig_advantages(cfg, x["rewards"], kl, MASKS, x["values"])
    if normalize:
        ref_adv = _orig_whiten(ref_adv, MASKS)
    for ours, theirs in zip(adv + ret, ref_adv + ref_ret, strict=True):
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize(
    ("estimator", "disable_std", "disable_norm"),
    [
        ("grpo", False, False),
        ("grpo", True, False),
        ("gspo", False, False),
        ("cispo", False, False),
        ("grpo", False, True),
        ("reinforce_plus_plus_baseline", False, False),
        ("reinforce_plus_plus", False, False),
        ("ppo", False, False),
    ],
)
def test_reward_normalization_matches_the_original(estimator, disable_std, disable_norm):
    cfg = _cfg(
        advantage_estimator=estimator,
        disable_grpo_std_normalization=disable_std,
        disable_rewards_normalization=disable_norm,
        n_samples_per_prompt=4,
        reward_key="score",
    )
    raw = [1.0, 0.0, 0.0, 1.0, 0.5, 0.25, 3.0, -1.0, 2.0, 2.0, 2.0, 0.0]
    samples = [Sample(index=i, group_index=i // 4, reward={"score": r, "other": 7.0}) for i, r in enumerate(raw)]
    got_raw, got = postprocess_rewards(cfg, samples)
    assert got_raw == raw  # --reward-key picks "score"
    assert got == pytest.approx(_orig_post_process_rewards(cfg, raw, 4), abs=1e-5)


def test_value_loss_matches_the_original():
    # slime/backends/megatron_utils/loss.py: value_loss_function
    cfg = _cfg(value_clip=0.2)
    x = _inputs(seed=4)
    old_values = x["values"]
    values = [(v + torch.linspace(-0.5, 0.5, v.numel())).requires_grad_(True) for v in old_values]
    returns = x["adv"]
    loss, metrics = compute_critic_loss(
        cfg,
        values=values,
        old_values=old_values,
        returns=returns,
        loss_masks=MASKS,
        loss_denominators=[float(max(m.sum().item(), 1.0)) for m in MASKS],
    )
    v, ov, r = torch.cat(values).detach(), torch.cat(old_values), torch.cat(returns)
    clipfrac = torch.abs(v - ov) > 0.2
    clipped = ov + (v - ov).clamp(-0.2, 0.2)
    ref = torch.max((clipped - r) ** 2, (v - r) ** 2)
    reduce = _orig_sum_of_sample_mean(MASKS, False)
    assert loss.item() == pytest.approx(reduce(ref).item(), abs=ATOL)
    assert metrics["value_clipfrac"].item() == pytest.approx(reduce(clipfrac.float()).item(), abs=ATOL)


@pytest.mark.parametrize("per_token", [False, True])
def test_one_vs_four_uneven_micro_batches_give_the_same_gradient(per_token):
    """The backend divides each micro-batch's SUM by the step's count: 1 or 4 micro-batches, one gradient."""
    cfg = _cfg(calculate_per_token_loss=per_token, entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    x = _inputs(seed=5)
    x["old"] = [o + torch.linspace(-0.6, 0.6, o.numel()) for o in x["old"]]
    denominators = [float(max(m.sum().item(), 1.0)) for m in MASKS]
    step_count = float(sum(m.sum().item() for m in MASKS)) if per_token else float(len(MASKS))

    def run(groups):
        lp = [t.clone().requires_grad_(True) for t in x["lp"]]
        total = 0.0
        for ids in groups:
            pick = lambda xs, ids=ids: [xs[i] for i in ids]  # noqa: E731
            loss, _ = compute_actor_loss(
                cfg,
                log_probs=pick(lp),
                old_log_probs=pick(x["old"]),
                advantages=pick(x["adv"]),
                loss_masks=pick(MASKS),
                loss_denominators=pick(denominators),
                ref_log_probs=pick(x["ref"]),
                entropy=pick(x["ent"]),
            )
            (loss / step_count).backward()
            total += loss.item() / step_count
        return total, [t.grad for t in lp]

    one_loss, one_grad = run([[0, 1, 2, 3]])
    four_loss, four_grad = run([[2], [0, 3], [1]])  # uneven and out of order
    assert four_loss == pytest.approx(one_loss, abs=ATOL)
    for a, b in zip(one_grad, four_grad, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    # The step's value is the original's: Σ over samples of the reducer, / global batch size (or token count).
    lp_ref = [t.clone().requires_grad_(True) for t in x["lp"]]
    ref_loss, _ = _orig_policy_loss_function(cfg, lp_ref, x["old"], x["adv"], MASKS, x["ent"], x["ref"], None)
    assert one_loss == pytest.approx(ref_loss.item() / step_count, abs=ATOL)


def _orig_opsm(args, lp_list, old_list, adv_list, masks):
    # slime/utils/ppo_utils.py: compute_opsm_mask (the mask, 1 = kept)
    keep = []
    for lp, old, adv, m in zip(lp_list, old_list, adv_list, masks, strict=True):
        seq_kl = ((old - lp) * m).sum() / torch.clamp_min(m.sum(), 1)
        keep.append(1 - ((adv < 0) & (seq_kl > args.opsm_delta)).float())
    return torch.cat(keep)


@pytest.mark.parametrize("estimator", ["grpo", "gspo"])
def test_opsm_pg_loss_matches_the_original(estimator):
    cfg = _cfg(advantage_estimator=estimator, use_opsm=True, opsm_delta=1e-4, eps_clip=0.2, eps_clip_high=0.2)
    x = _inputs(seed=6)
    # Samples 0 and 3 drift (old > current), 1 and 2 do not; advantages of both signs.
    x["old"] = [lp + (0.3 if i in (0, 3) else -0.3) for i, lp in enumerate(x["lp"])]
    loss, metrics, lp = _ours_loss(cfg, x)
    loss.backward()

    lp_ref = [t.clone().requires_grad_(True) for t in x["lp"]]
    reduce = _orig_sum_of_sample_mean(MASKS, False)
    if estimator == "gspo":
        ppo_kl = _orig_gspo_kl(lp_ref, x["old"], MASKS)
    else:
        ppo_kl = torch.cat(x["old"]) - torch.cat(lp_ref)
    pg, _ = _orig_policy_loss(ppo_kl, torch.cat(x["adv"]), 0.2, 0.2)
    keep = _orig_opsm(cfg, [t.detach() for t in lp_ref], x["old"], x["adv"], MASKS)
    assert keep.min() == 0.0 and keep.max() == 1.0  # the case drops some tokens and keeps others
    ref_pg = reduce(pg * keep)
    ref_pg.backward()
    assert metrics["pg_loss"].item() == pytest.approx(ref_pg.item(), abs=ATOL)
    for ours, theirs in zip(lp, lp_ref, strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=ATOL, rtol=0)


def test_documented_deviation_log_ratio_beyond_20_is_capped_without_gradient():
    """MIGRATION.md "Numbers that differ": the original's exp(25)·|A| here is capped at exp(20)·|A|, no gradient."""
    cfg = _cfg(eps_clip_c=None)
    lp = torch.tensor([0.0, 0.0], requires_grad=True)
    old = torch.tensor([-25.0, -0.1])  # ratio e^25 on token 0, 1.105 on token 1
    adv = torch.tensor([-1.0, -1.0])
    loss, _ = compute_actor_loss(
        cfg,
        log_probs=[lp],
        old_log_probs=[old],
        advantages=[adv],
        loss_masks=[torch.ones(2)],
        loss_denominators=[2.0],
    )
    loss.backward()
    e20, e01 = torch.exp(torch.tensor(20.0)).item(), torch.exp(torch.tensor(0.1)).item()
    assert loss.item() == pytest.approx((e20 + e01) / 2)
    # Token 1 (inside the clamp) keeps the original's gradient -A·ratio/2; token 0 gets none.
    assert lp.grad.tolist() == pytest.approx([0.0, torch.exp(torch.tensor(0.1)).item() / 2], abs=1e-6)
    lp_ref = torch.tensor([0.0, 0.0], requires_grad=True)
    ref, _ = _orig_policy_loss(old - lp_ref, adv, 0.2, 0.2)
    (ref.sum() / 2).backward()
    assert lp_ref.grad[0].item() == pytest.approx(torch.exp(torch.tensor(25.0)).item() / 2, rel=1e-5)


def test_documented_deviation_per_token_denominator_counts_trainable_tokens_only():
    """MIGRATION.md "Numbers that differ": a removed sample adds 0 to the per-token denominator (original: 1)."""
    from slime_core.train_data import build_rollout_batches

    cfg = _cfg(
        n_samples_per_prompt=2,
        global_batch_size=2,
        calculate_per_token_loss=True,
        use_dynamic_batch_size=False,
        max_tokens_per_gpu=None,
        micro_batch_size=1,
        balance_data=False,
        custom_reward_post_process_path=None,
        reward_key=None,
        disable_rewards_normalization=False,
    )
    samples = [
        Sample(tokens=[1, 2, 3, 4], response_length=3, loss_mask=[1, 0, 1], reward=1.0, index=0, group_index=0),
        Sample(tokens=[1, 2, 3], response_length=2, reward=0.0, index=1, group_index=0, remove_sample=True),
    ]
    (batch,) = build_rollout_batches(cfg, samples, dp_size=1)
    assert batch.step_token_counts == [2.0]  # the original's num_tokens: max(2, 1) + max(0, 1) = 3
