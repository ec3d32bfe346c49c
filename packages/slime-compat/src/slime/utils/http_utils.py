"""`slime.utils.http_utils`: `post` / `get` for custom generate functions (original module path).

`post(url, payload, max_retries=60, headers=None)` retries any failure up to `max_retries` attempts, one
second apart, and returns the decoded JSON (see `slime_rollout.engines.plugin_http`). The port helpers are the
original's: `is_port_available`, `find_available_port`, `get_host_info`.
"""

from __future__ import annotations

import os
import random
import socket

from slime_rollout.engines.plugin_http import get, init_http_client, post

__all__ = ["find_available_port", "get", "get_host_info", "init_http_client", "is_port_available", "post"]


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
