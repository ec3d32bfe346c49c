"""Sandbox behaviour for ordinary code and its limits. Every escape attempt must come back as output the
model can read, never as an exception in the caller, and must leave no process behind. The hostile-code
suite (with the in-process guard switched off) is in test_sandbox_hostile.py."""

import os
import pathlib

import pytest

from slime_envs import _bwrap, sandbox
from slime_envs.sandbox import SandboxConfig, SandboxUnavailableError, check_sandbox, run_python


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
    assert cwd == "/tmp"  # the sandbox's own tmpfs, gone with the run
    assert r.to_observation() == "42\n/tmp"


async def test_tmp_is_fresh_for_every_run():
    await run_python("open('/tmp/left.txt', 'w').write('x')")
    r = await run_python("import os\nprint(sorted(os.listdir('/tmp')))")
    # Only main.py, plus the first component of a Python runtime that lives under /tmp (a checkout there).
    runtime = sorted({p.split("/")[2] for p in _bwrap.runtime_view().binds if p.startswith("/tmp/")})
    assert r.stdout == f"{sorted(['main.py', *runtime])}\n"


async def test_exception_traceback_shows_user_code_only():
    r = await run_python("def f():\n    return 1 / 0\nf()")
    assert r.exit_code == 1 and not r.ok
    assert 'File "main.py", line 2, in f' in r.stderr
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "_sandbox_child" not in r.stderr


async def test_syntax_error_is_the_codes_error():
    r = await run_python("print(")
    assert r.exit_code == 1
    assert "SyntaxError" in r.stderr and 'File "main.py", line 1' in r.stderr


@pytest.mark.parametrize("code", ["print('\\ud800')\n\ud800", "x = 1\0"])
async def test_undecodable_source_is_the_codes_syntax_error(code):
    r = await run_python(code)
    assert r.exit_code == 1 and "SyntaxError" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("code", "exit_code", "observation"),
    [
        ("print('fine')", 0, "fine"),
        ("import sys; sys.exit(3)", 3, "(no output, exit code 3)"),
        # An exit status above 128 is the code's own number, not a signal (issue 27: 160 raised in
        # to_observation, 137 was reported as SIGKILL).
        ("import sys; sys.exit(160)", 160, "(no output, exit code 160)"),
        ("import sys; sys.exit(137)", 137, "(no output, exit code 137)"),
        ("import sys; sys.exit(255)", 255, "(no output, exit code 255)"),
        ("import os; os._exit(137)", 137, "(no output, exit code 137)"),
        ("import os; os.kill(os.getpid(), 15)", -15, "Error: the process was killed by signal SIGTERM."),
        ("import os; os.kill(os.getpid(), 9)", -9, "Error: the process was killed by signal SIGKILL."),
        ("import ctypes; ctypes.string_at(0)", -11, "Error: the process was killed by signal SIGSEGV."),
        # A real-time signal has no name in `signal.Signals`.
        ("import os; os.kill(os.getpid(), 40)", -40, "Error: the process was killed by signal 40."),
    ],
)
async def test_exit_status_comes_from_the_wait_status(code, exit_code, observation):
    r = await run_python(code)
    assert (r.exit_code, r.to_observation()) == (exit_code, observation), r.stderr
    assert r.ok == (exit_code == 0) and not r.timed_out


def test_exit_code_from_the_inits_report(caplog):
    assert sandbox._exit_code(b"%d\n" % (160 << 8), timed_out=False) == 160
    assert sandbox._exit_code(b"%d\n" % 9, timed_out=False) == -9
    assert sandbox._exit_code(b"%d\n" % (0x80 | 11), timed_out=False) == -11  # core-dump bit set
    assert caplog.records == []
    # No report: the init itself was killed (the OOM killer; nothing inside can signal it).
    assert sandbox._exit_code(b"", timed_out=False) == -9
    assert "killed before it reported" in caplog.text
    assert sandbox._exit_code(b"", timed_out=True) == -9


async def test_missing_rlimit_is_one_clear_start_up_error(monkeypatch):
    # A host that failed to set the limits on bubblewrap: the init refuses to start the code.
    bwrap_argv = sandbox.bwrap_argv
    monkeypatch.setattr(sandbox, "bwrap_argv", lambda view, **kw: bwrap_argv(view, **{**kw, "rlimits": {}}))
    with pytest.raises(SandboxUnavailableError, match=r"RLIMIT_AS is \(-1, -1\) in the sandbox's init, not"):
        await run_python("print('never runs')")


@pytest.mark.parametrize("exit_code", [-40, -63, -200, 1000])
def test_observation_never_raises(exit_code):
    text = sandbox.SandboxResult(stdout="", stderr="", exit_code=exit_code).to_observation()
    assert str(abs(exit_code)) in text


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        ("print(open('/etc/hostname').read())", "reading '/etc/hostname'"),
        ("print(open('/etc/hostname').read())", "outside the sandbox directory"),
        ("open('/usr/lib/slime-sandbox-escape.txt', 'w').write('x')", "writing '/usr/lib/slime-sandbox-escape.txt'"),
        ("import os; print(os.listdir('/'))", "listing '/'"),
        ("import os; os.remove('/usr/lib/anything')", "os.remove"),
        ("import socket; socket.create_connection(('192.0.2.1', 80), timeout=2)", "network access is not allowed"),
        ("import subprocess; subprocess.run(['ls'])", "starting processes"),
        ("import os; os.system('ls')", "starting processes (os.system)"),
        ("import ctypes; ctypes.CDLL('libc.so.6')", "ctypes"),
    ],
)
async def test_forbidden_actions_are_reported_by_the_guard(code, needle):
    r = await run_python(code)
    assert r.exit_code == 1
    assert "PermissionError: sandbox:" in r.stderr and needle in r.stderr


