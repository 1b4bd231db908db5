"""DCP's rules for one connection, both sides (sans-IO), and the server's rollback rule.

``Connection`` judges the packets of one DCP connection in both directions
(``feed(side, packet)``, the judge contract of ``wallaroo_proto.judge``): the
consumer's commands (OPEN, CONTROL, STREAM_REQ, BUFFER_ACK, noop replies) and
the producer's answers and stream messages. It checks what the protocol
promises (each rule named in ``RULES``):

- every response answers a pending request with its opaque and opcode; a
  STREAM_REQ is answered with the failover log (newest first) or ROLLBACK with
  a seqno no later than the requested start, never when the start is 0;
- stream messages ride an open stream's opaque and vbucket; within a stream
  seqnos increase and fall inside the current snapshot marker; a snapshot is
  complete when its end seqno arrives, and a new marker or an OK STREAM_END
  before that is a violation;
- with ``connection_buffer_size`` set, the producer sends a stream message only
  while fewer bytes than the buffer are unacknowledged (so it exceeds the
  buffer by at most the one message the notes allow); a consumer acknowledges
  no more than it got;
- NOOPs only after ``enable_noop``, one at a time, answered with their opaque.

No sockets, files or clocks: the mock producer, the mock consumer and the
capture dissector drive the same object. ``needs_rollback`` is the server's
rule (``FailoverTable::needsRollback``); ``add_failover_entry`` its table update.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ... import judge
from ...judge import End, Expected, Kind
from . import codec
from .codec import (
    FOREVER,
    HEADER_SIZE,
    SUCCESS,
    BufferAck,
    Control,
    Deletion,
    Expiration,
    Mutation,
    Open,
    Packet,
    ProtocolError,
    Response,
    SeqnoAdvanced,
    SnapshotMarker,
    StreamEnd,
    StreamReq,
)
from .controls import parse_u32

PRODUCER, CONSUMER = "producer", "consumer"
#: The server keeps at most this many failover entries (``max_failover_entries``).
MAX_FAILOVER_ENTRIES = 25
#: Snapshot flag 0x20: keys may repeat inside the snapshot.
SNAP_MAY_CONTAIN_DUPLICATES = 0x20
#: Keys remembered per snapshot for the uniqueness check (a bound on memory).
_KEYS_KEPT = 100_000
#: What the run path reads of a header and the first extras field (an item's seqno, a marker's start):
#: magic and opcode as one number, key length, extras length, vbucket, body length, opaque, seqno
#: (datatype and cas are not judged).
_RUN_HEAD = struct.Struct(">HHBxHII8xQ")
_REQ_MARKER, _REQ_MUTATION, _REQ_DELETION, _REQ_EXPIRATION = (
    codec.REQ << 8 | op for op in (codec.SNAPSHOT_MARKER, codec.MUTATION, codec.DELETION, codec.EXPIRATION)
)
#: A flow-control limit no count reaches: the run path's limit when there is no buffer.
_UNLIMITED = 1 << 80
_MARKER_V1 = struct.Struct(">QQI")
#: Requests the server takes only on a DCP connection (GET_FAILOVER_LOG is taken on any).
_NEEDS_OPEN = frozenset((codec.CONTROL, codec.STREAM_REQ, codec.CLOSE_STREAM, codec.BUFFER_ACK))
#: The types of the producer's stream messages, and of the commands a consumer may send (before
#: DCP_OPEN: those that need no DCP connection), for ``expects``.
_STREAM_MESSAGE_NAMES = frozenset(codec.OPCODES[op] for op in codec.STREAM_MESSAGES)
_CONSUMER_COMMANDS = frozenset(
    name for op, name in codec.OPCODES.items() if op not in codec.STREAM_MESSAGES and op != codec.NOOP
)
_BEFORE_OPEN = _CONSUMER_COMMANDS - {codec.OPCODES[op] for op in _NEEDS_OPEN}


#: Every rule a violation names (``Verdict.rule``): the catalogue of what ``Connection`` checks.
RULES: dict[str, str] = {
    "wrong-side": "a stream message or NOOP from the consumer, or a consumer command from the producer",
    "open-first": "a CONTROL, STREAM_REQ, CLOSE_STREAM or BUFFER_ACK before the consumer's DCP_OPEN",
    "stream-opaque": "a stream request whose opaque names a pending request or an open stream",
    "request-range": "a stream request whose start is after its end or outside its snapshot range",
    "buffer-ack": "a BUFFER_ACK without connection_buffer_size, or of more bytes than are unacknowledged",
    "noop-reply": "a NOOP reply with no NOOP outstanding, or with another opaque than the NOOP's",
    "noop": "a NOOP before enable_noop=true, or while the last NOOP is unanswered",
    "response-unsolicited": "a response whose opaque answers no pending request",
    "response-opcode": "a response whose opcode is not its request's",
    "malformed-accepted": "a malformed request answered SUCCESS (it must be refused: an error, or a close)",
    "range-accepted": "a stream request with a bad seqno range accepted (the producer must answer ERANGE)",
    "rollback": "a ROLLBACK to a seqno after the requested start, or of a request from seqno 0 and uuid 0",
    "failover-log": "a stream accepted with an empty failover log, a uuid 0, or entries not newest first",
    "stream-per-vbucket": "a second stream accepted for a vbucket that has one (must be KEY_EEXISTS)",
    "flow-control": "a stream message sent while the unacknowledged bytes fill the buffer",
    "no-stream": "a stream message on an opaque with no open stream",
    "stream-vbucket": "a stream message whose vbucket is not its stream's",
    "stream-id": "a stream message whose stream id is not the one its stream was opened with",
    "marker-range": "a snapshot marker whose start is after its end",
    "snapshot-incomplete": "a snapshot marker or an OK STREAM_END before the open snapshot's end seqno came",
    "marker-end": "a snapshot marker whose end is not after the stream's last seqno",
    "item-before-marker": "an item or SEQNO_ADVANCED before its stream's first snapshot marker",
    "seqno-order": "an item's seqno not after the stream's last seqno",
    "seqno-in-snapshot": "an item's seqno outside the current snapshot",
    "seqno-past-end": "an item's seqno after the end its stream request asked for",
    "duplicate-key": "a key twice in one snapshot (unless its marker says keys may repeat)",
}


@dataclass(slots=True)
class Verdict(judge.Verdict):
    """The judge's answer on one packet: the shared fields, then what DCP's records need."""

    packet: Packet | None = None
    message: Any = None
    #: What this packet did, for records and summaries: "snapshot complete", "rollback to 4", ...
    event: str | None = None
    request_opcode: int | None = None
    #: A response's vbucket: its request's (a response's own vbucket field carries its status).
    vbucket: int | None = None
    #: (severity, text) of what this packet explains, with its cause (``findings.mark``).
    finding: tuple[str, str] | None = None


#: Reasons a packet broke rules: (rule, text) in the order found. A verdict names the first rule.
Reasons = list[tuple[str, str]]


def item_window(
    last: int, snap_start: int, snap_end: int, marker_seen: bool, req_end: int
) -> tuple[int, int]:
    """The seqnos an item of a stream may carry now: those in ``(lo, hi]`` (hi -1: none).

    After the stream's last seqno, inside the current snapshot, not past the request's
    end, and only once a marker came: the rule both the packet path (``_item``) and the
    run path (``feed_run``) read, so it is written once.
    """
    lo = last if last >= snap_start else snap_start - 1  # max() and min() are calls: slower
    if not marker_seen:
        return lo, -1
    return lo, snap_end if snap_end <= req_end else req_end


def marker_fits(start: int, end: int, last: int, marker_seen: bool, snapshot_open: bool) -> bool:
    """May a snapshot marker ``start..end`` come now? Both paths read this one rule."""
    return start <= end and not snapshot_open and (end > last or not marker_seen)


def item_reasons(s: Stream, seqno: int) -> Reasons:
    """Why ``seqno`` is outside its stream's ``item_window`` (empty when inside)."""
    reasons = []
    if not s.marker_seen:
        reasons.append(("item-before-marker", f"seqno {seqno} before any snapshot marker"))
    if seqno <= s.last_seqno:
        reasons.append(("seqno-order", f"seqno {seqno} not after the last seqno {s.last_seqno}"))
    elif s.marker_seen and not s.snap_start <= seqno <= s.snap_end:
        reasons.append(
            ("seqno-in-snapshot", f"seqno {seqno} outside the snapshot {s.snap_start}..{s.snap_end}")
        )
    if s.request.end != FOREVER and seqno > s.request.end:
        reasons.append(("seqno-past-end", f"seqno {seqno} after the stream's end {s.request.end}"))
    return reasons


