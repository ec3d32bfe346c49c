"""A fully-async checkpoint resumed with another rollout function keeps the groups the producer held.

Issue 27 (pass 27): the fully-async producer's held groups (drawn from the data source, not yet trained) are saved
next to the cursor, which is past them. A resume without the fully-async rollout function never read that file:
their prompts were skipped without a word. They now go into the data source's buffer, served before new prompts;
a data source without a buffer is refused naming the file and the flags.
"""

import json
import logging

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_rollout.data.source import RolloutDataSource, RolloutDataSourceWithBuffer
from slime_rollout.generation import fully_async


def _args(data, **kw):
    fields = {"rollout_batch_size": 1, "num_rollout": 1, "input_key": "question", "label_key": "answer",
              "rollout_seed": 42, "prompt_data": data, "n_samples_per_prompt": 2, **kw}  # fmt: skip
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    """A fully-async save of rollout 0: groups q0 and q1 drawn and held, the cursor after them."""
    monkeypatch.setattr(fully_async, "_restored", [])  # the module's restored groups: put back after the test
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(6)))
    ckpt = tmp_path / "ckpt"
    source = RolloutDataSourceWithBuffer(_args(str(data), save=str(ckpt)))
    monkeypatch.setattr(fully_async, "_restored", source.get_samples(2))  # held as a producer holds them
    fully_async.save_state(source.args, source, 0)
    monkeypatch.setattr(fully_async, "_restored", [])
    return str(data), str(ckpt)


def _prompts(groups):
    return [group[0].prompt for group in groups]


def test_held_groups_go_into_the_buffer_and_are_served_first(checkpoint, caplog):
    data, ckpt = checkpoint
    source = RolloutDataSourceWithBuffer(_args(data, load=ckpt))
    source.load(0)
    assert _prompts(source.get_samples(1)) == ["q2"]  # the cursor alone: q0 and q1 never come back
    source = RolloutDataSourceWithBuffer(_args(data, load=ckpt))
    source.load(0)
    with caplog.at_level(logging.INFO, logger="slime_rollout.generation.fully_async"):
        assert fully_async.load_state_into_buffer(source.args, source, 0) == 2
    assert _prompts(source.get_samples(3)) == ["q0", "q1", "q2"]
    assert f"{ckpt}/rollout/fully_async_0.json: 2 group(s) the fully-async rollout had drawn" in caplog.text


def test_a_data_source_without_a_buffer_is_refused_naming_the_file(checkpoint):
    data, ckpt = checkpoint
    path = "slime_rollout.data.source.RolloutDataSource"
    source = RolloutDataSource(_args(data, load=ckpt, data_source_path=path))
    source.load(0)
    with pytest.raises(ValueError) as e:
        fully_async.load_state_into_buffer(source.args, source, 0)
    assert str(e.value).startswith(
        f"{ckpt}/rollout/fully_async_0.json: the checkpoint holds 2 group(s) the fully-async rollout had drawn and not "
        f"trained, which --data-source-path {path} cannot buffer (RolloutDataSource has no buffer"
    )
    assert str(e.value).endswith("or a data source with a buffer (the default RolloutDataSourceWithBuffer)")


def test_nothing_to_hand_over_without_load_or_a_held_groups_file(checkpoint, tmp_path):
    data, ckpt = checkpoint
    source = RolloutDataSourceWithBuffer(_args(data))
    assert fully_async.load_state_into_buffer(source.args, source, 0) == 0
    source = RolloutDataSourceWithBuffer(_args(data, load=ckpt))
    assert fully_async.load_state_into_buffer(source.args, source, 5) == 0 and source.buffer == []
