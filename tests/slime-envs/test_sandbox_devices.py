"""Hostile code: the sandbox's `/dev` holds no terminal. A pty is counted in kernel.pty.max, one pool for the whole
machine, so the code must not be able to take ptys that other containers of the host need. The in-process guard is
switched off first: what holds is the mount table."""

import pytest
from slime_sandbox_hostile import hostile

pytestmark = pytest.mark.usefixtures("host_survives_and_nothing_leaks")


async def test_no_pty_can_be_opened_and_dev_holds_only_the_plain_devices():
    # bubblewrap's --dev mounted a devpts instance: one run opened 61 ptys through /dev/ptmx (its descriptor limit),
    # and with allow_subprocess ~1,000, out of the 3,072 the host's other devpts instances share.
    code = """
        import errno, os
        for path in ("/dev/ptmx", "/dev/pts/ptmx", "/dev/tty"):
            try:
                os.close(os.open(path, os.O_RDWR | os.O_NOCTTY))
                print(path, "opened")
            except OSError as e:
                print(path, errno.errorcode[e.errno])
        try:
            os.openpty()
            print("openpty opened")
        except OSError as e:
            print("openpty", errno.errorcode[e.errno])
        print(sorted(os.listdir("/dev")))
        with open("/dev/null", "w") as f:
            print("null", f.write("x"))
        print("urandom", len(open("/dev/urandom", "rb").read(8)), "zero", open("/dev/zero", "rb").read(2))
        print("stdout", os.readlink("/dev/stdout"), "fd", os.readlink("/dev/fd"))
        try:
            open("/dev/new", "w")
        except OSError as e:
            print("/dev/new", errno.errorcode[e.errno])
    """
    r = await hostile(code, allow_subprocess=True)
    assert r.stdout.splitlines() == [
        "/dev/ptmx ENOENT",  # was opened, 61 times
        "/dev/pts/ptmx ENOENT",
        "/dev/tty ENOENT",
        "openpty ENOENT",
        "['fd', 'full', 'null', 'random', 'stderr', 'stdin', 'stdout', 'urandom', 'zero']",
        "null 1",
        "urandom 8 zero b'\\x00\\x00'",
        "stdout /proc/self/fd/1 fd /proc/self/fd",
        "/dev/new EROFS",
    ], r.stdout + r.stderr
