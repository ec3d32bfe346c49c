"""Pre-launch checks of the reward types that data rows and eval datasets name besides `--rm-type`.

The app's preflight runs the record check of `--rm-type` (`slime_core.extensions.run_preflight_hooks`). A row's
`metadata["rm_type"]` (a mixed-source dataset) or an `--eval-config` dataset's `rm_type` picks another record, whose
needs went unchecked: a `remote_rm` row without `--rm-url`, or a `dapo` row (a score dict) without a `--reward-key`
that picks a number of it, stopped the run after its first rollout (or at the eval before training).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from slime_core.extensions import REWARDS
from slime_core.registry import Problem

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["row_reward_problems"]


def row_reward_problems(
    cfg: SlimeArgs, rm_types: Iterable[str], where: str, *, evaluation: bool, checked: str | None
) -> list[Problem]:
    """The record checks of each reward type a data file's rows name, other than `--rm-type`'s.

    Args:
        cfg: the config the file is read with (an eval dataset's settings in it); reads `custom_rm_path` (a custom
            reward scores every row: nothing to check), `eval_interval`, `rm_url`, `reward_key`, `eval_reward_key`
            (+ what each record's check reads).
        rm_types: the rows' reward types as written (`boxed_` prefixes allowed; "" for none).
        where: names the file in messages (`"--prompt-data d.jsonl"`).
        evaluation: an eval dataset: its rewards are read with `--eval-reward-key`, else `--reward-key`, so a
            record's check sees that key as `reward_key`.
        checked: the run's `--rm-type`, whose record the app's preflight checks already.

    Returns:
        One problem per failed check, each naming `where` and the type.
    """
    if cfg.custom_rm_path or (evaluation and cfg.eval_interval is None):
        return []  # a custom reward scores every row; without --eval-interval no eval dataset is scored
    own = (checked or "").removeprefix("boxed_")
    if evaluation:
        cfg = cfg.model_copy(update={"reward_key": cfg.eval_reward_key or cfg.reward_key, "eval_reward_key": None})
    problems = []
    for name in sorted({t.removeprefix("boxed_") for t in rm_types} - {own, ""}):
        spec = REWARDS.get(name)
        prefix = f"{where}: rows of rm_type {name}"
        if spec.needs_url and not cfg.rm_url:
            problems.append(Problem(message=f"{prefix} call a reward service: set --rm-url http://host:port/path"))
        problems += [dataclasses.replace(p, message=f"{prefix}: {p.message}") for p in spec.check(cfg)]
    return problems
