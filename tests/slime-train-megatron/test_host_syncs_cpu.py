"""Host-device syncs of one Megatron `train()` / `train_critic()` do not grow with the micro-batches (issue 26).

On a GPU a read of a device tensor (`.item()`, `.tolist()`, `float(t)`, `.cpu()`, `if t:`, `nonzero`, boolean-mask
indexing) and a blocking host → device copy (`.to(device)` without `non_blocking`, `torch.tensor(data, device=...)`)
make the host wait until the GPU has run everything queued so far; inside the micro-batch loop that leaves the GPU
idle while the host queues the next kernels. This CPU test counts them in one `train()`: `SyncCounter`
(tests/_sync_counter.py, shared with FSDP's) follows which tensors would live on the device (the model's parameters,
buffers and main grads, and every tensor computed from them) and records each read of such a tensor and each blocking
copy towards the device, with the first slime / megatron-core frame that made it.

The schedule is 2 optimizer steps plus the old-log-prob forward (the benchmark's shape); the larger batch has 3× the
micro-batches and 2× the samples per micro-batch. On CPU, `slime_core.host_to_device.to_device` hands back the host
tensor itself, so reads of what it copied are not seen (the data-parallel reduction's one read of all metric sums
after the last step, `trainer_parts.reduce_metric_sums`). What may be read: once per optimizer step (the grad norm,
in the optimizer) and a fixed number of times at the end of train() (the log-probs of the old-log-prob forward in one
copy, the metric sums in one reduction).
"""

from __future__ import annotations

import collections
import importlib.util
import pathlib

import pytest
import torch

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.critic import critic_config

pytest.importorskip("megatron.core")

# The shared counter (tests/_sync_counter.py), loaded by path: tests/ is no package.
_spec = importlib.util.spec_from_file_location(
    "slime_tests_sync_counter", pathlib.Path(__file__).resolve().parents[1] / "_sync_counter.py"
)
_sync_counter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sync_counter)


def _batch(micro_batches: int, per_mb: int) -> RolloutBatch:
    """2 optimizer steps of `micro_batches` × `per_mb` samples (12 tokens, 5 of them response)."""
    g = torch.Generator().manual_seed(0)
    n = 2 * micro_batches * per_mb
    ids = iter(range(n))
    schedule = [[[next(ids) for _ in range(per_mb)] for _ in range(micro_batches)] for _ in range(2)]
    rewards = [1.0 if j % 2 == 0 else -1.0 for j in range(n)]
    return RolloutBatch(
        tokens=[torch.randint(0, 250, (12,), generator=g) for _ in range(n)],
        response_lengths=[5] * n,
        loss_masks=[torch.ones(5) for _ in range(n)],
        rewards=rewards,
        raw_rewards=rewards,
        loss_denominators=[5.0] * n,
        micro_batches=schedule,
        step_sample_counts=[micro_batches * per_mb] * 2,
        step_token_counts=[float(micro_batches * per_mb * 5)] * 2,
    )


def _count(backend, batch, critic: bool = False) -> collections.Counter:
    device_tensors = [*backend.module.parameters(), *backend.module.buffers()]
    device_tensors += [p.main_grad for p in backend.module.parameters() if getattr(p, "main_grad", None) is not None]
    counter = _sync_counter.SyncCounter(device_tensors, code=("/slime_", "megatron/core"))
    with counter:
        if critic:
            backend.train_critic(0, batch)
        else:
            backend.train(0, batch)
    return counter.hits


# `trainer_parts.optimizer_step`: megatron-core reads its grad norm once per step in `optimizer.step()`; here the CPU
# stand-in of conftest.py runs (a torch Adam whose rate is a tensor), whose reads are not the backend's.
_OPTIMIZER = "slime_train_megatron/trainer_parts.py:optimizer_step"


def test_host_syncs_of_a_train_step_do_not_grow_with_micro_batches(cpu_backend_env, tiny_hf):
    _, hf_dir = tiny_hf("qwen3")
    args = SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
        "megatron_args": ["--fp32", "--transformer-impl", "local", "--lr", "1e-3"], "advantage_estimator": "grpo",
        "rollout_temperature": 1.0, "kl_coef": 0.0, "use_kl_loss": False, "entropy_coef": 0.0, "eps_clip": 0.2,
    })  # fmt: skip
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    small, large = _batch(1, 2), _batch(3, 4)
    backend.train(0, small)  # first call: lazy state (optimizer moments) out of the way
    few, many = _count(backend, small), _count(backend, large)
    few, many = (collections.Counter({k: n for k, n in c.items() if k[1] != _OPTIMIZER}) for c in (few, many))
    assert few == many, f"syncs that grow with the micro-batches: {dict(many - few)}"
    assert dict(few) == {
        # the old log-probs of all micro-batches, one copy
        ("cpu", "slime_core/host_to_device.py:per_sample_on_host"): 1,
        ("tolist", "slime_core/step_metrics.py:_read_to_host"): 1,  # the metric sums of both steps, one read
    }


def test_critic_host_syncs_do_not_grow_with_micro_batches(cpu_backend_env, tiny_hf):
    from slime_train_megatron.critic_backend import MegatronCriticBackend

    _, hf_dir = tiny_hf("qwen3")
    args = critic_config(SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
        "megatron_args": ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer"],
        "advantage_estimator": "ppo", "critic_lr": 1e-3, "rollout_temperature": 1.0,
    }))  # fmt: skip
    critic = MegatronCriticBackend()
    critic.init(args)
    small, large = _batch(1, 2), _batch(3, 4)
    critic.train_critic(0, small)  # lazy optimizer state out of the way
    few, many = _count(critic, small, critic=True), _count(critic, large, critic=True)
    few, many = (collections.Counter({k: n for k, n in c.items() if k[1] != _OPTIMIZER}) for c in (few, many))
    assert few == many, f"syncs that differ with the micro-batches: small {dict(few)}, large {dict(many)}"
    assert dict(few) == {
        ("cpu", "slime_core/host_to_device.py:per_sample_on_host"): 1,  # the values, one copy
        ("tolist", "slime_core/step_metrics.py:_read_to_host"): 1,  # the metric sums of both steps, one read
    }
