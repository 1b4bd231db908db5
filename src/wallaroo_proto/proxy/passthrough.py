"""Both directions of one relayed connection as asyncio Protocols: the relay's path when no
fault rule reshapes the bytes.

Streams cost a copy into the reader's buffer, another out of it, a future and a task
switch per read and per drain; here each read is written on from the callback that
receives it (measured: a seventh of the CPU of the stream pumps for bulk data). The
rules stay the relay's: back-pressure through the transports' own flow control (a
full write buffer on one side pauses reading on the other, so nothing piles up
here), a half-close passed on as a half-close, a reset as a reset, and every byte
shown to the tap before it is forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from wallaroo_proto.write_watch import reset as reset_transport

#: What a side's transport may hold unsent before reading from the other side pauses: enough
#: to carry a peer's burst while the other takes it (DCP measured a tenth faster than with
#: asyncio's 64 KiB), bounded all the same (plus one read, at most 256 KiB).
WRITE_BUFFER = 1 << 20


class Tap(Protocol):
    """Sees every relayed connection's bytes, in the order they were forwarded."""

    def opened(self, conn: int, client: tuple[str, int], server: tuple[str, int], when: float) -> None: ...

    def data(self, conn: int, from_client: bool, data: bytes, when: float) -> None: ...

    def ended(self, conn: int, from_client: bool, reset: bool, when: float) -> None: ...

    def note(self, conn: int, from_client: bool, text: str, when: float) -> None:
        """A fault applied at the frame just passed (or withheld) in this direction."""

    @property
    def congested(self) -> bool:
        """The tap's own output is behind: read nothing more from the peers for now."""

    def when_room(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the relay's loop once the tap is no longer congested."""

    async def room(self) -> None:
        """Return once the tap is no longer congested."""


class _Side(asyncio.Protocol):
    """What one side's transport receives: forwarded to the other side's transport."""

    def __init__(self, link: _Link, from_client: bool) -> None:
        self.link = link
        self.from_client = from_client
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None
        #: The side's bytes are over: its FIN came, or its connection was lost.
        self.done = False
        #: Why reading from this side is paused ("writes": the other side's write buffer is
        #: full; "tap": the proxy's own output is behind); it resumes when none is left.
        self.holds: set[str] = set()

    def data_received(self, data: bytes) -> None:
        link = self.link
        link.counts[self.from_client] += len(data)
        tap = link.tap
        if tap is not None:
            tap.data(link.conn, self.from_client, data, time.time())
            if tap.congested:
                if "tap" not in self.holds:
                    tap.when_room(lambda: self.release("tap"))
                self.hold("tap")
        out = self.other.transport
        if not out.is_closing():  # else the other side is gone: its own direction told how
            out.write(data)

    def hold(self, why: str) -> None:
        """Read nothing more from this side until ``release(why)``."""
        self.holds.add(why)
        if self.transport.is_reading():
            self.transport.pause_reading()

    def release(self, why: str) -> None:
        if why in self.holds:
            self.holds.discard(why)
            if not self.holds and not self.transport.is_closing():
                self.transport.resume_reading()

    def eof_received(self) -> bool:
        link = self.link
        if link.tap is not None:
            link.tap.ended(link.conn, self.from_client, False, time.time())
        out = self.other.transport
        if out.can_write_eof() and not out.is_closing():
            with contextlib.suppress(OSError):
                out.write_eof()
        self._over()
        return True  # a half-close: the other direction keeps flowing

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:  # this side reset (or failed): the other is reset too
            if not self.done and self.link.tap is not None:
                self.link.tap.ended(self.link.conn, self.from_client, True, time.time())
            reset_transport(self.other.transport)
        elif not self.done and self.link.tap is not None:
            # Closed by the proxy itself (--strict): recorded as this side's end.
            self.link.tap.ended(self.link.conn, self.from_client, False, time.time())
        self.other._over()  # nothing more can be written to this side
        self._over()

    # A full write buffer on this side stops reading from the other side, until it drains.
    def pause_writing(self) -> None:
        self.other.hold("writes")

    def resume_writing(self) -> None:
        self.other.release("writes")

    def _over(self) -> None:
        if not self.done:
            self.done = True
            if self.other.done and not self.link.finished.done():
                self.link.finished.set_result(None)


class _Link:
    def __init__(self, conn: Any, tap: Tap | None, counts: dict[bool, int]) -> None:
        self.conn = conn
        self.tap = tap
        self.counts = counts
        self.finished: asyncio.Future = asyncio.get_running_loop().create_future()


async def pass_through(
    conn: Any,
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    tap: Tap | None,
    counts: dict[bool, int],
) -> None:
    """Relay until both directions are over. The streams' transports are taken over: what
    their readers already hold is forwarded first, in order."""
    link = _Link(conn, tap, counts)
    sides = {True: _Side(link, True), False: _Side(link, False)}
    readers = {True: client[0], False: server[0]}
    for from_client, (_, writer) in ((True, client), (False, server)):
        side = sides[from_client]
        side.other = sides[not from_client]
        side.transport = writer.transport
        side.transport.set_protocol(side)
        side.transport.set_write_buffer_limits(high=WRITE_BUFFER)
    for from_client, side in sides.items():
        held = readers[from_client]
        buffered = bytes(held._buffer)  # noqa: SLF001 - what the stream read before the switch
        held._buffer.clear()  # noqa: SLF001
        if buffered:
            side.data_received(buffered)
        if held.exception() is not None:
            side.connection_lost(held.exception())
        elif held.at_eof():
            side.eof_received()
        elif not side.transport.is_closing() and not side.transport.is_reading() and not side.holds:
            side.transport.resume_reading()  # the stream may have paused it, its buffer full
    await link.finished
