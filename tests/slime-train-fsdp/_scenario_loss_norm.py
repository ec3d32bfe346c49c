"""The scenario `loss_norm`: each optimizer step's gradient and `train/*` metrics over DP splits the DP size does not
divide (any world size), for `test_loss_normalization.py`; the cases are `tests/_loss_norm_cases.py`'s.

One backend per rank; its optimizer step is replaced by a capture of the summed gradient (no update), so every case
and step is taken at the initial weights and the test compares them all with one reference.
"""

from __future__ import annotations

import importlib.util
import pathlib

import torch
import torch.distributed as dist
from slime_fsdp_test_worker_common import make_args

from slime_train_fsdp import FSDPTrainBackend

_spec = importlib.util.spec_from_file_location(
    "slime_tests_loss_norm_cases", pathlib.Path(__file__).resolve().parents[1] / "_loss_norm_cases.py"
)
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)


def case_args(ckpt: str, name: str, per_token: bool):
    """The FSDP run config of case `name` (the shared test config with the case's flags)."""
    return make_args(ckpt, **cases.run_config(name, per_token))


def scenario_loss_norm(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """Per case and loss mode: this rank's schedule, each step's gradient (full tensors) and `train/*` metrics."""
    rank, world = dist.get_rank(), dist.get_world_size()
    b = FSDPTrainBackend()
    b.init(case_args(ckpt, "even", False), with_ref=False)
    grads: list[dict[str, torch.Tensor]] = []

    def capture():  # the step's summed gradient, gathered from the shards; the weights stay as they are
        grads.append({n: p.grad.full_tensor().clone() for n, p in b.model.named_parameters() if p.grad is not None})
        return torch.zeros(()), 0.0

    b.optimizer_step = capture
    return cases.train_every_case(
        b, lambda name, per_token: case_args(ckpt, name, per_token), cases.case_samples, grads, rank, world
    )
