"""`slime.rollout.data_source.DataSource` is the original's abstract base class (issue 27, plugin pass).

It was `slime_core.protocols.DataSource`, a `typing.Protocol` whose empty method bodies a subclass inherits: a custom
`--data-source-path` class without `add_samples` silently dropped the groups a partial rollout handed back to it (and
one without `save`/`load` silently resumed from the first prompt). The original refuses to build such a class.
"""

import json

import pytest

from slime.rollout.data_source import DataSource, RolloutDataSource, RolloutDataSourceWithBuffer
from slime_core import protocols
from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample


class Incomplete(DataSource):
    def __init__(self, args):
        self.args = args

    def get_samples(self, num_samples):
        return [[Sample(index=0)]]


class Complete(Incomplete):
    def add_samples(self, samples):
        self.added = samples

    def save(self, rollout_id):
        pass

    def load(self, rollout_id=None):
        pass

    def __len__(self):
        return 1


class FromTheProtocol(protocols.DataSource):
    def get_samples(self, num_groups):
        return []


def test_an_original_style_source_missing_methods_cannot_be_built():
    with pytest.raises(TypeError, match=r"Can't instantiate abstract class Incomplete .*'__len__', 'add_samples', "
                       r"'load', 'save'"):  # fmt: skip
        Incomplete(None)
    source = Complete(None)
    source.add_samples([[Sample(index=3)]])
    assert [[s.index for s in g] for g in source.added] == [[3]] and len(source) == 1


def test_the_built_in_sources_are_data_sources(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "a", "label": "1"}) + "\n")
    args = PluginArgs.from_config(SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "prompt_data": str(data), "input_key": "prompt"}
    ))  # fmt: skip
    assert isinstance(RolloutDataSourceWithBuffer(args), DataSource) and issubclass(RolloutDataSource, DataSource)


def test_a_method_left_out_of_a_protocol_subclass_raises_where_it_is_called():
    source = FromTheProtocol()
    with pytest.raises(NotImplementedError, match=r"^FromTheProtocol does not implement add_samples"):
        source.add_samples([[Sample(index=0)]])  # returned None: the groups were lost
    with pytest.raises(NotImplementedError, match=r"^FromTheProtocol does not implement save"):
        source.save(3)
