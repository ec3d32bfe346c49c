"""Hostile code, tenth pass (issue 27): kernel counters that a user namespace does not bound, because the kernel
charges them to the host uid that owns the namespace as well. Every case first switches the in-process guard off."""

import asyncio
import ctypes
import os
import resource

import pytest
from slime_sandbox_hostile import hostile

pytestmark = pytest.mark.usefixtures("host_survives_and_nothing_leaks")


def _inotify_instances_left_for(uid: int) -> int:
    """How many inotify instances a host process of `uid` can still make (forked, so the test process keeps its uid)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
            os.setgid(uid)
            os.setuid(uid)
            libc = ctypes.CDLL(None, use_errno=True)
            made = 0
            while made < 4000 and libc.inotify_init1(os.O_CLOEXEC) >= 0:
                made += 1
            os.write(write_fd, str(made).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as f:
        return int(f.read())


async def test_inotify_is_refused():
    # fs.inotify.max_user_instances (128 here) and max_user_watches (192,546) count per host uid across user
    # namespaces: before the fix a run that made 40 instances left host uid nobody 88 of 128 (one more run of 61
    # and a third run, or, on a non-root host, the host process itself got EMFILE), and one instance held 71,955
    # watches, each pinning an inode of the read-only runtime view.
    code = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        made = [libc.inotify_init1(0) for _ in range(40)]
        print("inotify_init1", sorted(set(made)), os.strerror(ctypes.get_errno()))
        if os.uname().machine == "x86_64":
            print("inotify_init", libc.syscall(253), os.strerror(ctypes.get_errno()))  # the legacy call, x86-64 only
        else:
            print("inotify_init -1 Operation not permitted")
        print("inotify_add_watch", libc.inotify_add_watch(0, b"/tmp", 0x100), os.strerror(ctypes.get_errno()))
    """
    r = await hostile(code)
    assert r.stdout.splitlines() == [
        "inotify_init1 [-1] Operation not permitted",  # was [3, 4, ..., 42]
        "inotify_init -1 Operation not permitted",
        "inotify_add_watch -1 Operation not permitted",
    ], r.stdout + r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs as host uid nobody only on a root host")
async def test_a_run_leaves_the_hosts_inotify_budget_alone():
    # The harm itself, seen from the host: while a run tries to hold inotify instances, uid nobody (the sandbox's
    # host uid on a root host) can still make as many as before it.
    before = _inotify_instances_left_for(65534)
    code = """
        import ctypes, sys, time
        libc = ctypes.CDLL(None, use_errno=True)
        held = [libc.inotify_init1(0) for _ in range(40)]
        print("holding", sum(fd >= 0 for fd in held), flush=True)
        time.sleep(6)
    """
    task = asyncio.create_task(hostile(code, timeout_s=30))
    await asyncio.sleep(0)
    # Wait until the code is past its inotify calls: its stdout is a host file we cannot see, so poll the budget.
    during = before
    for _ in range(40):
        await asyncio.sleep(0.25)
        during = min(during, _inotify_instances_left_for(65534))
        if task.done():
            break
    r = await task
    assert during == before, (before, during)  # was before - 40
    assert r.stdout == "holding 0\n", r.stdout + r.stderr


_SMALL_OUTPUT = ({"max_output_bytes": 4096}, 4096, "max_output_bytes")
_SMALL_TMP = ({"tmpfs_mb": 1, "max_output_bytes": 4 << 20}, 1 << 20, "tmpfs_mb")


