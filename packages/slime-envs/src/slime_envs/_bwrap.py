"""The bubblewrap command line of one sandboxed run, and the read-only view of the Python runtime it gets.

Inside, the sandbox sees (all read-only unless said otherwise):

* this interpreter's installation (`sys.base_prefix`), and for a virtual environment its `pyvenv.cfg`,
  its `bin/python` link and its site-packages (numpy, sympy, ... as the host has them);
* the shared libraries (`/usr/lib*`, the `/lib*` links, `/etc/ld.so.cache`) the interpreter and
  extension modules load;
* the runner (`/opt/slime-sandbox/_sandbox_child.py`), a fresh `/proc` of its own PID namespace and a
  minimal `/dev` (null, zero, full, random, urandom and the fd links; no terminal: see `_DEV_NODES`);
* `/tmp`: a private tmpfs of a fixed size (and, on a root host, a fixed number of files), the only writable
  place, the working directory and `$HOME`; the model's code is copied in as `/tmp/main.py`.

Nothing else of the host exists there: no `/etc`, `/home`, `/root`, `/work`, `/var`, host `/tmp`, `/sys`
or host `/proc`. The bound paths are the host's own names, and `/proc/self/mountinfo` prints each bind's source
path too (the runner's is its host path); the package README lists what a sandboxed program can see.

A root host runs bubblewrap as `nobody`, so that the sandbox's uid maps to an unprivileged host uid (a user
namespace made by root maps to root). nobody may not walk every runtime path (pyenv lives under `/root`,
mode 0700), so a root host first builds, once, a private *staging* mount namespace in which each runtime
path is also bound under a directory nobody can walk. Each run enters it (`nsenter --mount=...`), makes a
private copy of it (`unshare --mount`) in which it mounts the run's `/tmp` with a size and a file count, then
drops to nobody (`nsenter --setuid 65534 --setgid 65534`) and starts bubblewrap, which binds that `/tmp`. The
host's own mounts are never changed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import shutil
import site
import subprocess
import sys

__all__ = [
    "HOST_GID",
    "HOST_UID",
    "RUNNER",
    "SANDBOX_GID",
    "SANDBOX_UID",
    "WORKDIR",
    "BwrapMissingError",
    "RuntimeView",
    "bwrap_argv",
    "bwrap_path",
    "runtime_view",
]

_CHILD = pathlib.Path(__file__).with_name("_sandbox_child.py")
RUNNER = "/opt/slime-sandbox/_sandbox_child.py"
WORKDIR = "/tmp"
# The host uid/gid that runs bubblewrap (and so owns the sandbox) when the host process is root.
HOST_UID = HOST_GID = 65534
# The uid/gid the code has inside its user namespace (outside it is the uid bubblewrap runs as).
SANDBOX_UID = 1000
SANDBOX_GID = 1000
_LIBRARY_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", "/libx32")
_LIBRARY_FILES = ("/etc/ld.so.cache",)
# `resource` names -> util-linux prlimit's options.
_PRLIMIT_OPTIONS = {
    "RLIMIT_AS": "as",
    "RLIMIT_CPU": "cpu",
    "RLIMIT_FSIZE": "fsize",
    "RLIMIT_CORE": "core",
    "RLIMIT_RTPRIO": "rtprio",
    "RLIMIT_NICE": "nice",
}


class BwrapMissingError(RuntimeError):
    """bubblewrap is not installed."""


def bwrap_path() -> str:
    """Path of the `bwrap` executable.

    Raises:
        BwrapMissingError: `bwrap` is not on PATH (nor in /usr/bin).
    """
    found = shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/bin")
    if found is None:
        raise BwrapMissingError(
            "the Python sandbox needs bubblewrap (`bwrap`), which is not installed: "
            "apt-get install -y bubblewrap (Debian/Ubuntu) or dnf install -y bubblewrap (Fedora)"
        )
    return found


@dataclasses.dataclass(frozen=True)
class RuntimeView:
    """The host paths the sandbox sees, and how bubblewrap is started to bind them.

    Attributes:
        binds: sandbox path -> path bubblewrap binds there (read-only).
        links: sandbox path -> symlink target.
        launcher: argv prefix that starts bubblewrap: empty, or (a root host) nsenter into the staging namespace,
            unshare into a private copy of it and `_WORKDIR_SCRIPT`, whose arguments `bwrap_argv` appends.
        drop: what a root host's launcher runs after those arguments: nsenter dropping to nobody (else empty).
        prlimit: util-linux `prlimit`, which sets a run's rlimits on bubblewrap before it starts.
        workdir_mount: a root host's mount point (in the staging namespace) of each run's own `/tmp`, mounted by
            the launcher with a size and a file count; None: bubblewrap's `--tmpfs`, which has a size only (its
            file count is the kernel's default, half the machine's RAM pages).
        fds: descriptors the launcher needs (the staging namespace), passed to every run.
        python: interpreter path to run inside (the same path as on the host).
        read_roots: directories the runner's audit hook lets the code read.
    """

    binds: dict[str, str]
    links: dict[str, str]
    launcher: tuple[str, ...]
    drop: tuple[str, ...]
    prlimit: str
    workdir_mount: str | None
    fds: tuple[int, ...]
    python: str
    read_roots: tuple[str, ...]


@functools.cache
def runtime_view() -> RuntimeView:
    """The view for `sys.executable`, built once per process.

    Returns:
        What the sandbox sees and how to start bubblewrap.

    Raises:
        BwrapMissingError: bubblewrap or util-linux's prlimit (and, for a root host, unshare/nsenter) is missing.
        OSError: the staging namespace could not be built (its error output is in the message).
    """
    bwrap_path()
    prlimit = _tool("prlimit")
    binds: dict[str, str] = {}
    links: dict[str, str] = {}
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    for prefix in prefixes:
        binds[prefix] = prefix
    exe = os.path.abspath(sys.executable)
    real_exe = os.path.realpath(exe)
    if exe != real_exe:
        links[exe] = real_exe  # a venv's bin/python: Python finds pyvenv.cfg next to the link
    if not _under(real_exe, prefixes):
        binds[real_exe] = real_exe
    if sys.prefix != sys.base_prefix:
        venv = os.path.abspath(sys.prefix)
        binds[f"{venv}/pyvenv.cfg"] = f"{venv}/pyvenv.cfg"
        for path in site.getsitepackages([venv]):
            if os.path.isdir(path) and not _under(os.path.realpath(path), prefixes):
                binds[path] = os.path.realpath(path)
    for path in _LIBRARY_DIRS:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.isdir(path) and not _under(path, prefixes):
            binds[path] = path
    for path in _LIBRARY_FILES:
        if os.path.isfile(path):
            binds[path] = path
    binds[RUNNER] = str(_CHILD)
    read_roots = tuple(sorted(set(binds) - {RUNNER, *_LIBRARY_FILES}))
    launcher: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    fds: tuple[int, ...] = ()
    workdir_mount = None
    if os.geteuid() == 0:
        ns_fd, staged, workdir_mount = _stage(list(binds.values()))
        binds = {dest: staged[source] for dest, source in binds.items()}
        nsenter = _tool("nsenter")
        # Into the staging namespace, then a private copy of it per run (where the run's /tmp is mounted, gone
        # with the run), then `_WORKDIR_SCRIPT` mounts it and drops to nobody before bubblewrap.
        launcher = (nsenter, f"--mount=/proc/self/fd/{ns_fd}", "--", _tool("unshare"), "--mount")
        launcher += ("--propagation", "private", "--", "/bin/sh", "-c", _WORKDIR_SCRIPT, "sh", _tool("mount"))
        drop = (nsenter, "--setuid", str(HOST_UID), "--setgid", str(HOST_GID), "--")
        fds = (ns_fd,)
    return RuntimeView(
        binds=binds,
        links=links,
        launcher=launcher,
        drop=drop,
        prlimit=prlimit,
        workdir_mount=workdir_mount,
        fds=fds,
        python=exe,
        read_roots=read_roots,
    )


def _under(path: str, roots: set[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _tool(name: str) -> str:
    found = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None:
        raise BwrapMissingError(f"the Python sandbox needs `{name}` (util-linux): apt-get install -y util-linux")
    return found


# Run as root in a private mount namespace: a small tmpfs on $1 with every runtime path bound under it
# as 0, 1, 2, ... (all of them readable by nobody: the tmpfs is mode 0755 and bind mounts keep the
# sources' own modes). It then waits on stdin so that the host can open /proc/PID/ns/mnt.
_STAGE_SCRIPT = r"""
set -eu
stage=$1
shift
mount -t tmpfs -o mode=0755,size=64k slime-sandbox-runtime "$stage"
mkdir "$stage/workdir"
i=0
for src in "$@"; do
    if [ -d "$src" ]; then mkdir "$stage/$i"; else : > "$stage/$i"; fi
    mount --bind "$src" "$stage/$i"
    i=$((i + 1))
