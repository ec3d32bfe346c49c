"""A resume from a checkpoint the original slime wrote continues its prompt stream (`data/original_cursor.py`)."""

import json
import random

import numpy as np
import pytest
import torch

from slime_core.config import PluginArgs, SlimeArgs
from slime_rollout.data.source import RolloutDataSourceWithBuffer


def _args(tmp_path, **kw):
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(7)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = dict(rollout_batch_size=1, num_rollout=1, input_key="question", label_key="answer", rollout_seed=42,
                  n_samples_per_prompt=2, rollout_shuffle=True, prompt_data=str(data))  # fmt: skip
    return PluginArgs.from_config(SlimeArgs.from_dict({**fields, **kw}))


def test_the_originals_cursor_file_resumes_where_its_run_stopped(tmp_path):
    # Was: "no data-source cursor at .../data_source_3.json; starting from the beginning": the prompts of an
    # original run resumed with --load started over from the first one.
    ran = RolloutDataSourceWithBuffer(_args(tmp_path))
    ran.get_samples(5)  # into the second epoch: 7 prompts, 5 + 5 taken by the end
    ran.get_samples(5)
    expected = ran.get_samples(4)
    # What the original's RolloutDataSource.save(3) wrote at that point (slime/rollout/data_source.py).
    (tmp_path / "ckpt" / "rollout").mkdir(parents=True)
    torch.save(
        {"sample_offset": 3, "epoch_id": 1, "sample_group_index": 10, "sample_index": 20, "metadata": {"k": 1}},
        tmp_path / "ckpt" / "rollout" / "global_dataset_state_dict_3.pt",
    )
    resumed = RolloutDataSourceWithBuffer(_args(tmp_path, load=str(tmp_path / "ckpt")))
    resumed.load(3)
    got = resumed.get_samples(4)
    assert [[s.to_dict() for s in g] for g in got] == [[s.to_dict() for s in g] for g in expected]
    assert resumed.metadata == {"k": 1} and got[0][0].index == 20


def test_a_damaged_original_cursor_is_one_error_naming_the_file(tmp_path):
    (tmp_path / "ckpt" / "rollout").mkdir(parents=True)
    bad = tmp_path / "ckpt" / "rollout" / "global_dataset_state_dict_3.pt"
    bad.write_bytes(b"not a torch file")
    resumed = RolloutDataSourceWithBuffer(_args(tmp_path, load=str(tmp_path / "ckpt")))
    with pytest.raises(ValueError, match=rf"^{bad}: not a data cursor of the original slime"):
        resumed.load(3)


def _original_epoch(seed: int, epoch: int, n: int) -> list[int]:
    """The original's Dataset.shuffle(epoch) order, on the process-wide generator (restored after)."""
    saved = random.getstate()
    try:
        random.seed(seed + epoch)
        permutation = list(range(n))
        random.shuffle(permutation)
        return permutation
    finally:
        random.setstate(saved)


def test_a_shuffled_run_of_the_original_goes_on_in_the_originals_order(tmp_path):
    # Reproducer: the order was a NumPy permutation, so the original's run resumed mid-epoch 1 at offset 3 got
    # prompts of another order (some of the epoch's prompts skipped, others served twice).
    (tmp_path / "ckpt" / "rollout").mkdir(parents=True)
    torch.save(
        {"sample_offset": 3, "epoch_id": 1, "sample_group_index": 10, "sample_index": 20},
        tmp_path / "ckpt" / "rollout" / "global_dataset_state_dict_3.pt",
    )
    resumed = RolloutDataSourceWithBuffer(_args(tmp_path, load=str(tmp_path / "ckpt")))
    resumed.load(3)
    got = [g[0].prompt for g in resumed.get_samples(8)]
    # The rest of epoch 1 (4 prompts), then epoch 2, as the original's RolloutDataSource serves them (seed 42).
    expected = [f"q{i}" for i in _original_epoch(42, 1, 7)[3:] + _original_epoch(42, 2, 7)[:4]]
    assert got == expected


def test_a_cursor_written_with_the_earlier_numpy_order_keeps_it(tmp_path):
    # A run of this version checkpointed before the order followed the original goes on as it began.
    cursor = {"epoch_id": 1, "sample_offset": 3, "sample_group_index": 10, "sample_index": 20, "metadata": {}}
    (tmp_path / "ckpt" / "rollout").mkdir(parents=True)
    (tmp_path / "ckpt" / "rollout" / "data_source_3.json").write_text(json.dumps(cursor))
    resumed = RolloutDataSourceWithBuffer(_args(tmp_path, load=str(tmp_path / "ckpt")))
    resumed.load(3)
    expected = [f"q{i}" for i in np.random.default_rng(43).permutation(7)[3:]]
    assert [g[0].prompt for g in resumed.get_samples(4)] == expected
    assert resumed._state()["shuffle_order"] == "numpy"  # and says so in its next cursor


def test_a_cursor_saved_over_another_prompt_count_is_said(tmp_path, caplog):
    # Reproducer: a run resumed after --prompt-data changed (or another length filter) went on silently with other
    # prompts at the saved offset and epoch order.
    ran = RolloutDataSourceWithBuffer(_args(tmp_path, save=str(tmp_path / "ckpt")))
    ran.get_samples(2)
    ran.save(1)
    args = _args(tmp_path, load=str(tmp_path / "ckpt"))  # writes the 7 rows again
    same = RolloutDataSourceWithBuffer(args)
    same.load(1)
    assert "saved over" not in caplog.text
    rows = [{"question": f"r{i}", "answer": "0"} for i in range(5)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    resumed = RolloutDataSourceWithBuffer(args)
    resumed.load(1)
    assert f"saved over 7 prompts; --prompt-data {tmp_path / 'd.jsonl'} now gives 5" in caplog.text
