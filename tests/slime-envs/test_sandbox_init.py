"""Hostile code against the sandbox's own init (issue 27): bubblewrap's init must be out of the code's reach (no
memory, descriptors or tracing), under every limit and filter the code has, gone with the code, and the code must not
start before the init is under its filter. Every case first switches the in-process guard off."""

import asyncio
import os
import pathlib
import subprocess
import sys
import time

import pytest
from slime_sandbox_hostile import BREAK_GUARD, hostile

from slime_envs import _bwrap, sandbox

pytestmark = pytest.mark.usefixtures("host_survives_and_nothing_leaks")


async def test_the_init_cannot_be_read_written_or_traced():
    # The escape of issue 27: the code opened /proc/1/mem of the sandbox's init (same uid), wrote code there,
    # and the init then forked a process outside the limits. Every route into another process's memory
    # or descriptors must be refused by the kernel, whichever of the init and the code's parent is asked.
    code = """
        import ctypes, errno, os
        libc = ctypes.CDLL(None, use_errno=True)
        print("ppid", os.getppid())
        for what, path, flags in [("mem rw", "/proc/1/mem", os.O_RDWR), ("mem r", "/proc/1/mem", os.O_RDONLY),
                                  ("maps", "/proc/1/maps", os.O_RDONLY), ("environ", "/proc/1/environ", os.O_RDONLY),
                                  ("fd", "/proc/1/fd/1", os.O_WRONLY | os.O_APPEND)]:
            try:
                os.close(os.open(path, flags))
                print(what, "OPENED")
            except OSError as e:
                print(what, errno.errorcode[e.errno])
        try:
            print("fd list", os.listdir("/proc/1/fd"))
        except OSError as e:
            print("fd list", errno.errorcode[e.errno])
        PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
        nr = {"x86_64": dict(ptrace=101, pidfd_open=434, pidfd_getfd=438, process_vm_writev=311),
              "aarch64": dict(ptrace=117, pidfd_open=434, pidfd_getfd=438, process_vm_writev=271)}[os.uname().machine]
        for name, args in [("attach", (PTRACE_ATTACH, 1, 0, 0)), ("seize", (PTRACE_SEIZE, 1, 0, 0))]:
            ctypes.set_errno(0)
            print(name, libc.syscall(nr["ptrace"], *args), errno.errorcode.get(ctypes.get_errno()))
        pidfd = libc.syscall(nr["pidfd_open"], 1, 0)
        ctypes.set_errno(0)
        print("getfd", libc.syscall(nr["pidfd_getfd"], pidfd, 1, 0), errno.errorcode.get(ctypes.get_errno()))
        buf = ctypes.create_string_buffer(8)
        iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
        remote = (ctypes.c_void_p * 2)(0x400000, 8)
        ctypes.set_errno(0)
        rc = libc.syscall(nr["process_vm_writev"], 1, iov, 1, remote, 1, 0)
        print("vm_writev", rc, errno.errorcode.get(ctypes.get_errno()))
    """
    r = await hostile(code)
    lines = r.stdout.splitlines()
    assert lines == [
        "ppid 1",  # the code's parent is the init
        "mem rw EACCES",
        "mem r EACCES",
        "maps EACCES",
        "environ EACCES",
        "fd EACCES",
        "fd list EACCES",
        "attach -1 EPERM",
        "seize -1 EPERM",
        "getfd -1 EPERM",
        "vm_writev -1 EPERM",
    ], r.stdout + r.stderr


async def test_the_init_is_under_every_limit_and_filter():
    # Were the init ever hijacked, it must hold no more than the code: the same rlimits and both filters.
    code = """
        def limits(pid):
            rows = {}
            for line in open(f"/proc/{pid}/limits").readlines()[1:]:
                name, soft, hard = line[:26].strip(), *line[26:].split()[:2]
                rows[name] = (soft, hard)
            return {k: rows[k] for k in ("Max cpu time", "Max file size", "Max processes", "Max address space")}
        def status(pid):
            rows = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
            return rows["NoNewPrivs"].strip(), rows["Seccomp"].strip(), rows["Seccomp_filters"].strip()
        print(limits(1) == limits("self"), limits(1))
        print("init", *status(1))
        print("code", *status("self"))
    """
    r = await hostile(code, memory_mb=300, max_output_bytes=1 << 20, max_processes=5, timeout_s=5)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("True "), r.stdout + r.stderr
    assert eval(lines[0][5:]) == {  # noqa: S307 (our own test output)
        "Max cpu time": ("7", "7"),  # int(timeout_s) + 2 seconds
        # One byte above the output limit: the runner can tell "exactly the limit" from "cut" (output_limited).
        "Max file size": (str((1 << 20) + 1), str((1 << 20) + 1)),
        "Max processes": ("6", "6"),  # max_processes + the init
        "Max address space": (str(300 << 20), str(300 << 20)),
    }
    assert lines[1:] == ["init 1 2 2", "code 1 2 2"]  # no_new_privs, filter mode, base + no-process filter


