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
import time
from collections.abc import Iterable
from itertools import groupby
from operator import itemgetter

from wallaroo_proto.judge import Kind
from wallaroo_proto.pcap_writer import TcpSession
from wallaroo_proto.write_watch import WriteWatch, reset

from .codec import encode, encode_messages
from .errors import ProtocolError
from .frames import DEFAULT_MAX_FRAME_SIZE, Error, Frame, Message
from .protocol import ACCEPTED, Connection, Side, Use, Verdict
from .reader import FrameReader

READ_SIZE = 256 * 1024
_STALLED = "{what} read nothing of our frames for {timeout:g} s ({pending} bytes waiting); connection aborted"
_FIRST_FIELD = itemgetter(0)  # a MESSAGE's stream id: consecutive frames with one in common may be a run


class ConnectionClosed(Exception):
    """The peer closed the connection; ``mid_frame`` bytes of a frame were left unread."""

    def __init__(self, mid_frame: int = 0) -> None:
        self.mid_frame = mid_frame
        super().__init__(
            f"connection closed{f' in the middle of a frame ({mid_frame} bytes)' if mid_frame else ''}"
        )


class PeerStalled(ConnectionResetError):
    """The peer took none of our bytes for ``write_timeout`` seconds; we aborted."""


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
        #: Seconds a peer may leave our bytes unconsumed, with no progress, before we abort.
        self.write_timeout = write_timeout
        #: Why the watchdog aborted the connection, or None.
        self.stalled: str | None = None
        self._peer_closed_first = False
        self.bytes_in = 0
        self.bytes_out = 0
        #: When the last bytes were read (monotonic): the arrival time of the frames they completed.
        self.read_at = 0.0
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._sock = writer.get_extra_info("socket")
        #: Aborts a peer that leaves our bytes untaken for write_timeout; None once aborted.
        self._watch: WriteWatch | None = None
        if write_timeout and self._sock is not None:
            self._watch = WriteWatch(writer.transport, write_timeout, self._stalled, self.peer, _STALLED)

    def _stalled(self, reason: str) -> None:
        """The watchdog reset the connection: say why, and record the reset."""
        self.stalled = reason
        self.abort()

    def abort(self) -> None:
        """Reset the connection now (RST): the peer keeps nothing of ours, and we wait on nothing."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()
        if self.recording is not None:
            self.recording.reset(from_client=self._we_are_client)
        reset(self.writer.transport)

    def _check_stalled(self) -> None:
        if self.stalled is not None:
            raise PeerStalled(self.stalled)

    async def receive(self) -> list[tuple[Frame, Verdict]]:
        """Wait for the next bytes; return the whole frames they complete with the core's verdicts.

        Raises ConnectionClosed at EOF, PeerStalled once the peer stalled, and ProtocolError
        on bytes that are no frame.
        """
        frames = await self._read_frames()
        their_side = self.our_side.other
        feed = self.machine.feed
        return [(frame, feed(their_side, frame)) for frame in frames]

    async def receive_runs(self) -> list[tuple[Frame | list[Message], Verdict]]:
        """As ``receive``, but a run of MESSAGEs on one stream that the core accepted whole
        (``Connection.feed_run``) comes as one item: the list of them, ACCEPTED.

        Every frame is still judged: a run the core does not take whole is judged frame by frame.
        """
        frames = await self._read_frames()
        their_side = self.our_side.other
        feed, feed_run = self.machine.feed, self.machine.feed_run
        out: list[tuple[Frame | list[Message], Verdict]] = []
        append = out.append
        for _, group in groupby(frames, _FIRST_FIELD):
            run = list(group)
            if len(run) > 1 and feed_run(run, their_side):
                append((run, ACCEPTED))
            else:
                out += [(frame, feed(their_side, frame)) for frame in run]
        return out

    async def _read_frames(self) -> list[Frame]:
        if self.stalled is not None:
            raise PeerStalled(self.stalled)
        data = await self.reader.read(READ_SIZE)
        self.read_at = time.monotonic()
        if not data:
            self._check_stalled()
            self._peer_closed_first = True
            self.machine.end(self.our_side.other)
            raise ConnectionClosed(self.frames.buffered)
        self.bytes_in += len(data)
        if self.recording is not None:
            self.recording.send(not self._we_are_client, data)
        return self.frames.feed(data)

    def write(self, frames: Iterable[Frame | list[Message]], *, check: bool = True) -> None:
        """Queue frames for sending (call ``drain`` to respect back-pressure).

        An item that is a list of MESSAGEs on one stream is checked by the core as a run
        and encoded in one pass when it is accepted whole, else frame by frame.
        """
        if self.stalled is not None:
            raise PeerStalled(self.stalled)
        chunks = []
        feed, feed_run, side = self.machine.feed, self.machine.feed_run, self.our_side
        for item in frames:
            if type(item) is list:
                if feed_run(item, side):
                    chunks.append(encode_messages(item))
                    continue
                run = item
            else:
                run = (item,)
            for frame in run:
                outcome = feed(side, frame)
                if check and outcome.kind is Kind.VIOLATION:
                    raise OwnViolation(f"refusing to send {frame.TYPE.name}: {outcome.reason}")
                chunks.append(encode(frame))
        data = b"".join(chunks)
        if not data:
            return
        self.bytes_out += len(data)
        if self._watch is not None:
            self._watch.wrote(len(data))
        if self.recording is not None:
            self.recording.send(self._we_are_client, data)
        self.writer.write(data)

    async def drain(self) -> None:
        """Wait for room in our buffer; raises PeerStalled once the watchdog gave up on the peer."""
        try:
            await self.writer.drain()
        except ConnectionError:
            self._check_stalled()
            raise
        if self.stalled is not None:
            raise PeerStalled(self.stalled)

    async def send(self, *frames: Frame, check: bool = True) -> None:
        self.write(frames, check=check)
        await self.drain()

    async def fail(self, reason: str) -> None:
        """Answer a misbehaving peer: ERROR with the reason, then close."""
        with contextlib.suppress(ConnectionError, OSError):
            await self.send(Error(reason), check=False)
        await self.close()

    async def close(self) -> None:
        """Close once the peer took everything we sent (ERROR included), or reset a stalled one.

        Closing with bytes still queued would leave the kernel holding them for a peer
        that may never read, and that peer's connection open.
        """
        self.machine.end(self.our_side)
        if self._watch is not None:  # the watchdog bounds this wait
            delay = 0.001
            try:
                while (
                    self.stalled is None
                    and self._sock.fileno() >= 0
                    and self._watch.unacknowledged(unsent=True)
                ):
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.05)
            except asyncio.CancelledError:
                self.abort()
                raise
        if self.recording is not None:  # a no-op after the watchdog's reset
            # The side that closed first sends the first FIN.
            self.recording.close(from_client=self._we_are_client != self._peer_closed_first)
        if not self.writer.is_closing():
            self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
        if self._watch is not None:
            self._watch.stop()


def describe_protocol_error(err: ProtocolError) -> str:
    """The ERROR reason sent to a peer whose bytes were not frames."""
    return f"Invalid frame: {err}"
