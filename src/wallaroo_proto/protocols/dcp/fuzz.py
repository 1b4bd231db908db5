"""Fuzzing Couchbase DCP: its packets' fields, what a peer owes, how it refuses.

The layout is the memcached binary header (``codec.py``, shared/protocols/dcp.md): magic,
opcode, key length (with magic 0x08/0x18: framing extras length, then a one-byte key length),
extras length, datatype, vbucket (a response's status), body length, opaque, cas; the extras
begin after the framing extras. What a peer owes is the spec's: every consumer command but
BUFFER_ACK gets its response (an error status is one), a producer's NOOP a NOOP reply, a
snapshot marker with the ack flag (0x08) a marker reply. A refusal is a response with an
error status; a peer that closes has refused too (a data node answers a bad request with
EINVAL but drops a connection whose framing is wrong, so neither side must reply first).
"""

from __future__ import annotations

from wallaroo_proto.fuzz.hooks import Field, Owed, laid_out

from . import codec
from .codec import StreamReq

#: Extras fields by opcode, each (name, kind, offset in the extras, bits), taken only when the
#: extras have the length the layout is for.
_EXTRAS: dict[int, tuple[int, tuple[tuple[str, str, int, int], ...]]] = {
    codec.OPEN: (8, (("open_seqno", "uint", 0, 32), ("open_flags", "enum", 4, 32))),
    codec.STREAM_REQ: (
        48,
        (
            ("stream_flags", "enum", 0, 32),
            ("start_seqno", "id", 8, 64),
            ("end_seqno", "id", 16, 64),
            ("vb_uuid", "uint", 24, 64),
            ("snap_start", "id", 32, 64),
            ("snap_end", "id", 40, 64),
        ),
    ),
    codec.SNAPSHOT_MARKER: (
        20,
        (("snap_start", "id", 0, 64), ("snap_end", "id", 8, 64), ("snap_flags", "enum", 16, 32)),
    ),
    codec.MUTATION: (31, (("seqno", "id", 0, 64), ("rev_seqno", "uint", 8, 64))),
    codec.DELETION: (18, (("seqno", "id", 0, 64), ("rev_seqno", "uint", 8, 64))),
    codec.EXPIRATION: (20, (("seqno", "id", 0, 64), ("rev_seqno", "uint", 8, 64))),
    codec.SEQNO_ADVANCED: (8, (("seqno", "id", 0, 64),)),
    codec.STREAM_END: (4, (("end_reason", "enum", 0, 32),)),
    codec.BUFFER_ACK: (4, (("ack_bytes", "credit", 0, 32),)),
}
#: Statuses that are no refusal: success, a SCRAM step to come, a stream request's ROLLBACK.
_NOT_REFUSALS = frozenset(("SUCCESS", "AUTH_CONTINUE", "ROLLBACK"))
#: Consumer requests a producer never answers.
_UNANSWERED = frozenset(("DCP_BUFFER_ACKNOWLEDGEMENT",))
_CONSUMER_COMMANDS = frozenset(
    name for op, name in codec.OPCODES.items() if op not in codec.STREAM_MESSAGES and op != codec.NOOP
)


def fields(record: dict, raw: bytes) -> list[Field]:
    """The header's fields, and the extras' seqnos, ranges, flags, reasons and acknowledged bytes."""
    if len(raw) < codec.HEADER_SIZE:
        return []
    magic, opcode = raw[0], raw[1]
    alt = magic in (codec.ALT_REQ, codec.ALT_RES)
    layout: list[tuple[str, str, int, int]] = [("magic", "enum", 0, 8), ("opcode", "enum", 1, 8)]
    if alt:
        layout += [("framing_length", "length", 2, 8), ("key_length", "length", 3, 8)]
    else:
        layout.append(("key_length", "length", 2, 16))
    request = magic in codec.REQUEST_MAGICS
    layout += [
        ("extras_length", "length", 4, 8),
        ("datatype", "enum", 5, 8),
        ("vbucket", "id", 6, 16) if request else ("status", "enum", 6, 16),
        ("body_length", "length", 8, 32),
        ("opaque", "id", 12, 32),
        ("cas", "uint", 16, 64),
    ]
    extras_at = codec.HEADER_SIZE + (raw[2] if alt else 0)
    size, extras = _EXTRAS.get(opcode, (-1, ()))
    if request and raw[4] == size:
        layout += [(name, kind, extras_at + at, bits) for name, kind, at, bits in extras]
    return laid_out(raw, layout)


