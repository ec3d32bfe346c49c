"""`memory_mb` without a memory cgroup: memory that no address space counts is bounded too (issue 27, item 10).

Where this process gets no memory cgroup, RLIMIT_AS was the only memory limit, and it counts mappings, not
memory held by the kernel for the code: with `memory_mb=256` the code kept 3 GiB in memfds, 2.5 GiB in detached
System V shared memory segments and 1.1 GiB in socket buffers (measured here before the fix). Descriptors are
now capped (RLIMIT_NOFILE) and `shmget` is refused, so what is held is at most about `max_open_files` MiB.
"""

import textwrap

import pytest

from slime_envs import sandbox
from slime_envs.sandbox import SandboxConfig, run_python

# The audit hook would refuse ctypes and sockets with a readable error; hostile code turns it off through `gc`
# (test_sandbox_hostile.py), so what must hold here is the kernel's limits.
NO_GUARD = """
import gc
for f in gc.get_objects():
    if type(f).__name__ == "function" and f.__name__ == "hook" and "_deny" in f.__globals__:
        f.__globals__["_deny"] = lambda what: None
"""

HOLD = {
    "memfd": """
        import os
        held = []
        try:
            for i in range(4096):
                fd = os.memfd_create(f"m{i}")
                os.write(fd, b"x" * (1 << 20))
                held.append(fd)
        except OSError as e:
            print("stopped:", e.strerror)
        print("MiB", len(held))
    """,
    "socket buffers": """
        import socket
        held, total = [], 0
        try:
            for i in range(4096):
                a, b = socket.socketpair()
                a.setblocking(False)
                held.append((a, b))
                try:
                    while True:
                        total += a.send(b"x" * 65536)
                except BlockingIOError:
                    pass
        except OSError as e:
            print("stopped:", e.strerror)
        print("MiB", total >> 20)
    """,
    "sysv shm": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        total = 0
        for i in range(64):
            sid = libc.shmget(0, 64 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
            if sid < 0:
                print("stopped:", __import__("os").strerror(ctypes.get_errno()))
                break
            addr = libc.shmat(sid, None, 0)
            ctypes.memset(addr, 1, 64 << 20)
            libc.shmdt(ctypes.c_void_p(addr))  # detached: the segment keeps its memory, no mapping counts it
            total += 64
        print("MiB", total)
    """,
}


@pytest.mark.parametrize("how", list(HOLD))
async def test_memory_outside_the_address_space_is_bounded_without_a_cgroup(how, monkeypatch):
    monkeypatch.setattr(sandbox.CgroupLimits, "create", classmethod(lambda cls, **kwargs: None))
    config = SandboxConfig(timeout_s=20, memory_mb=256, max_open_files=64)
    r = await run_python(NO_GUARD + textwrap.dedent(HOLD[how]), config)
    assert r.exit_code == 0, r.stderr
    assert "no memory cgroup here" in r.enforcement["memory"]
    held = int(r.stdout.split("MiB ")[1])
    assert held <= 64, r.stdout  # was 3000 (memfd), 1111 (sockets), 2560 (shm, stopped at 40 segments)
    assert "stopped: " in r.stdout, r.stdout  # the kernel refused: too many open files, or shmget not permitted


async def test_the_descriptor_limit_is_the_configured_one():
    r = await run_python(
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE))", SandboxConfig(max_open_files=40)
    )
    assert r.stdout == "(40, 40)\n", r.stderr
