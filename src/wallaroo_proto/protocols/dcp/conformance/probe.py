"""The tester's end of one DCP connection: a consumer whose every packet, both ways, goes through the core.

What it sends is fed to ``core.Connection`` as the consumer's (a request the core calls a
violation is sent anyway, on purpose, and marked so in the trace); what the
producer sends is fed as the producer's, so a reply or stream message that breaks
a rule the core knows (an answer to no request, a seqno outside its snapshot, a
message beyond the flow-control buffer, a second stream accepted) fails the case
with the core's own reason. Only the answer to a request too malformed for the core
to parse is judged here, by its status alone.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from wallaroo_proto.conformance.runner import CaseFailed, Trace
from wallaroo_proto.judge import End, Kind

from .. import codec
from ..codec import Packet, PacketSplitter, ProtocolError, Response, decode_packet
from ..core import CONSUMER, PRODUCER, Connection, Verdict

READ_SIZE = 256 * 1024


def show(p: Packet, msg: Any = None) -> str:
    """A packet in one short line."""
    head = f"{p.name}{'' if p.is_request else ' response'}"
    parts = [head]
    if not p.is_request:
        parts.append(codec.STATUSES.get(p.status, f"0x{p.status:04x}"))
    parts.append(f"opaque=0x{p.opaque:08x}")
    if p.is_request:
        parts.append(f"vb={p.vbucket}")
    if isinstance(msg, codec.SnapshotMarker):
        parts.append(f"{msg.start}..{msg.end} flags=0x{msg.flags:x}")
    elif isinstance(msg, (codec.Mutation, codec.Deletion, codec.Expiration)):
        parts.append(f"seqno={msg.seqno} key={msg.key[:40]!r}")
    elif isinstance(msg, codec.StreamEnd):
        parts.append(f"reason={msg.reason_name}")
    elif isinstance(msg, codec.StreamReq):
        end = "forever" if msg.end == codec.FOREVER else msg.end
        parts.append(f"start={msg.start} end={end} uuid=0x{msg.vbucket_uuid:x}")
        parts.append(f"snap={msg.snap_start}..{msg.snap_end}")
    elif isinstance(msg, codec.Control):
        parts.append(f"{msg.key}={msg.value}")
    elif isinstance(msg, codec.BufferAck):
        parts.append(f"bytes={msg.nbytes}")
    elif isinstance(msg, Response):
        if msg.failover_log is not None:
            parts.append(f"failover log of {len(msg.failover_log)}")
        elif msg.rollback_seqno is not None:
            parts.append(f"to {msg.rollback_seqno}")
    return " ".join(parts)


class ProducerProbe:
    """One consumer connection to the producer under test."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trace: Trace, label: str):
        self.reader, self.writer, self.trace, self.label = reader, writer, trace, label
        self.conn = Connection()
        self.splitter = PacketSplitter()
        self.inbox: deque[tuple[Packet, Verdict]] = deque()
        self.closed = False
        self._opaque = random.getrandbits(24) << 4
        #: Opaques of requests too malformed for the core: their answers are judged here.
        self._unjudged: set[int] = set()
        #: Answer the producer's NOOPs with their opaque (a case about NOOPs turns it off).
        self.answer_noops = True
        self.noops: list[int] = []
        #: Stream messages by opaque, in order, as (packet, message).
        self.stream_messages: dict[int, list[tuple[Packet, Any]]] = {}

    @classmethod
    async def connect(cls, host: str, port: int, trace: Trace, label: str) -> ProducerProbe:
        reader, writer = await asyncio.open_connection(host, port)
        trace(f"{label} connected to {host}:{port}")
        return cls(reader, writer, trace, label)

    def next_opaque(self) -> int:
        self._opaque = (self._opaque + 1) & 0xFFFF_FFFF
        return self._opaque

    # --- sending ---------------------------------------------------------------------------------------

    def send(self, wire: bytes) -> Packet:
        p = decode_packet(wire)
        verdict = self.conn.feed(CONSUMER, p)
        mark = ""
        if verdict.kind is Kind.MALFORMED:
            self._unjudged.add(p.opaque)
            mark = f"   (on purpose, malformed: {verdict.reason})"
        elif not verdict.ok:
            mark = f"   (on purpose: {verdict.reason})"
        self.trace(f"{self.label} -> {show(p, verdict.message)}{mark}")
        self.writer.write(wire)
        return p

    def send_raw(self, data: bytes, what: str) -> None:
        self.trace(f"{self.label} -> {what} ({data[:12].hex(' ')} ...)")
        self.writer.write(data)

    def request(self, opcode: int, **fields: Any) -> int:
        opaque = self.next_opaque()
        self.send(codec.request(opcode, opaque=opaque, **fields))
        return opaque

    # --- receiving -------------------------------------------------------------------------------------

    async def _read(self) -> None:
        how = End.CLOSED
        try:
            data = await self.reader.read(READ_SIZE)
        except ConnectionError:
            data, how = b"", End.RESET
        if not data:
            self.closed = True
            partial = len(self.splitter.buf)
            self.conn.end(PRODUCER, End.CUT if partial and how is End.CLOSED else how, partial)
            self.trace(f"{self.label} <- (connection closed)")
            return
        try:
            packets = self.splitter.feed(data)
        except ProtocolError as err:
            raise CaseFailed(
                f"the producer sent bytes that are no packet: {err}", self.trace.tail()
            ) from None
        for offset, wire in packets:
            self._take(decode_packet(wire), offset)

    def _take(self, p: Packet, offset: int) -> None:
        if not p.is_request and p.opaque in self._unjudged:
            self._unjudged.discard(p.opaque)
            verdict = Verdict(Kind.ACCEPTED, PRODUCER, packet=p, message=Response(p.status, value=p.value))
        else:
            verdict = self.conn.feed(PRODUCER, p, offset=offset)
        self.trace(f"{self.label} <- {show(p, verdict.message)}")
        if not verdict.ok:
            raise CaseFailed(verdict.reason or "a packet the core refuses", self.trace.tail())
        if p.is_request and p.opcode == codec.NOOP:
            self.noops.append(p.opaque)
            if self.answer_noops:
                self.answer_noop(p.opaque)
            return
        if p.is_request:
            self.stream_messages.setdefault(p.opaque, []).append((p, verdict.message))
        self.inbox.append((p, verdict))

    def answer_noop(self, opaque: int) -> None:
        self.send(codec.response(codec.NOOP, opaque=opaque))

    async def packet(self) -> tuple[Packet, Verdict]:
        """The producer's next packet (NOOPs aside); the connection closing fails the case."""
        while not self.inbox:
            if self.closed:
                raise CaseFailed(
                    f"the producer closed the connection ({self.conn.violations} violations seen)",
                    self.trace.tail(),
                )
            await self._read()
        return self.inbox.popleft()

    async def response(self, opaque: int) -> tuple[Packet, Response]:
        """The response to the request of ``opaque``; stream messages on the way are kept."""
        self.trace(f"   waiting for the response to opaque 0x{opaque:08x}")
        while True:
            p, verdict = await self.packet()
            if not p.is_request and p.opaque == opaque:
                return p, verdict.message

    async def call(self, opcode: int, **fields: Any) -> tuple[Packet, Response]:
        return await self.response(self.request(opcode, **fields))

    async def expect_success(self, opaque: int, what: str) -> Response:
        p, msg = await self.response(opaque)
        if p.status != codec.SUCCESS:
            raise CaseFailed(f"{what} answered {msg.status_name}, expected SUCCESS", self.trace.tail())
        return msg

    async def until(self, done: Callable[[], bool]) -> None:
        """Read (judging every packet) until ``done()`` holds; the connection closing fails the case."""
        while not done():
            if self.closed:
                raise CaseFailed("the producer closed the connection", self.trace.tail())
            await self._read()

    async def stream_until(self, opaque: int, done) -> list[tuple[Packet, Any]]:
        """Read until ``done(messages)`` holds for the stream of ``opaque``."""
        await self.until(lambda: done(self.stream_messages.get(opaque, [])))
        return self.stream_messages.get(opaque, [])

    async def quiet(self, seconds: float) -> None:
        """Read whatever comes for ``seconds`` (each packet judged); the connection may stay silent."""
        try:
            async with asyncio.timeout(seconds):
                while not self.closed:
                    await self._read()
        except TimeoutError:
            pass

    async def closes(self) -> None:
        while not self.closed:
            await self._read()

    def abort(self) -> None:
        self.writer.transport.abort()
