"""The code's own streams, broken by the code, must not turn into the runner's failure (issue 27, item 11).

The expected exit codes and messages are what `python3 main.py` gives for the same script (checked by hand with
CPython 3.12): the runner inside the sandbox used to flush `sys.stdout` itself and crash on a closed or removed
one, so its own traceback and exit code 1 replaced the code's (exit code 3 reported as 1).
"""

import pytest

from slime_envs.sandbox import SandboxConfig, run_python


@pytest.mark.parametrize(
    ("code", "exit_code", "stderr_tail"),
    [
        ("import sys; sys.stdout.close(); sys.exit(3)", 3, ""),
        ("import sys; sys.stdout = None; sys.exit(3)", 3, ""),
        ("import sys; sys.stdout.close(); raise ValueError('v')", 1, "ValueError: v\n"),
        ("import sys; sys.stdout = None; raise ValueError('v')", 1, "ValueError: v\n"),
        ("import sys; sys.stderr = None; raise ValueError('v')", 1, ""),  # Python prints nothing either
        ("import os; os.close(1); os.close(2); raise ValueError('v')", 1, ""),
        ("import os, sys; os._exit = None; raise KeyError('k')", 1, "KeyError: 'k'\n"),
    ],
)
async def test_broken_streams_keep_the_codes_outcome(code, exit_code, stderr_tail):
    r = await run_python(code, SandboxConfig(timeout_s=10))
    assert (r.exit_code, r.stdout) == (exit_code, ""), r.stderr
    assert r.stderr.endswith(stderr_tail) and "_sandbox_child" not in r.stderr, r.stderr
    if not stderr_tail:
        assert r.stderr == ""


async def test_code_that_used_up_its_descriptors_keeps_its_output_and_error():
    # Fifth hostile pass on issue 27: the runner imported `traceback` before flushing the code's stdout; with no
    # descriptor left the import failed, and both the printed line and the error were lost ("(no output, exit
    # code 1)"). CPython itself prints both here.
    code = (
        "import os\nfds = []\ntry:\n    while True:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        "except OSError as e:\n    print('out of descriptors:', e.errno)\nraise ValueError('boom')\n"
    )
    r = await run_python(code, SandboxConfig(timeout_s=10))
    assert (r.exit_code, r.stdout) == (1, "out of descriptors: 24\n")  # was (1, "")
    assert r.stderr.endswith("ValueError: boom\n"), r.stderr  # was ""
