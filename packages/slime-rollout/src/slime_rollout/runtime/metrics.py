"""Rollout-side metrics with the original names.

`rollout/raw_reward`, `rollout/rewards` (after group normalization), `rollout/response_len/{mean,median,max,min}`
(trainable tokens), `rollout/truncated_ratio`, `rollout/repetition_frac`, `rollout/rollout_log_probs` (mean engine
log-prob over trainable tokens; the trainer's side logs `rollout/log_probs`), `rollout/zero_std/count_{reward}`,
`rollout/dynamic_filter/drop_{reason}`, `perf/rollout_time`, `perf/tokens_per_gpu_per_sec`,
`perf/effective_tokens_per_gpu_per_sec`, `perf/longest_sample_tokens_per_sec`,
`perf/longest_effective_sample_tokens_per_sec`, `perf/*non_generation*` (`non_generation_metrics`),
`rollout/top_p_kept_vocab_per_token` (top-p replay),
`rollout/round_number` (samples whose metadata has one), `rollout/num_empty_responses` (samples without a response
token, not in the original); with `--log-passrate` `passrate/pass@{k}`, with `--log-reward-category KEY`
`rollout/error_cat/{category}`, with `--log-multi-turn` `multi_turn/...` (`multi_turn_metrics`). Source of the
names: the original's `slime/observability/rollout_metrics.py` and `train_metric_utils.py`.
"""

from __future__ import annotations

import collections
import logging
import math
import numbers
import statistics
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slime_core.sample import Sample, Status
from slime_core.train_data import loss_denominators, postprocess_rewards, rollout_keys

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "compute_rollout_metrics",
    "flatten_groups",
    "has_repetition",
    "multi_turn_metrics",
    "non_generation_metrics",
    "pass_at_k",
    "post_processed_reward_metrics",
    "response_metrics",
    "reward_category_shares",
    "reward_value",
    "rollout_log_probs_mean",
    "sample_set_metrics",
    "throughput_metrics",
    "top_p_kept_per_token",
    "zero_std_counts",
    "zero_std_counts_of",
]

# The original's repetition test (`has_repetition`): the last 10,000 characters of a response longer than that
# compress more than 10:1 with zlib level 9.
_REPETITION_WINDOW = 10_000
_REPETITION_RATIO = 10.0


def flatten_groups(groups: Any, what: str = "the rollout", where: str = "groups") -> list[Sample]:
    """All samples of (nested) lists of samples, in order, flattened as the original does.

    Groups of samples, a group entry that is itself a list (fan-out generate) and a flat list of samples (a custom
    rollout function's) all flatten the same way; anything else failed far from its cause (`'Sample' object is not
    iterable`, or a None reaching the trainer).

    Args:
        groups: a `Sample` or a list whose entries are, recursively, `Sample`s or lists.
        what: what produced them, for the error (e.g. `"--rollout-function-path my.fn (rollout 3)"`).
        where: the name of `groups` in that output, for the error (e.g. `"samples"`).

    Returns:
        The samples, depth first.

    Raises:
        TypeError: an entry that is neither a Sample nor a list (names `what` and the entry's position, e.g.
            `samples[0][2]`).
    """
    if isinstance(groups, Sample):
        return [groups]
    if not isinstance(groups, list):
        raise TypeError(f"{what} returned {type(groups).__name__} at {where}, not a Sample or a list of them")
    return [s for i, item in enumerate(groups) for s in flatten_groups(item, what, f"{where}[{i}]")]


def reward_value(sample: Sample, reward_key: str | None) -> float:
    """The scalar raw reward (`metadata["raw_reward"]` wins, as in the original)."""
    override = sample.metadata_raw_reward()
    return override if override is not None else sample.get_reward_value(reward_key)


def has_repetition(text: str) -> bool:
    """Whether a response ends in a loop, as the original decides it for `rollout/repetition_frac`.

    True when `text` is longer than 10,000 characters and its last 10,000 characters, UTF-8 encoded, compress
    more than 10:1 with zlib at level 9 (the original's `slime.observability.metric_utils.has_repetition`).
    """
    if len(text) <= _REPETITION_WINDOW:
        return False
    tail = text[-_REPETITION_WINDOW:].encode("utf-8")
    return len(tail) / len(zlib.compress(tail, 9)) > _REPETITION_RATIO


