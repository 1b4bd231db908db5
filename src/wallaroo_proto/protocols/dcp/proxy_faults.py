"""DCP under the proxy's fault rules: its packets as frames, and the faults a DCP consumer fears.

The adapter cuts each direction into memcached binary packets with the codec's
``PacketSplitter`` and names their fields as ``dissect`` does. The proxy's client is
the consumer (it connects to the producer's KV port). The adapter keeps what later
packets need from earlier ones: the vbucket of each stream, close-stream and
failover-log request by its opaque (their answers carry none, so they get it as a
field), whether flow control is on, each vbucket's newest uuid, and the streams a
fault ended. Sans-IO, as ``proxy.faultkit`` asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wallaroo_proto.proxy.faultkit import FaultError, Frame, NamedFault, Send

from . import codec
from .codec import Packet, PacketSplitter, ProtocolError, decode_packet
from .core import CONSUMER, PRODUCER
from .dissect import message_fields, packet_fields, type_name

#: Requests awaiting their answer remembered by opaque at most; the oldest go first.
MAX_OPAQUES = 4096
#: A vbucket id no bucket has (at most 1024): a producer answers NOT_MY_VBUCKET for it.
NO_VBUCKET = 0xFFFF
#: The opaques of the close-stream requests the proxy itself sends upstream start here.
PROXY_OPAQUE = 0xDC9F_0000


class DcpAdapter:
    """One proxied DCP connection, for the fault rules."""

    def __init__(self) -> None:
        self._splitters = {True: PacketSplitter(), False: PacketSplitter()}
        #: A direction whose bytes stopped being packets: each later read passes as one frame.
        self._raw = {True: False, False: False}
        #: The client's requests that name a vbucket, until answered: opaque -> (opcode, vbucket).
        self.requests: dict[int, tuple[int, int]] = {}
        #: Is ``connection_buffer_size`` above 0 (asked by the client, and not refused)?
        self.flow_control = False
        self._buffer_opaque: int | None = None
        self._buffer_size = 0
        #: Each vbucket's newest uuid, from the failover logs the producer gave.
        self.vb_uuids: dict[int, int] = {}
        #: Streams a fault ended, by opaque; and the close-stream requests the proxy sent.
        self.ended: set[int] = set()
        self.closing: dict[int, int] = {}
        #: How many streams each stream-end rule (by its parameters' identity) has ended.
        self.ends_by_rule: dict[int, int] = {}
        self._next_opaque = PROXY_OPAQUE

    # ------------------------------------------------------------------ framing

    def frames(self, from_client: bool, data: bytes) -> list[bytes]:
        """Whole packets; after a bad header, the rest of the direction as it comes (type INVALID)."""
        if self._raw[from_client]:
            return [data] if data else []
        splitter = self._splitters[from_client]
        held = len(splitter.buf)
        # Held bytes as long as a header have had that header read, so a bad header is found in
        # them only when they are fewer: only those few are copied, to go on with the rest.
        short = bytes(splitter.buf) if held < codec.HEADER_SIZE else b""
        try:
            return [wire for _, wire in splitter.feed(data)]
        except ProtocolError as err:
            good = [wire for _, wire in err.packets]
            rest = (short + data)[sum(map(len, good)) - held + len(short) :]
            self._raw[from_client] = True
            return [*good, rest] if rest else good

    def tail(self, from_client: bool) -> bytes:
        """The part of a packet not yet whole in this direction: at its end, a packet cut short."""
        return b"" if self._raw[from_client] else bytes(self._splitters[from_client].buf)

    # ------------------------------------------------------------------ fields

    def fields(self, frame: bytes, from_client: bool) -> dict[str, Any]:
        """``type`` and the record fields ``dissect`` gives the packet; INVALID when it is none."""
        record: dict[str, Any] = {"sender": CONSUMER if from_client else PRODUCER}
        try:
            p = decode_packet(frame)
            msg = codec.parse(p)
        except (ValueError, IndexError):  # ProtocolError is a ValueError
            record["type"] = "INVALID"
            return record
        record["type"] = type_name(p)
        packet_fields(record, p)
        message_fields(record, p, msg)
        self._follow(p, msg, from_client, record)
        return record

    def _follow(self, p: Packet, msg: Any, from_client: bool, record: dict[str, Any]) -> None:
        """What later packets need: a request's vbucket, flow control, a vbucket's uuid."""
        if from_client and p.is_request:
            if p.opcode in (codec.STREAM_REQ, codec.CLOSE_STREAM, codec.GET_FAILOVER_LOG):
                self._remember(self.requests, p.opaque, (p.opcode, p.vbucket))
            elif isinstance(msg, codec.Control) and msg.key == "connection_buffer_size":
                self._buffer_opaque = p.opaque
                self._buffer_size = int(msg.value) if msg.value.isdigit() else 0
            return
        if p.is_request or from_client:
            return
        if p.opaque in self.closing:
            record["vbucket"] = self.closing[p.opaque]
            return
        if p.opcode == codec.CONTROL and p.opaque == self._buffer_opaque:
            self.flow_control = p.status == codec.SUCCESS and self._buffer_size > 0
        asked = self.requests.pop(p.opaque, None)
        if asked is not None:
            record["vbucket"] = asked[1]
            if msg.failover_log:
                self.vb_uuids[asked[1]] = msg.failover_log[0][0]

    @staticmethod
    def _remember(table: dict, key: int, value: Any) -> None:
        table.pop(key, None)
        table[key] = value
        if len(table) > MAX_OPAQUES:
            del table[next(iter(table))]

    def close_stream(self, vbucket: int, opaque: int, sid: int | None) -> bytes:
        """The close-stream request the proxy sends upstream for a stream it ended."""
        self.ended.add(opaque)
        ours = self._next_opaque
        self._next_opaque = PROXY_OPAQUE | ((self._next_opaque + 1) & 0xFFFF)
        self._remember(self.closing, ours, vbucket)
        return codec.request(codec.CLOSE_STREAM, vbucket=vbucket, opaque=ours, sid=sid)

    # ------------------------------------------------------------------ rewriting

    def rewrite(self, frame: Frame, field_name: str, value: Any) -> bytes:
        """The packet with one field changed, re-encoded (the body length follows the value)."""
        p = _packet(frame)
        setter = _SETTERS.get(field_name)
        if setter is None or not setter[0](p):
            can = [name for name, (applies, _) in _SETTERS.items() if applies(p)]
            raise FaultError(
                f"{frame.fields.get('type', 'this packet')} has no {field_name} to rewrite "
                f"(its rewritable fields: {', '.join(can) or 'none'})"
            )
        setter[1](p, value)
        return codec.encode(p)

    def error_frame(self, reason: str, to_client: bool) -> bytes | None:
        """None: DCP has no message for a broken peer; a data node closes the connection."""
        return None


def adapter() -> DcpAdapter:
    return DcpAdapter()


# ---------------------------------------------------------------------- rewriting, field by field


def _uint(value: Any, bits: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << bits:
        raise FaultError(f"{name} must be an integer from 0 to {(1 << bits) - 1}, not {value!r}")
    return value


def _named(value: Any, names: Mapping[int, str], bits: int, name: str) -> int:
    if isinstance(value, str):
        for number, known in names.items():
            if known.lower() == value.lower():
                return number
        raise FaultError(f"{name} {value!r} is none of {', '.join(names.values())}")
    return _uint(value, bits, name)


def _extras_u64(at: int):
    def put(p: Packet, value: Any) -> None:
        p.extras = p.extras[:at] + _uint(value, 64, "the value").to_bytes(8, "big") + p.extras[at + 8 :]

    return put


_ITEMS = (codec.MUTATION, codec.DELETION, codec.EXPIRATION)


def _request(*opcodes: int, extras: int | None = None):
    def applies(p: Packet) -> bool:
        return p.is_request and p.opcode in opcodes and (extras is None or len(p.extras) == extras)

    return applies


def _set_status(p: Packet, value: Any) -> None:
    p.vbucket = _named(value, codec.STATUSES, 16, "status")


def _set_rollback(p: Packet, value: Any) -> None:
    p.value = _uint(value, 64, "rollback_seqno").to_bytes(8, "big")


def _set_vbucket(p: Packet, value: Any) -> None:
    p.vbucket = _uint(value, 16, "vbucket")


def _set_opaque(p: Packet, value: Any) -> None:
    p.opaque = _uint(value, 32, "opaque")


def _set_ack(p: Packet, value: Any) -> None:
    p.extras = _uint(value, 32, "ack_bytes").to_bytes(4, "big")


def _set_reason(p: Packet, value: Any) -> None:
    p.extras = _named(value, codec.END_REASONS, 32, "end_reason").to_bytes(4, "big")


def _set_snap_flags(p: Packet, value: Any) -> None:
    p.extras = p.extras[:16] + _uint(value, 32, "snap_flags").to_bytes(4, "big")


def _set_control_value(p: Packet, value: Any) -> None:
    p.value = str(value).lower().encode("ascii") if isinstance(value, bool) else str(value).encode("ascii")


#: field -> (does this packet have it, set it). Snapshot markers: V1 (extras of 20) only.
_SETTERS = {
    "seqno": (_request(*_ITEMS, codec.SEQNO_ADVANCED, codec.SYSTEM_EVENT), _extras_u64(0)),
    "rev_seqno": (_request(*_ITEMS), _extras_u64(8)),
    "snap_start": (_request(codec.SNAPSHOT_MARKER, extras=20), _extras_u64(0)),
    "snap_end": (_request(codec.SNAPSHOT_MARKER, extras=20), _extras_u64(8)),
    "snap_flags": (_request(codec.SNAPSHOT_MARKER, extras=20), _set_snap_flags),
    "start_seqno": (_request(codec.STREAM_REQ), _extras_u64(8)),
    "end_seqno": (_request(codec.STREAM_REQ), _extras_u64(16)),
    "vb_uuid": (_request(codec.STREAM_REQ), _extras_u64(24)),
    "ack_bytes": (_request(codec.BUFFER_ACK), _set_ack),
    "end_reason": (_request(codec.STREAM_END), _set_reason),
    "control_value": (_request(codec.CONTROL), _set_control_value),
    "vbucket": (lambda p: p.is_request, _set_vbucket),
    "status": (lambda p: not p.is_request, _set_status),
    "rollback_seqno": (
        lambda p: not p.is_request and p.opcode == codec.STREAM_REQ and p.status == codec.ROLLBACK,
        _set_rollback,
    ),
    "opaque": (lambda p: True, _set_opaque),
}


# ---------------------------------------------------------------------- named faults


def _packet(frame: Frame) -> Packet:
    try:
        return decode_packet(frame.data)
    except ProtocolError as err:
        raise FaultError(f"not a DCP packet: {err}") from None


def _stream_req(frame: Frame) -> tuple[Packet, codec.StreamReq]:
    p = _packet(frame)
    if not (p.is_request and p.opcode == codec.STREAM_REQ):
        raise FaultError(f"acts at stream requests, not at {frame.fields.get('type')}")
    try:
        return p, codec.parse(p)
    except ProtocolError as err:
        raise FaultError(str(err)) from None


def _instead(p: Packet, req: codec.StreamReq, what: str, vbucket: int | None = None) -> list[Send]:
    """The client's stream request, changed, to the producer: its answer comes back in its place."""
    p.extras = codec.stream_req_request(0, 0, req)[codec.HEADER_SIZE : codec.HEADER_SIZE + 48]
    if vbucket is not None:
        p.vbucket = vbucket
    return [Send(True, codec.encode(p), what)]


