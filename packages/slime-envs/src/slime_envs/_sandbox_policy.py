"""What a sandboxed run enforces: the rlimits of its processes, the runner's policy, and the report of both.

`slime_envs.sandbox` builds a run from these; they are split off so that the list of limits reads in one place.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from slime_envs._bwrap import HOST_UID, SANDBOX_UID, WORKDIR, runtime_view
from slime_envs._cgroups import CgroupLimits
from slime_envs._seccomp import DENIED, no_process_filter

if TYPE_CHECKING:
    from slime_envs._sandbox_config import SandboxConfig

__all__ = ["INIT_RLIMITS", "enforcement", "rlimits", "runner_policy"]

_MIB = 1024 * 1024


def enforcement(config: SandboxConfig, cgroup: CgroupLimits | None) -> dict[str, str]:
    """`SandboxResult.enforcement`: for each limit, which mechanism enforced it on this machine (a cgroup or not)."""
    caps = {} if cgroup is None else {c.split()[0]: c for c in cgroup.enforced}
    host_uid = HOST_UID if os.geteuid() == 0 else os.geteuid()

    def with_cgroup(name: str, rlimit: str) -> str:
        return f"{rlimit} + {caps[name]} cgroup" if name in caps else f"{rlimit} (no {name} cgroup here)"

    return {
        "isolation": "bubblewrap: user/mount/pid/net/ipc/uts/cgroup namespaces, "
        f"uid {SANDBOX_UID} (host uid {host_uid}), non-dumpable init",
        "network": "empty network namespace + seccomp (no socket) + audit hook",
        "files": f"read-only runtime view, private {WORKDIR} tmpfs ({config.tmpfs_mb} MiB, "
        + (f"{config.max_files} files" if runtime_view().workdir_mount else "no file-count limit here")
        + ") + audit hook",
        "syscalls": f"seccomp: {len(DENIED)} syscalls denied"
        + ("" if config.allow_subprocess else ", fork/exec denied")
        + " (the init: both, once it has forked the code)",
        "time": "wall clock (SIGKILL of the PID namespace) + RLIMIT_CPU",
        "memory": with_cgroup("memory", "RLIMIT_AS per process + RLIMIT_NOFILE + no System V IPC, no socket"),
        "processes": with_cgroup("pids", "RLIMIT_NPROC in the user namespace")
        + ("" if config.allow_subprocess else " + seccomp (no fork/exec)"),
        "cpu": caps["cpu"] + f" cgroup, {config.cpus:g} CPU" if "cpu" in caps else "no cpu cgroup here",
        "output": "RLIMIT_FSIZE on every process + no fallocate + truncation",
    }


def rlimits(config: SandboxConfig) -> dict[str, int]:
    """Resource name -> soft = hard limit of every process of the sandbox; NPROC counts the init too, hence + 1."""
    return {
        "RLIMIT_AS": config.memory_mb * _MIB,
        "RLIMIT_CPU": int(config.timeout_s) + 2,
        # One byte of headroom: a file that reaches exactly the limit is then told apart from one that was cut.
        "RLIMIT_FSIZE": config.max_output_bytes + 1,
        # 1, not 0: a core_pattern that pipes to a helper (systemd-coredump, apport) ignores RLIMIT_CORE except the
        # value 1, so with 0 every crash of the code started a root helper on the host, outside every limit here
        # (fs/coredump.c, do_coredump); 1 is also below the smallest ELF core, so no core file is written either.
        # The code cannot change it (`slime_envs._seccomp`: `_RLIMIT_CORE`).
        "RLIMIT_CORE": 1,
        # Not the host's: a host with a real-time budget (limits.conf's rtprio, `docker --ulimit rtprio=99`) would
        # hand the code SCHED_FIFO, whose busy loop owns a CPU, and a nice below 0.
        "RLIMIT_RTPRIO": 0,
        "RLIMIT_NICE": 0,
        "RLIMIT_NPROC": config.max_processes + 1,
        # Each descriptor can hold memory RLIMIT_AS does not count (a memfd, a pipe or socket buffer).
        "RLIMIT_NOFILE": config.max_open_files,
        # Kernel memory no address space counts, per user: queued signals and POSIX timers (each holds one; the
        # host's default let one run make 96,369 timers, 49 MiB), and POSIX message queues (none needed).
        "RLIMIT_SIGPENDING": 1024,
        "RLIMIT_MSGQUEUE": 0,
    }


# Set by the sandbox's init, once inside its own user namespace (see the module docstring); the others are set
# on bubblewrap before it starts. NOFILE: bubblewrap itself needs more descriptors; NPROC, SIGPENDING, MSGQUEUE:
# counted per user, set before bubblewrap they become the ceiling at the level of the host uid, shared by every run.
INIT_RLIMITS = ("RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_SIGPENDING", "RLIMIT_MSGQUEUE")


def runner_policy(config: SandboxConfig, ready_fd: int, status_fd: int) -> dict:
    """What the runner checks and applies before the code (see `_sandbox_child.py`)."""
    return {
        "workdir": WORKDIR,
        "ready_fd": ready_fd,
        "status_fd": status_fd,
        # The init sets these, and checks that every one of `rlimits` is in place before it forks the code.
        "init_rlimits": {name: value for name, value in rlimits(config).items() if name in INIT_RLIMITS},
        "rlimits": rlimits(config),
        "read_roots": list(runtime_view().read_roots),
        "block_network": True,
        "block_subprocess": not config.allow_subprocess,
        # The init loads it on itself in any case, once it has forked the code's process.
        "no_process_filter": no_process_filter().hex(),
        "preload": config.preload,
    }
