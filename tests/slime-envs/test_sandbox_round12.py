"""Hostile code, twelfth pass (issue 27): what the host reads back from the sandbox. Every case first switches the
in-process guard off."""

import pytest
from slime_sandbox_hostile import hostile

pytestmark = pytest.mark.usefixtures("host_survives_and_nothing_leaks")


async def test_flags_the_code_sets_on_its_output_stay_off_the_hosts_reads():
    # The code's stdout and stderr were the host's own open file descriptions, whose status flags the code can set:
    # with O_DIRECT on them the host's read of the output failed with EINVAL, and `run_python` raised
    # SandboxUnavailableError ("the sandbox could not run on this host"), an infrastructure failure that drops the
    # sample instead of scoring it, at the code's choice. Its writes now go through descriptions of their own.
    code = """
        import fcntl, os, sys
        print("out", flush=True)
        sys.stderr.write("err\\n")
        sys.stderr.flush()
        for fd in (1, 2):
            for flag in (os.O_DIRECT, os.O_APPEND, os.O_NONBLOCK):
                try:
                    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | flag)
                except OSError:  # O_DIRECT on a host /tmp that cannot take it (tmpfs before Linux 6.6)
                    pass
        os._exit(3)
    """
    r = await hostile(code)
    assert (r.exit_code, r.stdout, r.stderr, r.output_limited) == (3, "out\n", "err\n", False)


async def test_secret_memory_is_refused():
    # memfd_secret's pages are taken out of the kernel's direct map, which splits the 1 GiB and 2 MiB pages mapping
    # them; the kernel never merges them back. One run with the default limits (60 memfds of 1 MiB, each touched and
    # unmapped) split 16 GiB of this machine's 1 GiB direct-map pages (/proc/meminfo: DirectMap1G 24 -> 8 GiB,
    # DirectMap4k 20 -> 386 MiB), a lasting TLB cost for every process of the host. Only the call is made here.
    code = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print("memfd_secret", libc.syscall(447, 0), os.strerror(ctypes.get_errno()))  # 447 on x86-64 and arm64
    """
    r = await hostile(code)
    assert r.stdout == "memfd_secret -1 Operation not permitted\n", r.stdout + r.stderr  # was a descriptor (3)
