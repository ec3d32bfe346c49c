"""Runner inside the Python sandbox: the sandbox's init (pid 1), which forks the process that runs the model's code.

Started by `slime_envs.sandbox.run_python` through `bwrap --as-pid-1` as
`python -I -B /opt/slime-sandbox/_sandbox_child.py POLICY_JSON`, already inside its own user, mount, PID,
network, IPC and UTS namespaces, as an unprivileged uid under the base seccomp filter and under the rlimits
the host set on bubblewrap (every process of the sandbox inherits them). No bubblewrap process lives inside:
its monitor stays outside the PID namespace, where the code cannot name it.

As pid 1 it never runs model code. It shares the code's uid, so it first makes itself unreachable (issue 27:
code rewrote bubblewrap's own init through `/proc/1/mem` and had it fork a process outside the limits):

1. `PR_SET_DUMPABLE 0`: the kernel then refuses `/proc/1/mem`, `/proc/1/fd`, ptrace and process_vm_* to a
   process without CAP_SYS_PTRACE in this user namespace, which the code never has; and the kernel drops
   every signal sent from inside the namespace to an init without a handler (SIGINT is reset to SIG_DFL);
2. sets RLIMIT_NPROC (counted in this user namespace) and checks that the rlimits the host set on bubblewrap
   are in place (a host bug is one clear start-up error, not a silent gap);
3. closes every inherited descriptor but stdin/stdout/stderr, the ready pipe and the status pipe;
4. forks the code's process (pid 2), loads the no-process seccomp filter on itself (it never forks again)
   and only then lets pid 2 run the code (it closes a pipe pid 2 waits on); reaps every process of the
   namespace and, once pid 2 is gone, writes pid 2's wait status to the status pipe: the host's only source
   of the exit code and the killing signal, which the code cannot forge (an exit code of 137 is 137, not
   SIGKILL). It then exits, and the kernel kills whatever is left.

The code's process (pid 2) imports the preloaded modules, loads the no-process seccomp filter unless
subprocesses are allowed, installs the audit hook (PEP 578; it turns forbidden actions into readable
`PermissionError: sandbox: ...` messages but is cosmetic: pure Python switches it off through `gc`, and its
path checks lose symlink and rename races; every documented limit holds without it), writes one byte to the
ready pipe (so the host can tell a sandbox that failed to start from code that failed) and runs `/tmp/main.py`.

This file is not imported by the package; it only uses the standard library.
"""

import ctypes
import json
import os
import resource
import signal
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
_PR_SET_DUMPABLE = 4
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


_LIBC = ctypes.CDLL(None, use_errno=True)


def _prctl(option, arg, what):
    if _LIBC.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"sandbox: {what} failed")


def _load_seccomp(program):
    """Adds a seccomp filter to this process (bubblewrap already set no_new_privs, which the kernel requires)."""

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    if _LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: loading the no-process seccomp filter failed")


def _set_and_check_rlimits(own, expected):
    """Sets the init's own limits and checks all of them (the others were set on bubblewrap).

    A missing one is a host bug: one clear start-up error (no ready byte), before any code runs.
    """
    for name, value in own.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    for name, value in expected.items():
        got = resource.getrlimit(getattr(resource, name))
        if got != (value, value):
            sys.stderr.write(f"sandbox: {name} is {got} in the sandbox's init, not ({value}, {value})\n")
            os._exit(125)


def _init(policy):
    """Steps 1-3 of the module docstring, as pid 1, before the code's process exists."""
    _prctl(_PR_SET_DUMPABLE, 0, "making the sandbox's init non-dumpable")
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no handler: the kernel drops it from inside the namespace
    _set_and_check_rlimits(policy["init_rlimits"], policy["rlimits"])
    keep = sorted({policy["ready_fd"], policy["status_fd"]})
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 65536)


def _reap_until(code_pid, status_fd, no_process_filter, go_fd):
    """Step 4 as pid 1: filters itself, then lets pid 2 run the code; reaps, reports pid 2's wait status, exits."""
    _load_seccomp(no_process_filter)
    os.close(go_fd)  # pid 2 reads EOF: the code starts only now that this process is under the filter too
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == code_pid:
            os.write(status_fd, b"%d\n" % status)
            os._exit(0)


