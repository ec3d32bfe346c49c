"""Return types of rollout functions (original `slime/rollout/base_types.py`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from slime_core.sample import Sample

__all__ = ["RolloutFnEvalOutput", "RolloutFnTrainOutput", "check_fan_out_rollout_ids", "wrap_rollout_output"]


# Not kw_only: the original's classes are plain dataclasses, so `RolloutFnTrainOutput(groups, metrics)` in a user's
# rollout function is valid there (it was a TypeError here).
@dataclasses.dataclass(slots=True)
class RolloutFnTrainOutput:
    """What a training rollout returns (fields in the original's order, positional or by keyword).

    Attributes:
        samples: `rollout_batch_size` groups of `n_samples_per_prompt` samples, sorted by sample index
            (a custom generate function may make a group's entries lists of samples).
        metrics: `rollout/*`, `perf/*` scalars for the metrics sink, or None.
    """

    samples: list[list[Sample]]
    metrics: dict[str, float] | None = None


@dataclasses.dataclass(slots=True)
class RolloutFnEvalOutput:
    """What an eval rollout returns (fields in the original's order, positional or by keyword).

    Attributes:
        data: per dataset name, `{"rewards": list[float], "truncated": list[bool], "samples": list[Sample]}`.
        metrics: `eval/{name}`, `eval/{name}-truncated_ratio`, ... scalars, or None.
    """

    data: dict[str, dict[str, Any]]
    metrics: dict[str, float] | None = None


def wrap_rollout_output(
    output: Any, *, evaluation: bool, what: str = "the rollout function"
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """Wraps the bare return value of a legacy custom rollout function (groups list or eval dict).

    Args:
        output: what the function returned.
        evaluation: it ran an eval rollout.
        what: names the function in errors (its flag and import path).

    Raises:
        TypeError: neither the output type nor its legacy bare form (the message names `what`).
    """
    if isinstance(output, RolloutFnTrainOutput | RolloutFnEvalOutput):
        return output
    if evaluation:
        if not isinstance(output, dict):
            raise TypeError(f"{what} returned {type(output).__name__}, not a RolloutFnEvalOutput or a dict")
        return RolloutFnEvalOutput(data=output)
    if not isinstance(output, list):
        raise TypeError(f"{what} returned {type(output).__name__}, not a RolloutFnTrainOutput or a list of groups")
    return RolloutFnTrainOutput(samples=output)


def check_fan_out_rollout_ids(node: Any, what: str, where: str = "samples", depth: int = 0) -> None:
    """Checks that the samples of one rollout execution share a `rollout_id` (the original's contract).

    Groups are lists of samples (depth 1); a list of samples deeper down (a fan-out generate function's entry in its
    group, a compact rollout's `[prompt][rollout][samples]`) is one execution's samples: with more than one, every
    sample must carry the same `rollout_id`, so the loss counts the execution once (the original's
    `validate_rollout_id_annotated`, which refuses such output; it was taken here as one rollout per sample, so a
    fan-out of five weighed five times as much as its siblings).

    Args:
        node: the training rollout's `samples`, recursively.
        what: names the function that returned them (its flag and import path).
        where: the position of `node` in that output, for the error.
        depth: nesting depth of `node` (0 for the whole output).

    Raises:
        ValueError: a fan-out whose samples lack a `rollout_id` or carry several (names `what`, the position and the
            sample indices).
    """
    if not isinstance(node, list):
        return
    samples = [s for s in node if isinstance(s, Sample)]
    if depth >= 2 and len(samples) > 1:
        ids = [s.rollout_id for s in samples]
        if None in ids or len(set(ids)) > 1:
            raise ValueError(
                f"{what}: {where} holds {len(samples)} samples of one rollout execution (samples "
                f"{[s.index for s in samples]}) with rollout_id {ids}; set the same Sample.rollout_id on each (e.g. "
                "the input sample's index), so the loss counts the execution once, as the original requires"
            )
    for i, item in enumerate(node):
        if isinstance(item, list):
            check_fan_out_rollout_ids(item, what, f"{where}[{i}]", depth + 1)
