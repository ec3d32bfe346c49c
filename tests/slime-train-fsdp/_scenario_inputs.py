"""Scenarios that vary what the backend is given: `tied` (tied embeddings, 2 ranks) and `pipeline` (the real
`build_rollout_batches` feeding the backend, any world size)."""

from __future__ import annotations

import pathlib

import torch
import torch.distributed as dist
from slime_fsdp_test_worker_common import full_params, hf_reference_log_probs, make_args, make_batch, max_diff

from slime_train_fsdp import FSDPTrainBackend


def scenario_tied(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """Tied embeddings (as small Qwen3 checkpoints have), 2 ranks: parity, training keeps the tie, export."""
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = make_batch(rank, world)
    b = FSDPTrainBackend()
    b.init(make_args(ckpt), with_ref=False)
    res = {"hf_diff": max_diff(b.compute_log_probs(batch), hf_reference_log_probs(ckpt, batch))}
    b.train(0, batch)
    b.save_hf(work / "hf_tied_trained")
    res["export_diff"] = max_diff(
        b.compute_log_probs(batch), hf_reference_log_probs(str(work / "hf_tied_trained"), batch)
    )
    res["tied_after_train"] = b.model.lm_head.weight is b.model.model.embed_tokens.weight
    res["names"] = sorted(full_params(b))
    return res


def pipeline_samples() -> list:
    """4 prompts x 2 responses as `Sample`s (varied lengths, one masked token, rewards 0/1)."""
    from slime_core.sample import Sample, Status

    g = torch.Generator().manual_seed(7)
    samples = []
    for i in range(8):
        prompt, response = 3 + i % 3, 2 + (i * 5) % 4
        mask = [1] * response
        if i == 5:
            mask[0] = 0
        samples.append(
            Sample(tokens=torch.randint(0, 64, (prompt + response,), generator=g).tolist(), response_length=response,
                   loss_mask=mask, reward=float(i % 3 == 0), status=Status.COMPLETED, group_index=i // 2, index=i)
        )  # fmt: skip
    return samples


def scenario_pipeline(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """Real `build_rollout_batches` (GRPO rewards, dynamic batch size) feeding the backend, any world size."""
    from slime_core.train_data import build_rollout_batches

    rank, world = dist.get_rank(), dist.get_world_size()
    args = make_args(
        ckpt,
        reward_key=None,
        disable_rewards_normalization=False,
        disable_grpo_std_normalization=False,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=16,
        micro_batch_size=1,
        balance_data=False,
    )
    batch = build_rollout_batches(args, pipeline_samples(), dp_size=world)[rank]
    b = FSDPTrainBackend()
    b.init(args, with_ref=False)
    init = full_params(b)
    grads: list[dict[str, torch.Tensor]] = []
    optimizer_step = b.optimizer_step

    def capture():  # the summed gradient each step applies (before clipping), gathered from the shards
        grads.append({n: p.grad.full_tensor().clone() for n, p in b.model.named_parameters() if p.grad is not None})
        return optimizer_step()

    b.optimizer_step = capture
    b.train(0, batch)
    return {"init": init, "params": full_params(b), "steps": b.step_metrics, "micro_batches": batch.micro_batches,
            "grad0": grads[0]}  # fmt: skip
