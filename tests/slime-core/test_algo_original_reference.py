"""The policy loss against reference vectors computed from the original slime's own code.

`test_algo_original_parity` compares with hand transcriptions of the original; the vectors here come from running
the original itself, so a transcription slip cannot hide a difference.
"""

import pytest
import torch

from slime_core.algorithms import compute_actor_loss
from slime_core.config import SlimeArgs

_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})
_OFF = dict(
    eps_clip_c=None, entropy_coef=0.0, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="k1", kl_coef=0.0,
    use_tis=False, use_unbiased_kl=False, calculate_per_token_loss=False, use_rollout_logprobs=False, use_opsm=False,
    get_mismatch_metrics=False, custom_pg_loss_reducer_function_path=None, custom_tis_function_path=None,
)  # fmt: skip


def _cfg(**fields) -> SlimeArgs:
    return _CONFIG.model_copy(update={**_OFF, "advantage_estimator": "grpo", **fields})


# Computed once (issue 27, pass 53) by running the original's `policy_loss_function` (slime/backends/megatron_utils/
# loss.py at 624b824a8, with its ppo_utils, cp_utils and examples/train_infer_mismatch_helper/mis.py; torch.compile
# removed; megatron's mpu stubbed to one rank; its log-prob head replaced by the per-sample log-probs and entropies
# below, with grad) on these inputs. Samples 0 and 1 share a rollout (denominator 3 = its summed mask). Loss and
# metrics are the micro-batch sums the original returns; gradients are d loss / d log-probs and d loss / d entropy.
REF_LP = [[-0.4, -1.2, -0.7], [-2.0], [-0.3, -0.9]]
REF_OLD = [[-0.5, -1.0, -0.6], [-1.7], [-1.5, -1.9]]
REF_REF = [[-0.6, -1.1, -0.9], [-1.8], [-0.2, -1.0]]
REF_ROLL = [[-0.45, 0.0, -0.62], [-2.9], [-0.3, -0.85]]
REF_ENT = [[1.2, 0.4, 0.9], [2.0], [0.5, 0.7]]
REF_ADV = [[1.5, 1.5, 1.5], [-1.0], [-0.5, -0.5]]
REF_MASKS = [[1.0, 0.0, 1.0], [1.0], [1.0, 1.0]]
REF_DENOMS = [3.0, 3.0, 2.0]