def marker_reasons(s: Stream, start: int, end: int) -> Reasons:
    """Why a marker ``start..end`` does not fit its stream now (``marker_fits``; empty when it does)."""
    reasons = []
    if start > end:
        reasons.append(("marker-range", f"snapshot start {start} > end {end}"))
    if s.snapshot_open:
        reasons.append(
            (
                "snapshot-incomplete",
                f"snapshot marker {start}..{end} before the snapshot {s.snap_start}..{s.snap_end} "
                f"completed (last seqno {s.last_seqno})",
            )
        )
    if end <= s.last_seqno and s.marker_seen:
        reasons.append(("marker-end", f"snapshot end {end} not after the last seqno {s.last_seqno}"))
    return reasons


def needs_rollback(
    start: int,
    uuid: int,
    snap_start: int,
    snap_end: int,
    table: list[tuple[int, int]],
    high_seqno: int,
    *,
    purge_seqno: int = 0,
    strict: bool = False,
) -> int | None:
    """The seqno a stream request must roll back to, or None: the server's rule, step by step.

    ``table`` is the server's failover log, newest first.
    """
    if start == 0 and (not strict or uuid == 0):
        return None
    if 0 < start < purge_seqno:
        return 0
    upper = None
    for i in range(len(table) - 1, -1, -1):  # oldest to newest
        if table[i][0] == uuid:
            upper = table[i - 1][1] if i > 0 else high_seqno
            break
    if upper is None:
        return 0
    if start == snap_start:
        snap_end = start
    if snap_end <= upper:
        return None
    if start == snap_end:
        snap_start = start
    return upper if upper < snap_start else snap_start


