"""sglang-router (SGLang Model Gateway) process and worker registration.

When the `sglang-router` package is installed (`slime-rollout[router]`) and asked for, `start_router`
launches `python -m sglang_router.launch_router` and engines are registered with `POST /workers
{"url", "worker_type"}` (the gateway's worker API; older routers' `POST /add_worker?url=` is the fallback).
Without a router, `slime_rollout.engines.client.RolloutClient` dispatches requests itself (least outstanding).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import urllib.parse
from typing import TYPE_CHECKING

import httpx

from slime_rollout.engines.listeners import serves_port
from slime_rollout.engines.process import EngineProcess, find_free_port, start_engine_process

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["register_worker", "router_available", "start_router", "unregister_worker"]

logger = logging.getLogger(__name__)


def router_available() -> bool:
    """Whether the `sglang_router` package can be imported here."""
    return importlib.util.find_spec("sglang_router") is not None


def build_router_command(
    cfg: SlimeArgs, *, host: str, port: int, prometheus_port: int, max_concurrent_requests: int | None = None
) -> list[str]:
    """Command line of `sglang_router.launch_router`.

    Args:
        cfg: run config; reads `sglang_router_request_timeout_secs` and `router_args` (the `--router-<field>`
            pass-through flags, e.g. `--router-policy`, emitted without the prefix).
        host: interface to bind.
        port: the router's HTTP port.
        prometheus_port: the router's metrics port.
        max_concurrent_requests: the router's `--max-concurrent-requests` (requests past it queue, then get 429;
            sglang-router 0.2 defaults to 256); a `--router-max-concurrent-requests` pass-through flag wins.
    """
    cmd = [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-port",
        str(prometheus_port),
        "--request-timeout-secs",
        str(cfg.sglang_router_request_timeout_secs),
        "--log-level",
        "warn",
    ]
    given = {key.replace("-", "_").removeprefix("router_") for key in cfg.router_args}
    if max_concurrent_requests is not None and "max_concurrent_requests" not in given:
        cmd += ["--max-concurrent-requests", str(max_concurrent_requests)]
    for key, value in cfg.router_args.items():
        flag = "--" + key.replace("_", "-").removeprefix("router-")
        if value is True:
            cmd.append(flag)
        elif value not in (None, False):
            cmd += [flag, str(value)]
    return cmd


PORT_ATTEMPTS = 3  # router starts on fresh ports when another process answers on the probed one


def start_router(
    cfg: SlimeArgs,
    *,
    host: str = "127.0.0.1",
    startup_timeout_s: float = 120.0,
    max_concurrent_requests: int | None = None,
) -> EngineProcess:
    """Starts sglang-router on `--sglang-router-port`, else a free port in 3000-4000, and waits for its `/health`.

    Args:
        cfg: run config (see `build_router_command`).
        host: interface to bind.
        startup_timeout_s: seconds to wait for `/health`.
        max_concurrent_requests: see `build_router_command`.

    The answer to the health check must come from the started router (`slime_rollout.engines.listeners`): a
    router of another run started at the same moment can bind the probed port first; then another port is tried.

    Raises:
        RuntimeError: sglang-router is not installed, the router exited during startup, `PORT_ATTEMPTS` ports
            were each served by another process, or another process serves `--sglang-router-port`.
    """
    if not router_available():
        raise RuntimeError("sglang-router is not installed (pip install 'slime-rollout[router]')")
    given = cfg.sglang_router_port  # the original starts its router there when no --sglang-router-ip names one
    for attempt in range(1, PORT_ATTEMPTS + 1):
        # A probed port is not one handed out before in this process: a retry moves on.
        port = given if given is not None else find_free_port(host, 3000)
        prometheus_port = find_free_port(host, 4000)
        command = build_router_command(
            cfg, host=host, port=port, prometheus_port=prometheus_port, max_concurrent_requests=max_concurrent_requests
        )
        proc = start_engine_process(command, url=f"http://{host}:{port}")
        try:
            proc.wait_healthy(startup_timeout_s, endpoint="/health")
            if serves_port(proc.pid, host, port) is not False:
                return proc
        except BaseException:
            proc.shutdown()
            raise
        # Another run's router bound the port between the probe and our bind, and answered our health check.
        proc.shutdown()
        if given is not None:
            raise RuntimeError(
                f"--sglang-router-port {given}: another process serves {host}:{given}; give a free port, or leave the "
                "flag unset to start the router on a free one"
            )
        logger.warning("router port %d is served by another process (attempt %d/%d)", port, attempt, PORT_ATTEMPTS)
    raise RuntimeError(f"no router port of its own on {host} in {PORT_ATTEMPTS} attempts: other processes took each")


def register_worker(router_url: str, worker_url: str, *, worker_type: str = "regular", timeout_s: float = 60.0) -> None:
    """Adds an engine to the router.

    Raises:
        RuntimeError: the router refused (message names router and worker).
    """
    with httpx.Client(timeout=timeout_s, trust_env=False) as c:
        resp = c.post(f"{router_url}/workers", json={"url": worker_url, "worker_type": worker_type})
        if resp.status_code in (404, 405):  # routers before the gateway API
            resp = c.post(f"{router_url}/add_worker", params={"url": worker_url})
    if resp.status_code >= 400:
        raise RuntimeError(
            f"router {router_url} refused worker {worker_url}: HTTP {resp.status_code} {resp.text[:500]}"
        )
    logger.info("registered %s with router %s", worker_url, router_url)


def unregister_worker(router_url: str, worker_url: str, *, timeout_s: float = 30.0) -> None:
    """Removes an engine from the router (by its id from `GET /workers`, else by URL)."""
    with httpx.Client(timeout=timeout_s, trust_env=False) as c:
        resp = c.get(f"{router_url}/workers")
        if resp.status_code in (404, 405):
            c.post(f"{router_url}/remove_worker", params={"url": worker_url}).raise_for_status()
            return
        resp.raise_for_status()
        body = resp.json()
        workers = body.get("workers", []) if isinstance(body, dict) else body
        for w in workers:
            if isinstance(w, dict) and w.get("url") == worker_url:
                key = w.get("id") or urllib.parse.quote(worker_url, safe="")
                c.delete(f"{router_url}/workers/{key}").raise_for_status()
                return
    logger.warning("worker %s was not registered with router %s", worker_url, router_url)
