"""The MIS helper and the mismatch metrics (`slime_core.algorithms.mis`) on hand-computed values.

Three samples, `Δ = lp_train - lp_rollout` on their trainable tokens:
A: Δ = [0.5, 0.0]; B: Δ = [0.0, (masked), -0.3]; C: Δ = [0.4, 0.5].
Expected values are written out from the formulas (exp by hand to 6 digits); tolerance abs 1e-5 (float32).
"""

import math

import pytest
import torch

from slime_core.algorithms import compute_actor_loss, compute_mis_weights, mismatch_metrics
from slime_core.algorithms.mis import compute_mis_weights_with_cp
from slime_core.config import ConfigError, SlimeArgs

ATOL = 1e-5
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})

TRAIN = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5, -3.0, -1.0]), torch.tensor([-0.6, -0.5])]
# B's masked token carries the engine's 0.0 placeholder (a tool token); it must not enter any value.
ROLL = [torch.tensor([-1.5, -2.0]), torch.tensor([-0.5, 0.0, -0.7]), torch.tensor([-1.0, -1.0])]
MASKS = [torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0])]


def _args(**fields) -> SlimeArgs:
    base = dict(use_tis=True, tis_level="token", tis_mode="truncate", tis_lower_bound=0.5, tis_upper_bound=2.0)
    base.update(use_rs=False, rs_level="token", rs_lower_bound=0.5, rs_upper_bound=2.0, rs_veto_threshold=None)
    base.update(tis_batch_normalize=False)
    base.update(fields)
    return _CONFIG.model_copy(update=base)


def test_mismatch_metrics_per_sample_values():
    m = mismatch_metrics(TRAIN, ROLL, MASKS)
    a, b = slice(0, 2), slice(2, 5)
    assert m["training_log_ppl"][a].tolist() == pytest.approx([1.5, 1.5], abs=ATOL)  # -mean(-1, -2)
    assert m["training_ppl"][0].item() == pytest.approx(4.481689, abs=ATOL)  # e^1.5
    assert m["rollout_log_ppl"][0].item() == pytest.approx(1.75, abs=ATOL)
    assert m["rollout_ppl"][0].item() == pytest.approx(5.754603, abs=ATOL)  # e^1.75
    assert m["kl"][a].tolist() == pytest.approx([-0.5, 0.0], abs=ATOL)  # lp_roll - lp_train
    assert m["k3_kl"][0].item() == pytest.approx(math.e**0.5 - 0.5 - 1, abs=ATOL)  # 0.148721
    assert m["log_ppl_diff"][0].item() == pytest.approx(-0.25, abs=ATOL)  # mean(roll) - mean(train)
    assert m["log_ppl_abs_diff"][0].item() == pytest.approx(0.25, abs=ATOL)
    assert m["ppl_ratio"][0].item() == pytest.approx(0.778801, abs=ATOL)  # e^-0.25
    assert m["chi2_token"][0].item() == pytest.approx((math.e + 1) / 2 - 1, abs=ATOL)  # mean(ρ²) - 1 = 0.859141
    assert m["chi2_seq"][0].item() == pytest.approx(math.e - 1, abs=ATOL)  # (e^0.5)² - 1
    # B: only tokens 0 and 2 count; the masked token's values are 0 (the 0.0 placeholder is ignored).
    assert m["training_log_ppl"][b].tolist() == pytest.approx([0.75] * 3, abs=ATOL)  # -mean(-0.5, -1.0)
    assert m["rollout_log_ppl"][2].item() == pytest.approx(0.6, abs=ATOL)  # -mean(-0.5, -0.7)
    assert m["kl"][b].tolist() == pytest.approx([0.0, 0.0, 0.3], abs=ATOL)
    assert m["chi2_seq"][2].item() == pytest.approx(math.exp(-0.6) - 1, abs=ATOL)  # exp(2·(-0.3)) - 1


