"""Over-sampling rounds of one training rollout: each refill logged, too many that keep nothing stopped.

Used by the default rollout (`slime_rollout.generation.rollout`): a round is one `data_source.get_samples` call.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["SamplingRounds", "drop_reasons"]


def drop_reasons(drops: collections.Counter[str], requeued: int) -> str:
    """`"zero_std_1.0: 3, aborted: 1"`: the groups left out of the batch so far, per reason ("none" if none)."""
    parts = [f"{reason}: {n}" for reason, n in drops.most_common()]
    if requeued:
        parts.append(f"re-queued (aborted, --partial-rollout): {requeued}")
    return ", ".join(parts) or "none"


class SamplingRounds:
    """Counts over-sampling rounds of one rollout: logs each refill, stops after too many that added nothing.

    A round is one `data_source.get_samples(--over-sampling-batch-size)` call. The first fills the batch; a
    later one only happens because groups were dropped (dynamic-sampling filter, aborted samples) or re-queued
    (aborted with `--partial-rollout`), so each refill logs what was kept and dropped so far. `max_empty` refills in
    a row without a newly kept group is a clear error naming the cause, instead of sampling forever: the filter drops
    everything (e.g. every group got the same reward), or every group comes back with an ABORTED sample (a generate
    function that marks its samples so; an engine that aborts every request).
    """

    def __init__(self, args: SlimeArgs, rollout_id: int, target: int):
        self.rollout_id, self.target, self.max_empty = rollout_id, target, args.dynamic_sampling_max_empty_rounds
        self.filter_path = args.dynamic_sampling_filter_path
        self.generate = args.custom_generate_function_path or "the default generate function"
        self.count = 0
        self.empty = 0
        self._kept_before = 0

    def _cause(self, drops: collections.Counter[str], requeued: int) -> str:
        """What keeps the batch from filling, from the counts: the filter, aborted samples, or both."""
        filtered = sum(n for reason, n in drops.items() if reason != "aborted")
        aborted = drops["aborted"] + requeued
        causes = []
        if filtered:
            causes.append(
                f"the dynamic-sampling filter --dynamic-sampling-filter-path {self.filter_path} drops every group "
                "(check the reward function and the filter)"
            )
        if aborted:
            causes.append(
                f"groups come back with ABORTED samples (from {self.generate}, or the engines abort its requests); "
                "a group with an ABORTED sample is not trained on"
                + (", with --partial-rollout it goes back to the buffer" if requeued else "")
            )
        return "; ".join(causes) or "no group came back"

    def next_round(self, kept: int, drops: collections.Counter[str], requeued: int = 0) -> None:
        """Called before each `get_samples` with what the rollout holds so far.

        Args:
            kept: groups in the batch.
            drops: groups dropped, per reason (filter reasons, "aborted").
            requeued: aborted groups kept for the buffer (`--partial-rollout`).

        Raises:
            RuntimeError: `max_empty` refills in a row kept no new group (names the drop reasons and their cause).
        """
        if self.count > 0:
            self.empty = self.empty + 1 if kept == self._kept_before else 0
            reasons = drop_reasons(drops, requeued)
            logger.info(
                "rollout %d: over-sampling round %d: %d/%d groups kept, %d dropped (%s)",
                self.rollout_id, self.count + 1, kept, self.target, sum(drops.values()) + requeued, reasons,
            )  # fmt: skip
            if self.empty >= self.max_empty:
                raise RuntimeError(
                    f"rollout {self.rollout_id}: {self.empty} over-sampling rounds in a row kept no group "
                    f"({kept}/{self.target} kept, dropped: {reasons}): {self._cause(drops, requeued)}; or raise "
                    "--dynamic-sampling-max-empty-rounds"
                )
        self._kept_before = kept
        self.count += 1
