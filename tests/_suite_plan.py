"""How the whole suite is spread over pytest-xdist workers, and what each worker keeps to itself.

`tests/conftest.py` loads this file by path and uses its hooks; `tests/test_suite_plan.py` tests it. Kept out of
the conftest so the conftest stays about fixtures, and free of package imports (the isolation runs load it too).

- `uv run pytest` (the whole suite, what CI runs) uses `SUITE_WORKERS` workers; a chosen file or test runs in
  one process. No `-n` sits in the pyproject's addopts, so `-p no:xdist` still works.
- Whole files go to a worker, in the order of a one-process run (`FileScheduling`); `SAME_WORKER` folders go
  to one worker as one unit. That order is `run_order`'s: the files that fork ranks, then the longest units
  (`LONGEST_FIRST`), then the rest as collected, so the workers end together.
- Each worker process gets its own Ray temp root and engine port range (`worker_env`).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# An end-to-end run (Ray, engine, trainer in subprocesses) keeps about 1.1 of 2 cores busy and waits on start-ups
# the rest of the time, so a third worker fills that time. Measured on this 2-core, 24 GiB machine, the whole CI
# (`.ci/run` on a clean clone, 2026-12-07): 3 workers 1,210 s for the README test command, 16.3 GiB peak memory in
# use, green under a load average of 6-10; 2 workers 1,423 s the run before (under a helper's load for part of it).
SUITE_WORKERS = 3

# Test files that must not run at the same time as each other: the sandbox tests look for leftover sandbox
# processes across the whole machine (/proc), and every slime-envs file runs some.
SAME_WORKER = {"tests/slime-envs/": "tests/slime-envs/"}

# First engine port of worker N (the benchmark scripts keep 15000): two runs starting engines at the same moment
# on two workers do not both probe the same first free port.
ENGINE_BASE_PORT = 16000
ENGINE_PORTS_PER_WORKER = 1000

# Test files that fork ranks from the pytest process. A forked child cannot run autograd once its parent has run a
# backward pass (torch: "Unable to handle autograd's threading in combination with fork-based multiprocessing"), so
# these files run first in every process, before any other test's backward (`run_order`).
FORKS_RANKS = (
    "tests/slime-train-fsdp/test_backend.py",
    "tests/slime-train-fsdp/test_context_parallel.py",
    "tests/slime-train-fsdp/test_critic_backend.py",
    "tests/slime-train-fsdp/test_lora.py",
    "tests/slime-train-fsdp/test_loss_normalization.py",
    "tests/slime-train-fsdp/test_routing_replay.py",
    "tests/slime-train-fsdp/test_true_on_policy_backend.py",
    "tests/slime-train-fsdp/test_vlm.py",
    "tests/slime-train-megatron/test_logprobs.py",
)

# The longest work units of the suite, longest first. The seconds are each unit's sum of the slowest-30 tests of the
# CI run of 2026-12-07 on this 2-core machine (`.ci/run` 1,401 s, --durations=30; 0.3 s for each other test), then
# the cuts since, measured or estimated as said; units with no test in that list (each under 20 s) keep their
# 2026-12-06 estimate, from a CI run about 1.5-2x slower for the units listed in both. A free worker takes the next
# unit in order, so the long ones start early and the short ones fill the end: in collection order the compile
# warm-up file (slime-train-fsdp, late in the alphabet) started last and one worker ran alone for minutes.
# Files of many fast tests (the graders: 290 tests, 18 s measured) are overestimated by the 0.3 s and stay out.
# A unit missing here only runs later; an entry that no longer exists fails tests/test_suite_plan.py.
LONGEST_FIRST = (
    "tests/apps/test_ppo_opd_e2e.py",  # 174 s
    "tests/apps/test_fully_async_e2e.py",  # 164 s
    "tests/slime-train-fsdp/test_compile_warmup.py",  # 164 s (its two warm-ups and real steps: 67.5 + 90.5 s)
    "tests/apps/test_train_e2e.py",  # 195 s; about 155 s since its --async test's runs went 3 -> 2 (x 0.65 measured)
    "tests/apps/test_faults_e2e.py",  # 102 s
    "tests/benchmarks/test_bench_smoke.py",  # 2026-12-06: about 151 s (12-07: only its 31-s fixture in the list)
    "tests/apps/test_interrupts.py",  # 78 s; about 68 s since its rollouts shrank (71.8 -> 62.2 s measured)
    "tests/apps/test_geo3k_vlm_example.py",  # 68 s
    "tests/apps/test_actor_stopped_e2e.py",  # 95 s in two runs; about 63 s in one since (111.4 -> 73.8 s measured)
    "tests/apps/test_nodes_e2e.py",  # 58 s
    "tests/apps/test_vlm_pipeline.py",  # 53 s
    "tests/apps/test_reproducibility_e2e.py",  # 56 s; about 47 s since one rollout per run (79.6 -> 66.4 s measured)
    "tests/slime-train-megatron/test_layer_fusions.py",  # 46 s
    "tests/apps/test_fp8_rollout_e2e.py",  # 42 s
    "tests/apps/test_routing_replay_e2e.py",  # 42 s
    "tests/slime-compat/test_original_plugin_e2e.py",  # 39 s
    "tests/slime-train-megatron/test_moe_cpu.py",  # 38 s (+ the TP 2 x EP 2 layouts of test_settings.py since)
    "tests/slime-envs/",  # 2026-12-06: 65 s
    "tests/slime-train-fsdp/test_compile_warmup_head.py",  # 30 s
    "tests/slime-train-fsdp/test_fused_head.py",  # 2026-12-06: 49 s
    "tests/apps/test_sft_e2e.py",  # 23 s
)

RAY_TMPDIR_ENV = "RAY_TMPDIR"
ENGINE_BASE_PORT_ENV = "SLIME_ENGINE_BASE_PORT"  # read by slime_app.engine_hosts


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or its `SAME_WORKER` folder.

    Args:
        nodeid: a pytest node id, `tests/apps/test_x.py::test_y[param]`.

    Returns:
        The key that xdist schedules as one unit (all tests with the same key run on one worker, in order).
    """
    path = nodeid.split("::", 1)[0]
    return next((unit for prefix, unit in SAME_WORKER.items() if path.startswith(prefix)), path)


