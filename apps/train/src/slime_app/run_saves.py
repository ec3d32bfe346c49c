"""The save phase of the training loop: checkpoint, data cursor and HF export of one rollout (`SavePhase`).

`slime_app.loop.Run` takes these methods from `SavePhase`; they read the run's `cfg`, `trainer`, `manager`,
`rollouts`, `per_epoch` and `manager_get`, and keep `_cursor_saved` and `last_hf_export`. A save is written data
cursor first, then the trainer's checkpoint, whose tracker is the commit point of a resume (`Run._commit`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from ray.exceptions import GetTimeoutError

from slime_app.actor_watch import ActorStopped
from slime_app.failures import save_failed
from slime_app.save_schedule import hf_export_path, should_run
from slime_core.config.validation_fully_async import is_fully_async
from slime_rollout.runtime.deadlines import DeadlineExceeded

logger = logging.getLogger(__name__)

__all__ = ["SAVE_GRACE_S", "SavePhase"]

SAVE_GRACE_S = 30.0  # past the data source's own save deadline: the manager reports its DeadlineExceeded first


class SavePhase:
    """The save methods of `slime_app.loop.Run` (a mixin: it holds no state of its own)."""

    def _saves_after(self, rollout_id: int) -> bool:
        """Whether a checkpoint is written after `rollout_id` (`step`'s rule, with `--save`)."""
        cfg = self.cfg
        return bool(cfg.save) and (
            should_run(cfg.save_interval, rollout_id, cfg.num_rollout, self.per_epoch)
            or rollout_id == cfg.num_rollout - 1
        )

    def _save_cursor_early(self, rollout_id: int) -> None:
        """`--async`: the data cursor of a save after `rollout_id`, written before rollout `rollout_id + 1` draws.

        After training it queued behind that generation, holding its prompts as drawn: a resume at `rollout_id + 1`
        skipped them (so does the original's train_async.py). The trainer's checkpoint still commits it (`save`).

        Raises:
            SaveFailed: the rollout manager could not write it (one line: `slime_app.failures`).
        """
        if is_fully_async(self.cfg) or not self._saves_after(rollout_id):
            return  # fully async: the producer's held groups are saved with the cursor (`_save_rollout_state`)
        with self._save_errors(rollout_id, "data-cursor save"):
            self._save_rollout_state(rollout_id)
        self._cursor_saved = rollout_id

    @contextlib.contextmanager
    def _save_errors(self, rollout_id: int, what: str) -> Iterator[None]:
        """An error of the block is `SaveFailed`: one line naming `--save`, not a rank's traceback (a full disk)."""
        try:
            yield
        except ActorStopped:
            raise  # not the disk's: its own line names the stopped process
        except Exception as e:
            logger.debug("the %s of rollout %d failed", what, rollout_id, exc_info=True)
            raise save_failed(f"the checkpoint of rollout {rollout_id}", "--save", self.cfg.save, e) from e

    def save(self, rollout_id: int) -> float:
        """Writes the checkpoint of `rollout_id` (data cursor, then trainer); returns the seconds it took.

        Not yet named in the tracker: `step` commits it once the run state is written too (`_commit`).

        Raises:
            SaveFailed: a rank or the rollout manager could not write it (one line: `slime_app.failures`).
        """
        t0 = time.perf_counter()
        with self._save_errors(rollout_id, "save"):
            # Data cursor first: the trainer's checkpoint tracker is the commit point of a resume.
            if self._cursor_saved != rollout_id:  # `--async` saved it before the next rollout drew its prompts
                self._save_rollout_state(rollout_id)
            self.trainer.save(rollout_id, commit=False)
        return time.perf_counter() - t0

    def _save_rollout_state(self, rollout_id: int) -> None:
        """The rollout manager's part of a save (data cursor; fully async, the producer's held groups), bounded.

        The manager runs the data source's save under `--plugin-timeout-secs`; a default-group call also waits for
        the generation in flight (`--async`: rollout N+1, under `--rollout-timeout-secs`). The fully-async state is
        read in one step of the rollout loop, so it needs no pause of that generation: it goes through the "save"
        concurrency group (queued behind the generation, the fully-async save waited for a collection that itself
        waits for this step's weights).

        Raises:
            DeadlineExceeded: no answer within those deadlines and `SAVE_GRACE_S` (names the flags).
        """
        cfg = self.cfg
        in_flight = self.rollouts is not None and self.rollouts.in_flight
        if is_fully_async(cfg):
            ref, queued = self.manager.save.options(concurrency_group="save").remote(rollout_id), False
        else:
            ref, queued = self.manager.save.remote(rollout_id), in_flight
        deadline = cfg.plugin_timeout_secs + SAVE_GRACE_S + (cfg.rollout_timeout_secs if queued else 0.0)
        flags = "--plugin-timeout-secs" + (" + --rollout-timeout-secs" if queued else "")
        try:
            self.manager_get(ref, "the save of the data cursor", timeout=deadline)
        except GetTimeoutError:
            raise DeadlineExceeded(
                f"the rollout manager's save of the data cursor (--data-source-path {cfg.data_source_path}) did not "
                f"finish within {deadline:g} s ({flags})"
            ) from None

    def save_hf(self, rollout_id: int) -> float:
        """Exports the actor as an HF checkpoint to `--save-hf` with `{rollout_id}` filled in; returns its seconds.

        Runs right after training, while the trainer is awake. Each backend writes `<path>.tmp` and renames it
        (a killed run leaves no half-written export under the final name).
        """
        t0 = time.perf_counter()
        path = hf_export_path(self.cfg.save_hf, rollout_id)
        try:
            self.trainer.save_hf(path)
        except ActorStopped:
            raise
        except Exception as e:
            logger.debug("the HF export of rollout %d failed", rollout_id, exc_info=True)
            raise save_failed(f"the HF export of rollout {rollout_id}", "--save-hf", path, e) from e
        self.last_hf_export = path
        logger.info("rollout %d: HF checkpoint exported to %s", rollout_id, path)
        return time.perf_counter() - t0
