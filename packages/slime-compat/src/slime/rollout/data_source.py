"""`slime.rollout.data_source`: the prompt data sources (original module path).

`RolloutDataSource(args)` iterates `--prompt-data` by epochs (shuffled with `--rollout-shuffle`) and
`RolloutDataSourceWithBuffer(args)` first hands out groups returned by partial rollouts. Custom data sources
(`--data-source-path`) implement `get_samples(num_groups)`, `add_samples(groups)`, `save(rollout_id)`,
`load(rollout_id)` and `__len__` (the `DataSource` protocol). `pop_first` is the default `--buffer-filter-path`.

`DataSource` is the original's abstract base class (`abc.ABC`): a subclass that leaves a method out cannot be built
(`TypeError` naming it). It was `slime_core.protocols.DataSource`, a `typing.Protocol`, whose empty method bodies a
subclass inherits: one without `add_samples` silently dropped the groups a partial rollout handed back, and one
without `save`/`load` silently resumed from the first prompt. The built-in sources are registered as its subclasses.
"""

from __future__ import annotations

import abc
from typing import Any

from slime_core.sample import Sample
from slime_rollout.data.buffer_filter import pop_first
from slime_rollout.data.source import RolloutDataSource, RolloutDataSourceWithBuffer

__all__ = ["DataSource", "RolloutDataSource", "RolloutDataSourceWithBuffer", "pop_first"]


class DataSource(abc.ABC):
    """The original's data-source interface (`slime.rollout.data_source.DataSource`); every method is abstract."""

    @abc.abstractmethod
    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """The next `num_samples` groups of `--n-samples-per-prompt` samples each."""

    @abc.abstractmethod
    def add_samples(self, samples: list[list[Sample]]) -> Any:
        """Takes back unfinished groups (`--partial-rollout`), to be handed out first."""

    @abc.abstractmethod
    def save(self, rollout_id: int) -> Any:
        """Saves the cursor with the checkpoint of `rollout_id`."""

    @abc.abstractmethod
    def load(self, rollout_id: int | None = None) -> Any:
        """Restores the cursor saved with the checkpoint of `rollout_id`."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Prompts in one epoch."""


DataSource.register(RolloutDataSource)  # RolloutDataSourceWithBuffer is its subclass