def suite_workers(config: pytest.Config, environ: dict[str, str] | None = None) -> int:
    """Workers for a run that did not pass `-n`: `SUITE_WORKERS` for the whole suite, 0 for chosen paths.

    `PYTEST_XDIST_AUTO_NUM_WORKERS` (pytest-xdist's own variable) overrides both.

    Raises:
        ValueError: `PYTEST_XDIST_AUTO_NUM_WORKERS` is not a whole number.
    """
    environ = os.environ if environ is None else environ
    if env := environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        if not env.isdigit():
            raise ValueError(f"PYTEST_XDIST_AUTO_NUM_WORKERS={env!r}: expected a whole number of workers")
        return int(env)
    return SUITE_WORKERS if config.args_source == pytest.Config.ArgsSource.TESTPATHS else 0


def worker_env(worker: str, make_dir=tempfile.mkdtemp) -> dict[str, str]:
    """Environment of one xdist worker process ("gw0", "gw1", ...); empty outside xdist.

    - `RAY_TMPDIR`: a temp root of its own (short: Ray's socket paths live under it). While a `ray.cluster_utils`
      cluster lives (test_nodes_e2e), Ray writes its address to `<root>/ray/ray_current_cluster`, and a plain
      `ray.init()` (what `apps/train` calls without `--ray-address`) connects to that cluster instead of starting
      its own; a run on the other worker would land on the two-node test cluster.
    - `SLIME_ENGINE_BASE_PORT`: `ENGINE_BASE_PORT + 1000 * N`.

    Args:
        worker: the `PYTEST_XDIST_WORKER` value.
        make_dir: `tempfile.mkdtemp` (tests pass a fake).
    """
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return {}
    index = int(worker[2:])
    return {
        RAY_TMPDIR_ENV: make_dir(prefix=f"ray-{worker}-", dir="/tmp"),
        ENGINE_BASE_PORT_ENV: str(ENGINE_BASE_PORT + ENGINE_PORTS_PER_WORKER * index),
    }


# The Ray temp root this process made (removed at the end of a passing run).
_created_ray_tmpdir: str | None = None


def apply_worker_env(environ: dict[str, str] | None = None, make_dir=tempfile.mkdtemp) -> dict[str, str]:
    """Sets `worker_env` in the environment (this process's by default) where not set already.

    A variable the user set wins; a temp root made for a variable the user set is not made at all.

    Returns:
        The variables it set.
    """
    global _created_ray_tmpdir
    environ = os.environ if environ is None else environ
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    if RAY_TMPDIR_ENV in environ:

        def make_dir(**_) -> str:  # the user's root stays; none is made
            return environ[RAY_TMPDIR_ENV]

    added = {k: v for k, v in worker_env(worker, make_dir).items() if k not in environ}
    environ.update(added)
    if RAY_TMPDIR_ENV in added and environ is os.environ:
        _created_ray_tmpdir = added[RAY_TMPDIR_ENV]
    return added


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Spreads the whole suite over workers unless `-n` was given (runs before pytest-xdist reads the options)."""
    if not config.pluginmanager.has_plugin("xdist") or hasattr(config, "workerinput"):
        return
    if config.option.numprocesses is None:
        # --pdb needs one process (pytest-xdist refuses it with workers).
        config.option.numprocesses = 0 if config.getoption("usepdb", False) else suite_workers(config)
    if config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "loadfile"
        config.option.loadscopereorder = False


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for an explicit `-n auto`: the same as without `-n`."""
    return suite_workers(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Whole `work_unit`s to a worker in collection order.

    A worker runs its files in the order of a plain `pytest` run, so a file never meets process state (e.g.
    autograd threads before an FSDP test forks its ranks) that it would not meet in one process; a file stays
    on one worker, so a module fixture (a teacher engine, a run several tests assert on) is built once.
    """
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # collection order, also under an explicit `-n N`
    return FileScheduling(config, log)


def run_order(nodeids: list[str]) -> list[int]:
    """The order to run tests in: `FORKS_RANKS` files, then `LONGEST_FIRST` units, then the rest as collected.

    Args:
        nodeids: the collected node ids, in collection order.

    Returns:
        A permutation of `range(len(nodeids))`; files stay whole and keep their own test order, and the files of
        a `SAME_WORKER` unit stay together where the unit is in `LONGEST_FIRST`.
    """
    forks = {path: i for i, path in enumerate(FORKS_RANKS)}
    longest = {unit: i for i, unit in enumerate(LONGEST_FIRST)}

    def key(i: int) -> tuple[int, int, int]:
        path = nodeids[i].split("::", 1)[0]
        if path in forks:
            return (0, forks[path], i)
        unit = work_unit(path)
        return (1, longest[unit], i) if unit in longest else (2, 0, i)

    return sorted(range(len(nodeids)), key=key)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Runs the tests in `run_order` (files that fork ranks first, then the longest); xdist schedules in this order."""
    order = run_order([item.nodeid for item in items])
    items[:] = [items[i] for i in order]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Removes the Ray temp root this worker made after a passing run (kept, with Ray's logs, after a failure)."""
    if _created_ray_tmpdir and exitstatus == 0:
        shutil.rmtree(_created_ray_tmpdir, ignore_errors=True)
