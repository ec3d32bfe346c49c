"""`slime_rollout.engines.probe` against real sockets: a closed port, a reset, a server that never answers."""

import asyncio
import socket
import struct
import time

from aiohttp import web

from slime_rollout.engines.probe import Probe, probe


def _closed_port() -> int:
    """A port nothing listens on (bound once by the OS, then released): connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_closed_port_is_down_at_once():
    t0 = time.monotonic()
    result = await probe(f"http://127.0.0.1:{_closed_port()}", "/health_generate", timeout_s=30)
    assert result.verdict is Probe.DOWN and not result.ok
    assert "ClientConnectorError" in result.detail
    assert time.monotonic() - t0 < 5  # refused at once: it does not wait out the 30 s timeout


async def test_a_server_that_never_answers_times_out():
    # Listening but never accepting: the kernel completes the handshake and the request sits unread, which is what
    # a SIGSTOPped engine looks like from outside.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        result = await probe(f"http://127.0.0.1:{port}", "/health_generate", timeout_s=0.5)
        elapsed = time.monotonic() - t0
    assert result.verdict is Probe.TIMEOUT, result
    assert result.detail.startswith("no reply within 0.5 s")
    assert 0.5 <= elapsed < 5


async def test_a_connection_reset_before_the_reply_is_down():
    async def reset(reader, writer):
        await reader.readline()  # the request line arrived
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
        writer.transport.abort()

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        result = await probe(f"http://127.0.0.1:{port}", "/health_generate", timeout_s=30)
    finally:
        server.close()
        await server.wait_closed()
    assert result.verdict is Probe.DOWN, result


async def test_answers_are_ok_or_unhealthy_by_status(http_server):
    async def handler(request):
        return web.Response(status=200 if request.path == "/health_generate" else 503)

    url = await http_server(handler)
    assert (await probe(url, "/health_generate", timeout_s=5)).ok
    result = await probe(url, "/health", timeout_s=5)
    assert (result.verdict, result.detail) == (Probe.UNHEALTHY, "HTTP 503")
