"""`slime.utils.http_utils`: `post` / `get` for custom generate functions (original module path).

`post(url, payload, max_retries=60, headers=None)` retries any failure up to `max_retries` attempts, one
second apart, and returns the decoded JSON (see `slime_rollout.engines.plugin_http`). The port helpers are the
original's: `is_port_available`, `find_available_port`, `get_host_info`.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
from typing import Any

from slime_rollout.engines.plugin_http import get, init_http_client, post
from slime_rollout.generation.group_rollout import num_engines

__all__ = [
    "find_available_port",
    "get",
    "get_host_info",
    "get_rollout_num_engines",
    "init_http_client",
    "is_port_available",
    "post",
    "terminate_process",
]


def is_port_available(port: int) -> bool:
    """Whether a TCP port can be bound on all interfaces right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
            return True
        except (OSError, OverflowError):
            return False


def find_available_port(base_port: int) -> int:
    """A free port a random 100..1000 above `base_port`, probing upwards (downwards past 60000)."""
    port = base_port + random.randint(100, 1000)
    while not is_port_available(port):
        port = port + 42 if port < 60000 else port - 43
    return port


def get_host_info() -> tuple[str, str]:
    """`(hostname, IP other nodes can reach)`: `$SLIME_HOST_IP` if set, else the address of the default route.

    No packet is sent: connecting a UDP socket only asks the routing table which local address it would use.
    Falls back to 127.0.0.1 on a machine without a route.
    """
    hostname = socket.gethostname()
    if override := os.environ.get("SLIME_HOST_IP"):
        return hostname, override
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("8.8.8.8", 80))
            ip = s.getsockname()[0]
    except OSError:
        ip = "127.0.0.1"
    return hostname, ip


def get_rollout_num_engines(args: Any) -> int:
    """Number of rollout engines behind the client, as the rollout counts them (`group_rollout.num_engines`).

    `len(rollout_engine_urls)` when the engines are known (external engines included: the original reads the count
    its discovery wrote into `rollout_num_engines`), else `--rollout-num-gpus` // `--rollout-num-gpus-per-engine`
    (at least 1). 0 with neither engine URLs nor rollout GPUs, as the original returns.
    """
    if not args.rollout_engine_urls and (args.rollout_num_gpus or 0) <= 0:
        return 0
    return num_engines(args)


def terminate_process(process: multiprocessing.Process, timeout: float = 1.0) -> None:
    """Stops a `multiprocessing.Process`: SIGTERM, up to `timeout` seconds, then SIGKILL; waits for it to end."""
    if not process.is_alive():
        return
    process.terminate()
    process.join(timeout=timeout)
    if process.is_alive():
        process.kill()
        process.join()
