"""Rank scenario of `test_host_syncs_cpu.py` (`run`): counts would-be host-device syncs of FSDP train steps.

One gloo rank on CPU. `SyncCounter` (a torch function mode) follows which tensors would live on the accelerator
and records, with the first slime frame that made it, each read of such a tensor (`.item()`, `.tolist()`, `float(t)`,
`int(t)`, `.cpu()`, `if t:`, `nonzero`, boolean-mask indexing, ...) and each blocking copy of a host tensor towards
the device (`.to(device)` without `non_blocking`, `torch.tensor(data, device=...)`).

"Device" tensors: the model's parameters and buffers, tensors torch.distributed creates with an explicit `device=`
(FSDP's all-gather buffers, of which the unsharded parameters are views), and every result of an op with a device
input. (A `device=` in slime's code is not enough: on CPU `device=host_tensor.device` looks the same.)
On CPU `slime_core.host_to_device.to_device` hands back the host tensor itself, so what it copied stays a host tensor
here (no sync on a GPU either: a pinned non-blocking copy). Not seen: a `.to(torch.device("cpu"))` of a device tensor
(on CPU it cannot be told from `.to(self.device)`); `.to("cpu")` with the string is counted.
"""

from __future__ import annotations

import collections
import copy
import pathlib
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.critic import critic_config
from slime_train_fsdp import FSDPCriticBackend, FSDPTrainBackend

_READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy", "nonzero", "argwhere",
          "masked_select", "unique", "repeat_interleave", "equal", "allclose"}  # fmt: skip
_COPIES = {"to", "cuda", "copy_"}
_FACTORIES = {"tensor", "as_tensor"}


def _site() -> str:
    """`package/module.py:function` of the innermost slime frame of the caller (else of torch)."""
    frames = traceback.extract_stack()[:-2]
    for frame in reversed(frames):
        if "/slime_" in frame.filename and "/tests/" not in frame.filename:
            return f"{frame.filename.split('/src/')[-1]}:{frame.name}"
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
        device_tensors: tensors that live on the accelerator from the start (parameters, buffers).
    """

    def __init__(self, device_tensors) -> None:
        super().__init__()
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
            self.hits[(name, _site())] += 1
        elif name in _COPIES and not from_device and target == "device" and not kwargs.get("non_blocking"):
            self.hits[(f"blocking {name}", _site())] += 1
        elif name in _FACTORIES and target == "device":
            self.hits[(f"blocking {name}", _site())] += 1
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


def make_batch(micro_batches: int, per_mb: int) -> RolloutBatch:
    """2 optimizer steps of `micro_batches` × `per_mb` samples (vocab 64; 9 to 12 tokens, 3 to 5 of them response)."""
    g = torch.Generator().manual_seed(0)
    n = 2 * micro_batches * per_mb
    ids = iter(range(n))
    schedule = [[[next(ids) for _ in range(per_mb)] for _ in range(micro_batches)] for _ in range(2)]
    resp = [3 + i % 3 for i in range(n)]
    masks = [torch.ones(r) for r in resp]
    rewards = [1.0 if i % 2 == 0 else -1.0 for i in range(n)]
    return RolloutBatch(
        tokens=[torch.randint(0, 64, (6 + r + i % 2,), generator=g) for i, r in enumerate(resp)],
        response_lengths=resp,
        loss_masks=masks,
        rewards=rewards,
        raw_rewards=rewards,
        loss_denominators=[float(r) for r in resp],
        micro_batches=schedule,
        step_sample_counts=[micro_batches * per_mb] * 2,
        step_token_counts=[float(sum(resp[: n // 2])), float(sum(resp[n // 2 :]))],
    )


def _args(ckpt: str, estimator: str) -> SlimeArgs:
    return SlimeArgs.from_dict({
        "hf_checkpoint": ckpt, "train_backend": "fsdp", "attn_implementation": "slime_varlen",
        "advantage_estimator": estimator, "rollout_batch_size": 4, "n_samples_per_prompt": 2,
        "global_batch_size": 4, "num_rollout": 4, "lr": 1e-3, "rollout_temperature": 0.8, "seed": 1234,
        "use_kl_loss": True, "kl_loss_coef": 0.1, "kl_coef": 0.0, "entropy_coef": 0.01, "eps_clip": 0.2,
        "log_probs_chunk_size": 4, "clip_grad": 1.0,
    })  # fmt: skip


def _count(model: torch.nn.Module, call) -> collections.Counter:
    counter = SyncCounter([*model.parameters(), *model.buffers()])
    full_tensor = DTensor.full_tensor

    def tracked_full_tensor(self, *args, **kwargs):
        # DTensor's redistribution runs outside torch function modes: carry the mark over by hand (the grad norm).
        out = full_tensor(self, *args, **kwargs)
        if self in counter.on_device:
            counter.on_device[out] = True
        return out

    DTensor.full_tensor = tracked_full_tensor  # this rank's process only, restored below
    try:
        with counter:
            call()
    finally:
        DTensor.full_tensor = full_tensor
    return counter.hits


def scenario_syncs(ckpt: str) -> dict:
    """Counts of `train()` and `train_critic()` on a 1-micro-batch and a 3-micro-batch schedule (2 steps each)."""
    small, large = make_batch(1, 2), make_batch(3, 4)
    actor = FSDPTrainBackend()
    actor.init(_args(ckpt, "grpo"), with_ref=True)
    actor.train(0, small)  # lazy state (AdamW moments) out of the way
    res = {"actor": [_count(actor.model, lambda b=b: actor.train(1, b)) for b in (small, large)]}
    critic = FSDPCriticBackend()
    critic.init(critic_config(_args(ckpt, "ppo")))
    critic.train_critic(0, small)
    res["critic"] = [_count(critic.model, lambda b=b: critic.train_critic(1, b)) for b in (small, large)]
    return {k: [dict(c) for c in v] for k, v in res.items()}


def run(scenario: str, out: pathlib.Path, ckpt: str) -> None:
    """Runs `scenario` on this rank (process group from the environment) and saves its results."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        res = {"syncs": scenario_syncs}[scenario](ckpt)
        torch.save(copy.deepcopy(res), out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run(sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3])