def response_metrics(samples: Sequence[Sample], prefix: str, lengths: Sequence[int] | None = None) -> dict[str, float]:
    """The original's per-sample statistics of a rollout or an eval set, under `prefix`.

    `{prefix}response_len/{mean,median,max,min}` (`effective_response_length`: trainable tokens),
    `{prefix}repetition_frac` (share of samples with `has_repetition(response)`) and `{prefix}truncated_ratio`
    (share of samples with status TRUNCATED), as the original's `compute_metrics_from_samples`.

    Args:
        samples: at least one sample.
        prefix: e.g. `"rollout/"` or `"eval/gsm8k/"`.
        lengths: the samples' `effective_response_length`s when the caller has them (None: read here).

    Raises:
        ValueError: no samples.
    """
    if not samples:
        raise ValueError(f"response_metrics: no samples for {prefix!r}")
    if lengths is None:
        lengths = [s.effective_response_length for s in samples]
    return {
        f"{prefix}response_len/mean": statistics.fmean(lengths),
        f"{prefix}response_len/median": float(statistics.median(lengths)),
        f"{prefix}response_len/max": float(max(lengths)),
        f"{prefix}response_len/min": float(min(lengths)),
        f"{prefix}repetition_frac": sum(has_repetition(s.response or "") for s in samples) / len(samples),
        f"{prefix}truncated_ratio": sum(s.status is Status.TRUNCATED for s in samples) / len(samples),
    }


def _round_number(sample: Sample) -> float:
    """`metadata["round_number"]` as a float, or ValueError naming the sample when it is not a number."""
    value = sample.metadata["round_number"]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"sample {sample.index}: metadata['round_number'] is {value!r}, not a number (rollout/round_number)"
        )
    return float(value)


def _num_backend_errors(sample: Sample) -> int:
    """Tool calls of the sample's episode whose backend failed (sum of its env steps' `info["num_backend_errors"]`)."""
    infos = sample.metadata.get("env_info")
    if not isinstance(infos, list):
        return 0
    return sum(int(i.get("num_backend_errors") or 0) for i in infos if isinstance(i, Mapping))


def multi_turn_metrics(samples: Sequence[Sample], max_response_len: int | None) -> dict[str, float]:
    """The original's `--log-multi-turn` statistics (`log_multi_turn_data`), means over the rollout's samples.

    `multi_turn/raw_response_length/response_length_{mean,max,min}`: every response token (model, tool and user);
    `.../response_length_clip_ratio`: share of samples with at least `max_response_len` of them;
    `multi_turn/wo_obs_response_length/response_length_{mean,max,min}`: model tokens only (loss mask 1);
    `multi_turn/multi_turn_metric/round_number_{mean,max,min}`: `metadata["round_number"]` (set by the original's
    multi-turn examples) or `metadata["num_turns"]` (the built-in multi-turn generate), when every sample has one.

    Args:
        samples: at least one sample.
        max_response_len: `--rollout-max-response-len` (None: no clip ratio).
    """
    raw = [s.response_length for s in samples]
    model = [s.effective_response_length for s in samples]
    prefix = "multi_turn/"
    out = {}
    for name, values in (("raw_response_length", raw), ("wo_obs_response_length", model)):
        out[f"{prefix}{name}/response_length_mean"] = statistics.fmean(values)
        out[f"{prefix}{name}/response_length_max"] = float(max(values))
        out[f"{prefix}{name}/response_length_min"] = float(min(values))
    if max_response_len:
        out[f"{prefix}raw_response_length/response_length_clip_ratio"] = sum(n >= max_response_len for n in raw) / len(
            raw
        )
    for key in ("round_number", "num_turns"):
        if all(key in s.metadata for s in samples):
            rounds = [float(s.metadata[key]) for s in samples]
            out[f"{prefix}multi_turn_metric/round_number_mean"] = statistics.fmean(rounds)
            out[f"{prefix}multi_turn_metric/round_number_max"] = max(rounds)
            out[f"{prefix}multi_turn_metric/round_number_min"] = min(rounds)
            break
    return out


