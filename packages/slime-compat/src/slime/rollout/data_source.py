"""`slime.rollout.data_source`: the prompt data sources (original module path).

`RolloutDataSource(args)` iterates `--prompt-data` by epochs (shuffled with `--rollout-shuffle`) and
`RolloutDataSourceWithBuffer(args)` first hands out groups returned by partial rollouts. Custom data sources
(`--data-source-path`) implement `get_samples(num_groups)`, `add_samples(groups)`, `save(rollout_id)`,
`load(rollout_id)` and `__len__` (the `DataSource` protocol). `pop_first` is the default `--buffer-filter-path`.
"""

from slime_core.protocols import DataSource
from slime_rollout.data.buffer_filter import pop_first
from slime_rollout.data.source import RolloutDataSource, RolloutDataSourceWithBuffer

__all__ = ["DataSource", "RolloutDataSource", "RolloutDataSourceWithBuffer", "pop_first"]
