"""The CUDA/NCCL smoke scenario `gpu` (subprocess ranks; skipped without CUDA)."""

from __future__ import annotations

import pathlib

import torch
import torch.distributed as dist
from slime_fsdp_test_worker_common import (
    full_params,
    hf_reference_log_probs,
    make_args,
    make_batch,
    max_diff,
    optimizer_states,
)

from slime_train_fsdp import FSDPTrainBackend


def scenario_gpu(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """CUDA/NCCL smoke: bf16 log-probs near fp32 HF, training, offload, buckets, save/resume."""
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = make_batch(rank, world)
    args = make_args(
        ckpt, save=str(work / "gpu_ckpt"), use_kl_loss=True, kl_loss_coef=0.01, offload_train_pin_memory=True
    )
    b = FSDPTrainBackend()
    b.init(args, with_ref=True)
    res = {"lp_diff": max_diff(b.compute_log_probs(batch), hf_reference_log_probs(ckpt, batch))}
    res["metrics"] = [b.train(rid, batch) for rid in range(2)]
    before = torch.cuda.memory_allocated()
    params_before, states_before = full_params(b), optimizer_states(b)
    b.sleep()
    res["mem_before_after_sleep"] = (before, torch.cuda.memory_allocated())
    host = b.residency._host._buffers
    res["pinned_buffers"] = (len(host), all(t.is_pinned() for t in host), b.residency._host.pinned_bytes)
    ptrs = [t.data_ptr() for t in host]
    b.wake_up()
    res["wake_params_equal"] = all(torch.equal(v, params_before[k]) for k, v in full_params(b).items())
    res["wake_states_equal"] = all(torch.equal(v, states_before[k]) for k, v in optimizer_states(b).items())
    res["states_device"] = sorted({t.device.type for t in optimizer_states(b, to_cpu=False).values()})
    b.sleep()  # the second sleep writes into the same pinned buffers
    res["buffers_reused"] = [t.data_ptr() for t in b.residency._host._buffers] == ptrs
    b.wake_up()
    b.train(2, batch)
    bucket = next(iter(b.named_hf_weights(1 << 20)))
    res["bucket_dtype_device"] = (str(bucket[0][1].dtype), bucket[0][1].device.type)
    b.save(2)
    expected = full_params(b)
    c = FSDPTrainBackend()
    res["start"] = c.init(make_args(ckpt, load=str(work / "gpu_ckpt")), with_ref=False)
    res["resume_max_diff"] = max(
        float((full_params(c)[k].float() - v.float()).abs().max()) for k, v in expected.items()
    )
    return res
