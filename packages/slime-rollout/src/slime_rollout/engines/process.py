"""Engine subprocesses: free-port probing, start in a new session, health wait, and clean shutdown.

Every engine runs in its own process session (`start_new_session=True`), so the engine and anything it
forks (SGLang's scheduler and detokenizer processes) share one process group. Shutdown sends SIGTERM to the
main pid first (letting SGLang tear down its children), then SIGKILLs whatever is left of the group.
Live engines are also shut down at interpreter exit (including after Ctrl-C).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import httpx

from slime_core.secrets import redact_argv

__all__ = ["EngineProcess", "find_free_port", "port_reusable", "start_engine_process"]

logger = logging.getLogger(__name__)

_RESERVED_PORTS: set[int] = set()
_PORT_LOCK = threading.Lock()
_LIVE: set[EngineProcess] = set()


def find_free_port(host: str = "127.0.0.1", start: int = 15000, *, count: int = 1) -> int:
    """The first port >= `start` where `count` consecutive ports can be bound on `host`.

    Ports handed out earlier in this process are skipped even if not bound yet.

    Raises:
        RuntimeError: no free port below 65536.
    """
    with _PORT_LOCK:
        port = start
        while port + count <= 65536:
            block = range(port, port + count)
            if not any(p in _RESERVED_PORTS for p in block) and all(_can_bind(host, p) for p in block):
                _RESERVED_PORTS.update(block)
                return port
            port += 1
    raise RuntimeError(f"no {count} free consecutive port(s) on {host} from {start}")


def port_reusable(host: str, port: int) -> bool:
    """Whether a server can listen on `port` again (SO_REUSEADDR, as uvicorn binds: TIME_WAIT does not block)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclasses.dataclass(eq=False)
class EngineProcess:
    """One engine server process.

    Attributes:
        url: base URL, e.g. "http://127.0.0.1:15000".
        popen: the subprocess (its pid is also its process-group id).
        command: the command line it was started with.
        log_path: file receiving its stdout/stderr, or None when inherited.
    """

    url: str
    popen: subprocess.Popen
    command: list[str]
    log_path: pathlib.Path | None = None

    @property
    def pid(self) -> int:
        """Main process id (= process-group id)."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the main process is still running."""
        return self.popen.poll() is None

    def log_tail(self, num_chars: int = 4000) -> str:
        """Last characters of the engine's log file ('' when output is inherited)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def wait_healthy(
        self, timeout_s: float, *, endpoint: str = "/health_generate", poll_s: float = 1.0, flag: str | None = None
    ) -> None:
        """Blocks until `endpoint` answers 200.

        Args:
            timeout_s: seconds to wait.
            endpoint: the route polled.
            poll_s: seconds between polls.
            flag: the flag that sets `timeout_s`, named in the timeout's message.

        Raises:
            RuntimeError: the process exited first (message has the exit code and log tail).
            TimeoutError: not healthy within `timeout_s` (message names the URL, and `flag`).
        """
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=httpx.Timeout(30.0, connect=2.0), trust_env=False) as client:
            while True:
                if not self.alive():
                    raise RuntimeError(
                        f"engine {self.url} exited with code {self.popen.returncode} before becoming healthy; "
                        f"command: {' '.join(redact_argv(self.command))}\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.url + endpoint).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    set_by = f" ({flag})" if flag else ""
                    raise TimeoutError(
                        f"engine {self.url} not healthy after {timeout_s:.0f}s{set_by}\n{self.log_tail()}"
                    )
                time.sleep(poll_s)

    def shutdown(self, grace_s: float = 10.0) -> None:
        """SIGTERM the main pid, wait up to `grace_s`, then SIGKILL the whole process group."""
        pgid = self.popen.pid
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("engine %s did not exit within %.0fs of SIGTERM; killing its group", self.url, grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)
        _LIVE.discard(self)


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM when the launching thread dies, also by SIGKILL (Linux only).

    Exit hooks cover normal exits; this covers a launcher (e.g. a rollout-manager actor) that is killed.
    """
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def start_engine_process(
    command: Sequence[str], *, url: str, env: dict[str, str] | None = None, log_path: pathlib.Path | None = None
) -> EngineProcess:
    """Starts `command` in a new session and tracks it for shutdown at exit.

    Args:
        command: argv of the server.
        url: the base URL it will serve.
        env: full environment (None: inherit).
        log_path: where stdout/stderr go (None: inherit the parent's).
    """
    out = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "ab")  # noqa: SIM115  (handed to the child; closed below)
    try:
        popen = subprocess.Popen(
            list(command),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
            preexec_fn=_term_with_parent,
        )
    finally:
        if out is not None:
            out.close()
    proc = EngineProcess(url=url, popen=popen, command=list(command), log_path=log_path)
    _LIVE.add(proc)
    logger.info("started engine pid %d at %s: %s", popen.pid, url, " ".join(redact_argv(command)))
    return proc


@atexit.register
def _shutdown_all() -> None:
    for proc in list(_LIVE):
        proc.shutdown(grace_s=5.0)
