"""Couchbase DCP on the memcached binary protocol: packets and DCP messages (sans-IO).

A packet is a 24-byte header and a body of [framing extras] + extras + key +
value. Magics 0x80/0x81 are a request/response; 0x08/0x18 are the same with
flexible framing extras (byte 2 is then the framing extras length and byte 3
the key length); 0x82/0x83 are server-initiated. All integers are big-endian,
except that the opaque is four bytes echoed as they are: it is kept here as the
big-endian reading of those bytes, which round-trips them exactly.

``decode_packet`` splits one packet; ``parse`` reads a DCP packet's extras and
value into a message value and rejects what a DCP peer would reject (wrong
extras length, a key or value where there must be none, an opcode that is no
DCP or setup command), naming the byte offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

HEADER = struct.Struct(">BBHBBHIIQ")
ALT_HEADER = struct.Struct(">BBBBBBHIIQ")
HEADER_SIZE = 24

REQ, RES, ALT_REQ, ALT_RES, SRV_REQ, SRV_RES = 0x80, 0x81, 0x08, 0x18, 0x82, 0x83
MAGICS = {REQ: "request", RES: "response", ALT_REQ: "alt-request", ALT_RES: "alt-response"}
MAGICS |= {SRV_REQ: "server-request", SRV_RES: "server-response"}
REQUEST_MAGICS = frozenset((REQ, ALT_REQ, SRV_REQ))

OPEN, ADD_STREAM, CLOSE_STREAM, STREAM_REQ, GET_FAILOVER_LOG = 0x50, 0x51, 0x52, 0x53, 0x54
STREAM_END, SNAPSHOT_MARKER, MUTATION, DELETION, EXPIRATION = 0x55, 0x56, 0x57, 0x58, 0x59
SET_VBUCKET_STATE, NOOP, BUFFER_ACK, CONTROL, SYSTEM_EVENT = 0x5B, 0x5C, 0x5D, 0x5E, 0x5F
SEQNO_ADVANCED = 0x64
VERSION, HELLO, SASL_LIST_MECHS, SASL_AUTH, SASL_STEP = 0x0B, 0x1F, 0x20, 0x21, 0x22
GET_ALL_VB_SEQNOS, SELECT_BUCKET, GET_CLUSTER_CONFIG = 0x48, 0x89, 0xB5
GET_ERROR_MAP = 0xFE

OPCODES: dict[int, str] = {
    OPEN: "DCP_OPEN",
    ADD_STREAM: "DCP_ADD_STREAM",
    CLOSE_STREAM: "DCP_CLOSE_STREAM",
    STREAM_REQ: "DCP_STREAM_REQ",
    GET_FAILOVER_LOG: "DCP_GET_FAILOVER_LOG",
    STREAM_END: "DCP_STREAM_END",
    SNAPSHOT_MARKER: "DCP_SNAPSHOT_MARKER",
    MUTATION: "DCP_MUTATION",
    DELETION: "DCP_DELETION",
    EXPIRATION: "DCP_EXPIRATION",
    SET_VBUCKET_STATE: "DCP_SET_VBUCKET_STATE",
    NOOP: "DCP_NOOP",
    BUFFER_ACK: "DCP_BUFFER_ACKNOWLEDGEMENT",
    CONTROL: "DCP_CONTROL",
    SYSTEM_EVENT: "DCP_SYSTEM_EVENT",
    SEQNO_ADVANCED: "DCP_SEQNO_ADVANCED",
    VERSION: "VERSION",
    HELLO: "HELLO",
    SASL_LIST_MECHS: "SASL_LIST_MECHS",
    SASL_AUTH: "SASL_AUTH",
    SASL_STEP: "SASL_STEP",
    GET_ALL_VB_SEQNOS: "GET_ALL_VB_SEQNOS",
    SELECT_BUCKET: "SELECT_BUCKET",
    GET_CLUSTER_CONFIG: "GET_CLUSTER_CONFIG",
    GET_ERROR_MAP: "GET_ERROR_MAP",
}
#: Messages the producer sends on a stream (they count against the flow-control buffer).
STREAM_MESSAGES = frozenset(
    (STREAM_END, SNAPSHOT_MARKER, MUTATION, DELETION, EXPIRATION, SET_VBUCKET_STATE, SYSTEM_EVENT)
) | {SEQNO_ADVANCED}

SUCCESS, KEY_ENOENT, KEY_EEXISTS, EINVAL, NOT_MY_VBUCKET = 0x00, 0x01, 0x02, 0x04, 0x07
ERANGE, ROLLBACK, UNKNOWN_COMMAND, NOT_SUPPORTED, STREAMID_INVALID = 0x22, 0x23, 0x81, 0x83, 0x8D
NO_BUCKET, AUTH_ERROR, AUTH_CONTINUE, EACCESS = 0x08, 0x20, 0x21, 0x24
#: Datatype bit of a JSON value.
DATATYPE_JSON = 0x01
STATUSES: dict[int, str] = {
    SUCCESS: "SUCCESS",
    KEY_ENOENT: "KEY_ENOENT",
    KEY_EEXISTS: "KEY_EEXISTS",
    EINVAL: "EINVAL",
    NOT_MY_VBUCKET: "NOT_MY_VBUCKET",
    0x08: "NO_BUCKET",
    0x0A: "DCP_STREAM_NOT_FOUND",
    0x0B: "OPAQUE_NO_MATCH",
    0x20: "AUTH_ERROR",
    0x21: "AUTH_CONTINUE",
    ERANGE: "ERANGE",
    ROLLBACK: "ROLLBACK",
    0x24: "EACCESS",
    UNKNOWN_COMMAND: "UNKNOWN_COMMAND",
    0x82: "ENOMEM",
    NOT_SUPPORTED: "NOT_SUPPORTED",
    0x84: "EINTERNAL",
    0x85: "EBUSY",
    0x86: "ETMPFAIL",
    STREAMID_INVALID: "DCP_STREAMID_INVALID",
}

#: STREAM_END reasons (u32 in its extras).
END_OK, END_CLOSED, END_STATE_CHANGED, END_DISCONNECTED, END_TOO_SLOW = 0, 1, 2, 3, 4
END_REASONS = {
    0: "ok",
    1: "closed",
    2: "state_changed",
    3: "disconnected",
    4: "too_slow",
    5: "backfill_failed",
    6: "rollback",
    7: "filter_empty",
    8: "lost_privileges",
}
#: Snapshot marker flags.
SNAP_MEMORY, SNAP_DISK, SNAP_CHECKPOINT, SNAP_ACK = 0x01, 0x02, 0x04, 0x08
#: DCP_OPEN flags: 0x01 makes the connection a producer (the sender of OPEN consumes).
OPEN_PRODUCER = 0x01
#: A stream with no end.
FOREVER = 0xFFFF_FFFF_FFFF_FFFF
#: The DCP stream-id frame info: id 2, length 2.
STREAM_ID_FRAME = 0x22


class ProtocolError(ValueError):
    """Bytes that are no valid packet or DCP message; ``offset`` is where in the stream."""

    def __init__(self, reason: str, offset: int = 0) -> None:
        super().__init__(f"{reason} (at byte offset {offset})")
        self.reason = reason
        self.offset = offset
        #: From ``PacketSplitter.feed``: the whole packets before the bad header, still to be read.
        self.packets: list[tuple[int, bytes]] = []


@dataclass(slots=True)
class Packet:
    """One memcached binary protocol packet. ``vbucket`` is the status in a response."""

    magic: int
    opcode: int
    vbucket: int = 0
    opaque: int = 0
    cas: int = 0
    datatype: int = 0
    extras: bytes = b""
    key: bytes = b""
    value: bytes = b""
    framing: bytes = b""

    @property
    def is_request(self) -> bool:
        return self.magic in REQUEST_MAGICS

    @property
    def status(self) -> int:
        return self.vbucket

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.framing) + len(self.extras) + len(self.key) + len(self.value)

    @property
    def name(self) -> str:
        return OPCODES.get(self.opcode, f"UNKNOWN(0x{self.opcode:02x})")


def encode(p: Packet) -> bytes:
    """The packet's wire bytes (an alt magic is chosen by the caller, with framing extras)."""
    body = len(p.framing) + len(p.extras) + len(p.key) + len(p.value)
    if p.magic in (ALT_REQ, ALT_RES):
        head = ALT_HEADER.pack(
            p.magic,
            p.opcode,
            len(p.framing),
            len(p.key),
            len(p.extras),
            p.datatype,
            p.vbucket,
            body,
            p.opaque,
            p.cas,
        )
    else:
        if p.framing:
            raise ValueError("framing extras need magic 0x08 or 0x18")
        head = HEADER.pack(
            p.magic, p.opcode, len(p.key), len(p.extras), p.datatype, p.vbucket, body, p.opaque, p.cas
        )
    return b"".join((head, p.framing, p.extras, p.key, p.value))


