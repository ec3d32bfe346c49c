"""`slime_core.step_metrics.read_scalars`: 0-d tensors of step records read in one transfer, as `float(t)` would."""

from __future__ import annotations

import torch

from slime_core.step_metrics import read_scalars


def test_read_scalars_gives_the_floats_of_float_t_and_keeps_the_rest():
    norm0 = torch.tensor(0.1, dtype=torch.float32)  # not exact in binary: float32 and float64 differ
    norm1 = torch.tensor([[3.5]], dtype=torch.float64).reshape(())
    records = [{"train/grad_norm": norm0, "train/lr": 0.25}, {"train/grad_norm": norm1, "train/lr": 0.5}]
    out = read_scalars(records)
    assert out == [{"train/grad_norm": float(norm0), "train/lr": 0.25}, {"train/grad_norm": 3.5, "train/lr": 0.5}]
    assert out[0]["train/grad_norm"] != 0.1  # the float32 value itself, not a rounded decimal
    assert all(type(v) is float for r in out for v in r.values())
    assert records[0]["train/grad_norm"] is norm0  # the input dicts are left as they were


def test_read_scalars_without_tensors_copies():
    records = [{"a": 1.0}]
    out = read_scalars(records)
    assert out == records and out[0] is not records[0]
    assert read_scalars([]) == []
