"""Rank scenario of `test_host_syncs_cpu.py` (`run`): counts would-be host-device syncs of FSDP train steps.

One gloo rank on CPU; `SyncCounter` (tests/_sync_counter.py) records each read of a would-be device tensor and each
blocking copy towards the device, with the first slime frame that made it; the model's parameters and buffers start
on the "device".
"""

from __future__ import annotations

import collections
import copy
import importlib.util
import pathlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.critic import critic_config
from slime_train_fsdp import FSDPCriticBackend, FSDPTrainBackend

# The shared counter (tests/_sync_counter.py), loaded by path: tests/ is no package.
_spec = importlib.util.spec_from_file_location(
    "slime_tests_sync_counter", pathlib.Path(__file__).resolve().parents[1] / "_sync_counter.py"
)
_sync_counter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sync_counter)
SyncCounter = _sync_counter.SyncCounter


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