def add_failover_entry(table: list[tuple[int, int]], uuid: int, high_seqno: int) -> list[tuple[int, int]]:
    """The table after a vbucket takes over at ``high_seqno``: later entries dropped, the new one first."""
    kept = [(u, s) for u, s in table if s <= high_seqno]
    return [(uuid, high_seqno), *kept][:MAX_FAILOVER_ENTRIES]


@dataclass(slots=True)
class Stream:
    """One vbucket stream as both sides see it, from its accepted STREAM_REQ to its STREAM_END."""

    vbucket: int
    opaque: int
    request: StreamReq
    sid: int | None = None
    failover_log: list[tuple[int, int]] = field(default_factory=list)
    last_seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0
    snap_flags: int = 0
    marker_seen: bool = False
    snapshot_open: bool = False
    keys: set[bytes] = field(default_factory=set)
    items: int = 0
    snapshots: int = 0
    snapshots_complete: int = 0
    end_reason: str | None = None


@dataclass(slots=True)
class StreamRun:
    """Consecutive stream messages of one stream, taken and judged by ``Connection.feed_run``.

    ``items``: (opcode, seqno, key, value) per item, key and value sliced from the
    buffer; ``markers``: (items before it, start, end, flags) per snapshot marker;
    ``completed``: the end seqnos of the snapshots its items completed, in order.
    """

    opaque: int
    items: list[tuple[int, int, bytes, bytes]]
    markers: list[tuple[int, int, int, int]]
    completed: list[int]

    @property
    def packets(self) -> int:
        return len(self.items) + len(self.markers)


@dataclass(slots=True)
class _Pending:
    opcode: int
    vbucket: int
    message: Any
    #: The request was malformed (or of an opcode DCP does not know): its answer, if any, is a refusal.
    malformed: bool = False