def _report_ready(fd):
    os.write(fd, b"R")
    os.close(fd)


def _run_code(policy, go_fd):
    """The code's process (pid 2): preloads, filter, audit hook, waits for pid 1's filter, then `/tmp/main.py`."""
    os.close(policy["status_fd"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _prctl(_PR_SET_DUMPABLE, 1, "restoring the code's dumpable flag")  # its own /proc/self, as usual
    for name in policy["preload"]:
        try:
            __import__(name)
        except ImportError:
            pass
    workdir = policy["workdir"]
    with open(os.path.join(workdir, "main.py"), "rb") as f:
        source = f.read()  # bytes: an undecodable source is the code's SyntaxError, reported below
    if policy["block_subprocess"]:
        _load_seccomp(bytes.fromhex(policy["no_process_filter"]))
    # Until pid 1 is under its own no-process filter (on a loaded machine pid 2 got here first: the code then ran
    # beside an init holding the base filter only). EOF, not a byte: an init that died lets it go on into the
    # namespace's end.
    os.read(go_fd, 1)
    os.close(go_fd)
    sys.addaudithook(_make_hook(workdir, policy["read_roots"], policy["block_network"], policy["block_subprocess"]))
    # The user's code gets a fresh `__main__` module, so `import __main__` does not reach this runner.
    user_main = types.ModuleType("__main__")
    user_main.__file__ = "main.py"
    sys.modules["__main__"] = user_main
    _report_ready(policy["ready_fd"])
    namespace = user_main.__dict__
    try:
        exec(compile(source, "main.py", "exec"), namespace)
    except SystemExit:
        _flush_quietly("stdout")  # the interpreter's exit flushes again and reports what fails, as for any script
        raise
    except BaseException:
        try:
            _report_exception(sys.exc_info()[1])
        finally:
            _exit(1)  # whatever the code did to its streams: it failed, and 1 is what Python exits with


_exit = os._exit  # taken before the code runs, which may rebind `os._exit`


def _flush_quietly(name):
    """Flushes `sys.<name>` if the code left it flushable (it may have closed, replaced or removed it)."""
    try:
        getattr(sys, name).flush()
    except Exception:  # noqa: BLE001 - a stream the code broke is its own; the runner must not fail on it
        pass


def _report_exception(exc):
    """Writes the code's traceback to its `sys.stderr`, as Python does for an uncaught exception.

    The code's own output is flushed first, and when the traceback cannot be formatted (the code used up its
    descriptors, so `import traceback` fails with EMFILE) its last line is written alone: before, both were lost
    and the run read "(no output, exit code 1)".
    """
    _flush_quietly("stdout")
    try:
        import traceback  # only on this path: it costs a few ms of every call's start-up

        # Show the user's frames (and library frames), not this runner's or its audit hook's.
        lines = ["Traceback (most recent call last):\n"]
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
        lines += traceback.format_list(frames)
        lines += traceback.format_exception_only(exc)
    except Exception:  # noqa: BLE001 - no traceback module to be had: the exception's line is still the answer
        lines = [_exception_line(exc)]
    try:
        sys.stderr.write("".join(lines))
    except Exception:  # noqa: BLE001 - no usable stderr (closed, None): Python then prints nothing either
        return
    _flush_quietly("stderr")


def _exception_line(exc):
    """`ValueError: boom` as the last line of a traceback (the type alone if the code's `__str__` fails)."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - the code's own __str__
        message = ""
    return f"{type(exc).__name__}: {message}\n" if message else f"{type(exc).__name__}\n"


def main():
    policy = json.loads(sys.argv[1])
    _init(policy)
    go_r, go_w = os.pipe()  # pid 1 closes its end once it is under the no-process filter
    code_pid = os.fork()
    if code_pid == 0:
        os.close(go_w)
        _run_code(policy, go_r)  # returns or raises SystemExit: the interpreter exits as for any script
        return
    os.close(go_r)
    os.close(policy["ready_fd"])
    _reap_until(code_pid, policy["status_fd"], bytes.fromhex(policy["no_process_filter"]), go_w)


main()
