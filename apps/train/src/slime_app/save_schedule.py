"""When a run saves and evaluates, where its HF exports go, and which `--load` iteration its trainers read.

Pure functions of the run config, used by `slime_app.loop`.
"""

from __future__ import annotations

from slime_core.checkpoint_dirs import tracker_step
from slime_core.config import SlimeArgs

__all__ = ["hf_export_path", "pin_load_step", "should_run"]


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


def pin_load_step(cfg: SlimeArgs) -> SlimeArgs:
    """`cfg` with `--ckpt-step` set to the iteration `--load`'s tracker names now (unchanged without one).

    Each trainer rank read the tracker itself: a run saving into `--load` meanwhile (a fork of a live run) could
    have its ranks load two iterations. Read once here, every rank (and a PPO critic) loads the same one.
    """
    if not cfg.load or cfg.ckpt_step is not None:
        return cfg
    step = tracker_step(cfg.load)
    return cfg if step is None else cfg.model_copy(update={"ckpt_step": step})