def _rollback(frame: Frame, params: Mapping[str, Any], adapter: DcpAdapter) -> list[Send]:
    """A request the producer's own rollback rule answers ROLLBACK to ``seqno``: from ``seqno`` + 1
    inside a snapshot that starts at ``seqno`` and has no end, of its newest vbucket uuid (for 0,
    of uuid 0, which no failover log holds)."""
    seqno = _uint(params["seqno"], 64, "seqno")
    p, req = _stream_req(frame)
    if req.start == 0 and req.vbucket_uuid == 0:
        raise FaultError("a request from seqno 0 with no vbucket uuid is never rolled back")
    if seqno > req.start:
        raise FaultError(f"seqno {seqno} is past the request's start {req.start}: a rollback goes back")
    if seqno == 0:
        uuid = 0
    elif p.vbucket in adapter.vb_uuids:
        uuid = adapter.vb_uuids[p.vbucket]
    else:
        raise FaultError(
            f"seqno {seqno} needs vbucket {p.vbucket}'s uuid, and the producer has not given its "
            "failover log on this connection yet (seqno 0 needs none)"
        )
    changed = codec.StreamReq(req.flags, seqno + 1, codec.FOREVER, uuid, seqno, codec.FOREVER, req.json)
    return _instead(p, changed, f"the stream request changed so that the producer rolls it back to {seqno}")


