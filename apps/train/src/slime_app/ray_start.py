"""Starting the local Ray node on a busy machine: one retry when it times out, then one line saying why.

Where the start-up time goes (Ray 2.60, read in its source and measured here by delaying the agents' start):
the raylet starts its dashboard agent and runtime-env agent (Python processes, about 2.3 s of imports on an idle
2-core machine) and waits 15 s for their port files, then exits; `ray.init` waits 30 s for the node to register and
then raises a bare `Exception("The current node timed out during startup ...")`. Both limits are constants in Ray
2.60 (`node_manager.cc`'s `WaitForPersistedPort` default, `node.py`'s `raylet_start_wait_time_s = 30`):
`RAY_raylet_start_wait_time_s` and `RAY_agent_register_timeout_ms` do not reach them (with the agents delayed 20 s
the raylet still died after 15 s with both set to 300 s). What a loaded machine can do is retry when the load has
fallen, or start Ray once by itself and have runs connect to it (`--ray-address`).

Connecting to an explicit address has no such excuse, and Ray's own wait is long: with nothing listening there,
`ray.init` retries in C++ for minutes (over 240 s measured) and ends in a bare `SystemExit`. `check_ray_address`
therefore opens one TCP connection to the address first, with a short timeout, and fails with one line naming the
address and the flag when nothing answers.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "ray_address",
    "STARTUP_TIMEOUT_TEXT",
    "RayAddressError",
    "RayStartupError",
    "check_ray_address",
    "is_startup_timeout",
    "start_local_ray",
    "wait_for_load",
]

logger = logging.getLogger(__name__)

# What `ray.init` raises (a bare Exception) when the local node does not register in time.
STARTUP_TIMEOUT_TEXT = "timed out during startup"
_POLL_S = 2.0


class RayStartupError(RuntimeError):
    """The local Ray node did not start, also after the retry; the message is one line naming the knobs."""


class RayAddressError(ConnectionError):
    """Nothing accepts a TCP connection at the explicit Ray address; the message is one line naming it and the flag."""


# Seconds the pre-check waits for a TCP connection: a GCS on a reachable host answers in milliseconds.
ADDRESS_CHECK_TIMEOUT_S = 10.0


def check_ray_address(
    address: str,
    *,
    flag: str = "--ray-address",
    timeout_s: float = ADDRESS_CHECK_TIMEOUT_S,
    connect: Callable[..., socket.socket] = socket.create_connection,
) -> None:
    """Checks that something accepts TCP connections at a Ray address before `ray.init` waits on it for minutes.

    `host:port` is the head's GCS; `ray://host:port` its Ray Client server. `auto`, `local` and an address without
    a port are left to Ray (they name no socket to try).

    Args:
        address: `--ray-address` or `RAY_ADDRESS`.
        flag: where the address came from, named in the error.
        timeout_s: seconds to wait for the connection.
        connect: `socket.create_connection` (tests pass a fake).

    Raises:
        RayAddressError: the connection was refused, timed out or the host is unknown (one line).
    """
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if address in ("auto", "local") or not sep or not port.isdigit():
        return
    host = host.strip("[]")  # an IPv6 literal, [::1]:6379
    try:
        connect((host, int(port)), timeout=timeout_s).close()
    except (OSError, TimeoutError) as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise RayAddressError(
            f"{flag} {address}: no Ray head answers at {host}:{port} ({reason}, within {timeout_s:g} s); start one "
            "with `ray start --head` and pass the address it prints (the GCS port, 6379 by default), or leave "
            f"{flag} unset to start a local Ray"
        ) from None


def is_startup_timeout(error: BaseException) -> bool:
    """Whether `error` is Ray's start-up timeout of the local node (and not, e.g., a bad argument)."""
    return STARTUP_TIMEOUT_TEXT in str(error)


def _load() -> tuple[float, int]:
    """(1-minute load average, CPU cores) of this machine."""
    return os.getloadavg()[0], os.cpu_count() or 1


def wait_for_load(
    max_wait_s: float,
    *,
    load: Callable[[], tuple[float, int]] = _load,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> float:
    """Waits until the 1-minute load average is at most the core count, or `max_wait_s` seconds have passed.

    Args:
        max_wait_s: the longest wait in seconds (`--ray-startup-retry-wait`).
        load: returns (load average, cores); the default reads `os.getloadavg()` and `os.cpu_count()`.
        sleep: how to wait (tests pass a fake).
        clock: monotonic seconds (tests pass a fake).

    Returns:
        The load average when the wait ended.
    """
    deadline = clock() + max_wait_s
    current, cores = load()
    while current > cores and clock() < deadline:
        sleep(min(_POLL_S, max(0.0, deadline - clock())))
        current, cores = load()
    return current


def start_local_ray(
    init: Callable[..., Any],
    shutdown: Callable[[], None],
    kwargs: dict[str, Any],
    *,
    retry_wait_s: float,
    load: Callable[[], tuple[float, int]] = _load,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Starts a local Ray node with `init(**kwargs)`; on a start-up timeout retries once after the load has fallen.

    Args:
        init: `ray.init`.
        shutdown: `ray.shutdown` (clears the failed attempt's processes and state before the retry).
        kwargs: the arguments of `init`.
        retry_wait_s: how long the retry may wait for the load to fall to the core count (seconds).
        load: returns (1-minute load average, cores); the default reads this machine's.
        sleep: how to wait (tests pass a fake).
        clock: monotonic seconds (tests pass a fake).

    Raises:
        RayStartupError: both attempts timed out (one line: the cause, the load, the knobs).
        Exception: any other error of `init`, unchanged.
    """
    try:
        init(**kwargs)
        return
    except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception on start-up timeouts
        if not is_startup_timeout(e):
            raise
    shutdown()
    before, cores = load()
    logger.warning(
        "Ray's local node timed out during startup (load average %.1f on %d core(s)); retrying once when the load "
        "is at most %d, waiting at most %.0f s (--ray-startup-retry-wait)", before, cores, cores, retry_wait_s,
    )  # fmt: skip
    wait_for_load(retry_wait_s, load=load, sleep=sleep, clock=clock)
    try:
        init(**kwargs)
        return
    except Exception as e:  # noqa: BLE001
        if not is_startup_timeout(e):
            raise
        shutdown()
        now, cores = load()
        raise RayStartupError(
            f"Ray's local node did not start twice (load average {before:.1f}, then {now:.1f}, on {cores} core(s)): "
            "its raylet gives its agents 15 s to start and ray.init waits 30 s for the node, limits Ray 2.60 fixes "
            "(RAY_raylet_start_wait_time_s and RAY_agent_register_timeout_ms do not change them). Run again when the "
            "machine is less busy (--ray-startup-retry-wait sets how long the retry waits for the load to fall), "
            "or start Ray once with `uv run ray start --head --num-cpus 8 --include-dashboard false` (again until "
            "it comes up) and pass the address it prints with --ray-address"
        ) from None


def ray_address(cfg: Any) -> str | None:
    """The Ray cluster the run joins (`--ray-address`, else `RAY_ADDRESS`), or None for a local instance.

    Other hosts of such a cluster run the trainer and engines: this host's view of paths and hardware says little.
    """
    return cfg.ray_address or os.environ.get("RAY_ADDRESS") or None
