"""Shared by the hostile-code suites (`test_sandbox_hostile.py`, `test_sandbox_init.py`): the attack that switches
the in-process guard off, and a look at the host's process table. Importable as module `slime_sandbox_hostile`
(registered by this folder's conftest.py)."""

import pathlib
import textwrap

from slime_envs.sandbox import SandboxConfig, run_python

# Reaches the runner's audit hook through the garbage collector and makes its `_deny` a no-op: the issue's
# introspection attack. Every case below runs after it, so what holds is the kernel's boundary.
BREAK_GUARD = textwrap.dedent(
    """
    import gc
    for _obj in gc.get_objects():
        if type(_obj).__name__ == "function" and _obj.__name__ == "hook" and "_deny" in _obj.__globals__:
            _obj.__globals__["_deny"] = lambda what: None
    """
)
CANARY = "slime-canary-7f3e9b"


async def hostile(code: str, **config) -> "object":
    return await run_python(BREAK_GUARD + textwrap.dedent(code), SandboxConfig(**{"timeout_s": 5, **config}))


def sandbox_pids() -> list[int]:
    """Host pids of sandbox processes (the runner and anything forked from it keep its command line)."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if b"/opt/slime-sandbox/_sandbox_child.py" in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
    return found
