"""Rollout debug dumps: atomic save, exact round trip, eval file names, subsampling, regrouping."""

import pytest
import torch

from slime_core.config import SlimeArgs
from slime_core.sample import Sample, Status
from slime_rollout.runtime.debug_dump import dump_path, load_debug_rollout_data, regroup, save_debug_rollout_data


def _cfg(**fields):
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields})


def _samples(num):
    out = []
    for i in range(num):
        s = Sample(prompt=f"p{i // 2}", tokens=[1, 2], label="3", group_index=i // 2, index=i, metadata={"k": i})
        s.append_response_tokens([5, 6], log_probs=[-0.5, -1.25], text="xy", meta_info={"weight_version": "3"})
        s.status = Status.TRUNCATED if i % 2 else Status.COMPLETED
        s.reward = float(i)
        out.append(s)
    return out


def test_round_trip_is_exact(tmp_path):
    args = _cfg(
        save_debug_rollout_data=str(tmp_path / "r" / "{rollout_id}.pt"),
        load_debug_rollout_data=str(tmp_path / "r" / "{rollout_id}.pt"),
        load_debug_rollout_data_subsample=None,
    )
    samples = _samples(6)
    save_debug_rollout_data(args, 2, samples)
    save_debug_rollout_data(args, 2, samples[:2], evaluation=True)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["2.pt", "eval_2.pt"]
    raw = torch.load(tmp_path / "r" / "2.pt", weights_only=True)
    assert raw["rollout_id"] == 2 and raw["samples"][1]["status"] == "truncated"
    loaded = load_debug_rollout_data(args, 2)
    assert [s.to_dict() for s in loaded] == [s.to_dict() for s in samples]
    assert [[s.index for s in g] for g in regroup(loaded)] == [[0, 1], [2, 3], [4, 5]]


def test_subsample_keeps_head_and_tail(tmp_path):
    args = _cfg(
        save_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"),
        load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"),
        load_debug_rollout_data_subsample=0.4,
    )
    save_debug_rollout_data(args, 0, _samples(10))
    # 10 * 0.4 = 4 kept: 2 from the head, 2 from the tail.
    assert [s.index for s in load_debug_rollout_data(args, 0)] == [0, 1, 8, 9]


def test_path_template_must_have_rollout_id(tmp_path):
    with pytest.raises(ValueError, match="rollout_id"):
        dump_path(str(tmp_path / "fixed.pt"), 0)


def test_a_damaged_or_foreign_dump_is_one_line_naming_the_flag_and_file(tmp_path):
    # torch.load's UnpicklingError / zip error reached the driver as a traceback naming no flag.
    args = _cfg(load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"))
    (tmp_path / "0.pt").write_bytes(b"not a torch file\n")
    with pytest.raises(ValueError) as e:
        load_debug_rollout_data(args, 0)
    dump = tmp_path / "0.pt"
    assert str(e.value).startswith(f"--load-debug-rollout-data: {dump} is not a rollout dump torch can read (")
    torch.save({"rollout_id": 1, "samples": [{"no_such_field": 1}]}, tmp_path / "1.pt")
    with pytest.raises(ValueError, match=r"^--load-debug-rollout-data: .*1\.pt: a sample does not read back"):
        load_debug_rollout_data(args, 1)
    torch.save([1, 2], tmp_path / "2.pt")
    with pytest.raises(ValueError, match=r"^--load-debug-rollout-data: .*2\.pt is not a rollout dump \(expected a"):
        load_debug_rollout_data(args, 2)
