"""The limits of one sandboxed run (`SandboxConfig`) and the error of a host that cannot run the sandbox.

`slime_envs.sandbox` runs the code under these limits and re-exports both names (their import path for users).
"""

from __future__ import annotations

import os
import resource

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["SandboxConfig", "SandboxUnavailableError"]

_DEFAULT_PRELOAD = [
    "math",
    "cmath",
    "fractions",
    "decimal",
    "itertools",
    "functools",
    "collections",
    "statistics",
    "random",
    "re",
    "json",
    "string",
    "heapq",
    "bisect",
    # numpy imports ctypes, which dlopen()s at import time; later dlopen/dlsym calls get the audit hook's readable
    # refusal (a courtesy only: through ctypes the code reaches no syscall the filters do not allow anyway).
    "ctypes",
]


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot run here: bubblewrap or libseccomp missing, or no user namespaces."""


class SandboxConfig(BaseModel):
    """Limits of one sandboxed run."""

    # Upper bounds are what the kernel takes (pids.max ≤ 2^22, RLIMIT_NOFILE ≤ fs.nr_open's default 2^20, rlimits and
    # sizes in 64 bits) or more than any run needs (a day, 1,024 cores): past them every run failed, as a bare
    # OverflowError (timeout_s=inf), OSError EINVAL (max_processes=10**9) or "the sandbox failed to start" (prlimit).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    timeout_s: float = Field(10.0, gt=0, le=86_400, description="Wall-clock limit of the code (from its start).")
    memory_mb: int = Field(
        1024,
        gt=0,
        le=1 << 30,
        description="Address space per process (RLIMIT_AS) and, with a memory cgroup, the run's total.",
    )
    max_processes: int = Field(
        16,
        ge=1,
        le=(1 << 22) - 1,
        description="Tasks (processes and threads) of the code, itself included (RLIMIT_NPROC, pids cgroup).",
    )
    max_output_bytes: int = Field(
        1 << 20,
        gt=0,
        le=1 << 50,
        description="Max bytes of stdout and of stderr, and (RLIMIT_FSIZE, one byte higher so that output of exactly "
        "this size is not taken for a cut one) of any file written by any process of the sandbox.",
    )
    max_output_chars: int = Field(2000, gt=0, description="Characters of stdout/stderr kept in the result.")
    tmpfs_mb: int = Field(
        64, gt=0, le=1 << 30, description="Size of the private writable /tmp (counted in the memory cgroup)."
    )
    max_files: int = Field(
        4096,
        ge=16,
        le=1 << 32,
        description="Files and directories the private /tmp can hold (its inode count; each holds ~1 KiB of kernel "
        "memory tmpfs_mb does not count). Applied where the host runs as root (see README); else the kernel's default.",
    )
    cpus: float = Field(1.0, gt=0, le=1024, description="CPU share of the run with a cpu cgroup (1.0 = one core).")
    max_concurrent_runs: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        description="Sandboxed processes running at once in this process (others wait); the first run's value wins.",
    )
    max_open_files: int = Field(
        64,
        ge=16,
        le=1 << 20,
        description="Descriptors per process (RLIMIT_NOFILE). Without a memory cgroup this bounds the memory held "
        "outside the address space: a memfd holds up to max_output_bytes, a pipe 64 KiB (no F_SETPIPE_SZ), per "
        "descriptor and process.",
    )
    allow_subprocess: bool = Field(False, description="Let the code start processes (still capped by the limits).")
    preload: list[str] = Field(
        default_factory=lambda: list(_DEFAULT_PRELOAD),
        description="Modules imported before the policy hook is installed (missing ones are skipped); others "
        "(numpy, sympy) are imported on demand and count against the time limit.",
    )

    @model_validator(mode="after")
    def _within_host_hard_limits(self) -> SandboxConfig:
        """Refuses limits above this process's hard RLIMIT_NOFILE / RLIMIT_NPROC.

        The sandbox's init sets these two itself, without the capability to go past the hard limit it inherits:
        past it, every run failed to start ("ValueError: not allowed to raise maximum limit").
        """
        for field, name, value in (
            ("max_open_files", "RLIMIT_NOFILE", self.max_open_files),
            ("max_processes", "RLIMIT_NPROC", self.max_processes + 1),  # + the init
        ):
            hard = resource.getrlimit(getattr(resource, name))[1]
            if hard != resource.RLIM_INFINITY and value > hard:
                raise ValueError(
                    f"{field}={getattr(self, field)} needs {name} {value}, above this process's hard limit {hard}, "
                    "which the sandbox cannot raise; lower it or raise the host's limit (ulimit -H)"
                )
        return self
