"""Runner inside the Python sandbox: set the limits, arm the guards, then run the model's `/tmp/main.py`.

Started by `slime_envs.sandbox.run_python` through bubblewrap as
`python -I -B /opt/slime-sandbox/_sandbox_child.py POLICY_JSON`, already inside its own user, mount, PID,
network, IPC and UTS namespaces, as an unprivileged uid under the base seccomp filter. Before any of the
model's code it:

1. closes every inherited descriptor but stdin/stdout/stderr and the ready pipe;
2. sets the rlimits (address space, CPU seconds, file size, core dumps, tasks of this user namespace);
   the code cannot raise a hard limit again (that needs CAP_SYS_RESOURCE in the host's namespace);
3. imports the preloaded modules;
4. loads the no-process seccomp filter unless subprocesses are allowed;
5. installs the audit hook (PEP 578), which turns forbidden actions into readable
   `PermissionError: sandbox: ...` messages. It is defence in depth only: pure Python can switch it
   off (through `gc`), and then the OS boundary above is what holds;
6. writes one byte to the ready pipe, so the host can tell a sandbox that failed to start from code
   that failed.

This file is not imported by the package; it only uses the standard library.
"""

import ctypes
import json
import os
import resource
import sys
import types

_DEVICES = {"/dev/null", "/dev/urandom", "/dev/random", "/dev/zero"}
_SOCKET_EVENTS = ("socket.__new__", "socket.bind", "socket.connect", "socket.getaddrinfo", "socket.sendto")
_PROCESS_EVENTS = (
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.startfile",
    "subprocess.Popen",
    "pty.spawn",
)
_LIST_EVENTS = ("os.listdir", "os.scandir")
_PATH_EVENTS = (
    "os.mkdir",
    "os.remove",
    "os.rmdir",
    "os.rename",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "os.utime",
    "os.symlink",
    "os.link",
    "shutil.rmtree",
    "shutil.copyfile",
)
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def _inside(path, roots):
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + os.sep) for r in roots)


def _deny(what):
    raise PermissionError(f"sandbox: {what} is not allowed")


def _make_hook(workdir, read_roots, block_network, block_subprocess):
    """The audit hook; its policy lives in the closure (immutable tuples), not in module globals."""
    write_roots = (workdir,)
    read_roots = tuple(read_roots) + (workdir,)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args[0], args[1], args[2]
            if isinstance(path, int) or path is None:
                return
            path = os.fsdecode(path)
            if path in _DEVICES:
                return
            writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            if isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                writing = True
            if not _inside(path, write_roots if writing else read_roots):
                _deny(f"{'writing' if writing else 'reading'} {path!r} (outside the sandbox directory)")
        elif event in _SOCKET_EVENTS and block_network:
            _deny("network access")
        elif event in _PROCESS_EVENTS and block_subprocess:
            _deny(f"starting processes ({event})")
        elif event in _LIST_EVENTS:
            target = args[0] if args else None
            if isinstance(target, (str, bytes, os.PathLike)) and not _inside(os.fsdecode(target), read_roots):
                _deny(f"listing {os.fsdecode(target)!r} (outside the sandbox directory)")
        elif event in _PATH_EVENTS:
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and not _inside(os.fsdecode(arg), write_roots):
                    _deny(f"{event} on {os.fsdecode(arg)!r} (outside the sandbox directory)")
        elif event in ("ctypes.dlopen", "ctypes.dlsym"):
            _deny("ctypes")

    return hook


def _load_seccomp(program):
    """Adds a seccomp filter to this process (bubblewrap already set no_new_privs, which the kernel requires)."""

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: loading the no-process seccomp filter failed")


def _confine(policy):
    """Steps 1, 2 and 4 of the module docstring's list (preloading, step 3, happens in between)."""
    os.closerange(3, policy["ready_fd"])
    os.closerange(policy["ready_fd"] + 1, 65536)
    for name, value in policy["rlimits"]:
        resource.setrlimit(getattr(resource, name), (value, value))


def _report_ready(fd):
    os.write(fd, b"R")
    os.close(fd)


def main():
    policy = json.loads(sys.argv[1])
    _confine(policy)
    for name in policy["preload"]:
        try:
            __import__(name)
        except ImportError:
            pass
    workdir = policy["workdir"]
    with open(os.path.join(workdir, "main.py"), "rb") as f:
        source = f.read()  # bytes: an undecodable source is the code's SyntaxError, reported below
    if policy["no_process_filter"]:
        _load_seccomp(bytes.fromhex(policy["no_process_filter"]))
    sys.addaudithook(_make_hook(workdir, policy["read_roots"], policy["block_network"], policy["block_subprocess"]))
    # The user's code gets a fresh `__main__` module, so `import __main__` does not reach this runner.
    user_main = types.ModuleType("__main__")
    user_main.__file__ = "main.py"
    sys.modules["__main__"] = user_main
    _report_ready(policy["ready_fd"])
    del policy
    namespace = user_main.__dict__
    try:
        exec(compile(source, "main.py", "exec"), namespace)
    except SystemExit:
        sys.stdout.flush()
        raise
    except BaseException:
        import traceback  # only on this path: it costs a few ms of every call's start-up

        # Show the user's frames (and library frames), not this runner's or its audit hook's.
        exc = sys.exc_info()[1]
        lines = ["Traceback (most recent call last):\n"]
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
        lines += traceback.format_list(frames)
        lines += traceback.format_exception_only(exc)
        sys.stdout.flush()
        sys.stderr.write("".join(lines))
        sys.stderr.flush()
        os._exit(1)


main()
