"""The tester's end of one connection: sends what a case says (bad frames too), judges what comes back.

Every frame either way goes through the protocol core (``protocol.Connection``), so a
peer's frame that breaks a rule the core knows is reported with the core's own reason;
the suites never restate the rules. Frames of ours that the core calls violations are
sent anyway (that is the point of a test) and marked so in the trace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterable

from wallaroo_proto.conformance.runner import CaseFailed, Trace
from wallaroo_proto.judge import Kind

from ..codec import encode
from ..errors import ProtocolError
from ..frames import DEFAULT_MAX_FRAME_SIZE, Ack, Error, Frame, Message, NotifyAck, Ok, show_text
from ..protocol import Connection, Side, Use
from ..reader import FrameReader
from ..twopc import TWOPC_STREAM, decode_twopc

READ_SIZE = 64 * 1024


class PeerClosed(Exception):
    """The peer closed (or reset) the connection."""


def show(frame: Frame, *, sink: bool = False) -> str:
    """A frame in one short line, 2PC payloads decoded on a sink connection."""
    if type(frame) is Message:
        if sink and frame.stream_id == TWOPC_STREAM:
            try:
                msg = decode_twopc(frame.payload)
            except ProtocolError as err:
                return f"MESSAGE stream=0 (bad 2PC payload: {err.what})"
            return f"2PC {msg.TAG.name} " + ", ".join(f"{k}={_value(v)}" for k, v in msg._asdict().items())
        key = f" key={_value(frame.key)}" if frame.key else ""
        return f"MESSAGE stream={frame.stream_id} id={frame.message_id}{key} payload={len(frame.payload)}B"
    fields = ", ".join(f"{k}={_value(v)}" for k, v in frame._asdict().items())
    return f"{frame.TYPE.name} {fields}".rstrip()


def _value(value: object) -> str:
    if isinstance(value, (str, bytes)):
        text = show_text(value)
        return repr(text if len(text) <= 60 else text[:57] + "...")
    return str(value)


class Probe:
    """Frames over one TCP connection, logged to the case's trace and judged by the core."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        use: Use,
        our_side: Side,
        trace: Trace,
        label: str,
        strict_credits: bool = False,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.machine = Connection(use, lenient_credits=not strict_credits)
        self.our_side = our_side
        self.trace = trace
        self.label = label
        self._sink = use is Use.SINK
        self._frames = FrameReader(DEFAULT_MAX_FRAME_SIZE)
        self._queue: deque[Frame] = deque()
        self.closed = False
        #: The core's verdicts on the peer's frames that broke a rule.
        self.violations: list[str] = []
        #: Frames ``expect`` passed over (ACKs between the frames a case waits for).
        self.passed_over: list[Frame] = []

    @classmethod
    async def connect(cls, host: str, port: int, **kwargs) -> Probe:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, **kwargs)

    # --- out ------------------------------------------------------------------

    def send(self, *frames: Frame) -> None:
        """Send frames as they are; the core's opinion of ours goes to the trace."""
        for i, frame in enumerate(frames):
            outcome = self.machine.feed(self.our_side, frame)
            note = f"  (breaks a rule on purpose: {outcome.reason})" if outcome.kind is Kind.VIOLATION else ""
            if note or i < 2 or i == len(frames) - 1:
                self.trace(f"{self.label} -> {show(frame, sink=self._sink)}{note}")
            elif i == 2:
                self.trace(f"{self.label} -> ... {len(frames) - 3} more like it")
        self.writer.write(b"".join(encode(f) for f in frames))

    def send_raw(self, data: bytes, what: str) -> None:
        self.trace(f"{self.label} -> {what} ({data[:16].hex(' ')}{' ...' if len(data) > 16 else ''})")
        self.writer.write(data)

    # --- in -------------------------------------------------------------------

    async def recv(self) -> Frame:
        """The peer's next frame; raises PeerClosed at EOF and CaseFailed on bytes that are no frame."""
        while not self._queue:
            if self.closed:
                raise PeerClosed()
            try:
                data = await self.reader.read(READ_SIZE)
            except (ConnectionError, OSError) as err:
                data = b""
                self.trace(f"{self.label} <- reset ({err})")
            if not data:
                self.closed = True
                self.machine.end(self.our_side.other)
                self.trace(f"{self.label} <- close")
                raise PeerClosed()
            try:
                self._queue.extend(self._frames.feed(data))
            except ProtocolError as err:
                self._queue.extend(err.decoded)
                if not self._queue:
                    raise CaseFailed(
                        f"the peer sent bytes that are no frame: {err}", self.trace.tail()
                    ) from err
        frame = self._queue.popleft()
        outcome = self.machine.feed(self.our_side.other, frame)
        self.trace(f"{self.label} <- {show(frame, sink=self._sink)}")
        if outcome.kind is Kind.VIOLATION:
            self.violations.append(outcome.reason)
            self.trace(f"   the core: {outcome.reason}")
        return frame

    @property
    def buffered(self) -> bool:
        """Frames already read from the socket and not yet taken by ``recv``."""
        return bool(self._queue)

    async def expect(
        self,
        kind: type,
        match: Callable[[Frame], bool] | None = None,
        *,
        what: str = "",
        skip: Iterable[type] = (Ack,),
    ) -> Frame:
        """The next frame of ``kind`` (passing over ``skip`` types); anything else fails the case."""
        skip = tuple(skip)
        wanted = what or kind.TYPE.name
        self.trace(f"   waiting for {wanted}")
        while True:
            try:
                frame = await self.recv()
            except PeerClosed:
                raise CaseFailed(
                    f"closed the connection instead of sending {wanted}", self.trace.tail()
                ) from None
            if type(frame) is kind and (match is None or match(frame)):
                return frame
            if isinstance(frame, skip):
                self.passed_over.append(frame)
                continue
            raise CaseFailed(f"sent {show(frame, sink=self._sink)} instead of {wanted}", self.trace.tail())

    async def expect_error_and_close(self, deciding: tuple[type, ...] = (Ok, NotifyAck)) -> str:
        """ERROR (other frames before it are passed over), then the close: the reason.

        A frame of ``deciding`` is an answer that took what was to be refused (OK to a bad
        HELLO, NOTIFY_ACK to a NOTIFY before one): it fails the case at once, not at the deadline.
        """
        self.trace("   waiting for ERROR and a close")
        while True:
            try:
                frame = await self.recv()
            except PeerClosed:
                raise CaseFailed("closed the connection without an ERROR", self.trace.tail()) from None
            if type(frame) is Error:
                break
            if isinstance(frame, deciding):
                raise CaseFailed(f"got {frame.TYPE.name} where ERROR was due", self.trace.tail())
        reason = show_text(frame.reason)
        with contextlib.suppress(PeerClosed):
            while True:
                extra = await self.recv()
                raise CaseFailed(
                    f"ERROR {reason!r}, then {show(extra, sink=self._sink)}: nothing may follow an ERROR",
                    self.trace.tail(),
                )
        return reason

    async def quiet(self, seconds: float) -> list[Frame]:
        """Every frame the peer sends within ``seconds`` (stops early at a close)."""
        got: list[Frame] = []
        with contextlib.suppress(TimeoutError, PeerClosed):
            async with asyncio.timeout(seconds):
                while True:
                    got.append(await self.recv())
        return got

    def check_clean(self) -> None:
        """Fail the case if any frame of the peer broke a rule of the core."""
        if self.violations:
            raise CaseFailed(self.violations[0], self.trace.tail())

    def abort(self) -> None:
        """Close now, without waiting for anything."""
        if not self.writer.is_closing():
            with contextlib.suppress(OSError):
                self.writer.transport.abort()

    async def close(self) -> None:
        """Close in order (FIN) and wait until it is done."""
        if not self.writer.is_closing():
            self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
