"""Saved groups (the partial-rollout buffer, fully-async held groups) resumed with another --n-samples-per-prompt.

Issue 27: they came back at their old size. The default rollout then stopped, blaming the data source
("group 0 has 2 samples, expected 3"); the fully-async producer, whose restored groups skip its size check, trained
them (advantages normalized over groups of two sizes). Now they are dropped with one counted warning, as the original
(which keeps no such group across a resume); groups of the run's size are kept.
"""

import json
import logging
import types

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_rollout.data.source import RolloutDataSourceWithBuffer
from slime_rollout.generation import fully_async


def _args(path, **kw):
    fields = {"rollout_batch_size": 1, "num_rollout": 1, "input_key": "question", "label_key": "answer",
              "rollout_seed": 42, "prompt_data": path, "n_samples_per_prompt": 2, **kw}  # fmt: skip
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


def _warnings(caplog):
    """The messages of the module that drops the groups (other loggers may warn in a shared worker)."""
    return [r.getMessage() for r in caplog.records if r.name == "slime_rollout.data.cursor_file"]


def _data(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(6)))
    return str(path)


def test_buffered_groups_of_another_size_are_dropped_with_a_count(tmp_path, caplog):
    data, ckpt = _data(tmp_path), str(tmp_path / "ckpt")
    ds = RolloutDataSourceWithBuffer(_args(data, save=ckpt))
    ds.get_samples(2)
    ds.add_samples(ds.get_samples(1))  # prompt q2, a group of 2, buffered
    ds.save(0)

    same = RolloutDataSourceWithBuffer(_args(data, load=ckpt))
    same.load(0)
    assert [[s.prompt for s in g] for g in same.buffer] == [["q2", "q2"]]  # same size: kept

    resumed = RolloutDataSourceWithBuffer(_args(data, load=ckpt, n_samples_per_prompt=3))
    with caplog.at_level(logging.WARNING, logger="slime_rollout.data.cursor_file"):
        resumed.load(0)
    assert resumed.buffer == []  # was: served first, a group of 2 where 3 are expected
    assert _warnings(caplog) == [
        f"{ckpt}/rollout/data_source_0.json: dropped 1 of 1 saved group(s) of 2 sample(s), not --n-samples-per-prompt "
        "3 (saved by a run with another value); their prompts are not drawn again"
    ]
    (group,) = resumed.get_samples(1)
    assert [s.prompt for s in group] == ["q3"] * 3  # the stream goes on after the cursor


def test_fully_async_held_groups_of_another_size_are_dropped_with_a_count(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(fully_async, "_restored", [])  # the module's restored groups: put back after the test
    held = [[Sample(index=2 * g + i, group_index=g, prompt=f"q{g}").to_dict() for i in range(2)] for g in range(2)]
    held.append([Sample(index=9, group_index=4, prompt="q4").to_dict()])  # a group of 1
    path = fully_async.state_path(tmp_path, 3)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"held": held}))
    args = types.SimpleNamespace(load=str(tmp_path), n_samples_per_prompt=2)
    with caplog.at_level(logging.WARNING, logger="slime_rollout.data.cursor_file"):
        assert fully_async.load_state(args, 3) == 2  # was 3: the group of 1 was generated and trained as it was
    assert [[s.group_index for s in g] for g in fully_async._restored] == [[0, 0], [1, 1]]
    assert _warnings(caplog) == [
        f"{path}: dropped 1 of 3 saved group(s) of 1 sample(s), not --n-samples-per-prompt 2 (saved by a run with "
        "another value); their prompts are not drawn again"
    ]
