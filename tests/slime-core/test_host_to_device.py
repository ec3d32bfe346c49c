"""`slime_core.host_to_device`: copies towards the accelerator that keep shapes, dtypes and values (CPU here)."""

import torch

from slime_core.host_to_device import to_device, to_device_many


def test_to_device_on_the_same_device_is_the_tensor_itself():
    t = torch.arange(4)
    assert to_device(t, "cpu") is t and to_device(t, torch.device("cpu")) is t


def test_to_device_many_keeps_each_tensor():
    tensors = [
        torch.tensor([1.5, -2.0]),
        torch.tensor([[1, 2], [3, 4]]),
        torch.zeros(0),
        torch.tensor(7, dtype=torch.int32),
    ]
    out = to_device_many(tensors, "cpu")
    assert len(out) == 4
    for got, want in zip(out, tensors, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert to_device_many([], "cpu") == []


def test_to_device_many_groups_host_tensors_by_dtype():
    """Host tensors towards another device: one copy per dtype, split back to each shape ("meta" stands in)."""
    tensors = [torch.ones(2, 3), torch.arange(5), torch.ones(4), torch.tensor(3)]
    out = to_device_many(tensors, "meta")
    assert [(t.device.type, t.dtype, tuple(t.shape)) for t in out] == [
        ("meta", torch.float32, (2, 3)),
        ("meta", torch.int64, (5,)),
        ("meta", torch.float32, (4,)),
        ("meta", torch.int64, ()),
    ]
