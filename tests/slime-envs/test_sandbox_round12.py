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
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT | os.O_APPEND | os.O_NONBLOCK)
        os.lseek(1, 1 << 40, os.SEEK_SET)
        os._exit(3)
    """
    r = await hostile(code)
    assert (r.exit_code, r.stdout, r.stderr, r.output_limited) == (3, "out\n", "err\n", False)
