"""An asyncio connection that speaks frames through the shared protocol core.

The mock peers all use this: bytes from the socket go through the FrameReader
and every frame, received or sent, through the same ``protocol.Connection``.
A frame we are about to send that the core calls a violation is a bug in the
caller and raises ``OwnViolation`` instead of going on the wire (fault
injection that wants to break the protocol on purpose passes ``check=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from .codec import encode
from .errors import ProtocolError
from .frames import DEFAULT_MAX_FRAME_SIZE, Error, Frame
from .pcap_writer import TcpSession
from .protocol import ACCEPTED, Connection, Outcome, Side, Use
from .reader import FrameReader

READ_SIZE = 256 * 1024


class ConnectionClosed(Exception):
    """The peer closed the connection; ``mid_frame`` bytes of a frame were left unread."""

    def __init__(self, mid_frame: int = 0) -> None:
        self.mid_frame = mid_frame
        super().__init__(
            f"connection closed{f' in the middle of a frame ({mid_frame} bytes)' if mid_frame else ''}"
        )


class PeerStalled(ConnectionResetError):
    """The peer read nothing of our frames for ``write_timeout`` seconds; we aborted."""


class OwnViolation(Exception):
    """We were about to send a frame the protocol forbids."""


class FramedConnection:
    """Frames over an asyncio stream pair, checked by a ``Connection`` state machine."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        use: Use,
        our_side: Side,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        lenient_credits: bool = False,
        recording: TcpSession | None = None,
        we_connected: bool = False,
        write_timeout: float | None = 30.0,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.our_side = our_side
        self.machine = Connection(use, lenient_credits=lenient_credits)
        self.frames = FrameReader(max_frame_size)
        self.recording = recording
        self._we_are_client = we_connected
        #: Seconds a peer may leave our writes unread before the connection is aborted.
        self.write_timeout = write_timeout
        self._peer_closed_first = False
        self.bytes_in = 0
        self.bytes_out = 0
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    async def receive(self) -> list[tuple[Frame, Outcome]]:
        """Wait for the next bytes; return the whole frames they complete with the core's verdicts.

        Raises ConnectionClosed at EOF and ProtocolError on bytes that are no frame.
        """
        data = await self.reader.read(READ_SIZE)
        if not data:
            self._peer_closed_first = True
            self.machine.connection_lost()
            raise ConnectionClosed(self.frames.buffered)
        self.bytes_in += len(data)
        if self.recording is not None:
            self.recording.send(not self._we_are_client, data)
        frames = self.frames.feed(data)
        their_side = self.our_side.other
        process = self.machine.process
        return [(frame, process(frame, their_side)) for frame in frames]

    def write(self, frames: Iterable[Frame], *, check: bool = True) -> None:
        """Queue frames for sending (call ``drain`` to respect back-pressure)."""
        chunks = []
        process, side = self.machine.process, self.our_side
        for frame in frames:
            outcome = process(frame, side)
            if outcome is not ACCEPTED and check and outcome.is_violation:
                raise OwnViolation(f"refusing to send {frame.TYPE.name}: {outcome.reason}")
            chunks.append(encode(frame))
        data = b"".join(chunks)
        if not data:
            return
        self.bytes_out += len(data)
        if self.recording is not None:
            self.recording.send(self._we_are_client, data)
        self.writer.write(data)

    async def drain(self) -> None:
        """Wait for the peer to take our bytes, at most ``write_timeout`` seconds.

        A peer that stops reading would otherwise hold this connection, and what
        it owns (streams, a slot, shutdown), forever.
        """
        try:
            async with asyncio.timeout(self.write_timeout):
                await self.writer.drain()
        except TimeoutError:
            self.writer.transport.abort()
            raise PeerStalled(
                f"{self.peer} read nothing of our frames for {self.write_timeout:g} s; connection aborted"
            ) from None

    async def send(self, *frames: Frame, check: bool = True) -> None:
        self.write(frames, check=check)
        await self.drain()

    async def fail(self, reason: str) -> None:
        """Answer a misbehaving peer: ERROR with the reason, then close."""
        with contextlib.suppress(ConnectionError, OSError):
            await self.send(Error(reason), check=False)
        await self.close()

    async def close(self) -> None:
        if self.recording is not None:
            # The side that closed first sends the first FIN.
            self.recording.close(from_client=self._we_are_client != self._peer_closed_first)
        self.machine.connection_lost()
        if not self.writer.is_closing():
            self.writer.close()
        try:
            async with asyncio.timeout(self.write_timeout):
                await self.writer.wait_closed()  # flushes what is queued: bounded like drain
        except TimeoutError:
            self.writer.transport.abort()
        except (ConnectionError, OSError):
            pass


def describe_protocol_error(err: ProtocolError) -> str:
    """The ERROR reason sent to a peer whose bytes were not frames."""
    return f"Invalid frame: {err}"