def pass_at_k(groups: Sequence[Sequence[float]]) -> dict[str, float]:
    """Mean unbiased pass@k over prompt groups, for k = 1, 2, 4, ... up to the group size (none for groups of one).

    Per group of n rewards with c of them equal to 1: pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1); the original counts a reward of exactly 1
    as correct.

    Args:
        groups: the rewards of each prompt group; all groups must have the same size n >= 1.

    Returns:
        `{"pass@1": ..., "pass@2": ..., ...}`; empty for no groups, and for groups of one sample, as the original's
        `compute_pass_rate` (its pass@1 would only restate the rewards).

    Raises:
        ValueError: groups of different sizes.
    """
    sizes = {len(g) for g in groups}
    if not sizes:
        return {}
    if len(sizes) > 1 or 0 in sizes:
        raise ValueError(f"pass@k needs equal non-empty groups, got sizes {sorted(sizes)}")
    n = sizes.pop()
    if n == 1:
        return {}
    correct = [sum(r == 1 for r in g) for g in groups]
    out = {}
    k = 1
    while k <= n:
        out[f"pass@{k}"] = statistics.fmean(1.0 - math.comb(n - c, k) / math.comb(n, k) for c in correct)
        k *= 2
    return out


def rollout_log_probs_mean(samples: Sequence[Sample]) -> float | None:
    """The original's `rollout/rollout_log_probs`: the engine log-probs' mean per rollout, then over rollouts.

    As its `log_rollout_data` (`sum_of_sample_mean` with `rollout_mask_sums`, divided by the rollout count): each
    sample adds `Σ_t lp_t·m_t / max(D, 1)`, `m` its training mask (all 0 with `remove_sample`, as the train batch's)
    and `D` the summed mask of its rollout (`slime_core.train_data.loss_denominators`: its own when it is alone,
    all siblings' when samples share a `rollout_id`); the sum is divided by the number of rollouts. A sample
    without log-probs adds 0 (the train batch gives it zeros). `rollout/log_probs` is the trainer's
    (`slime_core.train_step`).

    Returns:
        The mean, or None when no sample carries `rollout_log_probs`.
    """
    if not any(s.rollout_log_probs is not None for s in samples):
        return None
    total = 0.0
    for s, denominator in zip(samples, loss_denominators(samples), strict=True):
        if s.rollout_log_probs is None or s.remove_sample:
            continue
        mask = [1] * s.response_length if s.loss_mask is None else s.loss_mask
        total += sum(lp for lp, m in zip(s.rollout_log_probs, mask, strict=True) if m) / denominator
    return total / len(set(rollout_keys(samples)))


def zero_std_counts(groups: Sequence[Sequence[Any]], reward_key: str | None) -> dict[str, float]:
    """The original's `rollout/zero_std/count_{r}`: groups whose rewards are all equal, by that reward.

    As its `_compute_zero_std_metrics`: the reward the advantages use (`get_reward_value`, not a
    `metadata["raw_reward"]` shown as `rollout/raw_reward`), `r` rounded to one decimal as `str(round(r, 1))`, and a
    group of one sample counted (its GRPO advantage is 0 too). The caller leaves it out under a critic estimator
    (the original: `--advantage-estimator ppo`), whose advantages do not come from the group's spread. A group with
    an unscored sample is not counted (`rollout/num_reward_undecided` counts those samples).

    Args:
        groups: the accepted groups (nested lists of samples, as `flatten_groups` takes them).
        reward_key: `--reward-key`.
    """
    values = []
    for group in groups:
        members = flatten_groups([group])
        if members and all(s.reward is not None for s in members):
            values.append([s.get_reward_value(reward_key) for s in members])
    return zero_std_counts_of(values)


def zero_std_counts_of(group_rewards: Sequence[Sequence[float]]) -> dict[str, float]:
    """`rollout/zero_std/count_{r}` of groups given as their scalar rewards (`zero_std_counts` without samples)."""
    counts: collections.Counter[str] = collections.Counter()
    for values in group_rewards:
        if values and all(v == values[0] for v in values):
            counts[str(round(values[0], 1))] += 1
    return {f"rollout/zero_std/count_{value}": float(count) for value, count in counts.items()}


