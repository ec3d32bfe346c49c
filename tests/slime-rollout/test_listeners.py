"""Telling a started server from another process answering on its port (`slime_rollout.engines.listeners`), and the
launcher's and router's use of it: two runs started at once on one machine probed the same port."""

import contextlib
import http.server
import sys
import threading

import pytest

from slime_core.config import SlimeArgs
from slime_rollout.engines import router as router_mod
from slime_rollout.engines.launch import EngineLauncher
from slime_rollout.engines.launch import launcher as launcher_mod
from slime_rollout.engines.launch.common import PortTaken
from slime_rollout.engines.launch.launcher import _wait_own_engine
from slime_rollout.engines.launch.sglang import SGLangKind
from slime_rollout.engines.listeners import listener_inodes, serves_port
from slime_rollout.engines.process import find_free_port, start_engine_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A server answering 200 to every GET (its port from argv), as an engine or router process would once up.
SERVER = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'{}')\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)
LOADING = "import time; time.sleep(120)"  # an engine still loading its model: alive, not bound yet


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def foreign_server():
    """Another run's server in this test process: answers 200 on a port of 127.0.0.1; yields the port."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _started(code: str, port: int, tmp_path):
    return start_engine_process(
        [sys.executable, "-c", code, str(port)], url=f"http://127.0.0.1:{port}", log_path=tmp_path / f"{port}.log"
    )


def test_the_listening_socket_is_found_and_attributed_to_its_process(tmp_path):
    port = find_free_port(start=47100)
    assert listener_inodes("127.0.0.1", port) == set()
    proc = _started(SERVER, port, tmp_path)
    try:
        proc.wait_healthy(30, endpoint="/", poll_s=0.05)
        assert len(listener_inodes("127.0.0.1", port)) == 1
        assert serves_port(proc.pid, "127.0.0.1", port) is True
        assert serves_port(proc.pid, "127.0.0.1", find_free_port(start=47200)) is None  # nothing listens there
        with foreign_server() as other:
            assert serves_port(proc.pid, "127.0.0.1", other) is False
    finally:
        proc.shutdown()


def test_an_engine_still_loading_is_not_taken_for_the_server_on_its_port(tmp_path):
    # Issue 27: two runs started at once probed the same free port; an SGLang engine binds it only after loading its
    # model, so the other run's engine bound it first and answered this engine's health checks. The launcher took it
    # for this engine (SGLang's kind checks nothing of its own, and the engine was alive: still loading), and the run
    # sent its rollouts to another run's engine while its own engine later failed to bind and exited.
    with foreign_server() as port:
        proc = _started(LOADING, port, tmp_path)
        try:
            with pytest.raises(PortTaken, match=rf"127.0.0.1:{port} is served by another process, not by engine pid"):
                _wait_own_engine(proc, SGLangKind(), timeout_s=30)
        finally:
            proc.shutdown()


def test_the_launcher_restarts_the_engine_on_another_port_when_another_process_answers(tmp_path, monkeypatch):
    cfg = SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "hf_checkpoint": str(tmp_path), "rollout_engine": "reference"}
    )
    launcher = EngineLauncher(cfg, gpus_per_engine=1, startup_timeout_s=30, log_dir=str(tmp_path))
    launcher.kind = type(
        "ServerKind",
        (),
        {
            "name": "test",
            # On the taken port it is still loading when the other server answers (it would fail to bind later).
            "command": lambda self, cfg, *, port, **kw: (
                [sys.executable, "-c", LOADING if port == taken else SERVER, str(port)],
                port,
            ),
            "env": lambda self: None,
            "check_own": lambda self, proc: None,
        },
    )()
    with foreign_server() as taken:
        probes = iter([taken])  # the first probe returns the port the other run's server bound right after it
        real = launcher_mod.find_free_port
        monkeypatch.setattr(launcher_mod, "find_free_port", lambda host, start: next(probes, None) or real(host, start))
        proc = launcher.launch(0)
        try:
            assert proc.url != f"http://127.0.0.1:{taken}"
            assert serves_port(proc.pid, "127.0.0.1", int(proc.url.rsplit(":", 1)[1])) is True
        finally:
            proc.shutdown()


def test_the_router_moves_to_another_port_when_another_router_answers_on_its_own(tmp_path, monkeypatch):
    # The router had no check at all: its health check was answered by whatever listened on the probed port.
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})
    monkeypatch.setattr(router_mod, "router_available", lambda: True)
    monkeypatch.setattr(
        router_mod, "build_router_command", lambda cfg, *, port, **kw: [sys.executable, "-c", LOADING + "  # router"]
    )
    with foreign_server() as taken:
        monkeypatch.setattr(router_mod, "find_free_port", lambda host, start: taken)  # every probe: the taken port
        with pytest.raises(RuntimeError, match="no router port of its own on 127.0.0.1 in 3 attempts"):
            router_mod.start_router(cfg, startup_timeout_s=30)
    # Probed ports that the started router itself binds are accepted.
    probes = iter([find_free_port(start=47300), find_free_port(start=47400)])
    monkeypatch.setattr(router_mod, "find_free_port", lambda host, start: next(probes))
    monkeypatch.setattr(
        router_mod, "build_router_command", lambda cfg, *, port, **kw: [sys.executable, "-c", SERVER, str(port)]
    )
    proc = router_mod.start_router(cfg, startup_timeout_s=30)
    try:
        assert serves_port(proc.pid, "127.0.0.1", int(proc.url.rsplit(":", 1)[1])) is True
    finally:
        proc.shutdown()


def test_the_router_starts_on_sglang_router_port_when_given(tmp_path, monkeypatch):
    # `--sglang-router-port P` without `--sglang-router-ip` starts the router on P, as in the original's
    # `_start_router`; it was ignored: the router went to a free port of 3000-4000.
    monkeypatch.setattr(router_mod, "router_available", lambda: True)
    ports = []

    def command(cfg, *, port, **kw):
        ports.append(port)
        return [sys.executable, "-c", SERVER, str(port)]

    monkeypatch.setattr(router_mod, "build_router_command", command)
    given = find_free_port(start=47500)
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "sglang_router_port": given})
    proc = router_mod.start_router(cfg, startup_timeout_s=30)
    try:
        assert ports == [given] and proc.url == f"http://127.0.0.1:{given}"
        assert serves_port(proc.pid, "127.0.0.1", given) is True
    finally:
        proc.shutdown()
    # Served by another process: one error naming the flag, no move to another port.
    monkeypatch.setattr(
        router_mod, "build_router_command", lambda cfg, *, port, **kw: [sys.executable, "-c", LOADING + "  # router"]
    )
    with foreign_server() as taken:
        cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "sglang_router_port": taken})
        with pytest.raises(RuntimeError, match=rf"^--sglang-router-port {taken}: another process serves 127.0.0.1:"):
            router_mod.start_router(cfg, startup_timeout_s=30)
