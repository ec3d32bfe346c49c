"""Hostile code, eleventh pass (issue 27): core dumps. Every case first switches the in-process guard off."""

import pytest
from slime_sandbox_hostile import hostile

pytestmark = pytest.mark.usefixtures("host_survives_and_nothing_leaks")


async def test_the_core_limit_stays_at_one_so_no_crash_reaches_the_hosts_core_helper():
    # A core_pattern piping to a helper (systemd-coredump, apport) ignores RLIMIT_CORE except the value 1
    # (fs/coredump.c): with the old limit of 0, every crash of the code started a root helper on the host, outside
    # the sandbox's limits, and the code could lower its own limit back to 0 (setrlimit needs no privilege to lower).
    code = """
        import ctypes, os, resource, signal
        print("core", resource.getrlimit(resource.RLIMIT_CORE))
        for soft, hard in ((0, 1), (0, 0)):
            try:
                resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
                print("lowered", soft, hard)
            except (ValueError, OSError) as e:
                print("refused", soft, hard, type(e).__name__)
        libc = ctypes.CDLL(None, use_errno=True)
        zero = (ctypes.c_uint64 * 2)(0, 0)
        print("prlimit64", libc.prlimit64(0, resource.RLIMIT_CORE, zero, None), os.strerror(ctypes.get_errno()))
        read = (ctypes.c_uint64 * 2)()
        print("read", libc.prlimit64(0, resource.RLIMIT_CORE, None, read), list(read))
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 64))  # another limit still takes a new value
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGSEGV)
        _, status = os.waitpid(pid, 0)
        print("child", os.WTERMSIG(status), "dumped" if os.WCOREDUMP(status) else "no core")
        print("cores", sorted(f for f in os.listdir(".") if f.startswith("core")))
    """
    r = await hostile(code, allow_subprocess=True)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:6] == [
        "core (1, 1)",
        "refused 0 1 ValueError",
        "refused 0 0 ValueError",
        "prlimit64 -1 Operation not permitted",
        "read 0 [1, 1]",
        "child 11 no core",
    ], r.stdout
    # The crash wrote no core file (1 byte is below the smallest ELF core). Only `core*` names are looked at: the
    # runtime's mount points show in the working directory where the repository lives under /tmp.
    assert lines[6] == "cores []"
