"""Weight-version staleness of generated groups: which policy version a group came from and how far behind it is.

Versions are the integers the trainer pushes (`slime_app`: the initial push is the start rollout id, the push after
training rollout `r` is `r + 1`), so when rollout `r` is trained the trainer holds version `r`, and a group generated
under version `v` is `r - v` versions stale. The engine reports the version of each generate call
(`meta_info.weight_version`), which `Sample.append_response_tokens` records in `Sample.weight_versions`.

Used by the fully-async rollout (`slime_rollout.generation.fully_async`): a group is trained on while its staleness
is at most `--max-weight-staleness`, else dropped and counted (`rollout/stale_groups_dropped`: groups, at the take
that found them too stale). A partial sample continued after a weight push carries both versions and counts by the
older one, unless `--mask-offpolicy-in-partial-rollout` keeps the older tokens out of the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from slime_core.sample import Sample, Status
from slime_rollout.runtime.metrics import flatten_groups

__all__ = [
    "fits_deadlines",
    "group_version",
    "oldest_counted_version",
    "parse_version",
    "past_bound",
    "sample_version",
    "staleness_metrics",
    "version_floor",
]


def parse_version(version: str | None) -> int | None:
    """The integer of an engine `weight_version` string, or None for a non-integer one.

    An engine that has not received weights yet reports SGLang's "default"; a push that failed part way tags the
    engine `"<v>-incomplete"` (`slime_rollout.weight_sync.push`). Neither is a policy version.
    """
    if version is None:
        return None
    text = str(version).strip()
    return int(text) if text.isdigit() else None


def sample_version(sample: Sample, *, trainable_only: bool = False) -> int | None:
    """The policy version a sample counts as generated under: its oldest generate call's version.

    Args:
        sample: a generated sample; `weight_versions` holds one entry per generate call, in order.
        trainable_only: the older calls' tokens are masked out of the loss (`--mask-offpolicy-in-partial-rollout`
            on a continued partial sample): only the last call's version counts.

    Returns:
        The version, or None when the sample carries no integer version (a custom generate function that did
        not record `meta_info`, or an engine that never received weights).
    """
    versions = [parse_version(v) for v in sample.weight_versions]
    if trainable_only and versions:
        versions = versions[-1:]
    known = [v for v in versions if v is not None]
    return min(known) if known else None


def group_version(group: Sequence[Any], *, mask_offpolicy: bool = False) -> int | None:
    """The oldest version among a group's samples (a fan-out entry is a list of samples), or None if none has one.

    Args:
        group: one prompt group (`n_samples_per_prompt` entries).
        mask_offpolicy: `--mask-offpolicy-in-partial-rollout`: a continued sample counts by its last call only.
    """
    found: list[int] = []
    for item in group:
        for sample in item if isinstance(item, list) else [item]:
            trainable_only = mask_offpolicy and len(sample.weight_versions) > 1
            v = sample_version(sample, trainable_only=trainable_only)
            if v is not None:
                found.append(v)
    return min(found) if found else None


def staleness_metrics(staleness: Sequence[int]) -> dict[str, float]:
    """`rollout/staleness_{mean,min,max,p50,p90}` over the accepted samples' staleness (versions behind).

    Args:
        staleness: one entry per trained sample: the training rollout id minus its group's version
            (`group_version`), so a group of n samples gives n equal entries and the mean is sample-weighted.

    Percentiles use numpy's default (linear interpolation). Empty input gives no metric.
    """
    if not staleness:
        return {}
    arr = np.asarray(staleness, dtype=np.float64)
    return {
        "rollout/staleness_mean": float(arr.mean()),
        "rollout/staleness_min": float(arr.min()),
        "rollout/staleness_max": float(arr.max()),
        "rollout/staleness_p50": float(np.percentile(arr, 50)),
        "rollout/staleness_p90": float(np.percentile(arr, 90)),
    }


# ---- the fully-async take's deadlines (`FullyAsyncProducer._pick`) ----------------------------------


def oldest_counted_version(group: Sequence[Any], *, mask_offpolicy: bool) -> int | None:
    """The oldest weight version among a group's samples that already count (None: none does yet).

    With `--mask-offpolicy-in-partial-rollout` a sample still to be continued does not count yet, and a sample
    generated over several versions counts by its trainable tokens' (`sample_version(trainable_only=True)`).

    Args:
        group: a prompt group still being generated (samples, possibly nested).
        mask_offpolicy: `--mask-offpolicy-in-partial-rollout`.
    """
    oldest = None
    for sample in flatten_groups([group]):
        done = sample.status in (Status.COMPLETED, Status.TRUNCATED)
        if mask_offpolicy and not done:
            continue
        version = sample_version(sample, trainable_only=mask_offpolicy and len(sample.weight_versions) > 1)
        if version is not None:
            oldest = version if oldest is None else min(oldest, version)
    return oldest


def version_floor(group: Sequence[Any], submitted_version: int, *, mask_offpolicy: bool) -> int:
    """A lower bound on the version a group still being generated will count as (`group_version` when done).

    Every call from its (re)submission on runs at `submitted_version` or later; samples already generated count
    by their versions (with `--mask-offpolicy-in-partial-rollout`, a sample still to be continued counts by a call
    to come).
    """
    oldest = oldest_counted_version(group, mask_offpolicy=mask_offpolicy)
    return submitted_version if oldest is None else min(submitted_version, oldest)


def past_bound(group: Sequence[Any], rollout_id: int, bound: int, *, mask_offpolicy: bool) -> bool:
    """Whether a group still being generated will be more than `bound` versions behind `rollout_id` when done.

    Its version (`group_version`) is the oldest among its samples and a sample's only gets older, except that
    with `--mask-offpolicy-in-partial-rollout` a sample still to be continued counts by a call to come: so the
    version of a finished sample (any sample without that flag) is a ceiling of the group's.
    """
    ceiling = oldest_counted_version(group, mask_offpolicy=mask_offpolicy)
    return ceiling is not None and rollout_id - ceiling > bound


def fits_deadlines(deadlines: Sequence[int], rollout_id: int, places: int, batch: int) -> bool:
    """Whether groups with these sorted deadlines each get a place in a take no later than their deadline.

    Earliest deadline first: `places` places in take `rollout_id`, then `batch` in each later take.

    Args:
        deadlines: each group's last take (its version + `--max-weight-staleness`), ascending.
        rollout_id: the take being filled.
        places: places left in that take.
        batch: places of each later take (`--rollout-batch-size`).
    """
    for i, deadline in enumerate(deadlines):
        take = rollout_id if i < places else rollout_id + 1 + (i - places) // batch
        if take > deadline:
            return False
    return True
