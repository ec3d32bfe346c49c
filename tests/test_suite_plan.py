"""tests/_suite_plan.py: which tests share a worker, what each worker keeps to itself, how many workers run."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
_spec = importlib.util.spec_from_file_location("slime_tests_suite_plan_under_test", TESTS / "_suite_plan.py")
plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plan)


def test_a_file_is_one_unit_and_the_sandbox_folder_is_one_unit():
    assert plan.work_unit("tests/apps/test_train_e2e.py::test_gsm8k_two_rollouts") == "tests/apps/test_train_e2e.py"
    assert plan.work_unit("tests/apps/test_train_e2e.py::test_lora_two_rollouts") == "tests/apps/test_train_e2e.py"
    assert plan.work_unit("tests/slime-core/test_sample.py::test_x[a::b]") == "tests/slime-core/test_sample.py"
    # Every slime-envs file on one worker: the sandbox tests scan /proc for any leftover sandbox process.
    envs = {plan.work_unit(f"tests/slime-envs/{f}::t") for f in ("test_sandbox.py", "test_sandbox_hostile.py")}
    assert envs == {"tests/slime-envs/"}


def test_each_worker_gets_its_own_ray_root_and_engine_ports():
    made = []

    def make_dir(prefix, dir):  # noqa: A002 - tempfile.mkdtemp's keyword
        made.append((prefix, dir))
        return f"{dir}/{prefix}x{len(made)}"

    gw0, gw1 = plan.worker_env("gw0", make_dir), plan.worker_env("gw1", make_dir)
    assert gw0 == {"RAY_TMPDIR": "/tmp/ray-gw0-x1", "SLIME_ENGINE_BASE_PORT": "16000"}
    assert gw1 == {"RAY_TMPDIR": "/tmp/ray-gw1-x2", "SLIME_ENGINE_BASE_PORT": "17000"}
    # Ray puts its sockets under the root (a Unix socket path holds at most 107 bytes): keep it short.
    assert all(len(env["RAY_TMPDIR"]) < 32 for env in (gw0, gw1))
    assert plan.worker_env("", make_dir) == {} and plan.worker_env("master", make_dir) == {}
    assert len(made) == 2


def test_a_variable_the_user_set_wins_and_no_root_is_made(tmp_path):
    environ = {"PYTEST_XDIST_WORKER": "gw1", "RAY_TMPDIR": str(tmp_path)}
    made = []
    added = plan.apply_worker_env(environ, make_dir=lambda **kw: made.append(kw) or "/tmp/unused")
    assert added == {"SLIME_ENGINE_BASE_PORT": "17000"} and made == []
    assert environ["RAY_TMPDIR"] == str(tmp_path)
    outside = {"HOME": "/root"}
    assert plan.apply_worker_env(outside) == {} and outside == {"HOME": "/root"}


def test_a_cluster_address_left_in_one_ray_root_is_not_found_from_another(tmp_path, monkeypatch):
    # Why a worker has its own root: a `ray.cluster_utils.Cluster` (test_nodes_e2e) writes its address to
    # <root>/ray/ray_current_cluster, and a plain `ray.init()` in the same root connects there.
    from ray._private import utils

    (tmp_path / "gw0" / "ray").mkdir(parents=True)  # the session a Cluster starts makes it
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "gw0"))
    utils.write_ray_address("127.0.0.1:6380")
    assert utils.read_ray_address() == "127.0.0.1:6380"
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "gw1"))
    assert utils.read_ray_address() is None


class _Config:
    def __init__(self, source):
        self.args_source = source


def test_whole_suite_on_two_workers_chosen_paths_in_one_process():
    suite, chosen = _Config(pytest.Config.ArgsSource.TESTPATHS), _Config(pytest.Config.ArgsSource.ARGS)
    assert plan.suite_workers(suite, {}) == plan.SUITE_WORKERS == 3
    assert plan.suite_workers(chosen, {}) == 0
    assert plan.suite_workers(chosen, {"PYTEST_XDIST_AUTO_NUM_WORKERS": "3"}) == 3
    with pytest.raises(ValueError, match="PYTEST_XDIST_AUTO_NUM_WORKERS='two'"):
        plan.suite_workers(suite, {"PYTEST_XDIST_AUTO_NUM_WORKERS": "two"})


def test_pytest_without_xdist_still_runs():
    # The workers are set by the conftest, not by addopts: `-p no:xdist` (and a package without pytest-xdist)
    # must not meet an unknown `-n` in the pyproject's addopts.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "tests/test_suite_plan.py"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    count = sum(line.startswith("def test_") for line in pathlib.Path(__file__).read_text().splitlines())
    assert f"{count} tests collected" in proc.stdout, proc.stdout[-2000:]


def test_a_worker_of_this_run_has_its_own_ray_root_and_ports():
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        pytest.skip("runs in one process here: the whole suite (`uv run pytest`) runs it on a worker")
    if "RAY_TMPDIR" not in os.environ or not os.environ["RAY_TMPDIR"].startswith("/tmp/ray-"):
        pytest.fail(f"worker {worker} has no Ray temp root of its own: RAY_TMPDIR={os.environ.get('RAY_TMPDIR')!r}")
    assert pathlib.Path(os.environ["RAY_TMPDIR"]).is_dir()
    assert os.environ["SLIME_ENGINE_BASE_PORT"] == str(16000 + 1000 * int(worker[2:]))


def test_files_that_fork_ranks_run_before_any_other_test():
    # A forked rank cannot run autograd after its parent ran a backward (tests/apps' shared-step tests do): the
    # FSDP/Megatron files that fork run first, whole and in their own order; the rest keep collection order.
    ids = ["tests/apps/test_plugin_pkg.py::test_a", "tests/slime-core/test_x.py::t",
           "tests/slime-train-fsdp/test_vlm.py::v1", "tests/slime-train-fsdp/test_backend.py::b1",
           "tests/slime-train-fsdp/test_vlm.py::v2", "tests/slime-train-fsdp/test_backend.py::b2",
           "tests/slime-train-fsdp/test_attention.py::a"]  # fmt: skip
    order = [ids[i] for i in plan.run_order(ids)]
    assert order == ["tests/slime-train-fsdp/test_backend.py::b1", "tests/slime-train-fsdp/test_backend.py::b2",
                     "tests/slime-train-fsdp/test_vlm.py::v1", "tests/slime-train-fsdp/test_vlm.py::v2",
                     "tests/apps/test_plugin_pkg.py::test_a", "tests/slime-core/test_x.py::t",
                     "tests/slime-train-fsdp/test_attention.py::a"]  # fmt: skip
    assert all(pathlib.Path(REPO / f).is_file() for f in plan.FORKS_RANKS)


def test_the_longest_units_run_right_after_the_files_that_fork(monkeypatch):
    # Listed units move up (in the list's order, a SAME_WORKER folder as one block); the rest keep collection order.
    monkeypatch.setattr(plan, "FORKS_RANKS", ("tests/slime-train-fsdp/test_backend.py",))
    monkeypatch.setattr(plan, "LONGEST_FIRST", ("tests/slime-train-fsdp/test_compile_warmup.py", "tests/slime-envs/"))
    ids = ["tests/apps/test_a.py::a", "tests/slime-envs/test_e1.py::e", "tests/slime-rollout/test_r.py::r",
           "tests/slime-envs/test_e2.py::e", "tests/slime-train-fsdp/test_compile_warmup.py::w1",
           "tests/slime-train-fsdp/test_backend.py::b",
           "tests/slime-train-fsdp/test_compile_warmup.py::w2"]  # fmt: skip
    order = [ids[i] for i in plan.run_order(ids)]
    assert order == ["tests/slime-train-fsdp/test_backend.py::b", "tests/slime-train-fsdp/test_compile_warmup.py::w1",
                     "tests/slime-train-fsdp/test_compile_warmup.py::w2", "tests/slime-envs/test_e1.py::e",
                     "tests/slime-envs/test_e2.py::e", "tests/apps/test_a.py::a",
                     "tests/slime-rollout/test_r.py::r"]  # fmt: skip


def test_every_longest_unit_exists_once_and_forks_no_rank():
    assert len(set(plan.LONGEST_FIRST)) == len(plan.LONGEST_FIRST)
    for unit in plan.LONGEST_FIRST:
        assert (REPO / unit).exists(), f"tests/_suite_plan.py LONGEST_FIRST: {unit} does not exist (renamed?)"
        assert plan.work_unit(unit) == unit and unit not in plan.FORKS_RANKS, unit


def test_inductor_compiles_in_process_and_skips_its_base_isa_probe():
    """tests/conftest.py sets (where unset) `TORCHINDUCTOR_VEC_ISA_OK=1`: inductor skips its base ISA probe build (a
    test kernel loaded by a fresh interpreter importing torch, ~2 CPU-s each) and takes the widest ISA the CPU's
    flags list; and `TORCHINDUCTOR_COMPILE_THREADS=1`: no pool of compile subprocesses. (Not `pick_vec_isa()` here:
    it runs the probes of the ISA's extensions, 19 s of g++ and interpreters on this machine.)"""
    from torch._inductor import config

    assert config.cpp.vec_isa_ok is True
    assert config.compile_threads == 1