def templates(side: str) -> dict[str, bytes]:
    """One well-formed packet of each DCP type ``side`` sends (vbucket 0): a producer's stream
    messages, NOOP and answers; a consumer's DCP commands and NOOP reply. The setup commands
    (HELLO, SASL, ...) are left out: every seed has them, and a DCP command out of state (a
    CLOSE_STREAM while streaming) is what the inserts are for."""
    if side == "producer":
        r = codec.response
        frames = {
            "DCP_NOOP": codec.noop(0x1234),
            "DCP_SNAPSHOT_MARKER": codec.snapshot_marker(0, 0, 1, 2, codec.SNAP_MEMORY),
            "DCP_MUTATION": codec.mutation(0, 0, 1, 1, b"fuzz", b'{"fuzz":1}'),
            "DCP_DELETION": codec.deletion(0, 0, 1, 1, b"fuzz"),
            "DCP_EXPIRATION": codec.expiration(0, 0, 1, 1, b"fuzz"),
            "DCP_SEQNO_ADVANCED": codec.seqno_advanced(0, 0, 1),
            "DCP_STREAM_END": codec.stream_end(0, 0, codec.END_OK),
            "DCP_SET_VBUCKET_STATE": codec.request(codec.SET_VBUCKET_STATE, extras=b"\x01"),
            "DCP_STREAM_REQ_RESPONSE": r(codec.STREAM_REQ, value=codec.failover_log_value([(1, 0)])),
            "DCP_CONTROL_RESPONSE": r(codec.CONTROL),
            "DCP_OPEN_RESPONSE": r(codec.OPEN),
        }
        return frames
    req = StreamReq(0, 0, codec.FOREVER, 0, 0, 0)
    return {
        "DCP_OPEN": codec.open_request("fuzz"),
        "DCP_CONTROL": codec.control_request("enable_noop", "true"),
        "DCP_STREAM_REQ": codec.stream_req_request(0, 0xF0220000, req),
        "DCP_CLOSE_STREAM": codec.request(codec.CLOSE_STREAM),
        "DCP_GET_FAILOVER_LOG": codec.request(codec.GET_FAILOVER_LOG),
        "DCP_BUFFER_ACKNOWLEDGEMENT": codec.buffer_ack(1),
        "DCP_NOOP_RESPONSE": codec.response(codec.NOOP),
    }


def owed(record: dict) -> Owed | None:
    """A consumer command is owed its response; a NOOP its reply; an acking marker its reply."""
    kind = record.get("type")
    if kind == "DCP_NOOP" or (kind in _CONSUMER_COMMANDS and kind not in _UNANSWERED):
        return Owed(frozenset({f"{kind}_RESPONSE"}))
    if kind == "DCP_SNAPSHOT_MARKER" and (record.get("snap_flags") or 0) & codec.SNAP_ACK:
        return Owed(frozenset({"DCP_SNAPSHOT_MARKER_RESPONSE"}))
    return None


def refusal(record: dict) -> bool:
    """A response with an error status (EINVAL, KEY_ENOENT, ERANGE, ...)."""
    status = record.get("status")
    return (
        str(record.get("type", "")).endswith("_RESPONSE")
        and status is not None
        and status not in _NOT_REFUSALS
    )


def tolerated(record: dict) -> bool:
    """A BUFFER_ACK of more bytes than are unacknowledged, or with flow control off: a data node
    logs it and goes on (``BufferLog::acknowledge``), so going on is no acceptance of it."""
    texts = record.get("violations") or ()
    return (
        record.get("type") == "DCP_BUFFER_ACKNOWLEDGEMENT"
        and record.get("verdict") == "violation"
        and bool(texts)
        and all("unacknowledged" in t or "without connection_buffer_size" in t for t in texts)
    )


#: Neither side must answer an illegal packet before it closes (see the module's docstring).
REPLY_BEFORE_CLOSE: frozenset[str] = frozenset()
