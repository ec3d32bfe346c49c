"""Seccomp-BPF programs for the Python sandbox, compiled by libseccomp (through ctypes).

Namespaces and an unprivileged uid do not cover every kernel interface: keyrings, BPF, perf events,
io_uring, kernel modules and the clock are global, and ptrace or mount are the usual first step of an
escape. Two programs are built here, once per host process:

* `base_filter()`: loaded by bubblewrap (`--seccomp FD`) right before it executes the interpreter. It
  answers the syscalls in `DENIED` with EPERM (a readable `PermissionError`, not a crash), `clone3` with
  ENOSYS (glibc then falls back to `clone`, whose flags a filter can inspect: `clone3` passes them in
  memory), `clone` asking for a new namespace with EPERM, `socket`/`socketpair` of every address family
  with EACCES (see `_NO_SOCKETS`), `fallocate` with EOPNOTSUPP (see `_NO_FALLOCATE`), `prlimit64` of
  another process, setting RLIMIT_CORE (see `_RLIMIT_CORE`) and `fcntl(F_SETPIPE_SZ)` (see
  `_F_SETPIPE_SZ`) with EPERM.
* `no_process_filter()`: loaded by the sandbox's runner before the model's code when subprocesses are not
  allowed: `fork`, `vfork`, `clone` without `CLONE_THREAD` (threads still work) and `execve`/`execveat`
  fail with EPERM, whichever Python API (or native code) asks for them.

libseccomp (Debian `libseccomp2`, a dependency of apt, so present on every Debian system) resolves the
syscall names for the running architecture, kills the process on a foreign syscall ABI (32-bit
`int 0x80` or x32 calls from a 64-bit process) and emits the classic BPF program. The filters are
deny-lists: the namespaces are the boundary and these close what they leave open.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

__all__ = ["DENIED", "SeccompUnavailableError", "base_filter", "no_process_filter"]

# Syscalls no sandboxed program needs and that reach state namespaces do not isolate. Names unknown on
# this architecture (`iopl` on arm64, ...) are skipped.
DENIED = (
    # debugging and cross-process memory access
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # mounts and namespaces (bubblewrap already forbids new user namespaces; this is belt and braces)
    "mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns", "mount_setattr",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_by_handle_at",
    "name_to_handle_at",
    # global kernel state: keyrings, BPF, perf, io_uring, modules, kexec, swap, clock, accounting
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "fanotify_init",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # Linux AIO: its limit (fs.aio-max-nr) is one for the whole machine, and one io_setup(65536) took all of it
    # (every other process's io_setup then fails with EAGAIN until the run ends)
    "io_setup",
    # inotify: its instance and watch counts (fs.inotify.max_user_instances/_watches) are charged to the host uid that
    # owns the sandbox's user namespace as well, a budget shared by every concurrent run (and, on a non-root host,
    # by the host process itself): one run's 40 instances left host uid nobody 88 of 128, and one instance held
    # 71,955 watches, each pinning an inode of the runtime view (a watch on a file the code only reads)
    "inotify_init", "inotify_init1", "inotify_add_watch",
    "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "quotactl_fd", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "stime", "sethostname", "setdomainname", "lookup_dcookie", "nfsservctl", "uselib", "vhangup",
    "sysfs", "_sysctl", "ustat",
    # System V IPC, all three kinds: a shared memory segment (after it is detached), a semaphore set (up to 32,000
    # semaphores, 3.5 MiB of kernel memory each) and a message queue hold memory no rlimit counts and no descriptor
    # pins, up to 32,000 of each per IPC namespace (semget: 1.4 GB held with memory_mb=256 and no memory cgroup, in
    # 3 s); POSIX shared memory and memfds are files, capped by RLIMIT_FSIZE and RLIMIT_NOFILE
    "shmget", "semget", "msgget",
    # secret memory: its pages are taken out of the kernel's direct map, splitting the 1 GiB and 2 MiB pages that map
    # them, and the kernel never merges them back: one run with the default limits (60 memfds of 1 MiB, touched and
    # unmapped) split 16 GiB of the host's 1 GiB direct-map pages (DirectMap1G 24 -> 8 GiB), for every process of
    # the machine and for good
    "memfd_secret",
    # raw hardware access (x86)
    "iopl", "ioperm", "modify_ldt", "vm86", "vm86old",
)  # fmt: skip
_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
_CLONE_THREAD = 0x00010000
# No socket of any family. The sandbox has no network (the audit hook refuses every socket, so no code that
# keeps it on loses anything), and a socket reaches state the namespaces do not bound:
# * AF_VSOCK reaches the hypervisor of a VM past the network namespace (this project's machines are Firecracker
#   VMs), AF_ALG is the kernel's crypto API;
# * the TCP memory limit (`net.ipv4.tcp_mem`) is one for the whole machine, and memory cgroup v1 does not count
#   TCP buffers: connections to a listener of the sandbox's own loopback that never accepts, each filled and
#   closed, pushed the machine's TCP memory past that hard limit in 6 s (576,123 pages, limit 575,826) with a
#   memory cgroup in place, where every host TCP socket (Ray, the engines) is then refused memory;
# * a listener's backlog holds connections that have no descriptor: unix ones filled and closed held 1 GiB with
#   memory_mb=256 and max_open_files=64, without a memory cgroup.
_NO_SOCKETS = ("socket", "socketpair")
# prlimit64 on another process needs no capability, only the same uid, which the sandbox's init shares with the
# code: the code lowered the init's RLIMIT_AS to 64 KiB and its RLIMIT_CPU to 0. Only pid 0 (itself; glibc's
# getrlimit/setrlimit) is allowed: the init stays out of the code's reach (issue 27, item 10).
_NO_PRLIMIT_OF_OTHERS = "prlimit64"
# RLIMIT_CORE stays 1 (`slime_envs._sandbox_policy.rlimits`): lowering it to 0 needs no privilege and turns the
# host's pipe core helper back on for every crash, so setting it (setrlimit, or prlimit64 with a new limit) is EPERM.
_RLIMIT_CORE = 4
# fallocate(FALLOC_FL_KEEP_SIZE) allocates disk blocks past a file's end without changing its size, which
# RLIMIT_FSIZE does not check: on the host's stdout file (the code's descriptor 1, on the host's disk) it took
# 2 GiB of the host's disk in one call with max_output_bytes = 1 MiB. EOPNOTSUPP, not EPERM: glibc's
# posix_fallocate then falls back to writing, which RLIMIT_FSIZE and the tmpfs size do bound.
_NO_FALLOCATE = "fallocate"

# fcntl(F_SETPIPE_SZ) grows a pipe's buffer from 64 KiB to 1 MiB (fs.pipe-max-size). Pipe buffers are charged to
# the host uid (fs.pipe-user-pages-soft: 64 MiB per uid, shared by every concurrent run, and on a non-root host by
# the host process, whose new pipes shrink to 8 KiB once it is passed): one run held 30 MiB in 30 pipes with the
# default limits. With 64 KiB pipes the same descriptors hold 2 MiB.
_F_SETPIPE_SZ = 1031

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_NE = 1
_SCMP_CMP_MASKED_EQ = 7


def _int_arg_eq(arg: int, value: int) -> tuple[int, int, int, int]:
    """The condition "argument `arg`, an `int`/`unsigned int` of the syscall, equals `value`", on its low 32 bits.

    The filter sees the whole 64-bit register and the kernel reads only its low half: compared whole,
    `setrlimit(RLIMIT_CORE | 1 << 32, ...)` and `fcntl(fd, F_SETPIPE_SZ | 1 << 32, ...)` passed the filter and did
    what it refuses (RLIMIT_CORE 0: the host's core helper back; 1 MiB pipes).
    """
    return (arg, _SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, value)


def _act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


class SeccompUnavailableError(RuntimeError):
    """libseccomp cannot be loaded or refused to build the filter."""


class _ArgCmp(ctypes.Structure):
    """`struct scmp_arg_cmp`: compare syscall argument `arg` with `op` (masked: `(arg & a) == b`)."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@functools.cache
def _libseccomp() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise SeccompUnavailableError(
            f"libseccomp not found ({e}); install it (Debian/Ubuntu: apt-get install -y libseccomp2)"
        ) from e
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


class _Filter:
    """A libseccomp context that allows by default; rules deny what they name."""

    def __init__(self) -> None:
        self.lib = _libseccomp()
        self.ctx = self.lib.seccomp_init(_SCMP_ACT_ALLOW)
        if not self.ctx:
            raise SeccompUnavailableError("seccomp_init failed")

    def deny(self, name: str, action: int, *conditions: tuple[int, int, int, int]) -> None:
        """Adds `action` for syscall `name` when all `(arg, op, a, b)` conditions hold; unknown names are skipped."""
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # __NR_SCMP_ERROR: no such syscall on this architecture
            return
        cmps = (_ArgCmp * max(len(conditions), 1))(*(_ArgCmp(*c) for c in conditions))
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(conditions), cmps)
        if rc < 0:
            raise SeccompUnavailableError(f"seccomp_rule_add({name}) failed: {os.strerror(-rc)}")

    def export(self) -> bytes:
        """The compiled BPF program (an array of `struct sock_filter`, 8 bytes each)."""
        read_fd, write_fd = os.pipe()
        try:
            # The program is a few hundred bytes, far below the pipe buffer: exporting cannot block.
            rc = self.lib.seccomp_export_bpf(self.ctx, write_fd)
            os.close(write_fd)
            write_fd = -1
            if rc < 0:
                raise SeccompUnavailableError(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            chunks = []
            while chunk := os.read(read_fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)

    def __del__(self) -> None:
        if getattr(self, "ctx", None):
            self.lib.seccomp_release(self.ctx)


@functools.cache
def base_filter() -> bytes:
    """The BPF program applied to everything in the sandbox (see the module docstring).

    Returns:
        The compiled program, for bubblewrap's `--seccomp FD`.

    Raises:
        SeccompUnavailableError: libseccomp is missing or failed.
    """
    f = _Filter()
    for name in DENIED:
        f.deny(name, _act_errno(errno.EPERM))
    f.deny("clone3", _act_errno(errno.ENOSYS))
    # clone's flags are its first argument on x86-64, arm64 and riscv64 (the architectures run here).
    for flag in _NAMESPACE_FLAGS:
        f.deny("clone", _act_errno(errno.EPERM), (0, _SCMP_CMP_MASKED_EQ, flag, flag))
    for name in _NO_SOCKETS:
        f.deny(name, _act_errno(errno.EACCES))
    f.deny(_NO_FALLOCATE, _act_errno(errno.EOPNOTSUPP))
    f.deny(_NO_PRLIMIT_OF_OTHERS, _act_errno(errno.EPERM), (0, _SCMP_CMP_NE, 0, 0))
    # A pid_t compared whole is safe: high bits only make it non-zero to the filter, which then refuses more.
    f.deny("setrlimit", _act_errno(errno.EPERM), _int_arg_eq(0, _RLIMIT_CORE))
    f.deny("prlimit64", _act_errno(errno.EPERM), _int_arg_eq(1, _RLIMIT_CORE), (2, _SCMP_CMP_NE, 0, 0))
    f.deny("fcntl", _act_errno(errno.EPERM), _int_arg_eq(1, _F_SETPIPE_SZ))
    return f.export()


@functools.cache
def no_process_filter() -> bytes:
    """The BPF program that stops the model's code from creating processes (threads stay allowed).

    Returns:
        The compiled program, loaded by the runner with `prctl(PR_SET_SECCOMP)`.

    Raises:
        SeccompUnavailableError: libseccomp is missing or failed.
    """
    f = _Filter()
    for name in ("fork", "vfork", "execve", "execveat"):
        f.deny(name, _act_errno(errno.EPERM))
    f.deny("clone", _act_errno(errno.EPERM), (0, _SCMP_CMP_MASKED_EQ, _CLONE_THREAD, 0))
    f.deny("clone3", _act_errno(errno.ENOSYS))
    return f.export()
