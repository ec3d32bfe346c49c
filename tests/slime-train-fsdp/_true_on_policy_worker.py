"""Worker of test_true_on_policy_backend.py: `FSDPTrainBackend` with `--true-on-policy-mode` on gloo ranks."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import pathlib
import sys

import torch
import torch.distributed as dist

from slime_train_fsdp.backend import FSDPTrainBackend


def _common():
    path = pathlib.Path(__file__).with_name("_worker_common.py")
    spec = importlib.util.spec_from_file_location("slime_fsdp_test_workers_top", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scenario_mode(ckpt: str, out: pathlib.Path) -> dict:
    w = _common()
    batch = w.make_batch(0, 1)
    # Single-turn samples (the test batch masks random tokens, which the mode refuses as multi-turn).
    batch = dataclasses.replace(batch, loss_masks=[torch.ones_like(m) for m in batch.loss_masks])
    b = FSDPTrainBackend()
    b.init(w.make_args(ckpt, train_backend="fsdp", true_on_policy_mode=True, attn_implementation=None), with_ref=False)
    res: dict = {"mirrored": hasattr(b.model, "slime_true_on_policy")}
    lps = b.compute_log_probs(batch)
    res["hf_diff"] = w.max_diff(lps, w.hf_reference_log_probs(ckpt, batch))
    before = {n: p.detach().clone() for n, p in w.full_params(b).items()}
    rb = dataclasses.replace(batch, rollout_log_probs=lps)
    b.cfg = b.cfg.model_copy(update={"use_rollout_logprobs": True})
    b.train(0, rb)
    res["steps"] = b.step_metrics
    after = w.full_params(b)
    res["changed"] = sum(int(not torch.equal(before[n], after[n])) for n in before)
    res["num_params"] = len(before)
    return res


def run(scenario: str, out: pathlib.Path, ckpt: str) -> None:
    """Runs one scenario on this rank (process group from the environment) and saves its results."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        res = {"mode": scenario_mode}[scenario](ckpt, out)
        torch.save(copy.deepcopy(res), out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run(sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3])
