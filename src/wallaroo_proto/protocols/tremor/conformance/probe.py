"""The tester's end of one Tremor session: a WebSocket client that can also send bad frames.

wsproto does the upgrade and the well-formed frames, as in the mock client;
what a case sends on purpose against the rules (an unmasked frame, text that
is not UTF-8, a reserved opcode) is built by ``client_frame``. Every text
message the node sends goes through ``core.Session``, so a reply that breaks a
rule the core knows fails the case with the core's own reason; the upgrade
response is judged by ``wsframes.read_response``, as the dissector judges it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections import deque
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from wallaroo_proto.conformance.runner import CaseFailed, Trace

from ..core import CLIENT, SERVER, Session, Verdict
from ..messages import ErrorClose, VersionInfo, dumps
from ..wsframes import Handshake, head_length, read_request, read_response, unmask

READ_SIZE = 64 * 1024
#: Longest text a trace line shows of a message.
SHOWN = 100


def client_frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True, rsv: int = 0) -> bytes:
    """One client frame as RFC 6455 5.2 lays it out, for the frames wsproto refuses to send."""
    n = len(payload)
    mask_bit = 0x80 if mask else 0
    head = bytes([(0x80 if fin else 0) | (rsv & 7) << 4 | opcode & 0xF])
    if n < 126:
        head += bytes([mask_bit | n])
    elif n < 1 << 16:
        head += bytes([mask_bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + unmask(payload, key)


def short(text: str) -> str:
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 3]}... ({len(text)} chars)"


class Closed(Exception):
    """The node ended the WebSocket (its Close frame, or the TCP connection)."""

    def __init__(self, code: int | None, how: str) -> None:
        self.code = code
        self.how = how
        super().__init__(how)


class NodeProbe:
    """One WebSocket session with the node under test; its messages judged by ``core.Session``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trace: Trace, label: str):
        self.reader, self.writer, self.trace, self.label = reader, writer, trace, label
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.session = Session()
        self.events: deque = deque()
        self._parts: list[str] = []
        self.closed: Closed | None = None
        self.request: Handshake | None = None
        self.response: Handshake | None = None
        self._head = bytearray()  # the upgrade response's bytes, judged as the dissector judges them
        self.pongs: list[bytes] = []
        #: The version the node announced as its first message, if it did.
        self.greeting: VersionInfo | None = None

    @classmethod
    async def open(cls, host: str, port: int, trace: Trace, label: str = "s1") -> NodeProbe:
        """Connect and upgrade; the greeting (if any) is left for the case to read."""
        reader, writer = await asyncio.open_connection(host, port)
        probe = cls(reader, writer, trace, label)
        request = probe.ws.send(Request(host=f"{host}:{port}", target="/"))
        probe.request = read_request(request)
        writer.write(request)
        trace(f"{label} -> GET / (upgrade to websocket)")
        while True:
            event = await probe._event()
            if isinstance(event, AcceptConnection):
                break
            if isinstance(event, RejectConnection):
                raise CaseFailed(f"the node refused the upgrade with HTTP {event.status_code}", trace.tail())
            if isinstance(event, Closed):
                raise CaseFailed(f"the node {event.how} during the upgrade", trace.tail())
        response = probe.response
        if response is not None and response.problems:
            raise CaseFailed("the upgrade response: " + "; ".join(response.problems), trace.tail())
        trace(f"{label} <- 101 Switching Protocols")
        return probe

    # --- bytes and events ------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            data = await self.reader.read(READ_SIZE)
        except ConnectionError:
            data = b""
        if not data:
            self.closed = self.closed or Closed(None, "closed the TCP connection")
            self.events.append(self.closed)
            return
        if self.response is None:
            self._head += data
            end = head_length(bytes(self._head))
            if end is not None:
                self.response = read_response(bytes(self._head[:end]), self.request)
        try:
            self.ws.receive_data(data)
            events = list(self.ws.events())
        except RemoteProtocolError as err:
            raise CaseFailed(f"the node broke WebSocket: {err}", self.trace.tail()) from None
        for event in events:
            if isinstance(event, TextMessage):
                self._parts.append(event.data)
                if event.message_finished:
                    self.events.append("".join(self._parts))
                    self._parts.clear()
            elif isinstance(event, BytesMessage):
                raise CaseFailed(
                    "the node sent a binary frame (RFC 0019: text frames only)", self.trace.tail()
                )
            elif isinstance(event, Ping):
                self._write(self.ws.send(event.response()))
            elif isinstance(event, Pong):
                self.pongs.append(bytes(event.payload))
                self.events.append(event)
            elif isinstance(event, CloseConnection):
                code = None if event.code == CloseReason.NO_STATUS_RCVD else int(event.code)
                self.trace(f"{self.label} <- Close frame {code or '(no code)'} {event.reason or ''}".rstrip())
                with contextlib.suppress(LocalProtocolError):
                    self._write(self.ws.send(event.response()))
                self.closed = Closed(code, f"sent a Close frame ({code or 'no code'})")
                self.events.append(self.closed)
            else:
                self.events.append(event)

    async def _event(self) -> Any:
        while not self.events:
            if self.closed is not None:
                return self.closed
            await self._read()
        return self.events.popleft()

    def _write(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    # --- sending ---------------------------------------------------------------------------------------

    def send(self, value: Any) -> Verdict:
        """One text message (a JSON value, or text sent as written), judged as the client's."""
        text = value if isinstance(value, str) else dumps(value)
        verdict = self.session.feed(CLIENT, text)
        mark = "" if verdict.ok else f"   (on purpose: {verdict.code} {verdict.reason})"
        self.trace(f"{self.label} -> {short(text)}{mark}")
        self._write(self.ws.send(TextMessage(data=text)))
        return verdict

    def send_fragments(self, text: str, pieces: int, ping: bytes | None = None) -> None:
        """``text`` in ``pieces`` frames, a ping after the first when given (RFC 6455 5.4)."""
        self.session.feed(CLIENT, text)
        size = -(-len(text) // pieces)
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        for i, chunk in enumerate(chunks):
            self._write(self.ws.send(TextMessage(data=chunk, message_finished=i == len(chunks) - 1)))
            if i == 0 and ping is not None:
                self._write(self.ws.send(Ping(payload=ping)))
        self.trace(
            f"{self.label} -> {short(text)} in {len(chunks)} fragments"
            + (", a ping after the first" if ping else "")
        )

    def close_frame(self, code: int, reason: str) -> None:
        """Start the WebSocket closing handshake (RFC 6455 5.5.1)."""
        self.trace(f"{self.label} -> Close frame {code}")
        self._write(self.ws.send(CloseConnection(code=code, reason=reason)))

    def ping(self, payload: bytes) -> None:
        self.trace(f"{self.label} -> Ping {payload!r}")
        self._write(self.ws.send(Ping(payload=payload)))

    def send_raw(self, data: bytes, what: str) -> None:
        self.trace(f"{self.label} -> {what} ({data[:12].hex(' ')}{' ...' if len(data) > 12 else ''})")
        self._write(data)

    # --- receiving -------------------------------------------------------------------------------------

    async def message(self) -> Verdict:
        """The node's next text message, judged; a broken rule or a close fails the case."""
        while True:
            event = await self._event()
            if isinstance(event, Closed):
                raise CaseFailed(
                    f"the node {event.how}; expecting {self.session.expects().text}", self.trace.tail()
                )
            if isinstance(event, str):
                verdict = self._judge(event)
                if verdict.type == "version-info" and self.session.server_messages == 1:
                    self.greeting = verdict.message  # the announcement on connect, not an answer
                    continue
                return verdict

    def _judge(self, text: str) -> Verdict:
        verdict = self.session.feed(SERVER, text)
        self.trace(f"{self.label} <- {short(text)}")
        if not verdict.ok:
            raise CaseFailed(verdict.reason or f"a {verdict.type} the core refuses", self.trace.tail())
        return verdict

    async def expect(self, type_: str) -> Verdict:
        """The next message, which must be of ``type_`` (``connect-ack``, ``echo``, ``pubsub:data``...)."""
        verdict = await self.message()
        if verdict.type != type_:
            if isinstance(verdict.message, ErrorClose):
                raise CaseFailed(
                    f"error close {verdict.message.text!r} where {type_} was due", self.trace.tail()
                )
            raise CaseFailed(f"{verdict.type} where {type_} was due", self.trace.tail())
        return verdict

    async def settle(self) -> None:
        """Read until the node owes nothing the core foretold."""
        while self.session.owed():
            await self.message()

    async def pong(self) -> bytes:
        while True:
            event = await self._event()
            if isinstance(event, Pong):
                return bytes(event.payload)
            if isinstance(event, Closed):
                raise CaseFailed(f"the node {event.how} instead of a Pong", self.trace.tail())
            if isinstance(event, str):
                self._judge(event)

    async def closes_unanswered(self) -> Closed:
        """Wait for the node to end the WebSocket; any text message before that fails the case."""
        while True:
            event = await self._event()
            if isinstance(event, Closed):
                return event
            if isinstance(event, str):
                self.trace(f"{self.label} <- {short(event)}")
                raise CaseFailed("the node answered instead of closing", self.trace.tail())

    async def closes(self) -> Closed:
        """Wait for the node to end the WebSocket; a text message before that is judged on the way."""
        while True:
            event = await self._event()
            if isinstance(event, Closed):
                return event
            if isinstance(event, str):
                self._judge(event)

    def abort(self) -> None:
        self.writer.transport.abort()