class Connection:
    """One DCP connection's rules, fed each side's packets in the order each side sent them.

    The judge contract (``wallaroo_proto.judge``): ``feed(side, packet)``, ``end(side, how)``,
    ``expects()``; its sides are ``SIDES`` and every violation names one of ``RULES``.
    """

    SIDES = (CONSUMER, PRODUCER)
    RULES = RULES

    def __init__(self) -> None:
        self.opened: Open | None = None
        self.open_sent = False
        self.controls: dict[str, str] = {}
        self.buffer_size = 0
        self.outstanding = 0
        self.stalls = 0
        self.noop_enabled = False
        self.stream_ids = False
        self.noop_pending: int | None = None
        self.noops = 0
        #: Consumer requests by opaque, each opaque's in the order sent (clients may reuse an opaque,
        #: as java-dcp-client does with 0 for its setup commands; the server answers in order).
        self.pending: dict[int, deque[_Pending]] = {}
        self.streams: dict[int, Stream] = {}  # open streams by opaque
        self.ended: list[Stream] = []
        self.rollbacks: list[tuple[int, int]] = []  # (vbucket, seqno)
        #: The newest failover log the producer gave per vbucket (a stream's or GET_FAILOVER_LOG's).
        self.failover_logs: dict[int, list[tuple[int, int]]] = {}
        self.acked = 0
        #: BUFFER_ACKs not refused: the producer answers an ack only to refuse it (EINVAL before
        #: DCP_OPEN, EACCESS before auth), so each may still get an error response, in any opaque's turn.
        self.acks_unrefused = 0
        self.violations = 0
        #: How each side stopped sending (``end``), by side.
        self.ended_sides: dict[str, End] = {}

    # --------------------------------------------------------------------------------- helpers

    def _verdict(
        self,
        side: str,
        p: Packet,
        msg: Any,
        reasons: Reasons,
        event: str | None = None,
        request_opcode: int | None = None,
        vbucket: int | None = None,
        finding: tuple[str, str] | None = None,
    ) -> Verdict:
        if reasons:
            self.violations += 1
            reason = "; ".join(text for _, text in reasons)
            return Verdict(
                Kind.VIOLATION, side, reasons[0][0], reason, p, msg, event, request_opcode, vbucket, finding
            )
        return Verdict(Kind.ACCEPTED, side, None, None, p, msg, event, request_opcode, vbucket, finding)

    def _malformed(self, side: str, p: Packet | None, err: ProtocolError) -> Verdict:
        self.violations += 1
        return Verdict(Kind.MALFORMED, side, None, str(err), p)

    def malformed(self, side: str, wire: bytes, err: ProtocolError) -> Verdict:
        """A packet whose header ``decode_packet`` refused (its lengths do not add up). A consumer's
        request is still remembered by its opaque: the producer may refuse it with an error status
        (memcached's EINVAL) before it closes, as well as only close (a data node)."""
        if side == CONSUMER and len(wire) >= HEADER_SIZE and wire[0] in codec.REQUEST_MAGICS:
            self._pending_malformed(
                wire[1], int.from_bytes(wire[6:8], "big"), int.from_bytes(wire[12:16], "big")
            )
        return self._malformed(side, None, err)

    def _pending_malformed(self, opcode: int, vbucket: int, opaque: int) -> None:
        self.pending.setdefault(opaque, deque()).append(_Pending(opcode, vbucket, None, True))

    def may_send(self) -> bool:
        """May a stream message go now? Only while under the buffer (so one message may overflow it)."""
        return not self.buffer_size or self.outstanding < self.buffer_size

    def count_sent(self, size: int) -> bool:
        """A stream message of ``size`` wire bytes went out; True when it filled the buffer (a stall)."""
        if not self.buffer_size:
            return False
        self.outstanding += size
        if self.outstanding >= self.buffer_size:
            self.stalls += 1
            return True
        return False

    def end_stream(self, opaque: int, reason: str) -> None:
        """The producer ended a stream it did not ``feed`` message by message."""
        stream = self.streams.pop(opaque, None)
        if stream is not None:
            stream.end_reason = reason
            self.ended.append(stream)

    def stream_for(self, vbucket: int) -> Stream | None:
        for s in self.streams.values():
            if s.vbucket == vbucket:
                return s
        return None

    # --------------------------------------------------------------------------------- the contract

    def feed(self, side: str, p: Packet, *, offset: int = 0) -> Verdict:
        """A packet ``side`` sent (its ``offset`` in that side's stream names where a malformed one is)."""
        if side == PRODUCER:
            return self._from_producer(p, offset)
        if side == CONSUMER:
            return self._from_consumer(p, offset)
        raise ValueError(f"side {side!r} is none of {self.SIDES}")

    def end(self, side: str, how: End = End.CLOSED, partial: int = 0) -> None:
        """``side`` stopped sending. No DCP rule is broken by it: a stream left open or
        mid-snapshot stays so (the summary says "open, mid-snapshot"), and a packet cut
        short is the capture's note, not the peer's violation; from now on ``expects``
        waits for nothing from that side."""
        if side not in self.SIDES:
            raise ValueError(f"unknown side {side!r} (known: {', '.join(self.SIDES)})")
        self.ended_sides[side] = how

    def expects(self) -> Expected:
        """What each side may send now, by its records' ``type``; the text says it for a person."""
        legal: dict[str, frozenset[str]] = {side: frozenset() for side in self.SIDES}
        said = []
        if CONSUMER not in self.ended_sides:
            commands = _CONSUMER_COMMANDS if self.open_sent else _BEFORE_OPEN
            if not self.buffer_size:
                commands = commands - {codec.OPCODES[codec.BUFFER_ACK]}
            if self.noop_pending is not None:
                commands = commands | {"DCP_NOOP_RESPONSE"}
                said.append(f"the consumer's reply to NOOP 0x{self.noop_pending:08x}")
            legal[CONSUMER] = commands
            said.append("a command from the consumer" if self.open_sent else "DCP_OPEN from the consumer")
        if PRODUCER not in self.ended_sides:
            types = {
                f"{codec.OPCODES.get(q[0].opcode, hex(q[0].opcode))}_RESPONSE" for q in self.pending.values()
            }
            if self.pending:
                said.append(f"the producer's answers to {sum(map(len, self.pending.values()))} requests")
            if self.streams:
                if self.may_send():
                    types |= _STREAM_MESSAGE_NAMES
                    said.append(f"stream messages on {len(self.streams)} streams")
                else:
                    said.append("a BUFFER_ACK before more stream messages")
            if self.noop_enabled and self.noop_pending is None:
                types.add(codec.OPCODES[codec.NOOP])
            legal[PRODUCER] = frozenset(types)
        return Expected(legal, ", or ".join(said) if said else "nothing: both sides have ended")

    # --------------------------------------------------------------------------------- consumer

    def _from_consumer(self, p: Packet, offset: int) -> Verdict:
        """A packet the consumer (the side that sent DCP_OPEN) sent."""
        request_opcode = None
        if not p.is_request and p.opcode == codec.NOOP:
            request_opcode = codec.NOOP
        try:
            msg = codec.parse(p, offset, request_opcode)
        except ProtocolError as err:
            if p.is_request:  # refused with EINVAL by the validator: that answer is its
                self._pending_malformed(p.opcode, p.vbucket, p.opaque)
            return self._malformed(CONSUMER, p, err)
        if not p.is_request:
            return self._consumer_response(p, msg)
        reasons: Reasons = []
        op = p.opcode
        if op in codec.STREAM_MESSAGES or op == codec.NOOP:
            reasons.append(("wrong-side", f"{p.name} is the producer's message, sent by the consumer"))
        elif op in _NEEDS_OPEN and not self.open_sent:
            reasons.append(("open-first", f"{p.name} before DCP_OPEN"))
        if op == codec.OPEN:
            self.open_sent = True
        if op == codec.BUFFER_ACK:
            return self._buffer_ack(p, msg, reasons)
        if op == codec.STREAM_REQ:
            if p.opaque in self.pending or p.opaque in self.streams:  # its opaque names its stream
                reasons.append(
                    ("stream-opaque", f"stream request with opaque 0x{p.opaque:08x}, already in use")
                )
            reasons += self._stream_req_rules(p, msg)
        self.pending.setdefault(p.opaque, deque()).append(_Pending(op, p.vbucket, msg))
        return self._verdict(CONSUMER, p, msg, reasons)

    def _stream_req_rules(self, p: Packet, req: StreamReq) -> Reasons:
        problems = []
        if req.start > req.end:
            problems.append(
                ("request-range", f"start {req.start} > end {req.end} (the producer must answer ERANGE)")
            )
        if not req.snap_start <= req.start <= req.snap_end:
            problems.append(
                (
                    "request-range",
                    f"snapshot range {req.snap_start}..{req.snap_end} does not hold start {req.start} "
                    "(the producer must answer ERANGE)",
                )
            )
        return problems

    def _buffer_ack(self, p: Packet, msg: BufferAck, reasons: Reasons) -> Verdict:
        if not self.buffer_size:
            reasons.append(("buffer-ack", "BUFFER_ACK without connection_buffer_size"))
        elif msg.nbytes > self.outstanding:
            reasons.append(
                ("buffer-ack", f"acknowledges {msg.nbytes} bytes, only {self.outstanding} are unacknowledged")
            )
        self.outstanding = max(0, self.outstanding - msg.nbytes)
        self.acked += msg.nbytes
        self.acks_unrefused += 1
        return self._verdict(CONSUMER, p, msg, reasons, event=f"acked {msg.nbytes}")

    def _consumer_response(self, p: Packet, msg: Response) -> Verdict:
        reasons: Reasons = []
        event = None
        if p.opcode == codec.NOOP:
            if self.noop_pending is None:
                reasons.append(("noop-reply", "NOOP reply with no NOOP outstanding"))
            elif p.opaque != self.noop_pending:
                reasons.append(
                    (
                        "noop-reply",
                        f"NOOP reply opaque 0x{p.opaque:08x}, the NOOP's was 0x{self.noop_pending:08x}",
                    )
                )
            self.noop_pending = None
        elif msg.status != SUCCESS:
            event = f"consumer answered {p.name} with {msg.status_name}"
        return self._verdict(CONSUMER, p, msg, reasons, event, p.opcode)

    # --------------------------------------------------------------------------------- producer

    def _from_producer(self, p: Packet, offset: int) -> Verdict:
        """A packet the producer sent."""
        if not p.is_request:
            queue = self.pending.get(p.opaque)
            if (
                p.opcode == codec.BUFFER_ACK
                and p.status != SUCCESS
                and self.acks_unrefused
                and not (queue and queue[0].opcode == codec.BUFFER_ACK)
            ):
                self.acks_unrefused -= 1
                msg = codec.parse(p, offset, codec.BUFFER_ACK)
                event = f"BUFFER_ACK refused: {msg.status_name}"
                return self._verdict(PRODUCER, p, msg, [], event, codec.BUFFER_ACK)
            pending = queue.popleft() if queue else None
            if queue is not None and not queue:
                del self.pending[p.opaque]
            if pending is not None and pending.malformed:  # its status is all a refusal says
                return self._producer_response(p, Response(p.status, value=p.value), pending)
            request_opcode = pending.opcode if pending is not None else None
            try:
                msg = codec.parse(p, offset, request_opcode)
            except ProtocolError as err:
                return self._malformed(PRODUCER, p, err)
            return self._producer_response(p, msg, pending)
        try:
            msg = codec.parse(p, offset)
        except ProtocolError as err:
            return self._malformed(PRODUCER, p, err)
        op = p.opcode
        if op == codec.NOOP:
            reasons: Reasons = []
            if not self.noop_enabled:
                reasons.append(("noop", "NOOP before enable_noop=true"))
            if self.noop_pending is not None:
                reasons.append(("noop", f"NOOP while the NOOP 0x{self.noop_pending:08x} is unanswered"))
            self.noop_pending = p.opaque
            self.noops += 1
            return self._verdict(PRODUCER, p, msg, reasons)
        if op not in codec.STREAM_MESSAGES:
            return self._verdict(
                PRODUCER,
                p,
                msg,
                [("wrong-side", f"{p.name} is the consumer's command, sent by the producer")],
            )
        return self._stream_message(p, msg)

    def feed_run(
        self, buf: bytes, pos: int = 0, max_body: int = 20 * 1024 * 1024
    ) -> tuple[int, list[StreamRun]]:
        """Judge the producer's stream messages at ``buf[pos:]`` in one pass, straight from the bytes.

        Takes whole packets as long as ``feed`` would accept each with no
        violation: MUTATION, DELETION, EXPIRATION and V1 SNAPSHOT_MARKER with magic
        0x80 on an open stream without a stream id, with the same checks (extras and
        key shape, opaque to stream, vbucket, seqno rising and inside the snapshot and
        the stream's end, key once per snapshot, flow control) and the same changes to
        the state. It stops before the first packet it does not take (a violation, a
        partial packet, any other message); the caller ``feed``s that one, which
        gives its verdict, and calls again after it. The seqno and marker rules are
        ``item_window`` and ``marker_fits``, which ``feed`` reads too.

        While consecutive packets stay on one stream, its fields live in locals (the
        checks per item are a few comparisons); the stream is written back when the
        packets move to another stream. Returns the position after the last packet
        taken and one ``StreamRun`` per such stretch, in order.
        """
        runs: list[StreamRun] = []
        start_pos = pos
        buffer_size = self.buffer_size
        outstanding = self.outstanding
        if buffer_size and outstanding >= buffer_size:
            return pos, runs
        # Taking the bytes up to here fills the flow-control window: the packet that reaches it is the last.
        window_end = pos + buffer_size - outstanding if buffer_size else _UNLIMITED
        # A packet whose body is over max_body ends past n, so it is not taken.
        n = min(len(buf), pos + HEADER_SIZE + max_body)
        streams = self.streams
        stalls = 0
        unpack = _RUN_HEAD.unpack_from
        unpack_marker = _MARKER_V1.unpack_from
        try:  # every message taken has more than its header and the first 8 bytes of extras
            magic_op, keylen, extlen, vb, bodylen, opaque, seqno = unpack(buf, pos)
        except struct.error:
            return pos, runs
        while True:
            s = streams.get(opaque)
            if s is None or s.vbucket != vb or s.sid is not None:
                break
            stream_opaque, vbucket = opaque, vb
            last, snap_start, snap_end, flags = s.last_seqno, s.snap_start, s.snap_end, s.snap_flags
            marker_seen, snapshot_open, keys, req_end = s.marker_seen, s.snapshot_open, s.keys, s.request.end
            # An item's seqno must be in (lo, hi]; it completes the snapshot when it is open_end.
            lo, hi = item_window(last, snap_start, snap_end, marker_seen, req_end)
            open_end = snap_end if snapshot_open else -1
            unique = not flags & SNAP_MAY_CONTAIN_DUPLICATES
            room = _KEYS_KEPT - len(keys)
            items: list[tuple[int, int, bytes, bytes]] = []
            markers: list[tuple[int, int, int, int]] = []
            completed: list[int] = []
            append = items.append
            next_stream = False
            while True:
                end = pos + 24 + bodylen
                if end > n:
                    break
                if (
                    magic_op == _REQ_MUTATION
                    and extlen == 31
                    or magic_op == _REQ_DELETION
                    and (extlen == 18 or extlen == 21)
                    or magic_op == _REQ_EXPIRATION
                    and extlen == 20
                ):
                    if not lo < seqno <= hi or not 0 < keylen <= bodylen - extlen:
                        break
                    key_at = pos + 24 + extlen
                    value_at = key_at + keylen
                    key = buf[key_at:value_at]
                    if unique:
                        if key in keys:
                            break
                        if room:
                            keys.add(key)
                            room -= 1
                    append((magic_op & 0xFF, seqno, key, buf[value_at:end]))
                    lo = seqno
                    if seqno == open_end:
                        snapshot_open = False
                        open_end = -1
                        completed.append(seqno)
                elif magic_op == _REQ_MARKER:
                    if extlen != 20 or keylen or bodylen != 20:
                        break
                    if items:
                        last = items[-1][1]
                    start, mark_end, mark_flags = unpack_marker(buf, pos + 24)
                    if not marker_fits(start, mark_end, last, marker_seen, snapshot_open):
                        break
                    snap_start, snap_end, flags = start, mark_end, mark_flags
                    marker_seen = True
                    snapshot_open = mark_end > last
                    keys = set()
                    room = _KEYS_KEPT
                    markers.append((len(items), start, mark_end, mark_flags))
                    lo, hi = item_window(last, start, mark_end, True, req_end)
                    open_end = mark_end if snapshot_open else -1
                    unique = not mark_flags & SNAP_MAY_CONTAIN_DUPLICATES
                else:
                    break
                pos = end
                if pos >= window_end:
                    stalls += 1
                    break
                try:
                    magic_op, keylen, extlen, vb, bodylen, opaque, seqno = unpack(buf, pos)
                except struct.error:
                    break
                if opaque != stream_opaque:
                    next_stream = True
                    break
                if vb != vbucket:
                    break
            if items or markers:
                if items:
                    last = items[-1][1]
                s.last_seqno, s.snap_start, s.snap_end, s.snap_flags = last, snap_start, snap_end, flags
                s.marker_seen, s.snapshot_open, s.keys = marker_seen, snapshot_open, keys
                s.items += len(items)
                s.snapshots += len(markers)
                s.snapshots_complete += len(completed)
                runs.append(StreamRun(stream_opaque, items, markers, completed))
            if not next_stream:
                break
        if buffer_size:
            self.outstanding = outstanding + pos - start_pos
            self.stalls += stalls
        return pos, runs

    def _producer_response(self, p: Packet, msg: Response, pending: _Pending | None) -> Verdict:
        if pending is None:
            reason = f"response opaque 0x{p.opaque:08x} answers no request"
            return self._verdict(PRODUCER, p, msg, [("response-unsolicited", reason)])
        vb = pending.vbucket
        if pending.opcode != p.opcode:
            reason = (
                f"{p.name} response to a {codec.OPCODES.get(pending.opcode, hex(pending.opcode))} request"
            )
            reasons: Reasons = [("response-opcode", reason)]
            return self._verdict(PRODUCER, p, msg, reasons, request_opcode=pending.opcode, vbucket=vb)
        if pending.malformed:
            if msg.status == SUCCESS:
                reasons = [("malformed-accepted", f"{p.name} SUCCESS to a malformed request")]
                return self._verdict(PRODUCER, p, msg, reasons, request_opcode=pending.opcode, vbucket=vb)
            event = f"malformed request refused: {msg.status_name}"
            return self._verdict(PRODUCER, p, msg, [], event, pending.opcode, vb)
        reasons = []
        event = finding = None
        ok = msg.status == SUCCESS
        if p.opcode == codec.OPEN and ok:
            self.opened = pending.message
        elif p.opcode == codec.CONTROL and ok:
            self._apply_control(pending.message)
        elif p.opcode == codec.STREAM_REQ:
            event, reasons, finding = self._stream_req_answer(p, msg, pending)
        elif p.opcode == codec.CLOSE_STREAM and ok:
            # Closed now, unless a STREAM_END (closed) is to follow, which ends it then.
            stream = self.stream_for(vb)
            if stream is not None and self.controls.get("send_stream_end_on_client_close_stream") != "true":
                self.end_stream(stream.opaque, "closed")
        elif p.opcode == codec.GET_FAILOVER_LOG and ok and msg.failover_log:
            self.failover_logs[vb] = msg.failover_log
        elif not ok:
            event = f"{msg.status_name}"
            finding = _refusal(p.name, vb if p.opcode in _VBUCKET_REQUESTS else None, msg)
        return self._verdict(PRODUCER, p, msg, reasons, event, pending.opcode, vb, finding)

    def _apply_control(self, c: Control) -> None:
        self.controls[c.key] = c.value
        size = parse_u32(c.value) if c.key == "connection_buffer_size" else None
        if size is not None:
            self.buffer_size = size
            if not self.buffer_size:
                self.outstanding = 0
        elif c.key == "enable_noop":
            self.noop_enabled = c.value == "true"
        elif c.key == "enable_stream_id" and c.value == "true":
            self.stream_ids = True

    def _stream_req_answer(
        self, p: Packet, msg: Response, pending: _Pending
    ) -> tuple[str | None, Reasons, tuple[str, str] | None]:
        req: StreamReq = pending.message
        vb = pending.vbucket
        bad_range = req.start > req.end or not req.snap_start <= req.start <= req.snap_end
        if msg.status == codec.ROLLBACK:
            seqno = msg.rollback_seqno or 0
            self.rollbacks.append((vb, seqno))
            problems: Reasons = []
            if seqno > req.start:
                problems.append(("rollback", f"rollback to {seqno}, after the requested start {req.start}"))
            if req.start == 0 and req.vbucket_uuid == 0:
                problems.append(
                    ("rollback", "rollback of a request from seqno 0 (such a request never rolls back)")
                )
            return f"rollback to {seqno}", problems, ("warning", self._rollback_cause(vb, req, seqno))
        if msg.status != SUCCESS:
            return f"stream request {msg.status_name}", [], _refusal("stream request", vb, msg)
        problems = []
        if bad_range:
            problems.append(
                ("range-accepted", "stream request with a bad seqno range accepted (must be ERANGE)")
            )
        log = msg.failover_log or []
        if not log:
            problems.append(("failover-log", "stream accepted with an empty failover log"))
        if any(u == 0 for u, _ in log):
            problems.append(("failover-log", "failover log entry with vbucket uuid 0"))
        if any(log[i][1] < log[i + 1][1] for i in range(len(log) - 1)):
            problems.append(("failover-log", "failover log not newest first (seqnos must not increase)"))
        if self.stream_for(vb) is not None:
            problems.append(
                ("stream-per-vbucket", f"a second stream for vbucket {vb} accepted (must be KEY_EEXISTS)")
            )
        if log:
            self.failover_logs[vb] = log
        sid = _json_sid(req.json)
        stream = Stream(vb, p.opaque, req, sid, log, req.start, req.snap_start, req.snap_end)
        self.streams[p.opaque] = stream
        return f"stream open from {req.start}", problems, None

    def _rollback_cause(self, vb: int, req: StreamReq, seqno: int) -> str:
        """Why vbucket ``vb`` rolls back, from what the request asked and the server's rule
        (``needs_rollback``): to the start of a snapshot the consumer had not completed, or to
        where the producer's history with the consumer's uuid ends."""
        asked = (
            f"vb {vb} rolls back to {seqno}: the consumer asked to resume at {req.start} "
            f"(snapshot {req.snap_start}..{req.snap_end}) with vbucket uuid 0x{req.vbucket_uuid:016x}"
        )
        log = self.failover_logs.get(vb)
        shown = f"; the failover log seen last, newest first: {_failover(log)}" if log else ""
        if seqno == req.snap_start < req.start:
            return (
                f"{asked}, inside a snapshot it had not completed; the producer's history with that uuid "
                f"reaches the snapshot's start, so the consumer resumes from there{shown}"
            )
        if log and any(entry_seqno == seqno for _, entry_seqno in log):
            ends = f"the producer's failover log branches at {seqno}, after which that history is not its own"
        elif seqno == 0:
            ends = "the producer holds no history with that uuid (none in its failover log, or purged)"
        else:
            ends = (
                f"the producer's history with that uuid goes no further than {seqno} (where its "
                "failover log moves to a newer uuid, or its last seqno)"
            )
        return f"{asked}; {ends}{shown}"

    def _stream_message(self, p: Packet, msg: Any) -> Verdict:
        reasons: Reasons = []
        event = None
        if self.buffer_size:
            if not self.may_send():
                full = (
                    f"sent with {self.outstanding} bytes unacknowledged of a {self.buffer_size}-byte buffer"
                )
                reasons.append(("flow-control", full))
            if self.count_sent(p.size):
                event = "buffer full"
        stream = self.streams.get(p.opaque)
        if stream is None:
            reasons.append(("no-stream", f"{p.name} on opaque 0x{p.opaque:08x}: no open stream"))
            return self._verdict(PRODUCER, p, msg, reasons, event)
        if p.vbucket != stream.vbucket:
            reasons.append(
                ("stream-vbucket", f"vbucket {p.vbucket} on the stream of vbucket {stream.vbucket}")
            )
        sid = codec.stream_id_of(p)
        if sid != stream.sid:
            reasons.append(("stream-id", f"stream id {sid} on the stream opened with {stream.sid}"))
        if isinstance(msg, SnapshotMarker):
            event = self._marker(stream, msg, reasons) or event
        elif isinstance(msg, (Mutation, Deletion, Expiration, SeqnoAdvanced)):
            event = self._item(stream, msg, reasons) or event
        elif isinstance(msg, StreamEnd):
            if msg.reason == codec.END_OK and stream.snapshot_open:
                reasons.append(
                    (
                        "snapshot-incomplete",
                        f"STREAM_END ok inside the snapshot {stream.snap_start}..{stream.snap_end} "
                        f"(last seqno {stream.last_seqno})",
                    )
                )
            stream.end_reason = msg.reason_name
            del self.streams[p.opaque]
            self.ended.append(stream)
            event = f"stream end {msg.reason_name}"
            why = _END_WHY.get(msg.reason)
            if why is not None or msg.reason_name.startswith("unknown"):
                text = f"the producer ended the stream of vb {stream.vbucket} at seqno {stream.last_seqno}: "
                finding = ("warning", text + (why or msg.reason_name))
                return self._verdict(PRODUCER, p, msg, reasons, event, finding=finding)
        return self._verdict(PRODUCER, p, msg, reasons, event)

    def _marker(self, s: Stream, m: SnapshotMarker, reasons: Reasons) -> str | None:
        if not marker_fits(m.start, m.end, s.last_seqno, s.marker_seen, s.snapshot_open):
            reasons += marker_reasons(s, m.start, m.end)
        s.snap_start, s.snap_end, s.snap_flags = m.start, m.end, m.flags
        s.marker_seen = True
        s.snapshot_open = m.end > s.last_seqno
        s.keys = set()
        s.snapshots += 1
        return f"snapshot {m.start}..{m.end}"

    def _item(self, s: Stream, m: Any, reasons: Reasons) -> str | None:
        seqno = m.seqno
        lo, hi = item_window(s.last_seqno, s.snap_start, s.snap_end, s.marker_seen, s.request.end)
        if not lo < seqno <= hi:
            reasons += item_reasons(s, seqno)
        key = getattr(m, "key", None)
        if key is not None and not s.snap_flags & SNAP_MAY_CONTAIN_DUPLICATES:
            if key in s.keys:
                reasons.append(
                    ("duplicate-key", f"key {key!r} twice in the snapshot {s.snap_start}..{s.snap_end}")
                )
            elif len(s.keys) < _KEYS_KEPT:
                s.keys.add(key)
        s.last_seqno = max(s.last_seqno, seqno)
        if not isinstance(m, SeqnoAdvanced):
            s.items += 1
        if s.snapshot_open and seqno == s.snap_end:
            s.snapshot_open = False
            s.snapshots_complete += 1
            return "snapshot complete"
        return None