REFERENCE = {
    # GSPO, asymmetric clip, dual clip c = 2, unbiased low_var_kl loss, entropy bonus.
    "gspo_dual_kl": (
        dict(
            advantage_estimator="gspo",
            eps_clip=0.05,
            eps_clip_high=0.08,
            eps_clip_c=2.0,
            use_kl_loss=True,
            kl_loss_coef=0.1,
            kl_loss_type="low_var_kl",
            use_unbiased_kl=True,
            entropy_coef=0.01,
        ),
        0.3002993,
        [-0.4926322, 0.0, -0.4939677, -0.0049388, -0.0166006, 0.0135914],
        [-0.0033333, 0.0, -0.0033333, -0.0033333, -0.005, -0.005],
        {
            "entropy_loss": 1.9666667,
            "kl_loss": 0.0329936,
            "loss": 0.3002993,
            "pg_clipfrac": 0.3333333,
            "pg_loss": 0.3166667,
            "ppo_kl": -1.0,
            "train_rollout_logprob_abs_diff": 1.5483334,
        },
    ),
    # CISPO with the MIS helper (--custom-tis-function-path ...mis.compute_mis_weights_with_cp there, built in
    # here): token mask mode, geometric rejection sampling, veto, batch normalization of the weights.
    "cispo_mis_rs": (
        dict(
            advantage_estimator="cispo",
            eps_clip=1.0,
            eps_clip_high=4.0,
            use_tis=True,
            tis_level="token",
            tis_mode="mask",
            tis_lower_bound=0.8,
            tis_upper_bound=1.25,
            use_rs=True,
            rs_level="geometric",
            rs_lower_bound=0.5,
            rs_upper_bound=2.0,
            rs_veto_threshold=0.5,
            tis_batch_normalize=True,
        ),
        0.4487411,
        [-0.4422547, 0.0, -0.3883418, 0.0, 0.0, 0.0],
        [0.0] * 6,
        {
            "entropy_loss": 0.7,
            "loss": 0.4487411,
            "mis_batch_norm_factor": 2.3770719,
            "mis_chi2_seq": 2.3133445,
            "mis_chi2_token": 2.429529,
            "mis_is_ratio_max_final": 1.7978234,
            "mis_is_ratio_mean_after_tis_rs": 2.0894153,
            "mis_is_ratio_mean_final": 1.757974,
            "mis_is_ratio_min_final": 1.7181246,
            "mis_k3_kl": 0.8244152,
            "mis_kl": 0.735,
            "mis_log_ppl_abs_diff": 1.5350001,
            "mis_log_ppl_diff": 0.735,
            "mis_ppl_ratio": 3.857357,
            "mis_rollout_log_ppl": 1.8983334,
            "mis_rollout_ppl": 8.9734783,
            "mis_rs_catastrophic_seq_fraction": 1.0,
            "mis_rs_catastrophic_token_fraction": 1.0,
            "mis_rs_mask_fraction_high": 0.3333333,
            "mis_rs_mask_fraction_low": 1.0,
            "mis_tis_mask_fraction_high": 0.3333333,
            "mis_tis_mask_fraction_low": 1.0,
            "mis_tis_weight_after_bound": 2.0894153,
            "mis_tis_weight_before_bound": 2.0894153,
            "mis_training_log_ppl": 2.6333334,
            "mis_training_ppl": 8.4540987,
            "ois": 3.9361415,
            "pg_clipfrac": 0.0,
            "pg_loss": 0.4487411,
            "ppo_kl": 0.0,
            "train_rollout_logprob_abs_diff": 0.0233333,
        },
    ),
    # PPO clip, truncated IS, OPSM (every token trainable in the dropped sample: the original's opsm_clipfrac and
    # this version's agree), k2 KL loss.
    "ppo_tis_opsm": (
        dict(
            eps_clip=0.2,
            eps_clip_high=0.28,
            use_tis=True,
            tis_clip=1.1,
            tis_clip_low=0.9,
            use_opsm=True,
            opsm_delta=0.05,
            use_kl_loss=True,
            kl_loss_coef=0.05,
            kl_loss_type="k2",
        ),
        0.372696,
        [-0.5223023, 0.0, -0.4582248, -0.0033333, 0.7445263, 0.6141134],
        [0.0] * 6,
        {
            "entropy_loss": 1.9666667,
            "kl_loss": 0.025,
            "loss": 0.372696,
            "ois": 3.9361415,
            "opsm_clipfrac": 1.0,
            "pg_clipfrac": 0.3333333,
            "pg_loss": 0.371446,
            "ppo_kl": -1.0,
            "tis": 2.0894153,
            "tis_abs": 1.4707971,
            "tis_clipfrac": 1.3333334,
            "train_rollout_logprob_abs_diff": 1.5483334,
        },
    ),
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_loss_metrics_and_gradients_match_reference_vectors_of_the_original(name):
    fields, want_loss, want_grad, want_ent_grad, want_metrics = REFERENCE[name]
    tensors = [torch.tensor(x) for x in REF_LP], [torch.tensor(x) for x in REF_ENT]
    lp = [t.requires_grad_(True) for t in tensors[0]]
    ent = [t.requires_grad_(True) for t in tensors[1]]
    loss, metrics = compute_actor_loss(
        _cfg(**fields),
        log_probs=lp,
        old_log_probs=[torch.tensor(x) for x in REF_OLD],
        advantages=[torch.tensor(x) for x in REF_ADV],
        loss_masks=[torch.tensor(x) for x in REF_MASKS],
        loss_denominators=REF_DENOMS,
        ref_log_probs=[torch.tensor(x) for x in REF_REF],
        rollout_log_probs=[torch.tensor(x) for x in REF_ROLL],
        entropy=ent,
        total_lengths=[7, 5, 6],
    )
    loss.backward()
    # Tolerance: the reference values are rounded to 7 decimals; fp32 sums of a few terms: atol 2e-6.
    assert loss.item() == pytest.approx(want_loss, abs=2e-6)
    torch.testing.assert_close(torch.cat([t.grad for t in lp]), torch.tensor(want_grad), atol=2e-6, rtol=0)
    torch.testing.assert_close(torch.cat([t.grad for t in ent]), torch.tensor(want_ent_grad), atol=2e-6, rtol=0)
    assert sorted(metrics) == sorted(want_metrics)  # the original's metric names, no more, no fewer
    for key, value in want_metrics.items():
        assert metrics[key].item() == pytest.approx(value, abs=2e-6), key
