"""The PPO critic, written once for every backend: its role config and its training step on a rollout.

`critic_config(cfg)` is the run config as the critic's trainer sees it (the original's critic role
overrides): `--critic-lr`, `--critic-lr-warmup-iters`, `--critic-load`, `--critic-save` replace the actor's
optimizer and checkpoint settings; the actor-only terms (reward KL, OPD, a custom advantage function, the HF
export) are off.

`train_critic_on_rollout` reads top to bottom like the original's `train_critic`:

1. values `V` of every response token with the critic's current weights (one forward, no grad);
2. returns `R = GAE(rewards, V) + V` (`--gamma`, `--lambd`; the reward at the last response token, no KL
   term: the critic sees no log-probs, as in the original);
3. prediction metrics of `V` against `R` over the loss-masked tokens of all data-parallel ranks (two small
   reductions: the means, then the centred squares);
4. per optimizer step: forward + backward of the clipped value loss (`--value-clip`) against `V` and `R`,
   the optimizer step; after the last step, every step's metric sums read from the device once, reduced over
   data-parallel ranks in one reduction and divided by their step's denominator;
5. `V` is returned: the actor's advantages use the same values (`RolloutBatch.values`).

Legend: `N` samples on this rank, `L_i` response length of sample i.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch

from slime_core.algorithms.value_loss import compute_critic_loss
from slime_core.batch import RolloutBatch
from slime_core.checkpoint_dirs import critic_dirs
from slime_core.config import SlimeArgs
from slime_core.estimators import get_estimator
from slime_core.host_to_device import to_device_many
from slime_core.step_metrics import check_grad_norms, read_steps
from slime_core.train_step import step_denominator

logger = logging.getLogger(__name__)

__all__ = [
    "CriticStepBackend",
    "ValueLoss",
    "critic_config",
    "train_critic_on_rollout",
    "value_prediction_stats",
]

ValueLoss = Callable[[Sequence[int], list[torch.Tensor]], tuple[torch.Tensor, dict]]
"""`loss_fn(ids, values) -> (loss, metrics)` for one non-empty micro-batch: `ids` are local sample positions,
`values` N×`[L_i]` float32 current critic values (with grad) in the order of `ids`; `loss` is a SUM over the
micro-batch's samples, `metrics` detached scalars summed the same way (as `slime_core.train_step.MicroBatchLoss`)."""


