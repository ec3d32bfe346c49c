"""Cancelling `run_python` at any point of the sandbox's start-up leaves no process and no zombie behind.

Each case runs in a fresh interpreter that is a child subreaper (PR_SET_CHILD_SUBREAPER): an orphan of the
sandbox is re-parented to it instead of to pid 1, so "no process left" is "no child left", alive or zombie,
whatever else runs on the machine. The cancel comes from a hook at a fixed point of the start-up, not a sleep.
"""

import json
import subprocess
import sys

import pytest

from slime_envs.sandbox import SandboxUnavailableError, check_sandbox

_CASE = r"""
import asyncio, ctypes, json, os, sys, time
from slime_envs import _sandbox_proc, sandbox

assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
point = sys.argv[1]
outer = None


def hook(module, name, cancels=1):
    real = getattr(module, name)

    def cancel():
        for _ in range(cancels):
            outer.cancel()

    if asyncio.iscoroutinefunction(real):
        async def wrapped(*args, **kwargs):
            cancel()
            return await real(*args, **kwargs)
    else:
        def wrapped(*args, **kwargs):
            cancel()
            return real(*args, **kwargs)
    setattr(module, name, wrapped)


if point == "spawn":  # inside asyncio's spawn: the process exists, its transport is not ready
    hook(asyncio, "create_subprocess_exec")
elif point == "info":  # bubblewrap started, its child's pid not read yet
    hook(sandbox, "_read_to_eof")
elif point == "release":  # the init is in the cgroup and is being let go
    hook(sandbox, "parent_pid")
elif point == "spawn_then_cleanup":  # a second cancel while the first one's clean-up runs
    hook(asyncio, "create_subprocess_exec")
    hook(_sandbox_proc, "children_of")


def children():
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat", "rb").read()
            except OSError:
                continue
            head, tail = stat.rsplit(b")", 1)
            fields = tail.split()
            if int(fields[1]) == os.getpid():
                out.append([int(name), fields[0].decode(), head.split(b"(", 1)[1].decode()])
    return out


async def main():
    global outer
    outer = asyncio.create_task(sandbox.run_python("while True: pass", sandbox.SandboxConfig(timeout_s=30)))
    try:
        await outer
        result = "finished"
    except asyncio.CancelledError:
        result = "cancelled"
    return result


result = asyncio.run(main())
deadline = time.monotonic() + 3.0
while children() and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"result": result, "left": children()}))
"""


@pytest.fixture(scope="module", autouse=True)
def _needs_sandbox():
    try:
        check_sandbox()
    except SandboxUnavailableError as e:
        pytest.skip(f"no sandbox on this machine: {e}")


@pytest.mark.parametrize("point", ["spawn", "info", "release", "spawn_then_cleanup"])
def test_a_cancel_during_start_up_leaves_no_process_or_zombie(point):
    run = subprocess.run([sys.executable, "-c", _CASE, point], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report == {"result": "cancelled", "left": []}, (point, run.stderr[-2000:])
