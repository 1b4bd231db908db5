"""The relay's unshaped path (asyncio Protocols) over loopback: what the streams held before it
took over is forwarded first, and a side that stops reading stops the other side (bounded)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from wallaroo_proto.proxy.passthrough import WRITE_BUFFER, pass_through

DEADLINE = 60


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def linked_pair():
    """(client socket, the proxy's streams to it), (server socket, the proxy's streams to it)."""
    ends = []
    for _ in range(2):
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(lambda r, w, f=accepted: f.set_result((r, w)), "127.0.0.1", 0)
        peer = socket.create_connection(server.sockets[0].getsockname()[:2], timeout=DEADLINE)
        ends.append((peer, await accepted))
        server.close()
    return ends


class Tap:
    congested = False  # its output never falls behind

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def data(self, conn, from_client, data, when) -> None:
        self.events.append(("data", from_client, bytes(data)))

    def ended(self, conn, from_client, reset, when) -> None:
        self.events.append(("ended", from_client, reset))


@pytest.mark.timeout(120)
def test_bytes_and_a_fin_the_streams_held_before_the_switch_are_forwarded_first() -> None:
    async def main() -> None:
        (client, (client_r, client_w)), (server, streams) = await linked_pair()
        client.sendall(b"early bytes")
        client.shutdown(socket.SHUT_WR)
        # Both already read by the stream, as when the client is quicker than the upstream's connect.
        await until(lambda: client_r._eof and len(client_r._buffer) == 11, "the stream to hold all")
        tap = Tap()
        relaying = asyncio.create_task(
            pass_through(1, (client_r, client_w), streams, tap, {True: 0, False: 0})
        )
        got = await asyncio.to_thread(_read_all, server)
        assert got == b"early bytes"
        server.sendall(b"answer")
        server.close()
        assert await asyncio.to_thread(_read_all, client) == b"answer"
        await asyncio.wait_for(relaying, DEADLINE)
        client.close()
        assert tap.events == [
            ("data", True, b"early bytes"),
            ("ended", True, False),
            ("data", False, b"answer"),
            ("ended", False, False),
        ]

    asyncio.run(main())


@pytest.mark.timeout(120)
def test_a_side_that_stops_reading_stops_the_other_and_nothing_piles_up_in_the_proxy() -> None:
    async def main() -> None:
        (client, client_streams), (server, server_streams) = await linked_pair()
        relaying = asyncio.create_task(
            pass_through(1, client_streams, server_streams, None, {True: 0, False: 0})
        )
        total = 256 << 20
        sent = [0]

        def send() -> None:
            block = bytes(range(256)) * 256  # 64 KiB
            try:
                while sent[0] < total:
                    sent[0] += client.send(block)
            except OSError:
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        # The server reads nothing: the sender must come to a stop, long before the total.
        last = -1
        while last != sent[0]:
            last = sent[0]
            await asyncio.sleep(0.5)
        assert sent[0] < total
        proxy_side = server_streams[1].transport
        assert proxy_side.get_write_buffer_size() <= WRITE_BUFFER + (256 << 10)  # high water and a read
        received = 0
        server.settimeout(DEADLINE)
        while received < sent[0] or sender.is_alive():
            chunk = await asyncio.to_thread(server.recv, 1 << 20)
            if not chunk:
                break
            received += len(chunk)
            if received >= total:
                break
        assert received == total
        client.close()
        server.close()
        await asyncio.wait_for(relaying, DEADLINE)

    asyncio.run(main())


def _read_all(sock: socket.socket) -> bytes:
    parts = []
    while chunk := sock.recv(65536):
        parts.append(chunk)
    return b"".join(parts)