async def test_user_code_cannot_reach_the_runner():
    code = "import __main__\nprint(__name__, hasattr(__main__, '_make_hook'), '_confine' in globals())"
    r = await run_python(code)
    assert r.stdout == "__main__ False False\n"


async def test_enforcement_is_reported():
    r = await run_python("print('x')")
    assert r.enforcement["isolation"].startswith("bubblewrap: user/mount/pid/net/ipc/uts/cgroup namespaces")
    assert r.enforcement["network"] == "empty network namespace + seccomp (no socket) + audit hook"
    assert r.enforcement["processes"].startswith("RLIMIT_NPROC in the user namespace")
    assert r.enforcement["memory"].startswith("RLIMIT_AS per process")
    assert check_sandbox().keys() == r.enforcement.keys()


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


async def test_threads_work_without_subprocesses():
    code = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "with ThreadPoolExecutor(3) as pool:\n"
        "    print(sum(pool.map(lambda x: x * x, range(10))))\n"
    )
    r = await run_python(code)
    assert r.stdout == "285\n", r.stderr


async def test_subprocess_when_allowed():
    code = "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', '5'], capture_output=True).returncode)"
    r = await run_python(code, SandboxConfig(allow_subprocess=True))
    assert r.stdout == "0\n", r.stderr


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


def test_missing_bubblewrap_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(_bwrap.shutil, "which", lambda *a, **k: None)
    with pytest.raises(_bwrap.BwrapMissingError, match=r"needs bubblewrap .* apt-get install -y bubblewrap"):
        _bwrap.bwrap_path()


async def test_missing_prlimit_is_one_clear_error(monkeypatch):
    which = _bwrap.shutil.which
    monkeypatch.setattr(_bwrap.shutil, "which", lambda name, **kw: None if name == "prlimit" else which(name, **kw))
    _bwrap.runtime_view.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match=r"needs `prlimit` \(util-linux\): apt-get install"):
            await run_python("print(1)")
    finally:
        _bwrap.runtime_view.cache_clear()  # the next run builds the real view again


async def test_sandbox_unavailable_is_raised_not_returned(monkeypatch):
    def broken_view():
        raise _bwrap.BwrapMissingError("the Python sandbox needs bubblewrap (`bwrap`), which is not installed")

    monkeypatch.setattr(sandbox, "runtime_view", broken_view)
    with pytest.raises(SandboxUnavailableError, match="needs bubblewrap"):
        await run_python("print(1)")


def test_check_sandbox_passes_here():
    # CI must install bubblewrap: here it fails with SandboxUnavailableError naming it, it never skips.
    enforcement = check_sandbox()
    assert "seccomp" in enforcement["syscalls"]
    assert os.path.exists(_bwrap.bwrap_path())


async def test_output_limited_means_output_was_cut_not_that_it_reached_the_limit():
    """Exactly `max_output_bytes` is written whole and not flagged; one byte more is cut to the limit and flagged."""
    config = SandboxConfig(max_output_bytes=4096, max_output_chars=10_000)
    exact = await run_python("import os\nos.write(1, b'x' * 4096)", config)
    assert (exact.stdout, exact.output_limited, exact.exit_code) == ("x" * 4096, False, 0), exact.stderr
    assert exact.to_observation() == "x" * 4096
    over = await run_python("import os\nos.write(1, b'x' * 4096)\nos.write(1, b'y')", config)
    assert over.output_limited and over.stdout == "x" * 4096  # the byte of headroom landed, and is cut here
    crossing = await run_python("import os\nos.write(1, b'z' * 5000)\nos.write(1, b'z')", config)
    assert crossing.output_limited and crossing.stdout == "z" * 4096 and "File too large" in crossing.stderr


async def test_a_second_max_concurrent_runs_is_told_it_has_no_effect(caplog, monkeypatch):
    # The process's runs share the first run's limit; another value was ignored without a word.
    import weakref

    from slime_core.config import base as config_base

    monkeypatch.setattr(sandbox, "_LIMITERS", weakref.WeakKeyDictionary())  # this test's own, whatever ran before
    monkeypatch.setattr(config_base, "_WARNED", set())  # warn_once's keys: this test's own
    first = sandbox._limiter(2)
    assert sandbox._limiter(3) is first and sandbox._limiter(3) is first and sandbox._limiter(2) is first
    warnings = [r.getMessage() for r in caplog.records if "max_concurrent_runs" in r.getMessage()]
    assert warnings == [
        "sandbox: max_concurrent_runs=3 has no effect: this process's runs share the limit of its first run (2)"
    ]


def test_concurrent_first_checks_run_one_probe(monkeypatch):
    # The envs of a rollout's episodes are built in worker threads at once: each saw no probe yet and ran its own.
    import threading
    import time

    calls = []

    def slow_probe():
        calls.append(1)
        time.sleep(0.3)  # every thread arrives while the first probe runs
        return {"isolation": "probe"}

    monkeypatch.setattr(sandbox, "_PROBE", [])  # this test's own process-wide result
    monkeypatch.setattr(sandbox, "_probe", slow_probe)
    results = []
    threads = [threading.Thread(target=lambda: results.append(check_sandbox())) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(calls) == 1 and results == [{"isolation": "probe"}] * 6
