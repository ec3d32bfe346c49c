"""`slime.utils.ppo_utils`: the original's pure tensor RL functions, for plugins that import them.

A `--custom-loss-function-path`, `--custom-advantage-function-path` or `--custom-tis-function-path` written for the
original may import these by name. Each keeps the original's signature and runs `slime_core.algorithms`, so it
gives the built-in loss's numbers (same values as the original's to fp32 rounding, except where MIGRATION.md
"Numbers that differ" says: a log-ratio is clamped to ±20 before `exp`, a masked token never makes a sequence NaN).

Not carried: the functions that read Megatron's parallel groups (`_NOT_CARRIED`, each naming what does its work).

Legend: `T` concatenated response tokens, `B` rows, `L` padded row length; tensors float32.
"""

from __future__ import annotations

import torch

from slime_core.algorithms import kl as _kl
from slime_core.algorithms import policy_loss as _pl
from slime_core.algorithms.advantages import discounted_cumsum

__all__ = [
    "chunked_discounted_returns",
    "chunked_gae",
    "compute_approx_kl",
    "compute_cispo_loss",
    "compute_gspo_kl",
    "compute_policy_loss",
    "get_grpo_returns",
    "get_reinforce_plus_plus_baseline_advantages",
    "vanilla_gae",
]

compute_policy_loss = _pl.compute_policy_loss
compute_cispo_loss = _pl.compute_cispo_loss

# The original's functions that read Megatron's parallel groups, and what does their work here.
_NOT_CARRIED = {
    "compute_opsm_mask": "--use-opsm (slime_core.algorithms.policy_loss.compute_opsm_mask)",
    "get_reinforce_plus_plus_returns": "--advantage-estimator reinforce_plus_plus",
    "get_advantages_and_returns_batch": "--advantage-estimator ppo (chunked_gae here for one process)",
    "calculate_log_probs_and_entropy": "the trainer's log-prob head (slime_core.algorithms.logprobs)",
}