def post_processed_reward_metrics(
    cfg: SlimeArgs, samples: Sequence[Sample], rewards: tuple[Sequence[float], Sequence[float]]
) -> dict[str, float]:
    """The reward metrics of a rollout whose rewards come from `--custom-reward-post-process-path`.

    With that plugin a sample's own reward may be anything the plugin reads (the original's on-policy distillation
    plugins keep the teacher's reply there), so `rollout/raw_reward`, `rollout/zero_std/*` and `passrate/*` are
    computed from what the plugin returned, as the original logs its `raw_reward` from the train data the plugin
    produced: `rollout/raw_reward` and `rollout/rewards` are the means of its two lists, and the groups (samples of
    equal `group_index`) for the zero-std counts and pass@k hold its raw rewards.

    Args:
        cfg: run config; reads `use_critic` (no zero-std counts then) and `log_passrate`.
        samples: the rollout's samples, in the order the plugin got them.
        rewards: the plugin's `(raw_rewards, rewards)`, one float per sample each.
    """
    raw, shaped = rewards
    metrics = {"rollout/raw_reward": statistics.fmean(raw), "rollout/rewards": statistics.fmean(shaped)}
    groups: dict[Any, list[float]] = {}
    for sample, value in zip(samples, raw, strict=True):
        groups.setdefault(sample.group_index, []).append(float(value))
    if not cfg.use_critic:
        metrics.update(zero_std_counts_of(list(groups.values())))
    if cfg.log_passrate:
        if len({len(g) for g in groups.values()}) == 1:
            metrics.update({f"passrate/{k}": v for k, v in pass_at_k(list(groups.values())).items()})
        else:
            logger.warning("--log-passrate: groups of different sizes, pass@k skipped")
    return metrics


def reward_category_shares(samples: Sequence[Sample], category_key: str, prefix: str) -> dict[str, float]:
    """The original's `--log-reward-category` shares: `{prefix}error_cat/{category}` = share of the samples.

    The category is the value of `category_key` in a sample's dict reward (e.g. an error type its reward function
    reports); a reward that is not a dict, or a dict without the key, counts as `unknown` (the original fails there).

    Args:
        samples: at least one sample.
        category_key: `--log-reward-category`.
        prefix: e.g. `"rollout/"` or `"eval/gsm8k/"`.
    """
    categories = collections.Counter(
        str(s.reward.get(category_key, "unknown")) if isinstance(s.reward, dict) else "unknown" for s in samples
    )
    return {f"{prefix}error_cat/{category}": count / len(samples) for category, count in categories.items()}


def sample_set_metrics(
    cfg: SlimeArgs, samples: Sequence[Sample], prefix: str, reward_key: str | None
) -> dict[str, float]:
    """The original's `compute_metrics_from_samples` under `prefix`, for an eval dataset's samples.

    `response_metrics`, `zero_std_counts` over the groups of equal `group_index` (none under a critic estimator),
    `--log-reward-category` shares and `top_p_kept_vocab_per_token`, as the original's `log_eval_rollout_data` writes
    them under `eval/{name}/`.

    Args:
        cfg: run config; reads `use_critic`, `log_reward_category`.
        samples: at least one sample.
        prefix: e.g. `"eval/gsm8k/"`.
        reward_key: the key of the samples' dict rewards (the eval's `--eval-reward-key`, else `--reward-key`).
    """
    metrics = response_metrics(samples, prefix)
    if not cfg.use_critic:
        groups: dict[Any, list[Sample]] = {}
        for s in samples:
            groups.setdefault(s.group_index, []).append(s)
        counts = zero_std_counts(list(groups.values()), reward_key)
        metrics.update({k.replace("rollout/", prefix, 1): v for k, v in counts.items()})
    if cfg.log_reward_category:
        metrics.update(reward_category_shares(samples, cfg.log_reward_category, prefix))
    kept = top_p_kept_per_token(samples)
    if kept is not None:
        metrics[f"{prefix}top_p_kept_vocab_per_token"] = kept
    return metrics