async def test_nothing_runs_after_the_code_exits(tmp_path):
    # A process left behind by the code (double-forked, own session) must not outlive it: it would run
    # after the result is taken, and before, the init kept the run open until it exited.
    code = """
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1.0)
                print("STILL RUNNING", flush=True)
                for _ in range(3):
                    os.fork()
                time.sleep(30)
            os._exit(0)
        print("main exits", flush=True)
    """
    start = time.monotonic()
    r = await hostile(code, allow_subprocess=True, timeout_s=5)
    took = time.monotonic() - start
    await asyncio.sleep(1.5)  # the grandchild would have printed by now
    assert r.stdout == "main exits\n" and r.exit_code == 0 and not r.timed_out, r.stdout + r.stderr
    assert took < 1.0, took  # the run ended with its main process, not with its last one


async def test_output_limit_holds_for_every_process(monkeypatch):
    # Several processes (children, a setsid grandchild, a reopened descriptor, ftruncate, pwrite far out)
    # together try to grow the host's output file past the limit; they report on stderr.
    sizes = []
    read_capped = sandbox.read_capped

    def recording(f, *args, **kwargs):
        sizes.append(f.seek(0, os.SEEK_END))
        return read_capped(f, *args, **kwargs)

    monkeypatch.setattr(sandbox, "read_capped", recording)
    limit = 256 << 10
    code = f"""
        import os
        def attempt(name, fn):
            try:
                fn()
                os.write(2, f"{{name}} DONE\\n".encode())
            except OSError as e:
                os.write(2, f"{{name}} {{e.errno}}\\n".encode())
        pids = []
        for i in range(3):
            pid = os.fork()
            if pid == 0:
                if i == 2:
                    os.setsid()
                attempt(f"child{{i}}", lambda: [os.write(1, b"x" * 65536) for _ in range(8)])
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        attempt("reopen", lambda: open("/proc/self/fd/1", "ab", buffering=0).write(b"y" * ({limit} + 1)))
        attempt("ftruncate", lambda: os.ftruncate(1, {limit} * 4))
        attempt("pwrite", lambda: os.pwrite(1, b"z", {limit} * 4))
    """
    r = await hostile(code, allow_subprocess=True, max_output_bytes=limit, max_output_chars=10_000)
    assert r.output_limited and sizes[0] == limit, sizes  # stdout: full, and not one byte more
    reports = dict(line.split() for line in r.stderr.splitlines())
    # EFBIG everywhere; the host's file cannot even be opened again (EACCES: it belongs to the host's uid).
    assert reports.pop("reopen") in ("27", "13"), r.stderr
    assert reports == {"child0": "27", "child1": "27", "child2": "27", "ftruncate": "27", "pwrite": "27"}, r.stderr


def test_the_code_starts_only_once_the_init_is_under_its_filter(tmp_path):
    # A loaded machine let the code's process reach the code before the init had loaded its no-process filter
    # ("init 1 2 1" once in a full test run). Here the init is made slow on purpose (a copy of the runner that sleeps
    # before loading it), so the order is the code's to keep, not the scheduler's.
    runner = pathlib.Path(_bwrap.__file__).with_name("_sandbox_child.py").read_text()
    marker = "    _load_seccomp(no_process_filter)\n"
    assert runner.count(marker) == 1
    slow = tmp_path / "_sandbox_child.py"
    slow.write_text(runner.replace(marker, "    __import__('time').sleep(1.0)\n" + marker))
    script = f"""
import asyncio
from slime_envs import _bwrap
from slime_envs.sandbox import SandboxConfig, run_python
_bwrap._CHILD = __import__("pathlib").Path({str(slow)!r})
code = {BREAK_GUARD!r} + 'print(dict(l.split(":", 1) for l in open("/proc/1/status"))["Seccomp_filters"].strip())'
result = asyncio.run(run_python(code, SandboxConfig(timeout_s=20)))
print(result.stdout.strip(), result.exit_code)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout == "2 0\n", out.stdout + out.stderr  # was "1 0": the base filter only