@pytest.mark.parametrize(("config", "limit", "which"), [_SMALL_OUTPUT, _SMALL_TMP])
async def test_a_program_larger_than_the_sandbox_holds_is_the_codes_error(config, limit, which):
    # The program is copied to /tmp/main.py under the run's RLIMIT_FSIZE and in its /tmp: one byte past either
    # raised SandboxUnavailableError ("the sandbox failed to start (exit 1): bwrap: Can't write data to file
    # /tmp/main.py: File too large" / "No space left on device"), the error for a machine that cannot run a sandbox
    # at all, out of the model's tool call. A program of exactly the limit runs; one byte more is refused.
    from slime_envs.sandbox import SandboxConfig, run_python

    def program(size: int) -> str:
        head = "print(len(open('/tmp/main.py', 'rb').read()))\n#"
        return head + "x" * (size - len(head) - 1) + "\n"

    fits = await run_python(program(limit), SandboxConfig(timeout_s=10, **config))
    assert (fits.exit_code, fits.stdout) == (0, f"{limit}\n"), fits.stderr
    r = await run_python(program(2 * limit), SandboxConfig(timeout_s=10, **config))
    assert (r.exit_code, r.stdout, r.ok) == (1, "", False)
    one_more = await run_python(program(limit + 1), SandboxConfig(timeout_s=10, **config))
    assert one_more.exit_code == 1 and "at most" in one_more.stderr, one_more
    assert r.to_observation() == (
        f"Error: the program is {2 * limit} bytes; the sandbox runs programs of at most {limit} bytes ({which})."
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", float("inf")),  # was a bare OverflowError at every run (int(inf) for RLIMIT_CPU)
        ("timeout_s", 1e300),  # was "the sandbox failed to start: prlimit: failed to parse CPU limit"
        ("cpus", float("inf")),  # OverflowError (the cgroup's quota)
        ("memory_mb", 1 << 45),  # prlimit: failed to parse AS limit
        ("max_processes", 10**9),  # OSError EINVAL writing pids.max
        ("max_output_bytes", 1 << 64),  # prlimit: failed to parse FSIZE limit
        ("max_open_files", 2_000_000),  # the init's setrlimit(RLIMIT_NOFILE) past fs.nr_open: failed to start
    ],
)
def test_limits_the_kernel_refuses_are_config_errors(field, value):
    from pydantic import ValidationError

    from slime_envs.sandbox import SandboxConfig

    with pytest.raises(ValidationError, match=field):
        SandboxConfig(**{field: value})


def _hard(name: str, cap: int) -> int:
    hard = resource.getrlimit(getattr(resource, name))[1]
    return cap if hard == resource.RLIM_INFINITY else min(cap, hard)


def test_limits_above_the_hosts_hard_limits_are_config_errors():
    # The init sets RLIMIT_NOFILE and RLIMIT_NPROC itself and cannot go past the hard limit it inherits: every run
    # failed to start ("ValueError: not allowed to raise maximum limit") with max_open_files=1 << 20 here (hard 20000).
    from pydantic import ValidationError

    from slime_envs.sandbox import SandboxConfig

    for field, name, extra in (("max_open_files", "RLIMIT_NOFILE", 0), ("max_processes", "RLIMIT_NPROC", 1)):
        hard = resource.getrlimit(getattr(resource, name))[1]
        if hard == resource.RLIM_INFINITY or hard - extra + 1 > (1 << 20):
            continue
        SandboxConfig(**{field: hard - extra})
        with pytest.raises(ValidationError, match=rf"{field}={hard - extra + 1} needs {name} .*hard limit {hard}"):
            SandboxConfig(**{field: hard - extra + 1})


async def test_the_largest_limits_the_config_takes_run():
    from slime_envs.sandbox import SandboxConfig, run_python

    config = SandboxConfig(
        timeout_s=86_400, cpus=1024, memory_mb=1 << 30, max_output_bytes=1 << 50, tmpfs_mb=1 << 30, max_files=1 << 32,
        max_processes=_hard("RLIMIT_NPROC", 1 << 22) - 1, max_open_files=_hard("RLIMIT_NOFILE", 1 << 20), preload=[],
    )  # fmt: skip
    r = await asyncio.wait_for(run_python("print('ran')", config), 60)
    assert (r.exit_code, r.stdout) == (0, "ran\n"), r.stderr


async def test_pipes_keep_their_default_size():
    # F_SETPIPE_SZ grew each pipe to 1 MiB: one run held 30 MiB in 30 pipes with the default limits, memory no
    # address space counts and that the kernel charges to the host uid (fs.pipe-user-pages-soft, 64 MiB per uid:
    # three concurrent runs pushed every other pipe of that uid down to 8 KiB). Reading the size still works.
    code = """
        import fcntl, os
        r, w = os.pipe()
        print("size", fcntl.fcntl(w, 1032))  # F_GETPIPE_SZ
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
            print("grown", fcntl.fcntl(w, 1032))
        except OSError as e:
            print("F_SETPIPE_SZ", os.strerror(e.errno))
    """
    r = await hostile(code)
    assert r.stdout.splitlines() == ["size 65536", "F_SETPIPE_SZ Operation not permitted"], r.stdout + r.stderr