def __getattr__(name: str):
    """Names the replacement of a function of the original's module that is not carried (an ImportError)."""
    if name in _NOT_CARRIED:
        raise ImportError(
            f"slime.utils.ppo_utils.{name} is the original slime's and reads Megatron's parallel groups; this "
            f"version does not carry it: {_NOT_CARRIED[name]} does its work (MIGRATION.md 'Plugins')"
        )
    raise AttributeError(f"module 'slime.utils.ppo_utils' has no attribute {name!r}")


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_loss_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate k1 / k2 / k3 / low_var_kl (`slime_core.algorithms.kl.compute_approx_kl`).

    Args:
        log_probs: `[...]` current log-probs.
        log_probs_base: `[...]` base (reference) log-probs.
        kl_loss_type: "k1", "k2", "k3" or "low_var_kl" (the original's keyword).
        importance_ratio: optional `[...]` weight `exp(lp - lp_old)` (`--use-unbiased-kl`).

    Returns:
        `[...]` float32.

    Raises:
        ValueError: unknown type or mismatched shapes.
    """
    return _kl.compute_approx_kl(log_probs, log_probs_base, kl_loss_type, importance_ratio)


def compute_gspo_kl(
    full_log_probs: list[torch.Tensor],
    full_old_log_probs: list[torch.Tensor],
    local_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
) -> torch.Tensor:
    """GSPO's sequence log-ratio `Σ_t (lp_old - lp)·m / max(Σm, 1)` of each sample on each of its tokens, `[T]`.

    `local_log_probs` is the original's context-parallel shard; the loss gets whole responses here, so it has
    the same lengths as `full_log_probs` (`slime_core.algorithms.policy_loss.sequence_mean_ppo_kl`; Zheng et al.
    2025, arXiv:2507.18071).

    Args:
        full_log_probs: N `[L_i]` current log-probs of each response.
        full_old_log_probs: N `[L_i]` old (behaviour) log-probs.
        local_log_probs: N `[L_i]`; only their lengths are read.
        loss_masks: N `[L_i]` 1 = trainable token; a masked token adds 0 whatever its value.

    Returns:
        `[T]` float32, `T = Σ L_i`: sample i's mean log-ratio repeated on each of its tokens.
    """
    lengths = [int(lp.numel()) for lp in local_log_probs]
    ppo_kl = torch.cat([o - lp for o, lp in zip(full_old_log_probs, full_log_probs, strict=True)])
    mask = torch.cat([m.reshape(-1).to(ppo_kl.device) for m in loss_masks])
    return _pl.sequence_mean_ppo_kl(ppo_kl, mask, lengths)


def get_grpo_returns(rewards: torch.Tensor, kl: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each sample's scalar reward on each of its tokens (GRPO's advantages and returns).

    Args:
        rewards: `[N]` the group-normalized reward of each sample.
        kl: N `[L_i]`; only their shapes are read.

    Returns:
        N `[L_i]` tensors, each filled with its sample's reward.
    """
    return [torch.ones_like(k) * rewards[i] for i, k in enumerate(kl)]


def get_reinforce_plus_plus_baseline_advantages(
    rewards: torch.Tensor, kl: list[torch.Tensor], loss_masks: list[torch.Tensor], kl_coef: float
) -> list[torch.Tensor]:
    """REINFORCE++-baseline advantages before whitening: `r̃_i - kl_coef·kl_it` (Hu et al. 2025).

    Args:
        rewards: `[N]` group-baselined rewards `r̃_i`.
        kl: N `[L_i]` per-token KL to the reference.
        loss_masks: N `[L_i]`; unused, as in the original.
        kl_coef: `--kl-coef`.

    Returns:
        N `[L_i]` advantages.
    """
    return [torch.ones_like(k) * r - kl_coef * k for k, r in zip(kl, rewards, strict=False)]


def chunked_discounted_returns(rewards: torch.Tensor, discount: float, chunk_size: int = 128) -> torch.Tensor:
    """Reverse discounted sums `S_t = r_t + discount·S_{t+1}` of each row (`discounted_cumsum`).

    Args:
        rewards: `[B, L]` per-token rewards.
        discount: γ (or γλ for GAE).
        chunk_size: the original's chunk length; the values do not depend on it.

    Returns:
        `[B, L]`, `rewards`' dtype.

    Raises:
        ValueError: `rewards` is not 2-D.
    """
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [B, L], got shape {tuple(rewards.shape)}")
    rows = [discounted_cumsum(row, discount, chunk_size) for row in rewards]
    return torch.stack(rows).to(rewards.dtype) if rows else rewards.clone()


def chunked_gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float, chunk_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016) of `[B, L]` rows, the value after the last position 0: `(advantages, returns)`.

    `δ_t = r_t + γ V_{t+1} - V_t`, `A_t = Σ_l (γλ)^l δ_{t+l}`, returns `A + V`.

    Args:
        rewards: `[B, L]` per-token rewards.
        values: `[B, L]` critic values.
        gamma: discount γ.
        lambd: GAE λ.
        chunk_size: the original's chunk length; the values do not depend on it.

    Returns:
        `(advantages, returns)`, both `[B, L]`.

    Raises:
        ValueError: rewards and values are not both `[B, L]`.
    """
    if rewards.ndim != 2 or values.shape != rewards.shape:
        raise ValueError(f"rewards and values must both be [B, L], got {tuple(rewards.shape)}, {tuple(values.shape)}")
    next_values = torch.cat([values[:, 1:], values.new_zeros(values.shape[0], 1)], dim=1)
    advantages = chunked_discounted_returns(rewards + gamma * next_values - values, gamma * lambd, chunk_size)
    return advantages, advantages + values


def vanilla_gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same GAE as `chunked_gae` (the original's serial loop; one implementation here).

    Args:
        rewards: `[B, L]`.
        values: `[B, L]`.
        gamma: discount γ.
        lambd: GAE λ.

    Returns:
        `(advantages, returns)`, both `[B, L]`.

    Raises:
        ValueError: rewards and values are not both `[B, L]`.
    """
    return chunked_gae(rewards, values, gamma, lambd)