def _json_sid(raw: bytes) -> int | None:
    if not raw:
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    sid = obj.get("sid") if isinstance(obj, dict) else None
    return sid if isinstance(sid, int) else None


_AUTH_CONTINUE = 0x21
#: Requests about one vbucket, whose header's vbucket a refusal names.
_VBUCKET_REQUESTS = frozenset({codec.STREAM_REQ, codec.CLOSE_STREAM, codec.GET_FAILOVER_LOG})

#: Why a producer ends a stream, for the reasons a consumer must act on (ok and closed are routine).
_END_WHY = {
    codec.END_STATE_CHANGED: (
        "state_changed (the vbucket changed state; KV also ends a stream so for a rollback): "
        "the consumer asks again, and may be told to roll back"
    ),
    codec.END_DISCONNECTED: "disconnected (the producer is closing the connection)",
    codec.END_TOO_SLOW: "too_slow (the consumer did not read fast enough; it must ask again)",
    5: "backfill_failed (the producer could not read the vbucket's history from disk)",
    6: "rollback (the vbucket rolled back; a new request learns where to)",
    7: "filter_empty (every collection the stream filtered on was dropped)",
    8: "lost_privileges (the connection may no longer read this bucket)",
}


def _failover(log: list[tuple[int, int]]) -> str:
    entries = [f"0x{uuid:016x} from {seqno}" for uuid, seqno in log[:4]]
    return ", ".join(entries) + (f", ... ({len(log)} entries)" if len(log) > 4 else "")


def _refusal(what: str, vb: int | None, msg: Response) -> tuple[str, str] | None:
    """A request the producer refused: which, for which vbucket, and what its status means
    (None for AUTH_CONTINUE, a SASL exchange's next step and no refusal)."""
    status = msg.status_name
    if msg.status == _AUTH_CONTINUE:
        return None
    on = f" for vb {vb}" if vb is not None else ""
    if msg.status == codec.NOT_MY_VBUCKET:
        which = f"vb {vb}" if vb is not None else "that vbucket"
        serves = f"this node does not serve {which} (not here, or not active or replica)"
        return "warning", f"{what}{on} refused NOT_MY_VBUCKET: {serves}"
    return "warning", f"{what}{on} refused: {status}"
