"""The mock consumer's connection (``dcp.link.Link``) over real loopback TCP."""

from __future__ import annotations

import asyncio

import pytest

from wallaroo_proto.protocols.dcp.link import Link

PAYLOAD = bytes(range(256)) * (32 * 1024)  # 8 MiB


async def _until(condition, seconds: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_a_link_stops_reading_at_its_limit_and_then_delivers_every_byte_in_order():
    async def main() -> None:
        async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(PAYLOAD)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(flood, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link = await Link.open("127.0.0.1", port, limit=1024 * 1024)
        await _until(lambda: link.reading_paused)
        assert link.buffered <= 1024 * 1024 + 256 * 1024  # the limit and at most one socket read
        got = bytearray()
        while data := await link.read():
            got += data
        assert bytes(got) == PAYLOAD
        link.close()
        await link.wait_closed()
        server.close()

    asyncio.run(main())


def test_a_link_writes_and_reports_a_lost_connection_on_drain():
    async def main() -> None:
        received = asyncio.get_running_loop().create_future()

        async def echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.set_result(await reader.readexactly(5))
            writer.close()

        server = await asyncio.start_server(echo_once, "127.0.0.1", 0)
        link = await Link.open("127.0.0.1", server.sockets[0].getsockname()[1])
        link.write(b"hello")
        await link.drain()
        assert await received == b"hello"
        assert await link.read() == b""  # the server closed
        await link.wait_closed()
        with pytest.raises(ConnectionResetError):
            await link.drain()
        server.close()

    asyncio.run(main())


def test_a_read_from_a_silent_peer_ends_at_its_timeout_and_data_still_comes_after():
    async def main() -> None:
        go = asyncio.Event()

        async def silent_then_one_word(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await go.wait()
            writer.write(b"late")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(silent_then_one_word, "127.0.0.1", 0)
        link = await Link.open("127.0.0.1", server.sockets[0].getsockname()[1])
        with pytest.raises(TimeoutError):
            await link.read(0.05)
        go.set()
        assert await link.read(60) == b"late"
        link.close()
        await link.wait_closed()
        server.close()

    asyncio.run(main())
