"""When a run saves and evaluates, and where its HF exports go.

Pure functions of the run config, used by `slime_app.loop`.
"""

from __future__ import annotations

__all__ = ["hf_export_path", "should_run"]


def hf_export_path(template: str, rollout_id: int) -> str:
    """The `--save-hf` directory of the export after `rollout_id`: `template.format(rollout_id=rollout_id)`.

    As the original (`save_hf.format(rollout_id=rollout_id)`); config validation has checked that the template
    takes no other field. A template without `{rollout_id}` names one directory, which each export replaces.
    """
    return template.format(rollout_id=rollout_id)


def should_run(interval: int | None, rollout_id: int, num_rollout: int, per_epoch: int | None = None) -> bool:
    """Whether a periodic save/eval runs after `rollout_id`.

    Every `interval` rollouts, at the last one and (with --num-epoch, as the original) at each epoch's end,
    `per_epoch` rollouts apart.
    """
    if not interval:
        return False
    step = rollout_id + 1
    return step % interval == 0 or rollout_id == num_rollout - 1 or bool(per_epoch and step % per_epoch == 0)
