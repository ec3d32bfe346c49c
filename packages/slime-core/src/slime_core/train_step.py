"""One RL training step on a rollout, written once for every backend: `train_on_rollout`.

Reads top to bottom like the original's `train_actor`:

1. old log-probs: the engine's with `--use-rollout-logprobs`; none when the training forward's detached
   log-probs are the old ones (`can_reuse_old_log_probs`) or the loss never reads them; else a forward;
2. reference log-probs when the backend holds a reference model; with `--use-opd`, the teacher's: scored
   during the rollout (`--opd-type sglang`, `RolloutBatch.teacher_log_probs`) or by the backend's teacher
   weights (`--opd-type megatron` / `fsdp`);
3. advantages (the `--advantage-estimator` spec's function; PPO's GAE reads the critic's values attached as
   `RolloutBatch.values`; OPD subtracts `--opd-kl-coef·(old - teacher)`), whitened over all data-parallel ranks
   with `--normalize-advantages`;
4. per optimizer step: the step's denominator (its global rollout count, or token count with
   `--calculate-per-token-loss`), forward + backward of its micro-batches with `compute_train_loss` as the
   loss, and the optimizer step; the metric sums stay on the device;
5. after the last step, one reduction over data-parallel ranks of every step's metric sums (each then divided by
   its step's denominator), the goodput counts and the rollout means (`slime_core.step_metrics`);
   `--ref-update-interval`, and the metrics averaged over steps.

Nothing between the forward of a micro-batch and the next step's waits for the GPU: host data goes to the device
without a sync (`slime_core.host_to_device`) and device values are read once, after the last step (issue 26).

Nothing here talks to `torch.distributed`: collectives, forward passes and the optimizer come from the
backend (`StepBackend`), which also keeps what is its own — how a loss is scaled for its gradient reduction
(FSDP2 averages over ranks, Megatron sums), how empty micro-batches keep collectives aligned, where metrics
live under pipeline parallelism.

Legend: `N` samples on this rank, `L_i` response length of sample i.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch

from slime_core.algorithms import (
    LossInputs,
    apply_whitening,
    compute_advantages_and_returns,
    compute_train_loss,
    default_reducer,
    needs_old_log_probs,
    whitening_stats,
)
from slime_core.algorithms.advantages import reward_kl
from slime_core.algorithms.reducers import sample_means
from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.config.opd import trainer_side_teacher
from slime_core.estimators import get_estimator
from slime_core.flops import model_config, throughput_metrics
from slime_core.goodput import trained_token_sums
from slime_core.hook_deadline import hooks_of_rollout
from slime_core.host_to_device import to_device_many
from slime_core.step_metrics import (
    check_grad_norms,
    length_means,
    length_sums,
    read_steps,
    rollout_mean_sums,
    rollout_means,
)

logger = logging.getLogger(__name__)

__all__ = [
    "MicroBatchLoss",
    "StepBackend",
    "can_reuse_old_log_probs",
    "entropy_has_grad",
    "records_routes",
    "runs_no_grad_forward",
    "step_denominator",
    "train_on_rollout",
]

MicroBatchLoss = Callable[[Sequence[int], list[torch.Tensor], list[torch.Tensor]], tuple[torch.Tensor, dict]]
"""`loss_fn(ids, log_probs, entropy) -> (loss, metrics)` for one non-empty micro-batch: `ids` are the local
sample positions in the batch, `log_probs` and `entropy` N×`[L_i]` float32 current-policy values (with grad) in
the order of `ids`. `loss` is a scalar SUM over the micro-batch's samples (not yet divided by the step's
denominator); `metrics` are detached scalars summed the same way."""


@runtime_checkable
class StepBackend(Protocol):
    """What a training backend supplies to `train_on_rollout` (every method is collective over its ranks)."""

    @property
    def has_ref(self) -> bool:
        """Whether reference weights are held (`init(..., with_ref=True)`)."""
        ...

    @property
    def has_teacher(self) -> bool:
        """Whether on-policy-distillation teacher weights are held (`--opd-type megatron` / `fsdp`)."""
        ...

    def compute_log_probs(self, batch: RolloutBatch, *, model: str = "actor") -> list[torch.Tensor]:
        """N `[L_i]` float32 response log-probs of the current (`actor`), reference (`ref`) or `teacher` weights."""
        ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of `tensor` over data-parallel ranks, on CPU (whitening statistics)."""
        ...

    def forward_backward(
        self, batch: RolloutBatch, step: int, loss_fn: MicroBatchLoss, *, denominator: float
    ) -> list[dict[str, torch.Tensor]]:
        """Zeroes gradients, then forward + backward over the micro-batches of optimizer step `step`.

        Calls `loss_fn` once per non-empty micro-batch and back-propagates its loss divided by `denominator`
        (scaled for the backend's gradient reduction so that the summed gradient is the mean over the
        step's global batch). Returns the metrics of the micro-batches this rank computed.
        """
        ...

    def optimizer_step(self) -> tuple[float | torch.Tensor, float]:
        """Clips, steps the optimizer and the LR schedule; returns (pre-clip grad norm, rate of this step).

        The grad norm may be a 0-d device tensor: it is read after the last step, with the other steps' (no sync
        between steps).
        """
        ...

    def reduce_metric_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Sums per-metric values over data-parallel ranks; every rank returns the same dict."""
        ...

    def reset_optimizer_states(self) -> None:
        """Drops the optimizer moments (`--reset-optimizer-states`)."""
        ...

    def update_ref(self) -> None:
        """Makes the current weights the reference weights (`--ref-update-interval`)."""
        ...


def can_reuse_old_log_probs(cfg: SlimeArgs, batch: RolloutBatch) -> bool:
    """Whether the training forward's detached log-probs can stand in for the old-policy ones.

    True when the rollout trains in one optimizer step (every micro-batch then sees the weights the data
    was scored with, so `old = detach(current)` exactly), without reward-shaping KL or on-policy distillation
    (`--kl-coef` and `--use-opd` need the old log-probs before training, for the advantages), and the
    estimator's spec allows it; never when `--use-routing-replay` records routes there (`records_routes`).
    """
    return _reuses_old_log_probs(cfg, batch.num_steps)


def runs_no_grad_forward(cfg: SlimeArgs) -> bool:
    """Whether a train step at this config runs a model forward without gradients before training.

    That is: reference log-probs (`--use-kl-loss` / `--kl-coef`: `cfg.with_ref`), a trainer-side teacher's
    (`--use-opd` with `--opd-type fsdp|megatron`), a critic's values (`--advantage-estimator ppo`), or the
    actor's old log-probs (`_old_log_probs`, `_mismatch_train_log_probs`), judged with
    `cfg.num_steps_per_rollout` steps a rollout. The compile warm-up skips its no-grad graphs when False (its
    graphs are then never used). A step whose batch has another step count than the config's may differ.
    """
    if cfg.with_ref or trainer_side_teacher(cfg) or cfg.advantage_estimator == "ppo":
        return True
    reuses = _reuses_old_log_probs(cfg, cfg.num_steps_per_rollout or 1)
    if cfg.use_rollout_logprobs:
        return bool(cfg.get_mismatch_metrics) and not reuses
    return records_routes(cfg) or (needs_old_log_probs(cfg) and not reuses)


def _reuses_old_log_probs(cfg: SlimeArgs, num_steps: int) -> bool:
    if num_steps != 1 or cfg.kl_coef != 0 or cfg.use_opd:
        return False
    if records_routes(cfg):
        return False  # --use-routing-replay records its routes in the old-log-prob forward (as the original)
    return get_estimator(cfg.advantage_estimator).reuses_old_log_probs


def step_denominator(cfg: SlimeArgs, batch: RolloutBatch, step: int) -> float:
    """What step `step`'s summed loss is divided by: its global rollout count, or token count per-token.

    The rollout count is the original's `step_global_batch_size` (`loss_function`, `reduce_train_step_metrics`):
    samples that fanned out of one rollout share its token-mean denominator (`loss_denominators`), so their sum
    is that rollout's mean and the rollout counts once. Without `RolloutBatch.step_rollout_counts` every sample
    is its own rollout (`step_sample_counts`).

    Raises:
        ValueError: the batch's step counts do not have one entry per step.
    """
    if cfg.calculate_per_token_loss:
        name = "step_token_counts"
    else:
        name = "step_rollout_counts" if batch.step_rollout_counts else "step_sample_counts"
    counts = getattr(batch, name)
    if len(counts) != batch.num_steps:
        raise ValueError(f"RolloutBatch.{name} must have one entry per step ({batch.num_steps})")
    return max(float(counts[step]), 1.0)


def records_routes(cfg: SlimeArgs) -> bool:
    """Whether the old-log-prob forward records MoE routes (`--use-routing-replay` alone).

    The training forwards replay what it recorded, so that forward always runs.
    """
    return cfg.use_routing_replay and not cfg.use_rollout_routing_replay


def _old_log_probs(cfg: SlimeArgs, backend: StepBackend, batch: RolloutBatch) -> list[torch.Tensor] | None:
    if cfg.use_rollout_logprobs:
        return list(batch.rollout_log_probs)
    if (can_reuse_old_log_probs(cfg, batch) or not needs_old_log_probs(cfg)) and not records_routes(cfg):
        return None  # the micro-batch loss takes detach(current); sft_loss never reads them
    return backend.compute_log_probs(batch)


def _mismatch_train_log_probs(cfg: SlimeArgs, backend: StepBackend, batch: RolloutBatch) -> list[torch.Tensor] | None:
    """The trainer's log-probs for `--get-mismatch-metrics` when the old ones are the engine's (else None).

    With `--use-rollout-logprobs` the loss never needs the trainer's own old log-probs, but the metrics compare
    them with the engine's: as in the original, they are computed, or taken from the training forward (detached)
    when the rollout trains in one step.
    """
    if not (cfg.get_mismatch_metrics and cfg.use_rollout_logprobs) or can_reuse_old_log_probs(cfg, batch):
        return None
    return backend.compute_log_probs(batch)


def _teacher_log_probs(cfg: SlimeArgs, backend: StepBackend, batch: RolloutBatch) -> list[torch.Tensor] | None:
    if not cfg.use_opd:
        return None
    if batch.teacher_log_probs is not None:
        return list(batch.teacher_log_probs)  # --opd-type sglang: scored during the rollout
    if backend.has_teacher:
        return backend.compute_log_probs(batch, model="teacher")
    raise ValueError(
        f"--use-opd --opd-type {cfg.opd_type}: the batch has no teacher_log_probs and the trainer holds no teacher"
    )


def _advantages(
    cfg: SlimeArgs, backend: StepBackend, batch: RolloutBatch, old, ref, teacher
) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
    """`(advantages, returns)`, N `[L_i]` each (advantages whitened with `--normalize-advantages`), or Nones."""
    if cfg.disable_compute_advantages_and_returns:
        return None, None  # SFT / custom losses that need no advantages
    if get_estimator(cfg.advantage_estimator).needs_critic and batch.values is None:
        raise ValueError(
            f"--advantage-estimator {cfg.advantage_estimator} needs the critic's values in RolloutBatch.values "
            "(the trainer app attaches them after the critic step)"
        )
    adv, returns = compute_advantages_and_returns(
        cfg,
        rewards=list(batch.rewards),
        loss_masks=batch.loss_masks,
        log_probs=old,
        ref_log_probs=ref,
        values=None if batch.values is None else list(batch.values),
        teacher_log_probs=teacher,
        total_lengths=batch.total_lengths,
        rollout_log_probs=None if batch.rollout_log_probs is None else list(batch.rollout_log_probs),
    )
    if cfg.normalize_advantages:
        # Masked whitening over the whole DP group: the (count, sum, sum of squares) statistics are summed.
        stats = backend.all_reduce_sum(whitening_stats(adv, batch.loss_masks))
        adv = apply_whitening(adv, batch.loss_masks, stats)
    return adv, returns


def _opd_reverse_kl(cfg: SlimeArgs, inputs: LossInputs, student, teacher) -> torch.Tensor:
    """The reduced sampled reverse KL `student - teacher` (the original's `opd_reverse_kl` metric)."""
    lengths = inputs.response_lengths
    reduce = default_reducer(cfg.calculate_per_token_loss, lengths, inputs.loss_masks, inputs.loss_denominators)
    diff = torch.cat([s.float() - t.float() for s, t in zip(student, teacher, strict=True)]) if lengths else None
    return reduce(diff).detach() if diff is not None else torch.zeros(())


def _reverse_kls(student: list[torch.Tensor] | None, teacher: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    """Per sample `student - teacher` (`[L_i]` float32): the original's `rollout_data["opd_reverse_kl"]`.

    None without OPD (no teacher) or without old log-probs.
    """
    if student is None or teacher is None:
        return None
    return [s.float() - t.to(s.device).float() for s, t in zip(student, teacher, strict=True)]


def entropy_has_grad(cfg: SlimeArgs) -> bool:
    """Whether the loss back-propagates through the entropy: `--entropy-coef` != 0 or a `custom_loss`.

    Otherwise the step detaches it (a metric only), and the log-prob head's backward has no entropy term: a
    different graph for a compiled head (the compile warm-up must warm the one the run uses).
    """
    return cfg.entropy_coef != 0 or cfg.loss_type == "custom_loss"


def _micro_batch_loss(
    cfg: SlimeArgs,
    batch: RolloutBatch,
    old,
    ref,
    adv,
    teacher,
    trainer=None,
    seen_old: dict[int, torch.Tensor] | None = None,
    returns=None,
) -> MicroBatchLoss:
    entropy_grad = entropy_has_grad(cfg)  # the entropy keeps its graph only when a loss term can use it
    # A custom loss gets the original's other batch keys too (its plugin may read them); the others never do.
    custom = cfg.loss_type == "custom_loss"
    values = list(batch.values) if custom and batch.values is not None else None

    def loss_fn(ids, log_probs, entropy):
        device = log_probs[0].device

        def pick(xs: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
            # One non-blocking copy per series and micro-batch: a per-sample `.to(device)` synchronized each time.
            return None if xs is None else to_device_many([xs[i] for i in ids], device)

        masks = pick(batch.loss_masks)
        if seen_old is not None:
            # The detached training log-probs are the trainer's old ones here: record them for `rollout/log_probs`
            # (`sample_means_sum` of each sample, as 0-d tensors on the device: no sync).
            lengths = [int(m.numel()) for m in masks]
            means = sample_means(lengths, masks, [batch.loss_denominators[i] for i in ids])
            flat = torch.cat([lp.detach().reshape(-1).float() for lp in log_probs])
            for i, mean in zip(ids, means(flat).unbind(), strict=True):
                seen_old[i] = mean

        inputs = LossInputs(
            log_probs=log_probs,
            old_log_probs=pick(old) if old is not None else [lp.detach() for lp in log_probs],
            advantages=pick(adv),
            loss_masks=masks,
            loss_denominators=[float(batch.loss_denominators[i]) for i in ids],
            ref_log_probs=pick(ref),
            rollout_log_probs=pick(batch.rollout_log_probs),
            entropy=entropy if entropy_grad else [e.detach() for e in entropy],
            total_lengths=[int(batch.tokens[i].numel()) for i in ids],
            tokens=[batch.tokens[i] for i in ids],
            train_log_probs=pick(trainer),
            returns=pick(returns) if custom else None,
            values=pick(values),
            teacher_log_probs=pick(teacher) if custom else None,
        )
        loss, metrics = compute_train_loss(cfg, inputs)
        if teacher is not None:
            # The student is what the advantages used: the old log-probs (the rollout's with --use-rollout-logprobs).
            metrics["opd_reverse_kl"] = _opd_reverse_kl(cfg, inputs, inputs.old_log_probs, pick(teacher))
        return loss, metrics

    return loss_fn


def _optimizer_step(
    cfg: SlimeArgs, backend: StepBackend, batch: RolloutBatch, step: int, loss_fn: MicroBatchLoss
) -> tuple[dict[str, list], dict[str, float]]:
    """Step `step`: `(its micro-batches' metrics by name, left on the device; grad norm, rate, batch size)`."""
    denominator = step_denominator(cfg, batch, step)
    micro_metrics = backend.forward_backward(batch, step, loss_fn, denominator=denominator)
    grad_norm, lr = backend.optimizer_step()
    # Read after the last step (`read_steps`): a read here would wait for this step's optimizer kernels before the
    # host could queue the next step's forward.
    values: dict[str, list] = {}
    for metrics in micro_metrics:
        for key, value in metrics.items():
            values.setdefault(key, []).append(value)
    out = {"train/grad_norm": grad_norm}
    # The original's per-step `train/global_batch_size`: the step's rollout count (uneven steps show here).
    out["train/global_batch_size"] = float((batch.step_rollout_counts or batch.step_sample_counts)[step])
    out["train/lr"] = lr
    out["train/lr-pg_0"] = lr  # the original's name (one per Megatron param group; every group here has this rate)
    return values, out


def _step_metrics(
    cfg: SlimeArgs, batch: RolloutBatch, steps: list[tuple[dict[str, list], dict[str, float]]], reduced
) -> list[dict[str, float]]:
    """Each step's `train/*` dict: its reduced metric sums over its denominator, then the step's own values.

    The names come from `reduced`, not from this rank's `values`: a pipeline stage without the loss (every stage but
    the last) computed none, and its `reduce_metric_sums` hands it the last stage's sums. Named from its own empty
    `values`, the first stage (the rank whose metrics a run logs) reported no `train/loss` at PP > 1.
    """
    out = []
    for j, (_, own) in enumerate(steps):
        denominator = step_denominator(cfg, batch, j)
        prefix = f"steps/{j}/"
        names = sorted(key[len(prefix) :] for key in reduced if key.startswith(prefix))
        metrics = {f"train/{key}": reduced[prefix + key] / denominator for key in names}
        out.append({**metrics, **own})
    return out


def train_on_rollout(
    cfg: SlimeArgs, backend: StepBackend, rollout_id: int, batch: RolloutBatch
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Old/ref log-probs, advantages, then `batch.num_steps` optimizer steps (collective; see module docstring).

    Args:
        cfg: run config; reads the loss and advantage fields (`compute_train_loss`,
            `compute_advantages_and_returns`) plus `use_rollout_logprobs`, `normalize_advantages`,
            `disable_compute_advantages_and_returns`, `calculate_per_token_loss`, `reset_optimizer_states`,
            `ref_update_interval`, `check_for_nan_in_loss_and_grad`.
        backend: the rank's training backend.
        rollout_id: id of the rollout (for `--ref-update-interval` and the log line).
        batch: this rank's data with its micro-batch schedule.

    Returns:
        `(metrics, step_metrics)`: `train/*` metrics averaged over the steps, each reduced over all DP ranks
        and divided by its step's denominator, with `train/grad_norm` (pre-clip, mean over steps),
        `train/global_batch_size` (the steps' rollout count, mean over steps) and
        `train/lr` (rate of the last step; also as the original's `train/lr-pg_0`); the original's trainer-side
        `rollout/log_probs`, `rollout/ref_log_probs`, `rollout/advantages`, `rollout/returns`, (PPO)
        `rollout/values`, (`--kl-coef`) `rollout/kl` and (`--use-opd`) `rollout/teacher_log_probs`,
        `rollout/opd_reverse_kl` (per-rollout means over trainable tokens, averaged over the rollouts);
        `goodput/tokens_trained` and `goodput/tokens_zero_advantage`
        (trainable tokens with a non-zero / zero advantage, summed over DP ranks); `perf/log_probs_time`,
        `perf/ref_log_probs_time`, `perf/teacher_log_probs_time` (OPD), `perf/actor_train_time` (this rank's
        wall seconds); and the per-step dicts.

    Raises:
        ValueError: `--use-rollout-logprobs` without rollout log-probs in the batch, a batch without
            optimizer steps or step counts, or any error of the loss / advantage computation (a trainer-side hook's
            names its flag, path and `rollout_id`).
        RuntimeError: a step's gradient norm is NaN or inf, unless `--no-check-for-nan-in-loss-and-grad`
            (`step_metrics.check_grad_norms`).
    """
    with hooks_of_rollout(rollout_id):
        return _train_on_rollout(cfg, backend, rollout_id, batch)


def _train_on_rollout(
    cfg: SlimeArgs, backend: StepBackend, rollout_id: int, batch: RolloutBatch
) -> tuple[dict[str, float], list[dict[str, float]]]:
    if cfg.use_rollout_logprobs and batch.rollout_log_probs is None:
        raise ValueError("--use-rollout-logprobs needs rollout log-probs in the batch")
    if batch.num_steps == 0:
        raise ValueError("RolloutBatch has no optimizer step (empty micro_batches)")
    if cfg.reset_optimizer_states:
        backend.reset_optimizer_states()
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    old = _old_log_probs(cfg, backend, batch)
    trainer = _mismatch_train_log_probs(cfg, backend, batch)
    t1 = time.perf_counter()
    ref = backend.compute_log_probs(batch, model="ref") if backend.has_ref else None
    t2 = time.perf_counter()
    teacher = _teacher_log_probs(cfg, backend, batch)  # OPD: from the batch (engine teacher) or a forward here
    t_teacher = time.perf_counter()
    adv, returns = _advantages(cfg, backend, batch, old, ref, teacher)
    # Goodput: trainable tokens whose advantage is non-zero (summed over data-parallel ranks after training).
    fates = trained_token_sums(adv, batch.loss_masks)
    # `rollout/log_probs` is the trainer's old log-probs (the original's rollout_data["log_probs"]): computed, or
    # recorded in the training forward when it stands in for them; never the engine's (`--use-rollout-logprobs`
    # makes `old` the engine's: their mean is `rollout/rollout_log_probs`, and the trainer's exist only with
    # `--get-mismatch-metrics`, as in the original).
    if cfg.use_rollout_logprobs:
        record = trainer is None and cfg.get_mismatch_metrics
    else:
        record = old is None
    seen_old: dict[int, torch.Tensor] | None = {} if record else None
    loss_fn = _micro_batch_loss(cfg, batch, old, ref, adv, teacher, trainer, seen_old, returns)
    t3 = time.perf_counter()
    steps = [_optimizer_step(cfg, backend, batch, step, loss_fn) for step in range(batch.num_steps)]
    step_totals, owns = read_steps(steps)  # one read of every step's metric sums and grad norm
    if cfg.check_for_nan_in_loss_and_grad:
        check_grad_norms(owns, "train/grad_norm")
    steps = list(zip([v for v, _ in steps], owns, strict=True))
    values = None if batch.values is None else list(batch.values)  # PPO: the critic's
    series = {
        "log_probs": seen_old if record else (trainer if cfg.use_rollout_logprobs else old),
        "ref_log_probs": ref,
        "advantages": adv,
        "returns": returns,
        "values": values,
        # The reward-shaping KL the advantages used (`rollout/kl`), only with --kl-coef: without it it is all zeros.
        "kl": reward_kl(cfg, batch.loss_masks, old, ref) if cfg.kl_coef != 0 else None,
        # OPD, as the original's rollout_data: the teacher's log-probs and the reverse KL the advantages used
        # (student = the old log-probs, the rollout's with --use-rollout-logprobs).
        "teacher_log_probs": teacher,
        "opd_reverse_kl": _reverse_kls(old, teacher),
    }
    # One reduction over data-parallel ranks for the steps' metrics, the goodput counts, the rollout means and the
    # token counts of the FLOPs (the old log-probs are known only now).
    sums = {**step_totals, **fates}
    reduced = backend.reduce_metric_sums({**sums, **rollout_mean_sums(batch, series), **length_sums(batch)})
    per_step = _step_metrics(cfg, batch, steps, reduced)
    fates = {key: value for key, value in reduced.items() if not key.startswith(("rollout/", "lengths/", "steps/"))}
    times.update({"perf/log_probs_time": t1 - t0, "perf/ref_log_probs_time": t2 - t1})
    if cfg.use_opd:
        times["perf/teacher_log_probs_time"] = t_teacher - t2
    times["perf/actor_train_time"] = time.perf_counter() - t3
    # The forwards whose time `perf/*_tflops` divides by: the old log-probs' only when the trainer computed them.
    forwards_ran = ["perf/actor_train_time"]
    if ref is not None:
        forwards_ran.append("perf/ref_log_probs_time")
    if trainer is not None or (old is not None and not cfg.use_rollout_logprobs):
        forwards_ran.append("perf/log_probs_time")
    interval = cfg.ref_update_interval
    if backend.has_ref and interval and (rollout_id + 1) % interval == 0:
        backend.update_ref()  # --ref-update-interval: the reference follows the actor
    metrics = {key: sum(m[key] for m in per_step) / len(per_step) for key in per_step[0]}
    metrics["train/lr"] = metrics["train/lr-pg_0"] = per_step[-1]["train/lr"]
    metrics.update(rollout_means(reduced, sum(batch.step_rollout_counts)))
    metrics.update({f"goodput/{key}": value for key, value in fates.items()})
    metrics.update(times)
    metrics.update(length_means(reduced))
    config = model_config(cfg.hf_checkpoint)
    if config is not None:
        gpus = cfg.actor_num_nodes * cfg.actor_num_gpus_per_node
        metrics.update(throughput_metrics(config, reduced["lengths/total.sum"], reduced["lengths/total_sq.sum"],
                                          reduced["lengths/response.sum"], gpus,
                                          {key: times[key] for key in forwards_ran}))  # fmt: skip
    # DEBUG: the summary line of each rollout and TensorBoard/W&B carry these; at INFO it repeated them per rank.
    logger.debug("rollout %d: %s", rollout_id, {k: round(v, 6) for k, v in metrics.items()})
    return metrics, per_step