def packet_length(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """Whole length of the packet whose header starts at ``offset`` (header must be there)."""
    magic = buf[offset]
    if magic not in MAGICS:
        raise ProtocolError(f"bad magic 0x{magic:02x}", offset)
    return HEADER_SIZE + int.from_bytes(buf[offset + 8 : offset + 12], "big")


def decode_packet(buf: bytes | bytearray | memoryview, offset: int = 0, base: int = 0) -> Packet:
    """The one packet at ``buf[offset:]``; ``base + offset`` is its stream offset in errors."""
    where = base + offset
    if len(buf) - offset < HEADER_SIZE:
        raise ProtocolError(f"truncated header: {len(buf) - offset} of 24 bytes", where)
    magic = buf[offset]
    if magic in (ALT_REQ, ALT_RES):
        _, opcode, flen, keylen, extlen, datatype, vb, bodylen, opaque, cas = ALT_HEADER.unpack_from(
            buf, offset
        )
    elif magic in MAGICS:
        _, opcode, keylen, extlen, datatype, vb, bodylen, opaque, cas = HEADER.unpack_from(buf, offset)
        flen = 0
    else:
        raise ProtocolError(f"bad magic 0x{magic:02x} (not 0x80, 0x81, 0x08, 0x18, 0x82, 0x83)", where)
    if flen + extlen + keylen > bodylen:
        raise ProtocolError(
            f"framing extras {flen} + extras {extlen} + key {keylen} exceed the body length {bodylen}", where
        )
    if len(buf) - offset < HEADER_SIZE + bodylen:
        raise ProtocolError(
            f"truncated body: {len(buf) - offset - HEADER_SIZE} of {bodylen} bytes", where + HEADER_SIZE
        )
    start = offset + HEADER_SIZE
    body = bytes(buf[start : start + bodylen])
    framing = body[:flen]
    if framing:
        parse_frame_infos(framing, where + HEADER_SIZE)
    return Packet(
        magic,
        opcode,
        vb,
        opaque,
        cas,
        datatype,
        body[flen : flen + extlen],
        body[flen + extlen : flen + extlen + keylen],
        body[flen + extlen + keylen :],
        framing,
    )


def parse_frame_infos(framing: bytes, offset: int = 0) -> list[tuple[int, bytes]]:
    """Flexible framing extras as (id, data) pairs; nibble 15 escapes to 15 + the next byte."""
    infos = []
    i = 0
    while i < len(framing):
        first = framing[i]
        i += 1
        ident, length = first >> 4, first & 0x0F
        if ident == 15:
            if i >= len(framing):
                raise ProtocolError("frame info id escape runs past the framing extras", offset + i)
            ident, i = 15 + framing[i], i + 1
        if length == 15:
            if i >= len(framing):
                raise ProtocolError("frame info length escape runs past the framing extras", offset + i)
            length, i = 15 + framing[i], i + 1
        if i + length > len(framing):
            raise ProtocolError(
                f"frame info {ident} of {length} bytes runs past the framing extras", offset + i
            )
        infos.append((ident, framing[i : i + length]))
        i += length
    return infos


def stream_id_of(p: Packet) -> int | None:
    """The DCP stream id in a packet's frame infos (id 2), if any."""
    if not p.framing:
        return None
    for ident, data in parse_frame_infos(p.framing):
        if ident == 2 and len(data) == 2:
            return int.from_bytes(data, "big")
    return None


def stream_id_frame(sid: int) -> bytes:
    return bytes((STREAM_ID_FRAME,)) + sid.to_bytes(2, "big")


# ------------------------------------------------------------------------------------------ splitting


class PacketSplitter:
    """One direction's bytes to packets: ``feed`` gives (stream offset, wire bytes) for whole packets.

    A bad magic or a body over ``max_body`` raises ProtocolError with its
    offset and the whole packets before it (``packets``); after ``gap`` (lost
    bytes) or an error the splitter skips to the next offset where a plausible
    DCP header starts, on the next ``feed``.
    """

    __slots__ = ("buf", "offset", "max_body", "resync", "skipped")

    def __init__(self, max_body: int = 20 * 1024 * 1024) -> None:
        self.buf = bytearray()
        self.offset = 0  # stream offset of buf[0]
        self.max_body = max_body
        self.resync = False
        self.skipped = 0

    def feed(self, data: bytes, limit: int | None = None) -> list[tuple[int, bytes]]:
        """Whole packets buffered after adding ``data``; at most ``limit`` of them (the rest stay)."""
        buf = self.buf
        buf += data
        out = []
        pos = 0
        n = len(buf)
        while True:
            if self.resync:
                found = find_header(buf, pos, self.max_body)
                if found < 0:
                    keep = max(pos, n - HEADER_SIZE + 1)
                    self.skipped += keep - pos
                    pos = keep
                    break
                self.skipped += found - pos
                pos = found
                self.resync = False
            if n - pos < HEADER_SIZE or (limit is not None and len(out) >= limit):
                break
            magic = buf[pos]
            body = int.from_bytes(buf[pos + 8 : pos + 12], "big")
            if magic not in MAGICS or body > self.max_body:
                where = self.offset + pos
                self._drop(pos + 1)
                self.resync = True
                reason = f"bad magic 0x{magic:02x}" if magic not in MAGICS else f"body of {body} bytes"
                err = ProtocolError(f"{reason}: not a packet header; resyncing", where)
                err.packets = out
                raise err
            end = pos + HEADER_SIZE + body
            if end > n:
                break
            out.append((self.offset + pos, bytes(buf[pos:end])))
            pos = end
        self._drop(pos)
        return out

    def consume(self, pos: int) -> None:
        """The first ``pos`` buffered bytes were taken by the caller (whole packets, as from ``feed``)."""
        self._drop(pos)

    def rebuffer(self, data: bytes, pos: int) -> None:
        """``data`` is the buffer and more bytes after it; the caller took its first ``pos`` bytes."""
        self.buf = bytearray(memoryview(data)[pos:])
        self.offset += pos

    def _drop(self, pos: int) -> None:
        if pos:
            del self.buf[:pos]
            self.offset += pos

    def gap(self, missing: int) -> None:
        """``missing`` bytes were lost here: what is buffered is a torn packet; resync after it."""
        self.offset += len(self.buf) + missing
        self.buf.clear()
        self.resync = True

    def pending(self) -> int:
        return len(self.buf)


def find_header(buf: bytes | bytearray, start: int, max_body: int) -> int:
    """The first offset from ``start`` where a known opcode's plausible header starts, or -1."""
    n = len(buf)
    for pos in range(start, n - HEADER_SIZE + 1):
        magic = buf[pos]
        if magic not in MAGICS or buf[pos + 1] not in OPCODES:
            continue
        body = int.from_bytes(buf[pos + 8 : pos + 12], "big")
        if magic in (ALT_REQ, ALT_RES):
            fixed = buf[pos + 2] + buf[pos + 3] + buf[pos + 4]
        else:
            fixed = int.from_bytes(buf[pos + 2 : pos + 4], "big") + buf[pos + 4]
        if fixed <= body <= max_body and buf[pos + 5] <= 0x07:
            return pos
    return -1


# ------------------------------------------------------------------------------------------ messages


@dataclass(slots=True)
class Open:
    name: str
    flags: int
    seqno: int = 0

    @property
    def producer(self) -> bool:
        return bool(self.flags & OPEN_PRODUCER)


@dataclass(slots=True)
class ErrorMapReq:
    """GET_ERROR_MAP: the highest error-map version the client reads."""

    version: int


@dataclass(slots=True)
class Control:
    key: str
    value: str


@dataclass(slots=True)
class StreamReq:
    flags: int
    start: int
    end: int
    vbucket_uuid: int
    snap_start: int
    snap_end: int
    json: bytes = b""


@dataclass(slots=True)
class SnapshotMarker:
    start: int
    end: int
    flags: int
    version: int = 1
    max_visible: int | None = None
    high_completed: int | None = None


@dataclass(slots=True)
class Mutation:
    seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    lock_time: int
    key: bytes
    value: bytes
    nru: int = 0


@dataclass(slots=True)
class Deletion:
    seqno: int
    rev_seqno: int
    key: bytes
    value: bytes = b""
    delete_time: int | None = None  # V2 (21-byte extras) only


@dataclass(slots=True)
class Expiration:
    seqno: int
    rev_seqno: int
    delete_time: int
    key: bytes
    value: bytes = b""


@dataclass(slots=True)
class SeqnoAdvanced:
    seqno: int


@dataclass(slots=True)
class StreamEnd:
    reason: int

    @property
    def reason_name(self) -> str:
        return END_REASONS.get(self.reason, f"unknown({self.reason})")


@dataclass(slots=True)
class SetVbucketState:
    state: int


@dataclass(slots=True)
class BufferAck:
    nbytes: int


@dataclass(slots=True)
class SystemEvent:
    seqno: int
    event: int
    version: int
    key: bytes
    value: bytes


@dataclass(slots=True)
class Empty:
    """A request with no body of its own: NOOP, CLOSE_STREAM, GET_FAILOVER_LOG, setup commands."""


@dataclass(slots=True)
class Response:
    """A response: status, and what its value says for the request it answers."""

    status: int
    failover_log: list[tuple[int, int]] | None = None
    rollback_seqno: int | None = None
    vb_seqnos: list[tuple[int, int]] | None = None
    value: bytes = b""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def status_name(self) -> str:
        return STATUSES.get(self.status, f"0x{self.status:04x}")


_U64 = struct.Struct(">Q")
_FAILOVER_ENTRY = struct.Struct(">QQ")
_VB_SEQNO = struct.Struct(">HQ")
_MUTATION = struct.Struct(">QQIIIHB")
_MUTATION_HEAD = struct.Struct(">BBHBBHIIQQQIIIHB")
_DELETION_V1 = struct.Struct(">QQH")
_DELETION_V2 = struct.Struct(">QQIB")
_EXPIRATION = struct.Struct(">QQI")
_STREAM_REQ = struct.Struct(">IIQQQQQ")
_MARKER_V1 = struct.Struct(">QQI")
_MARKER_V20 = struct.Struct(">QQIQQ")
_SYSTEM_EVENT = struct.Struct(">QIB")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_OPEN = struct.Struct(">II")


def _need(p: Packet, offset: int, extras: tuple[int, ...], key: bool | None, value: bool | None) -> None:
    """Check a request's shape: extras length, and a key/value that must be there (True) or not (False)."""
    if len(p.extras) not in extras:
        want = " or ".join(str(e) for e in extras)
        raise ProtocolError(f"{p.name}: extras of {len(p.extras)} bytes, must be {want}", offset + 4)
    if key is not None and bool(p.key) is not key:
        what = f"must have no key, has {len(p.key)} bytes" if p.key else "must have a key"
        raise ProtocolError(f"{p.name}: {what}", offset + 2)
    if value is not None and bool(p.value) is not value:
        what = f"must have no value, has {len(p.value)} bytes" if p.value else "must have a value"
        raise ProtocolError(f"{p.name}: {what}", offset + 8)


def parse(p: Packet, offset: int = 0, request_opcode: int | None = None) -> Any:
    """The DCP message a packet carries; ProtocolError (with ``offset``) for what a peer rejects.

    A response's value is read by the request it answers: pass that request's
    opcode when it is known (matched by opaque), else the response's own.
    """
    if not p.is_request:
        return parse_response(p, offset, request_opcode)
    op = p.opcode
    ext = p.extras
    if op == MUTATION:
        _need(p, offset, (31,), True, None)
        seqno, rev, flags, exp, lock, _nmeta, nru = _MUTATION.unpack(ext)
        return Mutation(seqno, rev, flags, exp, lock, p.key, p.value, nru)
    if op == DELETION:
        _need(p, offset, (18, 21), True, None)
        if len(ext) == 18:
            seqno, rev, _ = _DELETION_V1.unpack(ext)
            return Deletion(seqno, rev, p.key, p.value)
        seqno, rev, when, _ = _DELETION_V2.unpack(ext)
        return Deletion(seqno, rev, p.key, p.value, when)
    if op == EXPIRATION:
        _need(p, offset, (20,), True, None)
        seqno, rev, when = _EXPIRATION.unpack(ext)
        return Expiration(seqno, rev, when, p.key, p.value)
    if op == SNAPSHOT_MARKER:
        _need(p, offset, (20, 1), False, None)
        if len(ext) == 20:
            if p.value:
                raise ProtocolError("DCP_SNAPSHOT_MARKER V1: must have no value", offset + 8)
            return SnapshotMarker(*_MARKER_V1.unpack(ext))
        version = ext[0]
        if version not in (0, 2) or len(p.value) != (36 if version == 0 else 52):
            raise ProtocolError(
                f"DCP_SNAPSHOT_MARKER V2: version {version} with a {len(p.value)}-byte value "
                "(must be 0 with 36 or 2 with 52)",
                offset + HEADER_SIZE,
            )
        start, end, flags, mvs, hcs = _MARKER_V20.unpack_from(p.value)
        return SnapshotMarker(start, end, flags, 2 if version == 0 else 22, mvs, hcs)
    if op == STREAM_REQ:
        _need(p, offset, (48,), False, None)
        flags, _reserved, start, end, uuid, snap_start, snap_end = _STREAM_REQ.unpack(ext)
        return StreamReq(flags, start, end, uuid, snap_start, snap_end, p.value)
    if op == STREAM_END:
        _need(p, offset, (4,), False, False)
        return StreamEnd(_U32.unpack(ext)[0])
    if op == SEQNO_ADVANCED:
        _need(p, offset, (8,), False, False)
        return SeqnoAdvanced(_U64.unpack(ext)[0])
    if op == BUFFER_ACK:
        _need(p, offset, (4,), False, False)
        return BufferAck(_U32.unpack(ext)[0])
    if op == OPEN:
        _need(p, offset, (8,), True, None)
        seqno, flags = _OPEN.unpack(ext)
        return Open(_text(p.key, "connection name", offset), flags, seqno)
    if op == CONTROL:
        _need(p, offset, (0,), True, True)
        return Control(_text(p.key, "control key", offset), _text(p.value, "control value", offset))
    if op == SET_VBUCKET_STATE:
        _need(p, offset, (1,), False, False)
        return SetVbucketState(ext[0])
    if op == SYSTEM_EVENT:
        _need(p, offset, (13,), None, None)
        seqno, event, version = _SYSTEM_EVENT.unpack(ext)
        return SystemEvent(seqno, event, version, p.key, p.value)
    if op in (NOOP, CLOSE_STREAM, GET_FAILOVER_LOG):
        _need(p, offset, (0,), False, False)
        return Empty()
    if op in (
        VERSION,
        HELLO,
        SASL_LIST_MECHS,
        SASL_AUTH,
        SASL_STEP,
        SELECT_BUCKET,
        GET_CLUSTER_CONFIG,
    ):
        return Empty()
    if op == GET_ERROR_MAP:  # the highest map version the client reads, for vbucket 0
        _need(p, offset, (0,), False, True)
        if len(p.value) != 2 or p.vbucket or p.datatype:
            raise ProtocolError("GET_ERROR_MAP: must be a 2-byte version, vbucket 0, raw", offset + 8)
        return ErrorMapReq(_U16.unpack(p.value)[0])
    if op == GET_ALL_VB_SEQNOS:
        _need(p, offset, (0, 4), False, False)
        return Empty()
    raise ProtocolError(f"opcode 0x{op:02x} is not a DCP or connection-setup command", offset + 1)


def parse_response(p: Packet, offset: int = 0, request_opcode: int | None = None) -> Response:
    op = p.opcode if request_opcode is None else request_opcode
    if op not in OPCODES:
        raise ProtocolError(
            f"response to opcode 0x{op:02x}, not a DCP or connection-setup command", offset + 1
        )
    status = p.vbucket
    value = p.value
    if op in (STREAM_REQ, GET_FAILOVER_LOG) and status == SUCCESS:
        return Response(status, failover_log=parse_failover_log(value, offset + HEADER_SIZE))
    if op == STREAM_REQ and status == ROLLBACK:
        if len(value) != 8:
            raise ProtocolError(
                f"ROLLBACK response: value of {len(value)} bytes, must be the 8-byte seqno", offset + 8
            )
        return Response(status, rollback_seqno=_U64.unpack(value)[0])
    if op == GET_ALL_VB_SEQNOS and status == SUCCESS:
        if len(value) % 10:
            raise ProtocolError(f"vbucket seqnos: {len(value)} bytes is no multiple of 10", offset + 8)
        return Response(status, vb_seqnos=[e for e in _VB_SEQNO.iter_unpack(value)])
    return Response(status, value=value)


def parse_failover_log(value: bytes, offset: int = 0) -> list[tuple[int, int]]:
    """Failover log entries (vbucket uuid, seqno), newest first; 16 bytes each, no count."""
    if len(value) % 16:
        raise ProtocolError(f"failover log of {len(value)} bytes is no multiple of 16", offset)
    return list(_FAILOVER_ENTRY.iter_unpack(value))


def _text(raw: bytes, what: str, offset: int) -> str:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not ASCII", offset + HEADER_SIZE) from None


# ------------------------------------------------------------------------------------------ builders


def request(
    opcode: int,
    *,
    vbucket: int = 0,
    opaque: int = 0,
    extras: bytes = b"",
    key: bytes = b"",
    value: bytes = b"",
    datatype: int = 0,
    sid: int | None = None,
) -> bytes:
    """A request's bytes; with ``sid`` the stream-id frame info and magic 0x08."""
    if sid is None:
        return encode(Packet(REQ, opcode, vbucket, opaque, 0, datatype, extras, key, value))
    return encode(
        Packet(ALT_REQ, opcode, vbucket, opaque, 0, datatype, extras, key, value, stream_id_frame(sid))
    )


def response(
    opcode: int,
    status: int = SUCCESS,
    *,
    opaque: int = 0,
    value: bytes = b"",
    extras: bytes = b"",
    key: bytes = b"",
    datatype: int = 0,
    cas: int = 0,
) -> bytes:
    return encode(Packet(RES, opcode, status, opaque, cas, datatype, extras, key, value))


def open_request(name: str, flags: int = OPEN_PRODUCER, opaque: int = 0) -> bytes:
    return request(OPEN, opaque=opaque, extras=_OPEN.pack(0, flags), key=name.encode("ascii"))


def control_request(key: str, value: str, opaque: int = 0) -> bytes:
    return request(CONTROL, opaque=opaque, key=key.encode("ascii"), value=value.encode("ascii"))


def stream_req_request(vbucket: int, opaque: int, req: StreamReq) -> bytes:
    extras = _STREAM_REQ.pack(
        req.flags, 0, req.start, req.end, req.vbucket_uuid, req.snap_start, req.snap_end
    )
    return request(STREAM_REQ, vbucket=vbucket, opaque=opaque, extras=extras, value=req.json)


def failover_log_value(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(_FAILOVER_ENTRY.pack(u, s) for u, s in entries)


def vb_seqnos_value(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(_VB_SEQNO.pack(vb, s) for vb, s in entries)


def rollback_response(opaque: int, seqno: int) -> bytes:
    return response(STREAM_REQ, ROLLBACK, opaque=opaque, value=_U64.pack(seqno))


def snapshot_marker(
    vbucket: int, opaque: int, start: int, end: int, flags: int, sid: int | None = None
) -> bytes:
    return request(
        SNAPSHOT_MARKER, vbucket=vbucket, opaque=opaque, extras=_MARKER_V1.pack(start, end, flags), sid=sid
    )


def mutation(
    vbucket: int,
    opaque: int,
    seqno: int,
    rev: int,
    key: bytes,
    value: bytes,
    *,
    flags: int = 0,
    expiration: int = 0,
    datatype: int = 0,
    sid: int | None = None,
) -> bytes:
    if sid is None:
        head = _MUTATION_HEAD.pack(
            REQ, MUTATION, len(key), 31, datatype, vbucket, 31 + len(key) + len(value), opaque, 0,
            seqno, rev, flags, expiration, 0, 0, 0,
        )  # fmt: skip
        return b"".join((head, key, value))
    extras = _MUTATION.pack(seqno, rev, flags, expiration, 0, 0, 0)
    return request(
        MUTATION,
        vbucket=vbucket,
        opaque=opaque,
        extras=extras,
        key=key,
        value=value,
        datatype=datatype,
        sid=sid,
    )


def items(
    vbucket: int, opaque: int, entries: list[tuple[int, int, int, bytes, bytes]], sid: int | None = None
) -> list[bytes]:
    """Many items' packets at once: (opcode, seqno, rev, key, value) each, a MUTATION, DELETION or EXPIRATION.

    The same bytes as ``mutation``, ``deletion`` and ``expiration`` one by one (the value
    is a mutation's only); without a
    stream id a mutation is one ``struct`` pack and one join.
    """
    out = []
    append = out.append
    head = _MUTATION_HEAD.pack
    join = b"".join
    for op, seqno, rev, key, value in entries:
        if op == MUTATION and sid is None:
            keylen = len(key)
            append(
                join(
                    (
                        head(REQ, MUTATION, keylen, 31, 0, vbucket, 31 + keylen + len(value), opaque, 0,
                             seqno, rev, 0, 0, 0, 0, 0),
                        key,
                        value,
                    )
                )
            )  # fmt: skip
        elif op == MUTATION:
            append(mutation(vbucket, opaque, seqno, rev, key, value, sid=sid))
        elif op == DELETION:
            append(deletion(vbucket, opaque, seqno, rev, key, sid))
        else:
            append(expiration(vbucket, opaque, seqno, rev, key, 0, sid))
    return out


def deletion(vbucket: int, opaque: int, seqno: int, rev: int, key: bytes, sid: int | None = None) -> bytes:
    return request(
        DELETION, vbucket=vbucket, opaque=opaque, extras=_DELETION_V1.pack(seqno, rev, 0), key=key, sid=sid
    )


def expiration(
    vbucket: int, opaque: int, seqno: int, rev: int, key: bytes, when: int = 0, sid: int | None = None
) -> bytes:
    return request(
        EXPIRATION,
        vbucket=vbucket,
        opaque=opaque,
        extras=_EXPIRATION.pack(seqno, rev, when),
        key=key,
        sid=sid,
    )


def seqno_advanced(vbucket: int, opaque: int, seqno: int, sid: int | None = None) -> bytes:
    return request(SEQNO_ADVANCED, vbucket=vbucket, opaque=opaque, extras=_U64.pack(seqno), sid=sid)


def stream_end(vbucket: int, opaque: int, reason: int, sid: int | None = None) -> bytes:
    return request(STREAM_END, vbucket=vbucket, opaque=opaque, extras=_U32.pack(reason), sid=sid)


def buffer_ack(nbytes: int) -> bytes:
    return request(BUFFER_ACK, extras=_U32.pack(nbytes))


def noop(opaque: int) -> bytes:
    return request(NOOP, opaque=opaque)