def test_sequence_level_truncate():
    weights, masks, metrics = compute_mis_weights(
        _args(tis_level="sequence"), train_log_probs=TRAIN, rollout_log_probs=ROLL, loss_masks=MASKS
    )
    # w = exp(Σ Δ): A e^0.5 = 1.648721; B e^-0.3 = 0.740818 (0 on its masked token); C e^0.9 = 2.459603 → 2.
    assert weights[0].tolist() == pytest.approx([1.648721] * 2, abs=ATOL)
    assert weights[1].tolist() == pytest.approx([0.740818, 0.0, 0.740818], abs=ATOL)
    assert weights[2].tolist() == pytest.approx([2.0, 2.0], abs=ATOL)
    assert [m.tolist() for m in masks] == [m.tolist() for m in MASKS]  # truncation rejects nothing
    assert metrics["tis_truncate_fraction"][2].tolist() == [1.0, 1.0]
    assert metrics["tis_weight_before_bound"][2][0].item() == pytest.approx(2.459603, abs=ATOL)
    assert metrics["is_ratio_max_final"][1].tolist() == pytest.approx([0.740818] * 3, abs=ATOL)


def test_geometric_level_clip_and_batch_normalize():
    weights, _, _ = compute_mis_weights(
        _args(tis_level="geometric", tis_mode="clip", tis_lower_bound=0.9, tis_upper_bound=1.5),
        train_log_probs=TRAIN,
        rollout_log_probs=ROLL,
        loss_masks=MASKS,
    )
    # exp(mean Δ): A e^0.25 = 1.284025; B e^-0.15 = 0.860708 → clipped to 0.9; C e^0.45 = 1.568312 → 1.5.
    assert [w[0].item() for w in weights] == pytest.approx([1.284025, 0.9, 1.5], abs=ATOL)
    normed, _, metrics = compute_mis_weights(
        _args(tis_level="sequence", tis_batch_normalize=True),
        train_log_probs=TRAIN,
        rollout_log_probs=ROLL,
        loss_masks=MASKS,
    )
    mean = (1.648721 + 0.740818 + 2.0) / 3  # the mean over samples of each sample's weight: 1.463180
    assert [w[0].item() for w in normed] == pytest.approx([1.648721 / mean, 0.740818 / mean, 2.0 / mean], abs=ATOL)
    assert metrics["batch_norm_factor"][0][0].item() == pytest.approx(mean, abs=ATOL)


def test_token_mask_mode_rejection_and_veto():
    train = [torch.tensor([0.0, 0.0, 0.0]), torch.tensor([0.0, 0.0])]
    roll = [torch.tensor([math.log(3.0), 0.0, -math.log(3.0)]), torch.tensor([0.0, math.log(20.0)])]
    masks = [torch.ones(3), torch.ones(2)]
    args = _args(tis_mode="mask", use_rs=True, rs_lower_bound=0.2, rs_upper_bound=5.0, rs_veto_threshold=0.1)
    weights, new_masks, metrics = compute_mis_weights(
        args, train_log_probs=train, rollout_log_probs=roll, loss_masks=masks
    )
    # Ratios 1/3, 1, 3: outside [0.5, 2] the token leaves the loss but its weight stays (mask mode).
    assert weights[0].tolist() == pytest.approx([1 / 3, 1.0, 3.0], abs=ATOL)
    assert new_masks[0].tolist() == [0.0, 1.0, 0.0]
    assert metrics["tis_mask_fraction_low"][0].tolist() == [1.0, 0.0, 0.0]
    # Sample 1 holds a ratio 1/20 < 0.1: the veto drops the whole response.
    assert new_masks[1].tolist() == [0.0, 0.0]
    assert metrics["rs_catastrophic_seq_fraction"][1].tolist() == [1.0, 1.0]
    assert metrics["rs_catastrophic_token_fraction"][1].tolist() == [0.0, 1.0]


def test_without_use_tis_only_measures():
    pg = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    out, masks, metrics = compute_mis_weights_with_cp(
        _args(use_tis=False), pg_loss=pg, train_log_probs=TRAIN, rollout_log_probs=ROLL, loss_masks=MASKS
    )
    assert out is pg and masks is MASKS
    assert {"mis_kl", "mis_k3_kl", "mis_chi2_seq", "mis_training_ppl"} <= set(metrics)
    assert not any(name.startswith("mis_tis") for name in metrics)