done
echo ready
read -r _ || true
"""
_STAGE_DIRS = ("/mnt", "/media", "/srv", "/opt", "/home")
# Run by a root host's launcher, as root in the run's private copy of the staging namespace: mounts the run's /tmp
# with a size and a file count, then runs the rest of its command line (nsenter dropping to nobody, bubblewrap).
# bubblewrap's own --tmpfs takes a size only, and its file count (nr_inodes) defaults to half the machine's RAM
# pages: empty files hold ~1 KiB of kernel memory each that the size does not count (388,000 files, 325 MiB, in
# 4 s with tmpfs_mb=16 and no memory cgroup). Arguments: mount's path, size in bytes, file count, mount point.
_WORKDIR_SCRIPT = rf"""
set -eu
"$1" -t tmpfs -o "nosuid,nodev,mode=0700,uid={HOST_UID},gid={HOST_GID},size=$2,nr_inodes=$3" slime-sandbox-tmp "$4"
shift 4
exec "$@"
"""


def _stage(sources: list[str]) -> tuple[int, dict[str, str], str]:
    """Builds the staging mount namespace of a root host.

    Returns its descriptor, source -> staged path, and the mount point of each run's `/tmp` in it.

    A root host drops to `nobody` before bubblewrap (so that the sandbox's uid maps to nobody, not to root),
    and nobody may not walk every path of the runtime (pyenv under /root, mode 0700). The staging
    namespace shows the same files at paths nobody can reach; the host's own mounts are untouched.
    """
    stage = next((d for d in _STAGE_DIRS if os.path.isdir(d) and not any(_under(s, {d}) for s in sources)), None)
    if stage is None:
        raise OSError(f"no directory to stage the sandbox's runtime on: none of {_STAGE_DIRS} fits")
    argv = [_tool("unshare"), "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _STAGE_SCRIPT, "sh"]
    proc = subprocess.Popen(
        [*argv, stage, *sources],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        if proc.stdout.readline() != b"ready\n":
            proc.kill()
            raise OSError(f"staging the sandbox's runtime failed: {proc.stderr.read().decode(errors='replace')}")
        ns_fd = os.open(f"/proc/{proc.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)  # keeps the namespace alive
    finally:
        proc.stdin.close()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return ns_fd, {src: f"{stage}/{i}" for i, src in enumerate(sources)}, f"{stage}/workdir"


# The device nodes the sandbox gets, bound from the host's /dev: bubblewrap's `--dev` set less `/dev/tty` and its
# `devpts` instance. A pty is counted in kernel.pty.max, one pool for the whole machine (4,096, of which 3,072 are
# open to any devpts instance but the host's first): one run opened 61 through /dev/ptmx (the descriptor limit), 16
# processes ~1,000, so a few concurrent runs took every pty that other containers of the host (their shells, tmux,
# `docker exec -t`) can get, for as long as they ran. No code interpreter needs a terminal.
_DEV_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_DEV_LINKS = {
    "/dev/fd": "/proc/self/fd",
    "/dev/stdin": "/proc/self/fd/0",
    "/dev/stdout": "/proc/self/fd/1",
    "/dev/stderr": "/proc/self/fd/2",
}


def _dev_argv() -> list[str]:
    """The bubblewrap options of the sandbox's `/dev`, in place of its `--dev`.

    A tmpfs (remounted read-only later) holding the `_DEV_NODES` the host has and `_DEV_LINKS`; no `/dev/pts`,
    `/dev/ptmx` or `/dev/tty`.
    """
    argv = ["--tmpfs", "/dev"]
    for node in _DEV_NODES:
        if os.path.exists(node):
            argv += ["--dev-bind", node, node]
    for link, target in _DEV_LINKS.items():
        argv += ["--symlink", target, link]
    return argv


def bwrap_argv(
    view: RuntimeView,
    *,
    tmpfs_bytes: int,
    max_files: int,
    code_fd: int,
    seccomp_fd: int,
    info_fd: int,
    block_fd: int,
    env: dict[str, str],
    rlimits: dict[str, int],
    runner_args: list[str],
) -> list[str]:
    """The full bubblewrap command line of one run.

    Args:
        view: what of the host runtime the sandbox sees.
        tmpfs_bytes: size of the writable `/tmp`.
        max_files: files and directories `/tmp` can hold (its nr_inodes), where the view mounts it itself
            (`RuntimeView.workdir_mount`); bubblewrap's own `--tmpfs` cannot be given one.
        code_fd: descriptor whose content becomes `/tmp/main.py`.
        seccomp_fd: descriptor holding the compiled seccomp program.
        info_fd: bubblewrap writes `{"child-pid": N, ...}` here once the namespaces exist.
        block_fd: bubblewrap waits for one byte on it before starting the runner (the host joins the
            cgroup first).
        env: the sandbox's whole environment (nothing of the host's is kept).
        rlimits: `RLIMIT_AS`-style name -> soft = hard limit, set on bubblewrap before it starts (util-linux
            `prlimit`), so that every process of the sandbox inherits it; one of `_PRLIMIT_OPTIONS`.
        runner_args: arguments of the runner script.

    Returns:
        argv: `prlimit ... --`, the view's launcher, then bwrap and its options.

    Raises:
        BwrapMissingError: bubblewrap is not installed.
        ValueError: a limit `prlimit` has no option for.
    """
    unknown = set(rlimits) - set(_PRLIMIT_OPTIONS)
    if unknown:
        raise ValueError(f"bwrap_argv: no prlimit option for {sorted(unknown)}; known: {sorted(_PRLIMIT_OPTIONS)}")
    argv = [
        view.prlimit,
        *(f"--{_PRLIMIT_OPTIONS[name]}={value}:{value}" for name, value in sorted(rlimits.items())),
        "--",
        *view.launcher,
        *(() if view.workdir_mount is None else (str(tmpfs_bytes), str(max_files), view.workdir_mount)),
        *view.drop,
        bwrap_path(),
        # user, mount, PID, network, IPC, UTS and cgroup namespaces; no nested user namespace can be made.
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid", str(SANDBOX_UID),
        "--gid", str(SANDBOX_GID),
        "--hostname", "sandbox",
        # Setsid: no controlling terminal to inject input into (TIOCSTI).
        "--new-session",
        # If the host (or bubblewrap's monitor) dies, the sandbox's init gets SIGKILL and takes every
        # process of the PID namespace with it.
        "--die-with-parent",
        # The runner is pid 1, not bubblewrap's own init: that one is dumpable, shares the code's uid and
        # would be writable through /proc/1/mem (issue 27); the runner makes itself unreachable first.
        "--as-pid-1",
        "--clearenv",
    ]  # fmt: skip
    for key, value in env.items():
        argv += ["--setenv", key, value]

    # A runtime under /tmp (e.g. a checkout's .venv there) is bound after the private /tmp is mounted, which
    # would otherwise hide it.
    def in_workdir(path: str) -> bool:
        return path == WORKDIR or path.startswith(WORKDIR + "/")

    def runtime(under_workdir: bool) -> list[str]:
        out: list[str] = []
        # Parents before children: a bind inside another bind's destination must come after it.
        for dest in sorted(view.binds, key=lambda p: p.count("/")):
            if in_workdir(dest) == under_workdir:
                out += ["--ro-bind", view.binds[dest], dest]
        for dest, target in sorted(view.links.items()):
            if in_workdir(dest) == under_workdir:
                out += ["--symlink", target, dest]
        return out

    argv += runtime(under_workdir=False)
    argv += ["--proc", "/proc", *_dev_argv()]
    if view.workdir_mount is None:
        argv += ["--size", str(tmpfs_bytes), "--perms", "0700", "--tmpfs", WORKDIR]
    else:  # mounted by the launcher, with its file count
        argv += ["--bind", view.workdir_mount, WORKDIR]
    argv += ["--perms", "0600", "--file", str(code_fd), f"{WORKDIR}/main.py"]
    argv += runtime(under_workdir=True)
    # The root and /dev are tmpfs owned by the sandbox user: read-only, or they would be unbounded writable space.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR]
    argv += ["--seccomp", str(seccomp_fd), "--info-fd", str(info_fd), "--block-fd", str(block_fd)]
    argv += ["--", view.python, "-I", "-B", RUNNER, *runner_args]
    return argv
