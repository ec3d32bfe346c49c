"""The driver's own part of a checkpoint: what its metric keepers need to go on after a resume.

`<--save>/rollout/run_state_<rollout_id>.json`, beside the data cursor, holds `GoodputMeter.state()` (the totals of
`goodput/cum/*`), `InstabilityMonitor.state()` (the rules' baselines and windows), `Tracker.state()` (the points
of the reward/eval curve PNG) through that rollout and `EvalAfterSave.state()` (the eval after it was due).
The loop writes it once the rollout's checkpoint is written and its metrics are accounted, and only then names
the checkpoint in the tracker (`Run._commit`), so a checkpoint a resume starts from always has it; a run resumed at
rollout S reads `run_state_<S-1>.json` from `--load`. Without it the cumulative curves restarted from zero at every
resume and the instability rules re-based themselves on the resumed rollouts.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from typing import Any

from slime_core.checkpoint_dirs import save_root
from slime_core.dir_swap import write_text_atomic

logger = logging.getLogger(__name__)

__all__ = ["EvalAfterSave", "load_run_state", "run_state_path", "save_run_state"]


def run_state_path(root: str | os.PathLike[str], rollout_id: int) -> pathlib.Path:
    """Where a checkpoint folder keeps the driver's state through `rollout_id`."""
    return pathlib.Path(root) / "rollout" / f"run_state_{rollout_id}.json"


def save_run_state(root: str | os.PathLike[str], rollout_id: int, parts: dict[str, Any]) -> pathlib.Path:
    """Writes `parts` (name -> JSON-able state) for `rollout_id` under `root`, atomically; returns the path.

    Raises:
        OSError: it cannot be written (a full disk).
    """
    path = run_state_path(root, rollout_id)
    write_text_atomic(path, json.dumps(parts, indent=1))
    return path


def load_run_state(root: str | os.PathLike[str], rollout_id: int, keepers: dict[str, Any]) -> list[str]:
    """Restores each keeper (`name -> object with restore(state)`) from the state saved for `rollout_id`.

    A checkpoint without the file (written by the original, or by an older version, which wrote it after the
    tracker: a run stopped between the two), an unreadable file or a part a keeper cannot take leaves that keeper as
    it is, said in one warning naming the file: its metrics then count from this run's start.

    Returns:
        The names of the keepers restored.
    """
    path = run_state_path(save_root(root), rollout_id)  # `--load <save>/iter_XXXXXXX` (Megatron): beside it
    fresh = (
        f"goodput/cum/*, the instability baselines and the curve PNG count from rollout {rollout_id + 1}, this run's "
        "start"
    )
    try:
        parts = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(parts, dict):
            raise TypeError(f"holds {type(parts).__name__}, not an object")
    except FileNotFoundError:
        logger.warning("%s is missing: %s", path, fresh)
        return []
    except (OSError, ValueError, TypeError) as e:
        logger.warning("%s: not read (%s: %s); %s", path, type(e).__name__, e, fresh)
        return []
    restored = []
    for name, keeper in keepers.items():
        if name not in parts and getattr(keeper, "optional", False):
            continue  # a part newer than the file: the keeper's default stands, as without a checkpoint
        try:
            keeper.restore(parts[name])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            logger.warning("%s: its %s part not read (%s: %s); it counts from this run's start", path, name,
                           type(e).__name__, e)  # fmt: skip
            continue
        restored.append(name)
    return restored


class EvalAfterSave:
    """Whether the run that saved a checkpoint was due to evaluate right after it (the run state's `eval` part).

    That eval runs after the save and is written at x = rollout + 1, where a run resumed from the checkpoint starts
    and TensorBoard hides the earlier points (`Tracker.begin_at`). The resumed run evaluates again where it was due
    then, also when its own schedule no longer says so, so that a finished run extended with a larger
    `--num-rollout` keeps the eval of its last rollout in the curves.

    Attributes:
        due: set by the loop before each run-state save.
        due_when_saved: what the checkpoint's run state said (False without one: older states have no such part).
    """

    optional = True  # `load_run_state`: a run state written before this part existed has none; nothing to say

    def __init__(self) -> None:
        self.due = False
        self.due_when_saved = False

    def state(self) -> dict[str, bool]:
        """`{"due": bool}` for the run state."""
        return {"due": self.due}

    def restore(self, state: dict[str, Any]) -> None:
        """Reads `state()`; raises TypeError/KeyError on another shape (`load_run_state` warns and goes on)."""
        self.due_when_saved = bool(state["due"])
