"""`slime_core.step_metrics.read_steps`: the steps' metric sums and grad norms read in one transfer, as `float(t)`."""

from __future__ import annotations

import torch

from slime_core import step_metrics
from slime_core.step_metrics import read_steps


def test_read_steps_gives_the_floats_of_float_t_and_keeps_the_rest():
    norm0 = torch.tensor(0.1, dtype=torch.float32)  # not exact in binary: float32 and float64 differ
    norm1 = torch.tensor([[3.5]], dtype=torch.float64).reshape(())
    records = [{"train/grad_norm": norm0, "train/lr": 0.25}, {"train/grad_norm": norm1, "train/lr": 0.5}]
    _, out = read_steps([({}, records[0]), ({}, records[1])])
    assert out == [{"train/grad_norm": float(norm0), "train/lr": 0.25}, {"train/grad_norm": 3.5, "train/lr": 0.5}]
    assert out[0]["train/grad_norm"] != 0.1  # the float32 value itself, not a rounded decimal
    assert all(type(v) is float for r in out for v in r.values())
    assert records[0]["train/grad_norm"] is norm0  # the input dicts are left as they were


def test_read_steps_sums_each_steps_micro_batches_in_order():
    third = torch.tensor(1 / 3, dtype=torch.float32)
    steps = [
        ({"loss": [third, torch.tensor(0.5), 0.25], "clipfrac": [torch.tensor(0.0)]}, {"train/grad_norm": 2.0}),
        ({"loss": [torch.tensor(-1.0)], "clipfrac": [0.125]}, {"train/grad_norm": torch.tensor(4.0)}),
    ]
    sums, records = read_steps(steps)
    assert sums == {
        "steps/0/loss": float(third) + 0.5 + 0.25,  # float64 additions of the float32 values
        "steps/0/clipfrac": 0.0,
        "steps/1/loss": -1.0,
        "steps/1/clipfrac": 0.125,
    }
    assert records == [{"train/grad_norm": 2.0}, {"train/grad_norm": 4.0}]


def test_read_steps_reads_the_sums_and_the_grad_norms_in_one_transfer(monkeypatch):
    reads = []
    real = step_metrics._read_to_host
    monkeypatch.setattr(step_metrics, "_read_to_host", lambda tensors: reads.append(len(tensors)) or real(tensors))
    steps = [({"loss": [torch.tensor(1.0), torch.tensor(2.0)]}, {"train/grad_norm": torch.tensor(3.0)})] * 2
    assert read_steps(steps)[0] == {"steps/0/loss": 3.0, "steps/1/loss": 3.0}
    assert reads == [6]  # 4 metric values and 2 grad norms


def test_read_steps_without_tensors_copies():
    records = [{"a": 1.0}]
    sums, out = read_steps([({}, records[0])])
    assert sums == {} and out == records and out[0] is not records[0]
    assert read_steps([]) == ({}, [])
