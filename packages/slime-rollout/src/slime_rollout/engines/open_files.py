"""The process's open-file limit, raised to fit the sockets of the requests in flight to the engines.

`RolloutClient` holds one socket per request in flight (`--sglang-server-concurrency` per engine); below the soft
`RLIMIT_NOFILE` connections fail with "Too many open files", which looks like unreachable engines.
"""

from __future__ import annotations

import logging

__all__ = ["ensure_open_files"]

logger = logging.getLogger(__name__)

# Descriptors a process needs besides its sockets to engines (files, pipes, Ray's own connections).
_SPARE_FILES = 1024


def ensure_open_files(connections: int) -> int:
    """Raises this process's soft open-file limit to fit `connections` sockets (up to the hard limit).

    Each request in flight holds a socket; below the limit, connections fail with "Too many open files" and look
    like unreachable engines. Warns when even the hard limit is too low.

    Args:
        connections: sockets to engines and router that may be open at once.

    Returns:
        The soft limit now in force (-1: unlimited or not known on this platform).
    """
    try:
        import resource
    except ImportError:  # not POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = connections + _SPARE_FILES
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        logger.warning(
            "open-file limit %d (hard) is below the %d requests in flight allowed by --sglang-server-concurrency; "
            "raise `ulimit -n` or lower the flag",
            hard,
            connections,
        )
    return target
