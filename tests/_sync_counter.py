"""Counts would-be host-device syncs on CPU: the shared helper of the trainers' `test_host_syncs_cpu.py` (issue 26).

On a GPU a read of a device tensor (`.item()`, `.tolist()`, `float(t)`, `int(t)`, `.cpu()`, `if t:`, `nonzero`,
boolean-mask indexing, ...) and a blocking copy of a host tensor towards the device (`.to(device)` without
`non_blocking`, `torch.tensor(data, device=...)`) make the host wait until the GPU has run everything queued so far.
`SyncCounter` (a torch function mode) follows which tensors would live on the accelerator and records each such read
and copy with the first frame of the code under test that made it.

"Device" tensors: the ones given (parameters, buffers), tensors torch.distributed creates with an explicit `device=`
(FSDP's all-gather buffers, of which the unsharded parameters are views), and every result of an op with a device
input. (A `device=` in slime's code is not enough: on CPU `device=host_tensor.device` looks the same.) On CPU
`slime_core.host_to_device.to_device` hands back the host tensor itself, so what it copied stays a host tensor here (no
sync on a GPU either: a pinned non-blocking copy). Not seen: a `.to(torch.device("cpu"))` of a device tensor (on CPU
it cannot be told from `.to(self.device)`); `.to("cpu")` with the string is counted.

Load it by path (tests/ is no package): `importlib.util.spec_from_file_location(..., tests / "_sync_counter.py")`.
"""

from __future__ import annotations

import collections
import sys
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

_READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy", "nonzero", "argwhere",
          "masked_select", "unique", "repeat_interleave", "equal", "allclose"}  # fmt: skip
_COPIES = {"to", "cuda", "copy_"}
_FACTORIES = {"tensor", "as_tensor"}


def _site(code: tuple[str, ...]) -> str:
    """`package/module.py:function` of the innermost caller frame whose file path holds one of `code` (not tests)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename
        if any(part in name for part in code) and "/tests/" not in name:
            return f"{name.split('/src/')[-1].split('site-packages/')[-1]}:{frame.name}"
    return "?"


def _device_target(args, kwargs) -> str | None:
    """The device a `.to`/`.cuda`/factory call names: "host" for the string "cpu", "device" otherwise, or None."""
    named = kwargs.get("device")
    if named is None:
        named = next((a for a in args[1:] if isinstance(a, (torch.device, str))), None)
    if named is None:
        return None
    return "host" if named == "cpu" else "device"


def _made_by_torch_distributed() -> bool:
    """Whether the innermost caller outside this file and torch's function-mode plumbing is in torch.distributed."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename == __file__ or "torch/overrides" in frame.f_code.co_filename):
        frame = frame.f_back
    return frame is not None and "torch/distributed" in frame.f_code.co_filename


def _bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class SyncCounter(TorchFunctionMode):
    """Counts would-be syncs: reads of device tensors and blocking copies of host tensors towards the device.

    Args:
        device_tensors: tensors that live on the accelerator from the start (parameters, buffers, main grads).
        code: path parts of the code whose frames name a sync (`"/slime_"`; `"megatron/core"` for Megatron's).

    Attributes:
        hits: `(operation, "module.py:function") -> count`.
    """

    def __init__(self, device_tensors, code: tuple[str, ...] = ("/slime_",)) -> None:
        super().__init__()
        self.code = code
        self.on_device = WeakTensorKeyDictionary()
        for t in device_tensors:
            self.on_device[t] = True
        self.hits: collections.Counter[tuple[str, str]] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        from_device = any(t in self.on_device for t in inputs)
        target = _device_target(args, kwargs) if name in _COPIES or name in _FACTORIES or "device" in kwargs else None
        if name in ("__getitem__", "__setitem__") and _bool_index(args):
            name = "boolean mask"
        if from_device and (name in _READS or name == "boolean mask" or (name == "to" and target == "host")):
            self.hits[(name, _site(self.code))] += 1
        elif name in _COPIES and not from_device and target == "device" and not kwargs.get("non_blocking"):
            self.hits[(f"blocking {name}", _site(self.code))] += 1
        elif name in _FACTORIES and target == "device":
            self.hits[(f"blocking {name}", _site(self.code))] += 1
        out = func(*args, **kwargs)
        made_on_device = target == "device" and "device" in kwargs and _made_by_torch_distributed()
        if (
            (from_device or made_on_device or (name in _COPIES and target == "device"))
            and name != "cpu"
            and target != "host"
        ):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.on_device[t] = True
        elif name == "cpu" or target == "host":
            # On CPU `.cpu()` hands back the tensor itself: from here on it is the host copy.
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t in self.on_device:
                    del self.on_device[t]
        return out
