"""Shared by the hostile-code suites (`test_sandbox_hostile.py`, `test_sandbox_init.py`): the attack that switches
the in-process guard off, and a look at the host's process table. Importable as module `slime_sandbox_hostile`
(registered by this folder's conftest.py)."""

import os
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


def _parent(pid: int) -> int:
    """The parent pid of `pid` (0 when it is gone); field 4 of /proc/PID/stat, after the command's parentheses."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _other_workers() -> set[int]:
    """Under pytest-xdist: the pids of this session's other workers (siblings of this one), whose live sandboxes are
    not this test's leaks. Empty when not run by xdist."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return set()
    me, controller = os.getpid(), os.getppid()
    siblings = set()
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != me and _parent(int(proc.name)) == controller:
            siblings.add(int(proc.name))
    return siblings


def sandbox_pids() -> list[int]:
    """Host pids of sandbox processes (the runner and anything forked from it keep its command line), leaving out
    those that descend from another xdist worker of this session (that worker's sandboxes are running, not leaked; a
    leaked process is reparented away from its worker, so it is still counted)."""
    others = _other_workers()
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if b"/opt/slime-sandbox/_sandbox_child.py" in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
    return [pid for pid in found if not others & _ancestors(pid)]


def _ancestors(pid: int) -> set[int]:
    """The pids above `pid` up to init (bounded: a chain changing under the walk ends it)."""
    chain = set()
    for _ in range(64):
        pid = _parent(pid)
        if pid <= 1 or pid in chain:
            break
        chain.add(pid)
    return chain