def compute_rollout_metrics(
    cfg: SlimeArgs,
    groups: Sequence[Sequence[Any]],
    *,
    rollout_time: float,
    drop_counts: Mapping[str, int] | None = None,
) -> dict[str, float]:
    """Scalar metrics of one training rollout.

    Args:
        cfg: run config; reads `reward_key`, `use_critic` (no `rollout/zero_std/*` then), `rollout_num_gpus`
            (the `perf/*_per_gpu_*` divisor, at least 1), `log_passrate`, `log_reward_category`, and for
            `rollout/rewards` the reward-normalization flags used by `slime_core.train_data.postprocess_rewards`;
            with `custom_reward_post_process_path` set, `rollout/raw_reward`, `rollout/rewards`,
            `rollout/zero_std/*` and `passrate/*` are left to the caller that runs that plugin (it must run once per
            rollout; `post_processed_reward_metrics`).
        groups: the accepted groups.
        rollout_time: wall-clock seconds of the rollout.
        drop_counts: groups dropped by the dynamic filter, per reason.

    Returns:
        Metric name → value; empty-batch metrics are omitted.
    """
    samples = flatten_groups(groups)
    metrics: dict[str, float] = {"perf/rollout_time": float(rollout_time)}
    for reason, count in (drop_counts or {}).items():
        metrics[f"rollout/dynamic_filter/drop_{reason}"] = float(count)
    if not samples:
        return metrics
    reward_key = cfg.reward_key
    scored = [s for s in samples if s.reward is not None or "raw_reward" in s.metadata]
    # With a reward post-process the rewards are what it returns; the caller that runs it logs them
    # (`post_processed_reward_metrics`): the samples' own rewards may be no scores (teacher replies under OPD).
    if scored and not cfg.custom_reward_post_process_path:
        raw = [reward_value(s, reward_key) for s in scored]
        metrics["rollout/raw_reward"] = statistics.fmean(raw)
        if len(scored) == len(samples):
            metrics["rollout/rewards"] = statistics.fmean(postprocess_rewards(cfg, samples)[1])
        if not cfg.use_critic:
            metrics.update(zero_std_counts(groups, reward_key))
        group_rewards = [[reward_value(s, reward_key) for s in flatten_groups([g])] for g in groups]
        if cfg.log_passrate and len(scored) == len(samples):
            if len({len(g) for g in group_rewards}) == 1:
                metrics.update({f"passrate/{k}": v for k, v in pass_at_k(group_rewards).items()})
            else:  # fan-out generate functions can make groups of different sizes
                logger.warning("--log-passrate: groups of different sizes, pass@k skipped")
    if cfg.log_reward_category:
        metrics.update(reward_category_shares(samples, cfg.log_reward_category, "rollout/"))
    # Samples that came back without a response token (a custom generate function, or no room left in the
    # context); the default rollout marks them remove_sample.
    metrics["rollout/num_empty_responses"] = float(
        sum(s.response_length == 0 and s.status is not Status.ABORTED for s in samples)
    )
    # Samples whose env's step raised (multi-turn): FAILED and removed, one warning each and one line per rollout.
    metrics["rollout/env_failed_samples"] = float(
        sum(s.status is Status.FAILED and "env_error" in s.metadata for s in samples)
    )
    # Samples trained with a tool backend's failure shown as an observation (`EnvStep.info["num_backend_errors"]`:
    # a retrieval server down); the env logs each one.
    metrics["rollout/env_backend_error_samples"] = float(sum(_num_backend_errors(s) > 0 for s in samples))
    lengths = [s.effective_response_length for s in samples]
    metrics.update(response_metrics(samples, "rollout/", lengths))
    if cfg.log_multi_turn:
        metrics.update(multi_turn_metrics(samples, cfg.rollout_max_response_len))
    if all("round_number" in s.metadata for s in samples):
        # The original's trainer-side `rollout/round_number`: its batch keeps metadata["round_number"] (its
        # multi-turn examples set it) and log_rollout_data averages every such key over the samples.
        metrics["rollout/round_number"] = statistics.fmean(_round_number(s) for s in samples)
    kept = top_p_kept_per_token(samples)
    if kept is not None:
        metrics["rollout/top_p_kept_vocab_per_token"] = kept
    engine_log_probs = rollout_log_probs_mean(samples)
    if engine_log_probs is not None:
        metrics["rollout/rollout_log_probs"] = engine_log_probs
    metrics.update(throughput_metrics(samples, rollout_time, cfg.rollout_num_gpus, lengths))
    return metrics


