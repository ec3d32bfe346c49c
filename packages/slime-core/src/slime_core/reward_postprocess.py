"""A rollout's scalar rewards: raw values per sample, normalized within each prompt group (`postprocess_rewards`).

Part of turning samples into training data (`slime_core.train_data`, which re-exports `postprocess_rewards` and
`reward_groups`). Behaviour follows the original slime `RolloutManager._post_process_rewards`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from slime_core.config import SlimeArgs
from slime_core.error_text import preview
from slime_core.estimators import get_estimator
from slime_core.plugins import load_function
from slime_core.sample import Sample

__all__ = ["postprocess_rewards", "reward_groups"]

_STD_EPS = 1e-6


def _normalize_group(raw: np.ndarray, divide_by_std: bool) -> np.ndarray:
    """Centres (and optionally std-scales) the rewards of one prompt group, `[n_g]` float64."""
    if raw.size < 2 or raw.max() == raw.min():
        # One sample, or equal rewards: no signal. Exact zeros (the mean may differ from the values by a
        # rounding error, which the std division would blow up).
        return np.zeros_like(raw)
    centred = raw - raw.mean()
    if divide_by_std:
        # Unbiased std as in GRPO (Shao et al. 2024, DeepSeekMath, eq. 3 outcome supervision).
        centred = centred / (raw.std(ddof=1) + _STD_EPS)
    return centred


def reward_groups(samples: Sequence[Sample], n_samples_per_prompt: int) -> list[list[int]]:
    """Positions of the samples of each prompt group, in order of first appearance.

    Groups are the samples sharing `Sample.group_index` (any sizes: filtering, aborted samples or a
    multi-turn fan-out make them uneven; members need not be adjacent). Without `group_index` on any sample,
    consecutive runs of `--n-samples-per-prompt` samples are the groups (as the original does for whole
    batches).

    Raises:
        ValueError: some samples have a `group_index` and some do not, or none has one and the count is not a
            multiple of `n_samples_per_prompt` (the groups cannot be told apart; normalizing over the whole
            batch instead would mix prompts).
    """
    has_group = [s.group_index is not None for s in samples]
    if all(has_group):
        groups: dict[Any, list[int]] = {}
        for pos, s in enumerate(samples):
            groups.setdefault(s.group_index, []).append(pos)
        return list(groups.values())
    if any(has_group):
        missing = [s.index for s, h in zip(samples, has_group, strict=True) if not h]
        raise ValueError(
            f"samples {missing[:5]} have no group_index while others have one; set Sample.group_index on all "
            "samples (reward normalization is per prompt group)"
        )
    n = int(n_samples_per_prompt)
    if n < 1:
        raise ValueError(f"--n-samples-per-prompt must be >= 1, got {n}")
    if len(samples) % n:
        raise ValueError(
            f"{len(samples)} samples without Sample.group_index are not a multiple of --n-samples-per-prompt={n}: "
            "set group_index on every sample so rewards are normalized within each prompt group"
        )
    return [list(range(start, start + n)) for start in range(0, len(samples), n)]


def _leave_one_out(raw: np.ndarray, groups: list[list[int]], samples: Sequence[Sample], name: str) -> list[float]:
    out = np.zeros_like(raw)
    for members in groups:
        size = len(members)
        if size < 2:
            raise ValueError(
                f"{name} needs >= 2 samples per prompt group; group {samples[members[0]].group_index} "
                f"(sample {samples[members[0]].index}) has 1"
            )
        values = raw[members]
        # r_i - mean_{j≠i} r_j = n/(n-1)·(r_i - mean_g r)
        out[members] = (values - values.mean()) * size / (size - 1)
    return [float(x) for x in out]


def postprocess_rewards(
    cfg: SlimeArgs, samples: Sequence[Sample], *, source: str | None = None
) -> tuple[list[float], list[float]]:
    """Raw and normalized scalar rewards of a rollout's samples.

    With `--custom-reward-post-process-path` the user function `fn(args, samples) -> (raw_rewards,
    rewards)` replaces everything below. Otherwise `raw[i] = samples[i].get_reward_value(cfg.reward_key)`
    and, unless `--disable-rewards-normalization`, the `--advantage-estimator` spec's `rewards` decides
    (`slime_core.estimators`), always within each prompt group (`reward_groups`: the samples sharing a
    `group_index`, whatever their number; never across the batch):

    * `group_mean` (reinforce_plus_plus_baseline) and `group_mean_std` (grpo, gspo, cispo): subtract the
      group mean;
    * `group_mean_std`: additionally divide by `(unbiased group std + 1e-6)` (GRPO, DeepSeekMath
      eq. 3), unless `--disable-grpo-std-normalization`;
    * `leave_one_out` (rloo): the baseline `r_i - mean_{j≠i} r_j = n_g/(n_g-1)·(r_i - mean_g r)` (Ahmadian
      et al. 2024, eq. 6) with the group's own size `n_g`, computed here where whole groups are visible (the
      DP split may separate siblings); the rloo estimator then only broadcasts it; applied even with
      `--disable-rewards-normalization`;
    * `none` (ppo, reinforce_plus_plus, ...): rewards = raw.

    A group of one sample or of equal rewards yields exact zeros (never NaN).

    Args:
        cfg: run config; reads `reward_key`, `advantage_estimator`, `n_samples_per_prompt`,
            `disable_rewards_normalization`, `disable_grpo_std_normalization`,
            `custom_reward_post_process_path` (the plugin receives `cfg` as `args`).
        samples: the rollout's samples.
        source: how the custom function's errors name it; None: `--custom-reward-post-process-path <path>` (the
            rollout manager adds the rollout id: it runs in a worker thread, so no traceback line says which).

    Returns:
        `(raw_rewards, rewards)`, two lists of N floats.

    Raises:
        ValueError: if a sample has no reward, a dict reward lacks `--reward-key`, a reward is not
            finite, the groups cannot be told apart (`reward_groups`), an rloo group has one sample, or the
            custom function returns the wrong shape.
        KeyError: unknown `--advantage-estimator`.
        slime_core.plugins.PluginError: if the custom function cannot be imported.
    """
    custom_path = cfg.custom_reward_post_process_path
    if custom_path:
        return _custom_postprocess(cfg, custom_path, samples, source)
    raw = [s.get_reward_value(cfg.reward_key) for s in samples]
    for s, r in zip(samples, raw, strict=True):
        if not math.isfinite(r):
            raise ValueError(f"sample {s.index}: reward {r} is not finite")
    spec = get_estimator(cfg.advantage_estimator)
    if not samples or (
        spec.rewards != "leave_one_out" and (cfg.disable_rewards_normalization or spec.rewards == "none")
    ):
        return raw, list(raw)
    groups = reward_groups(samples, cfg.n_samples_per_prompt)
    values = np.asarray(raw, dtype=np.float64)
    if spec.rewards == "leave_one_out":
        return raw, _leave_one_out(values, groups, samples, spec.name)
    divide = spec.rewards == "group_mean_std" and not cfg.disable_grpo_std_normalization
    out = np.zeros_like(values)
    for members in groups:
        out[members] = _normalize_group(values[members], divide)
    return raw, [float(x) for x in out]


def _custom_postprocess(
    cfg: SlimeArgs, custom_path: str, samples: Sequence[Sample], source: str | None
) -> tuple[list[float], list[float]]:
    """Calls `--custom-reward-post-process-path` and checks its two lists: N finite numbers each.

    A NaN or infinity from it went into the advantages and the loss (the built-in path refuses such rewards); a
    non-number failed in `float()` naming neither the function nor the sample.

    Raises:
        ValueError: wrong shape, a value that is not a number, or one that is not finite (names the function,
            the list and the sample).
    """
    fn = load_function(custom_path, flag="--custom-reward-post-process-path")
    out = fn(cfg, list(samples))
    where = source or f"--custom-reward-post-process-path {custom_path}"
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise ValueError(f"{where}: must return (raw_rewards, rewards), got {type(out).__name__} {preview(out, 60)}")
    raw_c, rew_c = (
        _finite_list(values, what, where, samples) for values, what in zip(out, ("raw_rewards", "rewards"), strict=True)
    )
    return raw_c, rew_c


def _finite_list(values: Any, what: str, where: str, samples: Sequence[Sample]) -> list[float]:
    """`values` as N finite floats, one per sample."""
    values = list(values)
    if len(values) != len(samples):
        raise ValueError(f"{where}: returned {len(values)} {what} for {len(samples)} samples")
    out = []
    for sample, value in zip(samples, values, strict=True):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}: {what} of sample {sample.index} is {preview(value, 60)}, not a number"
            ) from None
        if not math.isfinite(number):
            raise ValueError(f"{where}: {what} of sample {sample.index} is {number}, not finite")
        out.append(number)
    return out