@runtime_checkable
class CriticStepBackend(Protocol):
    """What a critic backend supplies to `train_critic_on_rollout` (every method is collective)."""

    def compute_values(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """N `[L_i]` float32 values (CPU) of the response tokens with the current weights."""
        ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of `tensor` over data-parallel ranks, on CPU."""
        ...

    def forward_backward(
        self, batch: RolloutBatch, step: int, loss_fn: ValueLoss, *, denominator: float
    ) -> list[dict[str, torch.Tensor]]:
        """Zeroes gradients, then forward + backward over step `step`'s micro-batches with `loss_fn`.

        As `slime_core.train_step.StepBackend.forward_backward`, with the value head's output in place of the
        log-probs.
        """
        ...

    def optimizer_step(self) -> tuple[float | torch.Tensor, float]:
        """Clips, steps the optimizer and the LR schedule; returns (pre-clip grad norm, rate of this step).

        The grad norm may be a 0-d device tensor, read after the last step (`StepBackend.optimizer_step`).
        """
        ...

    def reduce_metric_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Sums per-metric values over data-parallel ranks; every rank returns the same dict."""
        ...

    def reset_optimizer_states(self) -> None:
        """Drops the optimizer moments (`--reset-optimizer-states`)."""
        ...


def critic_config(cfg: SlimeArgs) -> SlimeArgs:
    """The run config of the critic's trainer ranks.

    Args:
        cfg: the validated run config (`--advantage-estimator ppo`).

    Returns:
        A copy (not re-validated: every value comes from validated fields) where `lr` is `--critic-lr` (else
        `--lr`), `lr_warmup_iters` is `--critic-lr-warmup-iters` (which also drops the actor's
        `--lr-warmup-fraction`; else `--lr-warmup-iters` / `--lr-warmup-fraction`), `load` is
        `--critic-load` (else `<--load>/critic`), `save` is `--critic-save` (else `<--save>/critic`), and
        `kl_coef`, `use_kl_loss`, `use_opd`, `opd_type`, `opd_teacher_load`, `custom_advantage_function_path`,
        `save_hf`, `ref_update_interval` are off (the original's critic role overrides).

    Raises:
        ValueError: the estimator needs no critic.
    """
    if not get_estimator(cfg.advantage_estimator).needs_critic:
        raise ValueError(f"--advantage-estimator {cfg.advantage_estimator} trains no critic")
    load, save = critic_dirs(cfg)
    own_warmup = cfg.critic_lr_warmup_iters is not None
    return cfg.model_copy(
        update={
            "lr": cfg.critic_lr if cfg.critic_lr is not None else cfg.lr,
            "lr_warmup_iters": cfg.critic_lr_warmup_iters if own_warmup else cfg.lr_warmup_iters,
            # The actor's --lr-warmup-fraction would win over the critic's own warmup steps (both schedules take the
            # fraction first) or, with steps > 0, be refused naming --lr-warmup-iters, a flag the user did not give.
            "lr_warmup_fraction": None if own_warmup else cfg.lr_warmup_fraction,
            "load": load,
            "save": save,
            "kl_coef": 0.0,
            "use_kl_loss": False,
            "use_opd": False,
            "opd_type": None,
            "opd_teacher_load": None,
            "custom_advantage_function_path": None,
            "save_hf": None,
            "ref_update_interval": None,
        }
    )


def value_prediction_stats(
    values: Sequence[torch.Tensor],
    returns: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor],
    centre: tuple[float, float] = (0.0, 0.0),
) -> torch.Tensor:
    """Masked sums `[Σm, ΣVm, ΣRm, Σ(R-c_R)²m, Σ(E-c_E)²m]` (float64, `E = R - V`), summable over ranks.

    Called twice: with `centre=(0, 0)` for the counts and means, then with the global means as `centre` for the
    variances. The one-pass `ΣR² - (ΣR)²/n` cancels catastrophically: 8k returns all 123.456 gave a variance of
    1e-10 and an explained variance of -5e11 where it is undefined.

    Args:
        values: N `[L_i]` critic values.
        returns: N `[L_i]` returns.
        masks: N `[L_i]` loss masks in {0, 1}.
        centre: `(c_R, c_E)` subtracted before squaring.

    Returns:
        `[5]` float64 on CPU.
    """
    stats = torch.zeros(5, dtype=torch.float64)
    centre_r, centre_e = centre
    for v, r, m in zip(values, returns, masks, strict=True):
        v64, r64, m64 = v.detach().double().cpu(), r.detach().double().cpu(), m.double().cpu()
        err = r64 - v64
        stats += torch.stack(
            [m64.sum(), (v64 * m64).sum(), (r64 * m64).sum(), ((r64 - centre_r).square() * m64).sum(),
             ((err - centre_e).square() * m64).sum()]
        )  # fmt: skip
    return stats


# Returns whose standard deviation is below this share of their root mean square are equal up to float32 rounding.
_EQUAL_RETURNS_RTOL = 1e-6


def _prediction_metrics(backend: CriticStepBackend, values, returns, masks) -> dict[str, float]:
    """`explained_variance = 1 - Var(R - V) / Var(R)`, value and return means, return std (collective).

    Explained variance is undefined when every return is the same (a first rollout whose rewards are all equal, a
    critic-only run on a solved task): it is then left out of the metrics (`return_std` 0 says why; the driver
    names it once), where a NaN made the tracker warn of non-finite metrics on every such rollout and a clamped
    denominator gave a made-up number. The original logs no explained variance.
    """
    count, sum_v, sum_r, _, _ = (
        float(x) for x in backend.all_reduce_sum(value_prediction_stats(values, returns, masks))
    )
    if count <= 0:
        return {}
    mean_r, mean_e = sum_r / count, (sum_r - sum_v) / count
    centred = backend.all_reduce_sum(value_prediction_stats(values, returns, masks, centre=(mean_r, mean_e)))
    var_r, var_e = float(centred[3]) / count, float(centred[4]) / count
    metrics = {"value_mean": sum_v / count, "return_mean": mean_r, "return_std": math.sqrt(var_r)}
    if var_r > _EQUAL_RETURNS_RTOL**2 * (var_r + mean_r**2):
        metrics["explained_variance"] = 1.0 - var_e / var_r
    return metrics


def _returns(cfg: SlimeArgs, batch: RolloutBatch, values: list[torch.Tensor]) -> list[torch.Tensor]:
    # The estimator's own function (GAE for ppo) with a zero KL term: the critic has no log-probs.
    zeros = [torch.zeros(m.shape, dtype=torch.float32) for m in batch.loss_masks]
    estimator = get_estimator(cfg.advantage_estimator).advantage_fn()
    with torch.no_grad():
        _adv, returns = estimator(
            cfg, rewards=list(batch.rewards), loss_masks=batch.loss_masks, kl=zeros, values=values
        )
    return [r.float() for r in returns]


