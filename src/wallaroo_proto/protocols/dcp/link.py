"""The mock consumer's TCP connection: received bytes handed over as they came, writes with drain.

asyncio's StreamReader copies every byte it buffers several times (into its
buffer, out as a slice, into bytes); at hundreds of megabytes a second of
stream messages those copies cost as much as judging them. A ``Link`` keeps
the chunks the socket gave and joins them only when more than one waits.
Reading pauses while ``limit`` bytes wait unread, so a producer that ignores
flow control cannot make the consumer buffer without bound. ``read`` and
``drain`` take a timeout, so a peer that goes quiet or stops reading cannot
hold the caller forever.
"""

from __future__ import annotations

import asyncio


class Link(asyncio.Protocol):
    """One client connection: ``read`` what came, ``write``, ``drain``, ``close``."""

    def __init__(self, limit: int = 4 * 1024 * 1024) -> None:
        self.limit = limit
        self.transport: asyncio.Transport | None = None
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.eof = False
        self.error: Exception | None = None
        self.reading_paused = False
        self.writing_paused = False
        self.waiter: asyncio.Future | None = None
        self.drain_waiter: asyncio.Future | None = None
        self.closed = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, host: str, port: int, limit: int = 4 * 1024 * 1024) -> Link:
        _, link = await asyncio.get_running_loop().create_connection(lambda: cls(limit), host, port)
        return link

    # ------------------------------------------------------------------------- protocol events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > self.limit and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        self.writing_paused = False
        self._wake_drain()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_drain()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _wake_drain(self) -> None:
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    # ------------------------------------------------------------------------- the caller's side

    async def read(self, timeout: float | None = None) -> bytes:
        """Everything received since the last read (waiting for something); b"" at the end of the stream.

        TimeoutError when nothing came within ``timeout`` seconds.
        """
        if not self.chunks and not self.eof:
            async with asyncio.timeout(timeout):
                while not self.chunks and not self.eof:
                    self.waiter = asyncio.get_running_loop().create_future()
                    try:
                        await self.waiter
                    finally:
                        self.waiter = None
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        if self.reading_paused and not self.eof:
            self.reading_paused = False
            self.transport.resume_reading()
        return data

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait while the transport holds more than its high-water mark; ConnectionResetError once lost.

        TimeoutError when the peer read too little for the buffer to fall within ``timeout`` seconds.
        """
        if self.transport.is_closing() and self.closed.done():
            raise ConnectionResetError("connection lost")
        if self.writing_paused:
            async with asyncio.timeout(timeout):
                while self.writing_paused:
                    self.drain_waiter = asyncio.get_running_loop().create_future()
                    try:
                        await self.drain_waiter
                    finally:
                        self.drain_waiter = None
        if self.closed.done():
            raise ConnectionResetError("connection lost")

    def close(self) -> None:
        """Close once what was written is sent (which a peer that reads nothing never lets happen)."""
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what was not sent."""
        if self.transport is not None:
            self.transport.abort()

    async def wait_closed(self) -> None:
        await self.closed
