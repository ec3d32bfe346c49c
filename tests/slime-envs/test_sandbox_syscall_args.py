"""Hostile code: seccomp rules that test a syscall's 32-bit argument hold whatever the register's high half holds.

The filter sees the whole 64-bit register; the kernel reads an `int`/`unsigned int` argument from its low half. A rule
comparing all 64 bits was passed by setting a high bit. Every case first switches the in-process guard off."""

import platform

import pytest
from slime_sandbox_hostile import hostile

pytestmark = pytest.mark.usefixtures("host_survives_and_nothing_leaks")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the raw syscall numbers are x86-64's")
async def test_high_bits_do_not_get_past_the_rules_on_32_bit_arguments():
    # prlimit64/setrlimit(RLIMIT_CORE | 1 << 32) set the core limit to 0 (issue 27's core-helper fix undone), and
    # fcntl(F_SETPIPE_SZ | 1 << 32) grew a pipe to 1 MiB (pass 10's fix undone).
    code = """
        import ctypes, fcntl, os, resource
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        zero = (ctypes.c_uint64 * 2)(0, 0)
        high = 1 << 32
        for name, args in (
            ("prlimit64", (302, ctypes.c_long(0), ctypes.c_ulong(high | resource.RLIMIT_CORE), zero, None)),
            ("setrlimit", (160, ctypes.c_ulong(high | resource.RLIMIT_CORE), zero)),
        ):
            rc = libc.syscall(*args)
            print(name, rc, os.strerror(ctypes.get_errno()) if rc else "", resource.getrlimit(resource.RLIMIT_CORE))
        r, w = os.pipe()
        rc = libc.syscall(72, ctypes.c_long(w), ctypes.c_ulong(high | 1031), ctypes.c_ulong(1 << 20))  # F_SETPIPE_SZ
        print("F_SETPIPE_SZ", rc, os.strerror(ctypes.get_errno()) if rc < 0 else "", fcntl.fcntl(w, 1032))
    """
    r = await hostile(code)
    assert r.stdout.splitlines() == [
        "prlimit64 -1 Operation not permitted (1, 1)",  # was 0, and (0, 0)
        "setrlimit -1 Operation not permitted (1, 1)",
        "F_SETPIPE_SZ -1 Operation not permitted 65536",  # was 1048576
    ], r.stdout + r.stderr
