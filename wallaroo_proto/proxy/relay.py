"""Forward TCP connections unchanged in both directions, for a proxy between two real peers.

Protocol-agnostic: bytes go through as they come, each read written on before the next
read (so a slow side slows the other, through TCP's own windows, and nothing piles up
here), a half-close is passed on as a half-close and a reset as a reset. What passes
is shown to a ``Tap`` (recording, live dissection) as it passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Protocol

#: Bytes read at a time from either side.
READ_SIZE = 1 << 16


class Tap(Protocol):
    """Sees every relayed connection's bytes, in the order they were forwarded."""

    def opened(self, conn: int, client: tuple[str, int], server: tuple[str, int], when: float) -> None: ...

    def data(self, conn: int, from_client: bool, data: bytes, when: float) -> None: ...

    def ended(self, conn: int, from_client: bool, reset: bool, when: float) -> None: ...


@dataclass
class RelayStats:
    """What the relay did, for the closing counts line (-v)."""

    accepted: int = 0
    refused_upstream: int = 0
    bytes: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a RST, as the peer that reset ours did (SO_LINGER 0, then close)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Relay:
    """Accept on ``listen``, connect each accepted connection to ``upstream``, pump both ways."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], tap: Tap | None = None) -> None:
        self.listen = listen
        self.upstream = upstream
        self.tap = tap
        self.stats = RelayStats()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._count = 0

    async def start(self) -> tuple[str, int]:
        """Listen; the address bound (port 0 gives a free one)."""
        self._server = await asyncio.start_server(self._accepted, *self.listen, limit=READ_SIZE)
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def stop(self) -> None:
        """Stop accepting and close every relayed connection (first: a server's ``wait_closed``
        waits for its connections to end)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._relay(reader, writer)
        except asyncio.CancelledError:
            pass  # stopped: asyncio would report a cancelled connection task as an error
        finally:
            self._tasks.discard(task)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        self._count += 1
        conn = self._count
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream, limit=READ_SIZE)
        except OSError:
            self.stats.refused_upstream += 1
            _reset(client_w)  # as the upstream refused us, so we refuse our client
            return
        ups = downs = None
        try:
            if self.tap is not None:
                peer = client_w.get_extra_info("peername")[:2]
                upstream = server_w.get_extra_info("peername")[:2]
                self.tap.opened(conn, peer, upstream, time.time())
            ups = asyncio.create_task(self._pump(conn, True, client_r, server_w, client_w))
            downs = asyncio.create_task(self._pump(conn, False, server_r, client_w, server_w))
            await asyncio.gather(ups, downs)
        except asyncio.CancelledError:
            for pump in (ups, downs):
                if pump is not None:
                    pump.cancel()
            raise
        finally:
            for w in (client_w, server_w):
                if not w.transport.is_closing():
                    w.close()

    async def _pump(
        self,
        conn: int,
        from_client: bool,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        own: asyncio.StreamWriter,
    ) -> None:
        """One direction until its end: data, then the same end (FIN or RST) passed on."""
        tap = self.tap
        counts = self.stats.bytes
        while True:
            try:
                data = await reader.read(READ_SIZE)
            except ConnectionResetError:  # this side reset: the other is reset too
                if tap is not None:
                    tap.ended(conn, from_client, True, time.time())
                _reset(writer)
                return
            if not data:
                break
            counts[from_client] += len(data)
            if tap is not None:
                tap.data(conn, from_client, data, time.time())
            try:
                writer.write(data)
                await writer.drain()
            except ConnectionError:
                # The other side is gone while we wrote: its own direction reports how.
                _reset(own)
                return
        if tap is not None:
            tap.ended(conn, from_client, False, time.time())
        if writer.can_write_eof() and not writer.transport.is_closing():
            with contextlib.suppress(OSError):
                writer.write_eof()