def _not_my_vbucket(frame: Frame, params: Mapping[str, Any], adapter: DcpAdapter) -> list[Send]:
    """The request for a vbucket no node holds: the producer answers NOT_MY_VBUCKET, with its body."""
    p, req = _stream_req(frame)
    return _instead(p, req, f"the stream request for vbucket {NO_VBUCKET}, which no node holds", NO_VBUCKET)


def _stream_end(frame: Frame, params: Mapping[str, Any], adapter: DcpAdapter) -> list[Send]:
    """The stream of the matched message ended toward the client, closed upstream; its later
    messages (and the answer to the close) withheld. A rule ends ``streams`` streams at most."""
    reason = _named(params["reason"], codec.END_REASONS, 32, "reason")
    p = _packet(frame)
    if p.is_request and p.opaque in adapter.ended or not p.is_request and p.opaque in adapter.closing:
        if not p.is_request:
            adapter.closing.pop(p.opaque, None)
        return _acked(adapter, p, len(frame.data))
    if not (p.is_request and p.opcode in codec.STREAM_MESSAGES):
        raise FaultError("passed on: no stream's message")
    done = adapter.ends_by_rule.get(id(params), 0)
    if done >= params["streams"]:
        raise FaultError(f"passed on: this rule has ended its {done} stream(s)")
    adapter.ends_by_rule[id(params)] = done + 1
    sid = codec.stream_id_of(p)
    end = codec.stream_end(p.vbucket, p.opaque, reason, sid)
    close = adapter.close_stream(p.vbucket, p.opaque, sid)
    # Closed upstream before the client hears of it, so that the producer has closed the stream
    # by the time the client may ask for it again. The client acknowledges the end it gets instead
    # of this message; the rest of the message the proxy acknowledges.
    return [
        Send(True, close, f"a CLOSE_STREAM of vbucket {p.vbucket}"),
        Send(False, end, f"a STREAM_END ({params['reason']}) of vbucket {p.vbucket}"),
        *_acked(adapter, p, len(frame.data) - len(end)),
    ]


