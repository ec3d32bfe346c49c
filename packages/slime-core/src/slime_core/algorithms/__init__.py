"""RL algorithms as pure single-process tensor functions, chosen by name from registries.

Entry points for the shared train step (`slime_core.train_step`): `compute_advantages_and_returns` (once
per rollout, with the `--advantage-estimator` spec's function from `slime_core.estimators`),
`whitening_stats`/`apply_whitening` (`--normalize-advantages`), and the `--loss-type` dispatch
`compute_train_loss(cfg, LossInputs)` (once per micro-batch) over `compute_actor_loss`,
`compute_sft_loss` (and `compute_critic_loss`); `log_probs_from_logits`/`entropy_from_logits` on the
response logits.
"""

from slime_core.algorithms.advantages import compute_advantages_and_returns, discounted_cumsum
from slime_core.algorithms.kl import compute_approx_kl
from slime_core.algorithms.logprobs import (
    entropy_from_logits,
    log_probs_and_entropy_from_logits,
    log_probs_from_logits,
    shifted_logits,
)
from slime_core.algorithms.mis import compute_mis_weights, compute_mis_weights_with_cp, mismatch_metrics
from slime_core.algorithms.objective import compute_actor_loss, policy_loss_name
from slime_core.algorithms.policy_loss import (
    compute_cispo_loss,
    compute_opsm_mask,
    compute_policy_loss,
    sequence_mean_ppo_kl,
)
from slime_core.algorithms.reducers import default_reducer, drgrpo, sum_of_sample_mean, sum_of_token
from slime_core.algorithms.registry import (
    get_advantage_estimator,
    get_policy_loss,
    register_advantage,
    register_policy_loss,
)
from slime_core.algorithms.sft_loss import compute_sft_loss
from slime_core.algorithms.tis import compute_tis_weights, icepop_function, vanilla_tis_function
from slime_core.algorithms.top_p import KeptTokens, restricted_logsumexp, validate_top_p_offsets
from slime_core.algorithms.train_loss import LossInputs, compute_train_loss, needs_old_log_probs
from slime_core.algorithms.value_loss import compute_critic_loss, compute_value_loss
from slime_core.algorithms.whitening import apply_whitening, whitening_stats

__all__ = [
    "KeptTokens",
    "LossInputs",
    "apply_whitening",
    "compute_actor_loss",
    "compute_advantages_and_returns",
    "compute_approx_kl",
    "compute_cispo_loss",
    "compute_critic_loss",
    "compute_mis_weights",
    "compute_mis_weights_with_cp",
    "compute_opsm_mask",
    "compute_policy_loss",
    "compute_sft_loss",
    "compute_tis_weights",
    "compute_train_loss",
    "compute_value_loss",
    "default_reducer",
    "discounted_cumsum",
    "drgrpo",
    "entropy_from_logits",
    "get_advantage_estimator",
    "icepop_function",
    "get_policy_loss",
    "log_probs_and_entropy_from_logits",
    "log_probs_from_logits",
    "mismatch_metrics",
    "needs_old_log_probs",
    "policy_loss_name",
    "register_advantage",
    "register_policy_loss",
    "restricted_logsumexp",
    "sequence_mean_ppo_kl",
    "shifted_logits",
    "sum_of_sample_mean",
    "sum_of_token",
    "validate_top_p_offsets",
    "vanilla_tis_function",
    "whitening_stats",
]
