"""Advantage estimators and `compute_advantages_and_returns`, the entry the trainers call.

Legend: `N` samples, `L_i` response length of sample i; all per-token tensors are `[L_i]` float32.

Advantage functions of the estimators registered in `slime_core.estimators` (`--advantage-estimator`):

| name | advantage `A_t` | returns |
|---|---|---|
| grpo, gspo, cispo | the (already group-normalized) scalar reward on every token | A |
| rloo | leave-one-out reward `r_i - mean_{j≠i} r_j` (computed in reward post-processing), minus `kl_coef·kl_t` | A |
| reinforce_plus_plus | discounted return of `ρ_t = -kl_coef·kl_t·m_t` + reward at last masked-in token | A |
| reinforce_plus_plus_baseline | `r̃ - kl_coef·kl_t` (reward already group-mean-centred) | A |
| ppo | GAE(γ, λ) over `ρ_t = -kl_coef·kl_t` + reward at the last token, with critic values | A + V |
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from slime_core.algorithms.kl import compute_approx_kl
from slime_core.config import SlimeArgs, plugin_view
from slime_core.error_text import preview, shape_or_type
from slime_core.estimators import get_estimator
from slime_core.hook_deadline import call_hook_with_deadline, hook_bounds, hook_label
from slime_core.plugins import load_function

logger = logging.getLogger(__name__)

__all__ = [
    "broadcast_reward_advantages",
    "compute_advantages_and_returns",
    "discounted_cumsum",
    "ppo_gae_advantages",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "reward_kl",
    "rloo_advantages",
]

_SCAN_CHUNK = 128


def discounted_cumsum(x: torch.Tensor, discount: float, chunk_size: int = _SCAN_CHUNK) -> torch.Tensor:
    """Reverse discounted cumulative sum `y_t = Σ_{l≥0} discount^l · x_{t+l}`.

    Computed as a chunked scan: inside a chunk of `C` tokens one `[C, C]` upper-triangular matmul,
    across chunks a carry `y_t += discount^(end - t) · y_end` from the chunk after. This keeps the
    number of sequential steps at `L / C` and never forms `discount^(-t)` (which overflows).

    Args:
        x: `[L]` float tensor.
        discount: factor in `[0, 1]` (γ for returns, γλ for GAE).
        chunk_size: tokens per chunk.

    Returns:
        `[L]` float32.
    """
    x = x.float()
    length = x.shape[0]
    if length == 0:
        return x.clone()
    if discount == 1.0:
        return x.flip(0).cumsum(0).flip(0)
    c = min(chunk_size, length)
    idx = torch.arange(c, device=x.device, dtype=torch.float64)
    offset = idx[None, :] - idx[:, None]  # [C, C], j - i
    # Built in float64 so discount^offset does not underflow to a wrong value before the cast.
    weights = torch.where(offset >= 0, discount ** offset.clamp(min=0), 0.0).float()
    out = torch.empty_like(x)
    carry = x.new_zeros(())
    for end in range(length, 0, -c):
        start = max(0, end - c)
        n = end - start
        local = weights[:n, :n] @ x[start:end]
        decay = discount ** (n - idx[:n])  # discount^(end - t) for t in [start, end)
        out[start:end] = local + decay.float() * carry
        carry = out[start]
    return out


def _broadcast(rewards: Sequence[float], loss_masks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [
        torch.full(m.shape, float(r), dtype=torch.float32, device=m.device)
        for r, m in zip(rewards, loss_masks, strict=True)
    ]


def broadcast_reward_advantages(cfg: SlimeArgs, *, rewards, loss_masks, kl, values):
    """GRPO (Shao et al. 2024, DeepSeekMath), GSPO, CISPO: `A_t = r̃` on every token; returns = A.

    `rewards` are expected already group-normalized by the rollout side; `kl_coef` is not applied.
    """
    advantages = _broadcast(rewards, loss_masks)
    return advantages, [a.clone() for a in advantages]


def reinforce_plus_plus_baseline_advantages(cfg: SlimeArgs, *, rewards, loss_masks, kl, values):
    """REINFORCE++-baseline (Hu et al. 2025): `A_t = r̃ - kl_coef·kl_t` (r̃ group-mean-centred upstream)."""
    advantages = [a - cfg.kl_coef * k for a, k in zip(_broadcast(rewards, loss_masks), kl, strict=True)]
    return advantages, [a.clone() for a in advantages]


def rloo_advantages(cfg: SlimeArgs, *, rewards, loss_masks, kl, values):
    """RLOO (Ahmadian et al. 2024): leave-one-out baseline within each group.

    `rewards` are already leave-one-out centred by `slime_core.train_data.postprocess_rewards`
    (`r_i - (Σ_{j∈g} r_j - r_i)/(n-1)`, computed where whole groups are visible); here they are broadcast:
    `A_{i,t} = r̃_i - kl_coef·kl_{i,t}`.
    """
    advantages = [a - cfg.kl_coef * k for a, k in zip(_broadcast(list(rewards), loss_masks), kl, strict=True)]
    return advantages, [a.clone() for a in advantages]


def reinforce_plus_plus_advantages(cfg: SlimeArgs, *, rewards, loss_masks, kl, values):
    """REINFORCE++ (Hu et al. 2025): discounted return of the KL-shaped token reward.

    `ρ_t = -kl_coef·kl_t·m_t`, plus the scalar reward at the last token with `m_t = 1` (nothing
    added to an all-masked sample); `A_t = G_t = Σ_l γ^l ρ_{t+l}` (`--gamma`).
    """
    advantages = []
    for r, m, k in zip(rewards, loss_masks, kl, strict=True):
        m = m.float()
        token_rewards = -cfg.kl_coef * k.float() * m
        trainable = torch.nonzero(m > 0).flatten()
        if trainable.numel():
            token_rewards[trainable[-1]] += float(r)
        advantages.append(discounted_cumsum(token_rewards, cfg.gamma))
    return advantages, [a.clone() for a in advantages]


def ppo_gae_advantages(cfg: SlimeArgs, *, rewards, loss_masks, kl, values):
    """PPO with GAE (Schulman et al. 2016, arXiv:1506.02438).

    `ρ_t = -kl_coef·kl_t` plus the scalar reward at the last response token;
    `δ_t = ρ_t + γ V_{t+1} - V_t` with `V_L = 0`; `A_t = Σ_l (γλ)^l δ_{t+l}`; returns `A + V`.
    As in the original, all response tokens take part (the mask is not used).

    Raises:
        ValueError: if `values` is None or a values tensor does not match its mask's shape.
    """
    if values is None:
        raise ValueError("advantage estimator 'ppo' needs critic values (values=None)")
    advantages, returns = [], []
    for i, (r, m, k, v) in enumerate(zip(rewards, loss_masks, kl, values, strict=True)):
        if v.shape != m.shape:
            raise ValueError(f"values[{i}] has shape {tuple(v.shape)}, expected {tuple(m.shape)}")
        v = v.detach().float()
        token_rewards = -cfg.kl_coef * k.float()
        if token_rewards.numel():
            token_rewards[-1] += float(r)
        next_values = torch.cat([v[1:], v.new_zeros(1)])
        deltas = token_rewards + cfg.gamma * next_values - v
        adv = discounted_cumsum(deltas, cfg.gamma * cfg.lambd)
        advantages.append(adv)
        returns.append(adv + v)
    return advantages, returns


def _check_list(name: str, tensors, loss_masks: Sequence[torch.Tensor], who: str = "") -> None:
    """Check that `tensors` is one tensor per sample shaped like its loss mask (`[L_i]`); None passes.

    Args:
        name: what the list is called in the error (`log_probs`, `rollout_data['advantages']`).
        tensors: N tensors `[L_i]`, or None.
        loss_masks: N tensors `[L_i]`.
        who: who produced `tensors` (a plugin's flag and path), named first in the error.

    Raises:
        ValueError: not a list of N, an entry not a tensor, or an entry's shape differs from its loss mask's.
    """
    if tensors is None:
        return
    wrong = None
    if not isinstance(tensors, list | tuple) or len(tensors) != len(loss_masks):
        wrong = f"{type(tensors).__name__} {preview(tensors)}"
    else:
        for i, (t, m) in enumerate(zip(tensors, loss_masks, strict=True)):
            if not isinstance(t, torch.Tensor) or t.shape != m.shape:
                wrong = f"{shape_or_type(t)} at sample {i}, where its loss mask has shape {tuple(m.shape)}"
                break
    if wrong is not None:
        # One value per response token, as the loss reads them: a list of floats (one per sample) failed later as
        # "'float' object has no attribute 'shape'", a tensor of N as a shape error; neither named who made it.
        raise ValueError(
            f"{who}{name} must be a list of {len(loss_masks)} tensors shaped like loss_masks (one value per "
            f"response token), got {wrong}"
        )


def compute_advantages_and_returns(
    cfg: SlimeArgs,
    *,
    rewards: list[float],
    loss_masks: list[torch.Tensor],
    log_probs: list[torch.Tensor] | None = None,
    ref_log_probs: list[torch.Tensor] | None = None,
    values: list[torch.Tensor] | None = None,
    teacher_log_probs: list[torch.Tensor] | None = None,
    total_lengths: list[int] | None = None,
    rollout_log_probs: list[torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-token advantages and returns for one rollout's samples (one DP rank's share).

    The reward-shaping KL `kl_t = KL(log_probs, ref_log_probs)` (`--kl-loss-type`) is computed when
    `cfg.kl_coef != 0`, else zeros. The advantage function is the `--advantage-estimator` spec's
    (`slime_core.estimators`). Pass as `log_probs` the "old" log-probs (recomputed by the
    trainer, or the rollout log-probs with `--use-rollout-logprobs`). Whitening
    (`--normalize-advantages`) is separate: see `whitening_stats`/`apply_whitening`, because its
    statistics are all-reduced over DP ranks by the backend.

    With `--custom-advantage-function-path`, `fn(args, rollout_data)` (the plugin receives `cfg` as `args`)
    replaces the estimator: it gets a
    dict with `rewards`, `loss_masks`, `response_lengths`, `total_lengths`, `log_probs`, `ref_log_probs`,
    `rollout_log_probs` (the engine's), `values`, `teacher_log_probs` and `kl` (the reward-shaping KL above,
    N `[L_i]`, as the original computes it before calling the plugin) and must set `rollout_data["advantages"]`
    and `["returns"]` (N `[L_i]` each).
    On-policy distillation (`--use-opd`) then subtracts `opd_kl_coef·(log_probs - teacher_log_probs)`
    from the advantages (returns unchanged).

    Args:
        cfg: run config; reads `advantage_estimator`, `kl_coef`, `kl_loss_type`, `gamma`, `lambd`,
            `custom_advantage_function_path`, `use_opd`, `opd_kl_coef`.
        rewards: N floats. For grpo/gspo/cispo the group-normalized reward, for
            reinforce_plus_plus_baseline the group-mean-centred one, for rloo, reinforce_plus_plus and ppo
            the RAW reward. For rloo the N samples must be whole groups, each group consecutive.
        loss_masks: N tensors `[L_i]`, 1 = trainable token.
        log_probs: N tensors `[L_i]`, old log-probs; needed when kl_coef != 0.
        ref_log_probs: N tensors `[L_i]`, reference log-probs; needed when kl_coef != 0.
        values: N tensors `[L_i]`, critic values; needed by ppo.
        teacher_log_probs: N tensors `[L_i]`, OPD teacher log-probs; needed with `--use-opd`.
        total_lengths: N prompt + response lengths in tokens (the custom advantage function's `total_lengths`).
        rollout_log_probs: N tensors `[L_i]`, the engine's log-probs (given to the custom advantage function).

    Returns:
        `(advantages, returns)`: two lists of N `[L_i]` float32 tensors (no grad).

    Raises:
        KeyError: unknown estimator.
        ValueError: mismatched lengths/shapes, or inputs the configuration needs are missing.
        slime_core.plugins.PluginError: the custom advantage function cannot be loaded.
    """
    if len(rewards) != len(loss_masks):
        raise ValueError(f"rewards has {len(rewards)} entries, loss_masks has {len(loss_masks)}")
    inputs = {
        "log_probs": log_probs,
        "ref_log_probs": ref_log_probs,
        "values": values,
        "teacher_log_probs": teacher_log_probs,
    }
    for name, tensors in inputs.items():
        _check_list(name, tensors, loss_masks)
    use_opd = cfg.use_opd
    if use_opd and (log_probs is None or teacher_log_probs is None):
        raise ValueError("--use-opd needs log_probs and teacher_log_probs")
    with torch.no_grad():
        kl = reward_kl(cfg, loss_masks, log_probs, ref_log_probs)
        custom_path = cfg.custom_advantage_function_path
        if custom_path:
            extra = {"kl": kl, "rollout_log_probs": rollout_log_probs}
            if total_lengths is not None:
                extra["total_lengths"] = list(total_lengths)
            advantages, returns = _custom_advantages(cfg, custom_path, rewards, loss_masks, {**inputs, **extra})
        else:
            estimator = get_estimator(cfg.advantage_estimator).advantage_fn()
            advantages, returns = estimator(cfg, rewards=rewards, loss_masks=loss_masks, kl=kl, values=values)
        if use_opd:
            coef = cfg.opd_kl_coef
            advantages = [
                a - coef * (lp.float() - t.float())
                for a, lp, t in zip(advantages, log_probs, teacher_log_probs, strict=True)
            ]
        return advantages, returns


def _custom_advantages(args: SlimeArgs, path, rewards, loss_masks, inputs):
    # A user plugin: it keeps the original `fn(args, rollout_data)` signature.
    fn = load_function(path, flag="--custom-advantage-function-path")
    rollout_data = {
        "rewards": list(rewards),
        "loss_masks": loss_masks,
        "response_lengths": [int(m.shape[0]) for m in loss_masks],
        **inputs,
    }
    what = hook_label(f"--custom-advantage-function-path {path}")
    call_hook_with_deadline(fn, plugin_view(args), rollout_data, what=what, **hook_bounds(args))
    for key in ("advantages", "returns"):
        if key not in rollout_data:
            raise ValueError(f"{what} did not set rollout_data[{key!r}]")
        _check_list(f"rollout_data[{key!r}]", rollout_data[key], loss_masks, who=f"{what}: ")
    return [a.float() for a in rollout_data["advantages"]], [r.float() for r in rollout_data["returns"]]


def reward_kl(cfg: SlimeArgs, loss_masks, log_probs, ref_log_probs) -> list[torch.Tensor]:
    """The reward-shaping KL (`--kl-coef`): per token `compute_approx_kl(log_probs, ref_log_probs, --kl-loss-type)`.

    The original's `rollout_data["kl"]` (`compute_advantages_and_returns`, `slime/backends/megatron_utils/loss.py`).

    Args:
        cfg: run config; reads `kl_coef`, `kl_loss_type`.
        loss_masks: N `[L_i]` (shapes only).
        log_probs: N `[L_i]` old log-probs, or None when `kl_coef` is 0.
        ref_log_probs: N `[L_i]` reference log-probs, or None when `kl_coef` is 0.

    Returns:
        N `[L_i]` float32; zeros when `kl_coef` is 0.

    Raises:
        ValueError: `kl_coef != 0` without log-probs or reference log-probs.
    """
    if cfg.kl_coef == 0:
        return [torch.zeros(m.shape, dtype=torch.float32, device=m.device) for m in loss_masks]
    if log_probs is None or ref_log_probs is None:
        raise ValueError("--kl-coef != 0 needs log_probs and ref_log_probs (is --ref-load set?)")
    return [compute_approx_kl(lp, ref, cfg.kl_loss_type) for lp, ref in zip(log_probs, ref_log_probs, strict=True)]
