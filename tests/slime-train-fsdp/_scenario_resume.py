"""Data parallelism and resume: `dp` (2 ranks: training, an uneven split, a checkpoint), `resume` (the same 2 ranks
restarted from it) and `resume1` (the 2-rank checkpoint on 1 rank)."""

from __future__ import annotations

import pathlib

import torch.distributed as dist
from slime_fsdp_test_worker_common import full_params, make_args, make_batch, make_uneven_batch

from slime_train_fsdp import FSDPTrainBackend


def scenario_dp(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    u = FSDPTrainBackend()
    u.init(make_args(ckpt, calculate_per_token_loss=True), with_ref=False)
    u.train(0, make_uneven_batch(rank))
    res = {"uneven_params": full_params(u), "uneven_steps": u.step_metrics}
    del u
    b = FSDPTrainBackend()
    b.init(make_args(ckpt, normalize_advantages=True, save=str(work / "ckpt")), with_ref=False)
    res["dp_metrics"] = b.train(0, make_batch(rank, world))
    res["dp_steps"] = b.step_metrics
    res["dp_params"] = full_params(b)
    b.save(0)
    res["ckpt_dir"] = str(work / "ckpt")
    res["resume_metrics_expected"] = b.train(1, make_batch(rank, world, seed=1))
    res["resume_params_expected"] = full_params(b)
    return res


def scenario_resume(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    b = FSDPTrainBackend()
    args = make_args(ckpt, normalize_advantages=True, load=str(work / "ckpt"), save=str(work / "ckpt"))
    start = b.init(args, with_ref=False)
    res = {"start": start, "global_step": b.global_step, "lr_last": b.optimizer.param_groups[0]["lr"]}
    res["resume_metrics"] = b.train(start, make_batch(rank, world, seed=1))
    res["resume_params"] = full_params(b)
    return res


def scenario_resume_one_rank(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """Loads the 2-rank checkpoint on 1 rank (DCP reshards) and trains the next rollout on the full batch."""
    b = FSDPTrainBackend()
    args = make_args(ckpt, normalize_advantages=True, load=str(work / "ckpt"))
    res = {"start": b.init(args, with_ref=False), "loaded_params": full_params(b)}
    b.train(res["start"], make_batch(0, 1, seed=1))
    res["resume_params"] = full_params(b)
    return res
