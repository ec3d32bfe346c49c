"""Return types of rollout functions (original `slime/rollout/base_types.py`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from slime_core.sample import Sample

__all__ = ["RolloutFnEvalOutput", "RolloutFnTrainOutput", "wrap_rollout_output"]


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
