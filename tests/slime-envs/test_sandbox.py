"""Sandbox containment. Every escape attempt must come back as output the model can read, never as
an exception in the caller, and must leave no process behind."""

import os
import pathlib

import pytest

from slime_envs.sandbox import SandboxConfig, hard_process_limit_available, run_python


def leftover_children():
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if b"_sandbox_child.py" in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


async def test_runs_code_in_private_dir():
    r = await run_python("import os\nprint(6 * 7)\nprint(os.getcwd())\nopen('f.txt', 'w').write('x')")
    assert r.ok and r.exit_code == 0
    out, cwd = r.stdout.splitlines()
    assert out == "42"
    assert os.path.basename(cwd).startswith("slime-sandbox-")
    assert not os.path.exists(cwd)  # removed after the run
    assert r.to_observation() == f"42\n{cwd}"


async def test_exception_traceback_shows_user_code_only():
    r = await run_python("def f():\n    return 1 / 0\nf()")
    assert r.exit_code == 1 and not r.ok
    assert 'File "main.py", line 2, in f' in r.stderr
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "_sandbox_child" not in r.stderr


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        ("print(open('/etc/hostname').read())", "reading '/etc/hostname'"),
        (f"print(open({__file__!r}).read())", "outside the sandbox directory"),
        ("open('/tmp/slime-sandbox-escape.txt', 'w').write('x')", "writing '/tmp/slime-sandbox-escape.txt'"),
        ("import os; print(os.listdir('/'))", "listing '/'"),
        ("import os; os.remove('/tmp/anything')", "os.remove"),
        ("import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)", "network access is not allowed"),
        ("import subprocess; subprocess.run(['ls'])", "starting processes"),
        ("import os; os.system('ls')", "starting processes (os.system)"),
        ("import ctypes; ctypes.CDLL('libc.so.6')", "ctypes"),
    ],
)
async def test_forbidden_actions_are_reported(code, needle):
    r = await run_python(code)
    assert r.exit_code == 1
    assert "PermissionError: sandbox:" in r.stderr and needle in r.stderr
    assert not os.path.exists("/tmp/slime-sandbox-escape.txt")


async def test_user_code_cannot_reach_the_runner():
    code = "import __main__\nprint(__name__, hasattr(__main__, '_make_hook'), '_confine' in globals())"
    r = await run_python(code)
    assert r.stdout == "__main__ False False\n"


async def test_network_namespace_or_hook_reported():
    r = await run_python("print('x')")
    assert r.enforcement["network"] in ("netns + audit hook", "audit hook")
    assert "processes" in r.enforcement and "memory" in r.enforcement


async def test_memory_limit():
    r = await run_python("x = bytearray(2 * 1024 ** 3)\nprint('allocated')", SandboxConfig(memory_mb=256))
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout


async def test_time_limit_kills_the_process_group():
    code = "import time\nprint('start', flush=True)\nwhile True:\n    pass"
    r = await run_python(code, SandboxConfig(timeout_s=1.5))
    assert r.timed_out and r.exit_code < 0
    assert r.stdout == "start\n"
    assert r.to_observation().endswith("Error: execution timed out (wall-clock limit reached); the process was killed.")
    assert leftover_children() == []


async def test_output_truncation_and_file_size_limit():
    r = await run_python("print('a' * 10000)", SandboxConfig(max_output_chars=100))
    assert r.stdout == "a" * 100 + "\n... (output truncated to 100 characters)"
    r = await run_python("print('b' * 100000)", SandboxConfig(max_output_bytes=4096, max_output_chars=50))
    assert r.output_limited
    assert "File too large" in r.stderr
    assert r.to_observation().endswith("Error: output limit exceeded; further writes failed.")


async def test_fork_refused_by_default():
    r = await run_python("import os\nos.fork()")
    assert "starting processes (os.fork)" in r.stderr


@pytest.mark.skipif(not hard_process_limit_available(), reason="no kernel-enforced process limit here")
async def test_fork_bomb_hits_hard_process_limit():
    # Bounded even without limits (at most 2**6 = 64 processes), and killed after 3 s.
    code = (
        "import os, time\n"
        "refused = 0\n"
        "for _ in range(6):\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        refused += 1\n"
        "if refused:\n"
        "    print('refused', flush=True)\n"
        "time.sleep(30)\n"
    )
    config = SandboxConfig(timeout_s=3, allow_subprocess=True, max_processes=8)
    r = await run_python(code, config)
    assert r.timed_out
    assert "refused" in r.stdout  # some fork failed: the limit (8) is below the 64 processes asked for
    assert leftover_children() == []

    code = (
        "import os, time\nn = 0\n"
        "for _ in range(30):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(n)\n"
    )
    r = await run_python(code, config)
    assert r.stdout.strip() == "7"  # 8 tasks in all: the sandboxed process and 7 children
    assert leftover_children() == []