def _acked(adapter: DcpAdapter, p: Packet, nbytes: int) -> list[Send]:
    """Withheld bytes of a stream, acknowledged upstream as the client would have (flow control on)."""
    if adapter.flow_control and p.is_request and p.opcode in codec.STREAM_MESSAGES and nbytes > 0:
        return [
            Send(True, codec.buffer_ack(nbytes), f"a BUFFER_ACKNOWLEDGEMENT of the {nbytes} bytes withheld")
        ]
    return []


_STREAM_TYPES = " ".join(f'"{codec.OPCODES[op]}"' for op in sorted(codec.STREAM_MESSAGES))

NAMED_FAULTS: dict[str, NamedFault] = {
    "rollback": NamedFault(
        help="a stream request changed so that the producer answers ROLLBACK to seqno (default 0)",
        where='type == "DCP_STREAM_REQ"',
        params={"seqno": (int, 0)},
        act=_rollback,
        direction="upstream",
    ),
    "not-my-vbucket": NamedFault(
        help="a stream request changed so that the producer answers NOT_MY_VBUCKET (with its cluster map)",
        where='type == "DCP_STREAM_REQ"',
        act=_not_my_vbucket,
        direction="upstream",
    ),
    "stream-end": NamedFault(
        help="the matched packet's stream ended toward the client (STREAM_END with reason, default "
        "state_changed) and closed upstream; its later packets withheld",
        where=f'type in {{{_STREAM_TYPES} "DCP_CLOSE_STREAM_RESPONSE"}}',
        params={"reason": (str, "state_changed"), "streams": (int, 1)},
        act=_stream_end,
        direction="client",
    ),
    "stall-buffer-ack": NamedFault(
        help="the client's buffer acknowledgements withheld: the producer's window fills and it stops",
        where='type == "DCP_BUFFER_ACKNOWLEDGEMENT"',
        action="drop",
        direction="upstream",
    ),
}
