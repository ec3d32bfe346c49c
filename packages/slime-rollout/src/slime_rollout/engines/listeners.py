"""Which process listens on a TCP port: tells a started server from another one that answers on its port.

Two runs started at once on one machine probe the same free port (`process.find_free_port`): a server binds its
port only once it has loaded (SGLang after its model, seconds to minutes), so both start on it. The first to bind
answers the other's health checks too, and the other run took that server for its own: it registered it with its
router and sent it requests (another run's engine, with other weights), while its own server later failed to bind
and exited. A health check cannot tell them apart; the kernel can: `/proc/net/tcp{,6}` lists each listening socket
with its inode, and `/proc/<pid>/fd` links to the sockets a process holds (Linux; elsewhere nothing is known).
"""

from __future__ import annotations

import os
import socket
import struct

__all__ = ["listener_inodes", "serves_port", "session_socket_inodes"]

_LISTEN = "0A"  # TCP state of a listening socket in /proc/net/tcp


def _address(hex_ip: str) -> str:
    """The IP of a /proc/net/tcp{,6} address (32-bit words in host byte order)."""
    raw = b"".join(struct.pack("=I", int(hex_ip[i : i + 8], 16)) for i in range(0, len(hex_ip), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def listener_inodes(host: str, port: int) -> set[int] | None:
    """Inodes of the listening sockets that serve `host:port` (bound to `host` itself, else to a wildcard address).

    Args:
        host: the IP in the server's URL.
        port: its TCP port.

    Returns:
        The inodes (empty: nothing listens there), or None when this system has no /proc/net/tcp.
    """
    exact: set[int] = set()
    wildcard: set[int] = set()
    found_table = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        found_table = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            hex_ip, hex_port = fields[1].split(":")
            if int(hex_port, 16) != port:
                continue
            ip = _address(hex_ip)
            if ip in (host, f"::ffff:{host}"):
                exact.add(int(fields[9]))
            elif ip in ("0.0.0.0", "::"):
                wildcard.add(int(fields[9]))
    if not found_table:
        return None
    return exact or wildcard  # the kernel hands a connection to the socket bound to the exact address first


def session_socket_inodes(sid: int) -> set[int] | None:
    """Inodes of the sockets held by the processes of session `sid` (a server started with `start_new_session`).

    Returns:
        The inodes, or None when a process of the session did not let its descriptors be read (then a socket not
        among them may still be the session's).
    """
    inodes: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            if int(stat[stat.rindex(")") + 2 :].split()[3]) != sid:  # field 6: session id
                continue
            fds = os.listdir(f"/proc/{name}/fd")
        except PermissionError:
            return None  # a process of the session we may not inspect (it made itself non-dumpable)
        except (OSError, ValueError):
            continue  # gone meanwhile
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def serves_port(sid: int, host: str, port: int) -> bool | None:
    """Whether the server answering `host:port` is a process of session `sid`.

    Args:
        sid: the session of the started server (its pid, when started with `start_new_session=True`).
        host: the IP in its URL.
        port: its port.

    Returns:
        True: a process of the session holds the listening socket; False: another process does; None: cannot tell
        (no /proc, nothing listens there any more, or the session's descriptors are not readable).
    """
    listening = listener_inodes(host, port)
    if not listening:
        return None
    own = session_socket_inodes(sid)
    if own is None:
        return None
    return bool(listening & own)
