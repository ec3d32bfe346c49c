"""Per-rank scenarios for the FSDP backend tests (`run`), or standalone: `python _workers.py SCENARIO OUT CKPT`.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun style). Each rank writes its results to
`OUT/rank{RANK}.pt`; the pytest side asserts on them. Scenarios run several checks on one process group. They live
in sibling modules by concern (`_scenario_single.py`, `_scenario_resume.py`, `_scenario_inputs.py`,
`_scenario_losses.py`, `_scenario_loss_norm.py`, `_scenario_gpu.py`, `_compile_scenario.py`) and share
`_worker_common.py`, which this module loads once and they import by name.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import pathlib
import sys
from types import ModuleType

import torch
import torch.distributed as dist


def _sibling(stem: str) -> ModuleType:
    """A sibling file imported by path once per process, as module `slime_fsdp_test{stem}` (the tests directory is
    not a package); the scenario modules import the shared ones (`slime_fsdp_test_worker_common`,
    `slime_fsdp_test_compile_scenario`) by that name, so those are loaded first."""
    name = f"slime_fsdp_test{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).with_name(f"{stem}.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(sys.modules[name])
        except BaseException:
            del sys.modules[name]  # as `import` does: no half-run module for the next load to find
            raise
    return sys.modules[name]


_common, _compile = _sibling("_worker_common"), _sibling("_compile_scenario")
_single, _resume, _inputs, _losses, _gpu, _loss_norm = (
    _sibling(s) for s in ("_scenario_single", "_scenario_resume", "_scenario_inputs", "_scenario_losses",
                          "_scenario_gpu", "_scenario_loss_norm")
)  # fmt: skip

SCENARIOS = {
    "loss_types": _losses.scenario_loss_types,
    "loss_norm": _loss_norm.scenario_loss_norm,
    "pipeline": _inputs.scenario_pipeline,
    "tied": _inputs.scenario_tied,
    "single": _single.scenario_single,
    "dp": _resume.scenario_dp,
    "resume": _resume.scenario_resume,
    "resume1": _resume.scenario_resume_one_rank,
    "gpu": _gpu.scenario_gpu,
    "compile": functools.partial(_compile.scenario_compile, make_args=_common.make_args),
    "compile_gpu": functools.partial(_compile.scenario_compile, make_args=_common.make_args),
}


def run(scenario: str, out: pathlib.Path, ckpt: str) -> None:
    """Runs one scenario on this rank (process group from the environment) and saves its results."""
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if scenario.endswith("gpu") else "gloo")
    try:
        res = SCENARIOS[scenario](ckpt, out, out.parent)
        torch.save(copy.deepcopy(res), out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run(sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3])