def _value_loss(cfg: SlimeArgs, batch: RolloutBatch, old_values, returns) -> ValueLoss:
    def loss_fn(ids, values):
        device = values[0].device
        n = len(ids)
        # One non-blocking copy for the three series (`to_device_many`): a per-sample `.to(device)` waited for the
        # micro-batch's value forward each time (issue 26).
        moved = to_device_many([*(old_values[i] for i in ids), *(returns[i] for i in ids),
                                *(batch.loss_masks[i] for i in ids)], device)  # fmt: skip
        return compute_critic_loss(
            cfg,
            values=values,
            old_values=moved[:n],
            returns=moved[n : 2 * n],
            loss_masks=moved[2 * n :],
            loss_denominators=[float(batch.loss_denominators[i]) for i in ids],
        )

    return loss_fn


def _optimizer_step(
    cfg, backend: CriticStepBackend, batch: RolloutBatch, step: int, loss_fn
) -> tuple[dict[str, list], dict[str, float]]:
    """Step `step`: `(its micro-batches' metrics by name, left on the device; grad norm and rate)`."""
    micro_metrics = backend.forward_backward(batch, step, loss_fn, denominator=step_denominator(cfg, batch, step))
    grad_norm, lr = backend.optimizer_step()
    # Read after the last step (`read_steps`): a `float()` here waited for each micro-batch's backward in turn.
    values: dict[str, list] = {}
    for metrics in micro_metrics:
        for key, value in metrics.items():
            values.setdefault(key, []).append(value)
    return values, {"grad_norm": grad_norm, "lr": lr}


def _per_step(cfg, batch: RolloutBatch, steps: list[tuple[dict[str, list], dict]], reduced) -> list[dict[str, float]]:
    """Each step's metrics: its reduced sums (`steps/<j>/<name>`) over its denominator, then grad norm and rate."""
    out = []
    for j, (_, own) in enumerate(steps):
        prefix, denominator = f"steps/{j}/", step_denominator(cfg, batch, j)
        sums = {key[len(prefix) :]: value for key, value in reduced.items() if key.startswith(prefix)}
        out.append({**{key: sums[key] / denominator for key in sorted(sums)}, **own})
    return out


def train_critic_on_rollout(
    cfg: SlimeArgs, backend: CriticStepBackend, rollout_id: int, batch: RolloutBatch
) -> tuple[dict[str, float], list[torch.Tensor]]:
    """Values, returns, then `batch.num_steps` critic optimizer steps (collective; see module docstring).

    Args:
        cfg: the critic's config (`critic_config`); reads `advantage_estimator`, `gamma`, `lambd`, `value_clip`,
            `calculate_per_token_loss`, `reset_optimizer_states`.
        backend: the rank's critic backend.
        rollout_id: id of the rollout (for the log line).
        batch: this rank's data with its micro-batch schedule (`rewards` are the raw rewards of the ppo spec).

    Returns:
        `(metrics, values)`: `train/critic-*` metrics — `value_loss`, `value_clipfrac` (means over the steps of
        the DP-reduced, denominator-normalized sums), `grad_norm` (mean), `lr` (last step), and, over all
        ranks' masked tokens before the update, `value_mean`, `return_mean`, `return_std` and
        `explained_variance` (left out where the returns are all equal: undefined); and the N `[L_i]` float32
        values before the update (CPU).

    Raises:
        ValueError: a batch without optimizer steps, or an error of the estimator / value loss.
    """
    if batch.num_steps == 0:
        raise ValueError("RolloutBatch has no optimizer step (empty micro_batches)")
    if cfg.reset_optimizer_states:
        backend.reset_optimizer_states()
    values = [v.float().cpu() for v in backend.compute_values(batch)]
    returns = _returns(cfg, batch, values)
    prediction = _prediction_metrics(backend, values, returns, batch.loss_masks)
    loss_fn = _value_loss(cfg, batch, values, returns)
    steps = [_optimizer_step(cfg, backend, batch, step, loss_fn) for step in range(batch.num_steps)]
    # One device-to-host read (every step's metric sums and grad norm) and one reduction over data-parallel ranks.
    sums, owns = read_steps(steps)
    if cfg.check_for_nan_in_loss_and_grad:
        check_grad_norms(owns, "grad_norm")
    steps = list(zip([v for v, _ in steps], owns, strict=True))
    per_step = _per_step(cfg, batch, steps, backend.reduce_metric_sums(sums))
    metrics = {key: sum(m[key] for m in per_step) / len(per_step) for key in per_step[0]}
    metrics["lr"] = per_step[-1]["lr"]
    metrics.update(prediction)
    metrics = {f"train/critic-{key}": value for key, value in metrics.items()}
    logger.debug("rollout %d critic: %s", rollout_id, {k: round(v, 6) for k, v in metrics.items()})
    return metrics, values
