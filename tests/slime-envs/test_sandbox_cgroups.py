"""The sandbox's cgroup limits, on fake cgroup trees for both versions (the machine has one of them at most),
and on the real hierarchy when this process may create cgroups."""

import os
import pathlib

import pytest

from slime_envs import _cgroups
from slime_envs._cgroups import CgroupLimits


def fake_tree(tmp_path, version):
    dirs = {}
    for name in ("memory", "pids", "cpu"):
        parent = tmp_path if version == 2 else tmp_path / name
        parent.mkdir(exist_ok=True)
        dirs[name] = (version, parent)
    return dirs


@pytest.mark.parametrize("version", [1, 2])
def test_limits_written_where_each_version_wants_them(tmp_path, monkeypatch, version):
    monkeypatch.setattr(_cgroups, "_controller_dirs", lambda: fake_tree(tmp_path, version))
    limits = CgroupLimits.create(memory_bytes=300 << 20, max_tasks=9, cpus=0.5)
    assert limits is not None
    if version == 2:
        (path,) = limits.dirs
        assert path.parent == tmp_path and path.name.startswith(f"slime-sandbox-{os.getpid()}-")
        read = {f: (path / f).read_text() for f in ("memory.max", "pids.max", "cpu.max")}
        assert read == {"memory.max": str(300 << 20), "pids.max": "9", "cpu.max": "50000 100000"}
        (path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    else:
        assert len(limits.dirs) == 3
        mem, pids, cpu = (limits.controllers[c][1] for c in ("memory", "pids", "cpu"))
        assert (mem / "memory.limit_in_bytes").read_text() == str(300 << 20)
        assert (pids / "pids.max").read_text() == "9"
        assert (cpu / "cpu.cfs_quota_us").read_text() == "50000"
        (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert limits.oom_killed()
    limits.join(12345)
    assert all((path / "cgroup.procs").read_text() == "12345" for path in limits.dirs)
    assert limits.enforced == [f"cpu (v{version})", f"memory (v{version})", f"pids (v{version})"]


def test_no_writable_controller_means_no_cgroup(monkeypatch):
    monkeypatch.setattr(_cgroups, "_controller_dirs", lambda: {})
    assert CgroupLimits.create(memory_bytes=1 << 30, max_tasks=4, cpus=1.0) is None


def test_leftovers_of_dead_hosts_are_swept(tmp_path):
    dead = tmp_path / "slime-sandbox-999999999-0123abcd"  # no such pid
    alive = tmp_path / f"slime-sandbox-{os.getpid()}-0123abcd"
    other = tmp_path / "someone-else"
    for d in (dead, alive, other):
        d.mkdir()
    _cgroups._sweep_leftovers({tmp_path})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_real_hierarchy_when_available():
    limits = CgroupLimits.create(memory_bytes=64 << 20, max_tasks=4, cpus=1.0)
    if limits is None:
        assert _cgroups._controller_dirs() == {}  # nothing writable: the sandbox reports rlimits only
        return
    try:
        assert all(pathlib.Path(p).is_dir() for p in limits.dirs)
        assert not limits.oom_killed()
    finally:
        limits.kill_and_remove()
    assert not any(pathlib.Path(p).exists() for p in limits.dirs)


async def test_cpus_without_a_cpu_cgroup_is_told_it_has_no_effect(caplog, monkeypatch):
    # SandboxConfig(cpus=0.5) on a machine without a cpu cgroup was accepted and ignored: the run used as many cores
    # as its threads, and only SandboxResult.enforcement (which nothing reads) said so.
    from slime_core.config import base as config_base
    from slime_envs import sandbox
    from slime_envs.sandbox import SandboxConfig, run_python

    monkeypatch.setattr(config_base, "_WARNED", set())  # warn_once's keys: this test's own
    monkeypatch.setattr(sandbox.CgroupLimits, "create", classmethod(lambda cls, **kwargs: None))
    assert (await run_python("print(1)")).stdout == "1\n"  # the default cpus: nothing asked, nothing to say
    assert "has no effect" not in caplog.text
    for _ in range(2):
        result = await run_python("print(1)", SandboxConfig(cpus=0.5))
        assert result.stdout == "1\n" and result.enforcement["cpu"] == "no cpu cgroup here"
    warnings = [r.getMessage() for r in caplog.records if "has no effect" in r.getMessage()]
    assert warnings == [
        "sandbox: cpus=0.5 has no effect here: this machine gives this process no cpu cgroup (a run's threads and "
        "processes may use as many cores as max_processes; see SandboxResult.enforcement)"
    ]


def test_max_files_on_a_host_that_cannot_count_files_is_told_it_has_no_effect(caplog, monkeypatch):
    # A non-root host's /tmp is bubblewrap's --tmpfs, which takes no file count: max_files was accepted and ignored.
    # (This machine runs as root, so the non-root view is built here from the real one.)
    import dataclasses

    from slime_core.config import base as config_base
    from slime_envs import sandbox
    from slime_envs._bwrap import runtime_view
    from slime_envs.sandbox import SandboxConfig

    monkeypatch.setattr(config_base, "_WARNED", set())  # warn_once's keys: this test's own
    non_root = dataclasses.replace(runtime_view(), workdir_mount=None)
    sandbox._warn_ineffective(SandboxConfig(), has_cpu_cgroup=False, view=non_root)  # defaults: nothing asked
    sandbox._warn_ineffective(SandboxConfig(max_files=100), has_cpu_cgroup=True, view=runtime_view())  # enforced
    assert caplog.records == []
    for _ in range(2):
        sandbox._warn_ineffective(SandboxConfig(max_files=100), has_cpu_cgroup=True, view=non_root)
    assert [r.getMessage() for r in caplog.records] == [
        "sandbox: max_files=100 has no effect here: only a root host mounts /tmp with a file count (here /tmp holds "
        "the kernel's default, half the machine's RAM pages; tmpfs_mb still caps its size)"
    ]
