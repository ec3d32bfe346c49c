"""Child side of the Python sandbox: install the policy audit hook, then run the user's code.

Started by `slime_envs.sandbox.run_python` as `python -I _sandbox_child.py POLICY_JSON` in a new
session with the sandbox's private directory as cwd. Before any user code it joins the pids cgroup,
enters a new network namespace and sets its rlimits, as the policy says. This file is not
imported by the package; it only uses the standard library.

The audit hook (PEP 578) is a policy layer that turns forbidden actions into clear Python errors
(`PermissionError: sandbox: ...`) the model can read. It is not a security boundary on its own
(native code can bypass it); the OS limits set by the parent are the containment.
"""

import json
import os
import resource
import sys
import traceback
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


def _confine(policy):
    """Joins the pids cgroup, leaves the network namespace, sets the rlimits (before any user code)."""
    if policy["cgroup_procs"]:
        with open(policy["cgroup_procs"], "w") as f:
            f.write(str(os.getpid()))
    if policy["netns"]:
        os.unshare(os.CLONE_NEWNET)
    for name, value in policy["rlimits"]:
        resource.setrlimit(getattr(resource, name), (value, value))


def main():
    policy = json.loads(sys.argv[1])
    _confine(policy)
    for name in policy["preload"]:
        try:
            __import__(name)
        except ImportError:
            pass
    workdir = os.path.realpath(policy["workdir"])
    with open(os.path.join(workdir, "main.py"), encoding="utf-8") as f:
        source = f.read()
    code = compile(source, "main.py", "exec")
    read_roots = [os.path.realpath(p) for p in policy["read_roots"]]
    sys.addaudithook(_make_hook(workdir, read_roots, policy["block_network"], policy["block_subprocess"]))
    # The user's code gets a fresh `__main__` module, so `import __main__` does not reach this runner.
    user_main = types.ModuleType("__main__")
    user_main.__file__ = "main.py"
    sys.modules["__main__"] = user_main
    del policy, read_roots
    namespace = user_main.__dict__
    try:
        exec(code, namespace)
    except SystemExit:
        sys.stdout.flush()
        raise
    except BaseException:
        # Show only the frames of the user's code, as a plain Python run would.
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