def throughput_metrics(
    samples: Sequence[Sample], rollout_time: float, num_gpus: int | None, lengths: Sequence[int] | None = None
) -> dict[str, float]:
    """The original's `perf/*` of a rollout, every rate over the one `rollout_time` logged beside it.

    `perf/rollout_time`, `perf/tokens_per_gpu_per_sec` (response tokens / s / GPU), `perf/effective_...` (trainable
    tokens), `perf/longest_[effective_]sample_tokens_per_sec` and `non_generation_metrics`, as the original's
    `compute_perf_metrics_from_samples` (its rates divide by the `rollout_time` it logs).

    Args:
        samples: the rollout's samples (none: `perf/rollout_time` only).
        rollout_time: wall-clock seconds of the rollout.
        num_gpus: `--rollout-num-gpus` (the per-GPU divisor, at least 1).
        lengths: the samples' `effective_response_length`s (None: read here).
    """
    metrics = {"perf/rollout_time": float(rollout_time)}
    if not samples:
        return metrics
    if lengths is None:
        lengths = [s.effective_response_length for s in samples]
    if rollout_time > 0:
        per_gpu = rollout_time * max(num_gpus or 1, 1)
        metrics["perf/tokens_per_gpu_per_sec"] = sum(s.response_length for s in samples) / per_gpu
        metrics["perf/effective_tokens_per_gpu_per_sec"] = sum(lengths) / per_gpu
        metrics["perf/longest_sample_tokens_per_sec"] = max(s.response_length for s in samples) / rollout_time
        metrics["perf/longest_effective_sample_tokens_per_sec"] = max(lengths) / rollout_time
    metrics.update(non_generation_metrics(samples, rollout_time, lengths))
    return metrics


def top_p_kept_per_token(samples: Sequence[Sample]) -> float | None:
    """The original's `rollout/top_p_kept_vocab_per_token`: token ids the engine kept per trainable position.

    Top-p replay (`Sample.rollout_top_p_token_offsets`, `[response_length + 1]`): the kept-set sizes
    `offsets[t+1] - offsets[t]` summed over the positions with loss mask 1, over those positions' count, over the
    samples that carry offsets and are not `remove_sample` (the original's `_compute_top_p_kept_vocab_metrics`).

    Returns:
        The mean, or None when no trainable position carries a kept set.
    """
    kept = positions = 0
    for s in samples:
        offsets = s.rollout_top_p_token_offsets
        if not offsets or s.response_length == 0 or s.remove_sample:
            continue
        mask = [1] * s.response_length if s.loss_mask is None else s.loss_mask
        kept += sum(offsets[t + 1] - offsets[t] for t, m in enumerate(mask) if m)
        positions += sum(1 for m in mask if m)
    return kept / positions if positions else None


def non_generation_metrics(
    samples: Sequence[Sample], rollout_time: float, lengths: Sequence[int] | None = None
) -> dict[str, float]:
    """The original's `perf/*non_generation*` metrics of a rollout whose samples spent time outside generation.

    `perf/non_generation_time/{mean,median,max,min}` (seconds per sample, `Sample.non_generation_time`: tool and env
    calls) and, for the longest samples by response tokens and by trainable tokens (`effective_`),
    `perf/longest_[effective_]sample_non_generation_time` (their mean) and
    `perf/longest_[effective_]sample_tokens_per_sec_without_non_generation`: the longest length over the rollout's
    time less that mean. As the original's `compute_perf_metrics_from_samples`; empty when no sample spent any.

    Args:
        samples: the rollout's samples, at least one.
        rollout_time: wall-clock seconds of the rollout.
        lengths: the samples' `effective_response_length`s (None: read here).
    """
    non_gen = [s.non_generation_time for s in samples]
    if max(non_gen) <= 0:
        return {}
    if lengths is None:
        lengths = [s.effective_response_length for s in samples]
    metrics = {
        "perf/non_generation_time/mean": statistics.fmean(non_gen),
        "perf/non_generation_time/median": float(statistics.median(non_gen)),
        "perf/non_generation_time/max": float(max(non_gen)),
        "perf/non_generation_time/min": float(min(non_gen)),
    }
    for key, sizes in (("", [s.response_length for s in samples]), ("effective_", lengths)):
        longest = max(sizes)
        spent = statistics.fmean(t for t, n in zip(non_gen, sizes, strict=True) if n == longest)
        metrics[f"perf/longest_{key}sample_non_generation_time"] = spent
        if rollout_time > spent:  # the original divides by it whatever its sign (a negative rate, or a crash)
            rate = longest / (rollout_time - spent)
            metrics[f"perf/longest_{key}sample_tokens_per_sec_without_non_generation"] = rate
    return metrics