def test_actor_loss_with_sequence_is_and_mismatch_metrics():
    """Through `compute_actor_loss`: old = trainer log-probs; every advantage 1 and log_probs = old (ratio 1)."""
    adv = [torch.ones(len(m)) for m in MASKS]
    kwargs = dict(
        log_probs=[t.clone().requires_grad_(True) for t in TRAIN],
        old_log_probs=TRAIN,
        advantages=adv,
        loss_masks=MASKS,
        loss_denominators=[2.0, 2.0, 2.0],
        rollout_log_probs=ROLL,
    )
    base = dict(entropy_coef=0.0, use_kl_loss=False, eps_clip_c=None, custom_tis_function_path=None)
    loss, metrics = compute_actor_loss(_args(tis_level="sequence", **base), **kwargs)
    # pg per token = -1 · w; per sample mean over its 2 trainable tokens: -(1.648721 + 0.740818 + 2.0).
    assert loss.item() == pytest.approx(-(1.648721 + 0.740818 + 2.0), abs=ATOL)
    assert metrics["mis_tis_truncate_fraction"].item() == pytest.approx(1.0, abs=ATOL)  # C only: 0 + 0 + 1
    # --get-mismatch-metrics without --use-tis: the loss stays -3, the metrics are the helper's.
    plain, gap = compute_actor_loss(_args(use_tis=False, get_mismatch_metrics=True, **base), **kwargs)
    assert plain.item() == pytest.approx(-3.0, abs=ATOL)
    assert gap["mis_kl"].item() == pytest.approx((-0.5 + 0.0) / 2 + 0.3 / 2 + (-0.9) / 2, abs=ATOL)
    assert gap["ois"].item() == pytest.approx(3.0, abs=ATOL)  # exp(lp - old) = 1 per sample
    # Token TIS (the default --use-tis function) with --get-mismatch-metrics: its tis metrics plus the helper's.
    _, both = compute_actor_loss(_args(get_mismatch_metrics=True, **base), **kwargs)
    assert {"tis", "tis_clipfrac", "mis_kl", "mis_chi2_token"} <= set(both)
    assert both["mis_kl"].item() == pytest.approx(gap["mis_kl"].item(), abs=ATOL)


def test_get_mismatch_metrics_needs_rollout_log_probs():
    lp = [torch.tensor([-1.0])]
    with pytest.raises(ValueError, match="--get-mismatch-metrics needs rollout_log_probs"):
        compute_actor_loss(
            _args(use_tis=False, get_mismatch_metrics=True),
            log_probs=lp,
            old_log_probs=lp,
            advantages=[torch.ones(1)],
            loss_masks=[torch.ones(1)],
            loss_denominators=[1.0],
        )


def test_config_of_the_original_mis_yaml(tmp_path):
    # The settings of the original's examples/train_infer_mismatch_helper/mis.yaml, through --custom-config-path.
    path = tmp_path / "mis.yaml"
    path.write_text(
        "use_tis: true\nuse_rs: true\ntis_level: sequence\nrs_level: token\ntis_mode: truncate\n"
        "tis_lower_bound: 0.5\ntis_upper_bound: 2.0\nrs_lower_bound: null\nrs_upper_bound: null\n"
        "rs_veto_threshold: 1.0e-4\ntis_batch_normalize: true\n"
    )
    from slime_core.config import parse_args

    args = parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--custom-config-path", str(path)])
    assert (args.tis_level, args.use_rs, args.rs_veto_threshold) == ("sequence", True, 1e-4)
    assert (args.rs_lower_bound, args.rs_upper_bound) == (0.5, 2.0)  # filled from the TIS bounds
    assert args.custom_config == {}  # every key is a field here
    plain = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "tis_clip": 4.0})
    assert (plain.tis_upper_bound, plain.tis_lower_bound) == (4.0, 0.25)  # --tis-clip, then 1 / upper
    assert SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "get_mismatch_metrics": True})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"use_tis": True, "tis_mode": "icepop", "tis_level": "sequence"}, "icepop is token-level"),
        ({"use_tis": True, "tis_level": "geometric", "tis_batch_normalize": True}, "not geometric"),
        ({"use_tis": True, "tis_lower_bound": 3.0, "tis_upper_bound": 2.0}, "--tis-lower-bound"),
    ],
)
def test_config_rejects(fields, message):
    with pytest.raises(ConfigError, match=message):
        SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields})
