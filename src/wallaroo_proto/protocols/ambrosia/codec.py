"""AMBROSIA's IC <-> language binding wire format: varints, messages, RPCs, log records (sans-IO).

Two local TCP sockets join an Immortal Coordinator (IC) and its language
binding (LB). The LB sends bare messages to the IC's receive port; the IC
sends log records to the LB on its send port. A message is ``[size:
ZigZagInt][type: 1 byte][data]``, size counting type and data. A log record
is a 24-byte header (committer id i32, record size i32, check bytes u64,
sequence id i64, all little-endian) and messages packed back to back. Every
length and count is zig-zag encoded though never negative, so a length n is
written as the varint of 2n.

A Checkpoint message (type 8) carries a ZigZagLong length N and is followed on
its stream by N raw bytes outside any message or record: the splitters here
hand them out as ``Blob`` pieces. Check bytes are xxHash64 (seed 0) of the
record body; 0 for the checkpoint record (sequence id -2), whose size covers
its header and Checkpoint message but not the blob.
"""

from __future__ import annotations

import operator
import re
import struct
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter
from typing import NamedTuple

import xxhash

# --- message types (SharedAmbrosiaTools AmbrosiaRuntimeLBConstants) -------------------------------------

RPC = 0
ATTACH_TO = 1
TAKE_CHECKPOINT = 2
COMMIT = 3
REPLAY_FROM = 4
RPC_BATCH = 5
PING = 6
PING_RETURN = 7
CHECKPOINT = 8
INITIAL_MESSAGE = 9
UPGRADE_TAKE_CHECKPOINT = 10
TAKE_BECOMING_PRIMARY_CHECKPOINT = 11
UPGRADE_SERVICE = 12
COUNT_REPLAYABLE_RPC_BATCH = 13
TRIM_TO = 14
BECOMING_PRIMARY = 15

TYPE_NAMES: dict[int, str] = {
    RPC: "RPC",
    ATTACH_TO: "AttachTo",
    TAKE_CHECKPOINT: "TakeCheckpoint",
    COMMIT: "Commit",
    REPLAY_FROM: "ReplayFrom",
    RPC_BATCH: "RPCBatch",
    PING: "Ping",
    PING_RETURN: "PingReturn",
    CHECKPOINT: "Checkpoint",
    INITIAL_MESSAGE: "InitialMessage",
    UPGRADE_TAKE_CHECKPOINT: "UpgradeTakeCheckpoint",
    TAKE_BECOMING_PRIMARY_CHECKPOINT: "TakeBecomingPrimaryCheckpoint",
    UPGRADE_SERVICE: "UpgradeService",
    COUNT_REPLAYABLE_RPC_BATCH: "CountReplayableRPCBatch",
    TRIM_TO: "TrimTo",
    BECOMING_PRIMARY: "BecomingPrimary",
}

#: What the IC's local listener accepts from the LB (any other type byte kills the IC).
FROM_LB = frozenset(
    {RPC, ATTACH_TO, TAKE_CHECKPOINT, RPC_BATCH, PING, PING_RETURN, CHECKPOINT, INITIAL_MESSAGE}
)
#: The single message of a control record (sequence id -1).
CONTROL = frozenset(
    {
        TAKE_CHECKPOINT,
        UPGRADE_TAKE_CHECKPOINT,
        TAKE_BECOMING_PRIMARY_CHECKPOINT,
        UPGRADE_SERVICE,
        BECOMING_PRIMARY,
    }
)
#: What a normal record (sequence id >= 0) carries.
IN_RECORDS = frozenset({RPC, RPC_BATCH, COUNT_REPLAYABLE_RPC_BATCH, INITIAL_MESSAGE, PING, PING_RETURN})

# RPC types (the byte after the method id)
ASYNC, FORK, IMPULSE = 0, 1, 2
RPC_TYPE_NAMES = {ASYNC: "async", FORK: "fork", IMPULSE: "impulse"}

HEADER_SIZE = 24
CONTROL_SEQ = -1
CHECKPOINT_SEQ = -2
_HEADER = struct.Struct("<iiQq")
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class MalformedError(ValueError):
    """Bytes that no reader of the format can take; ``offset`` is where, within what was read."""

    def __init__(self, reason: str, offset: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


class Incomplete(Exception):
    """More bytes are needed."""


# --- varints ------------------------------------------------------------------------------------------


def zigzag(value: int, bits: int = 32) -> int:
    low, high = _INT32 if bits == 32 else _INT64
    if not low <= value <= high:
        raise ValueError(f"{value} does not fit a {bits}-bit ZigZag integer")
    return (value << 1) ^ (value >> (bits - 1))


def unzigzag(raw: int) -> int:
    return (raw >> 1) ^ -(raw & 1)


def uvarint(raw: int) -> bytes:
    """Protobuf base-128: low 7 bits first, bit 7 = more."""
    out = bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def zz32(value: int) -> bytes:
    """A ZigZagInt's bytes (1 to 5)."""
    if 0 <= value < 64:
        return bytes((value << 1,))
    return uvarint(zigzag(value, 32))


def zz64(value: int) -> bytes:
    """A ZigZagLong's bytes (1 to 10)."""
    return uvarint(zigzag(value, 64))


def read_zz(buf: bytes | bytearray | memoryview, pos: int, end: int, bits: int = 32) -> tuple[int, int]:
    """A ZigZag integer at ``pos`` (before ``end``): (value, position after it).

    Raises ``Incomplete`` when ``end`` cuts it, ``MalformedError`` for a varint
    longer than the type allows (5 bytes for 32 bits, 10 for 64) or too big for it.
    """
    limit = 5 if bits == 32 else 10
    raw = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise Incomplete
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if pos - start >= limit:
            raise MalformedError(f"ZigZag varint longer than {limit} bytes", start)
    if raw >> bits:
        raise MalformedError(f"ZigZag varint value {raw:#x} does not fit {bits} bits", start)
    return (raw >> 1) ^ -(raw & 1), pos


# --- messages -----------------------------------------------------------------------------------------


class Message(NamedTuple):
    type: int
    data: bytes

    @property
    def name(self) -> str:
        return type_name(self.type)


def type_name(code: int) -> str:
    return TYPE_NAMES.get(code, f"UNKNOWN({code})")


def encode_message(kind: int, data: bytes = b"") -> bytes:
    return zz32(len(data) + 1) + bytes((kind,)) + data


def read_message(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[Message, int]:
    """One message at ``pos``: (message, position after it); ``Incomplete`` if ``end`` cuts it."""
    start = pos
    size, pos = read_zz(buf, pos, end)
    if size < 1:
        raise MalformedError(f"message size {size}: it must count at least the type byte", start)
    stop = pos + size
    if stop > end:
        raise Incomplete
    return Message(buf[pos], bytes(buf[pos + 1 : stop])), stop


def checkpoint_length(message: Message) -> int:
    """A Checkpoint message's blob length (ZigZagLong, must be >= 0)."""
    try:
        n, pos = read_zz(message.data, 0, len(message.data), 64)
    except Incomplete:
        raise MalformedError("Checkpoint message without its length") from None
    if pos != len(message.data):
        raise MalformedError(f"Checkpoint message has {len(message.data) - pos} bytes after its length")
    if n < 0:
        raise MalformedError(f"Checkpoint length {n} is negative")
    return n


def encode_checkpoint(length: int) -> bytes:
    return encode_message(CHECKPOINT, zz64(length))


def batch_messages(message: Message) -> tuple[int, int | None, list[Message]]:
    """An RPCBatch or CountReplayableRPCBatch: (count, replayable count or None, inner messages)."""
    data = message.data
    end = len(data)
    try:
        count, pos = read_zz(data, 0, end)
        replayable = None
        if message.type == COUNT_REPLAYABLE_RPC_BATCH:
            replayable, pos = read_zz(data, pos, end)
    except Incomplete:
        raise MalformedError(f"{message.name} cut inside its counts") from None
    inner = []
    while pos < end:
        try:
            msg, pos = read_message(data, pos, end)
        except Incomplete:
            raise MalformedError(
                f"{message.name}: inner message {len(inner) + 1} overruns the batch"
            ) from None
        inner.append(msg)
    return count, replayable, inner


def encode_batch(messages: list[bytes], replayable: int | None = None) -> bytes:
    """An RPCBatch of encoded messages (CountReplayableRPCBatch when ``replayable`` is given)."""
    if replayable is None:
        return encode_message(RPC_BATCH, zz32(len(messages)) + b"".join(messages))
    return encode_message(
        COUNT_REPLAYABLE_RPC_BATCH, zz32(len(messages)) + zz32(replayable) + b"".join(messages)
    )


# --- RPCs ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rpc:
    """An RPC message's fields. ``destination`` None: incoming (IC -> LB); "" a self call."""

    method_id: int
    rpc_type: int
    args: bytes
    destination: str | None = None
    reserved: int = 0

    @property
    def is_self_call(self) -> bool:
        return self.destination == ""


def encode_incoming_rpc(method_id: int, rpc_type: int, args: bytes, reserved: int = 0) -> bytes:
    """An RPC as the IC delivers it in a record: ``size 00 reserved method type args``."""
    if 0 <= method_id < 64 and len(args) < 60:  # one-byte size and method id
        return bytes((2 * (len(args) + 4), RPC, reserved, method_id << 1, rpc_type)) + args
    return encode_message(RPC, bytes((reserved,)) + zz32(method_id) + bytes((rpc_type,)) + args)


def encode_outgoing_rpc(
    destination: str, method_id: int, rpc_type: int, args: bytes, reserved: int = 0
) -> bytes:
    """An RPC as the LB sends it: the destination's length and name first ("" is a self call)."""
    name = destination.encode("utf-8")
    head = zz32(len(name)) + name
    return encode_message(RPC, head + bytes((reserved,)) + zz32(method_id) + bytes((rpc_type,)) + args)


def decode_rpc(data: bytes, outgoing: bool) -> Rpc:
    """An RPC message's data; ``outgoing`` (LB -> IC) has the destination fields first."""
    end = len(data)
    pos = 0
    destination = None
    try:
        if outgoing:
            length, pos = read_zz(data, 0, end)
            if length < 0 or pos + length > end:
                raise MalformedError(f"RPC destination length {length} overruns the message")
            destination = data[pos : pos + length].decode("utf-8")
            pos += length
        if pos >= end:
            raise Incomplete
        reserved = data[pos]
        method_id, pos = read_zz(data, pos + 1, end)
        if pos >= end:
            raise Incomplete
    except Incomplete:
        raise MalformedError("RPC cut before its RPC type byte") from None
    except UnicodeDecodeError:
        raise MalformedError("RPC destination name is not UTF-8") from None
    return Rpc(method_id, data[pos], data[pos + 1 :], destination, reserved)


def encode_attach(destination: str) -> bytes:
    return encode_message(ATTACH_TO, destination.encode("utf-8"))


# --- log records --------------------------------------------------------------------------------------


class Header(NamedTuple):
    committer: int
    size: int
    check: int
    seq: int


def check_bytes(body: bytes | bytearray | memoryview, seq: int) -> int:
    """What the IC writes: 0 for the checkpoint record, else xxHash64 (seed 0) of the body."""
    return 0 if seq == CHECKPOINT_SEQ else xxhash.xxh64_intdigest(body)


def encode_record(committer: int, seq: int, body: bytes, check: int | None = None) -> bytes:
    """A log record: header and body (``check`` overrides the right check bytes, for faults)."""
    if check is None:
        check = check_bytes(body, seq)
    return _HEADER.pack(committer, HEADER_SIZE + len(body), check, seq) + body


def control_record(committer: int, kind: int) -> bytes:
    """A sequence-id -1 record holding one body-less control message."""
    return encode_record(committer, CONTROL_SEQ, encode_message(kind))


def checkpoint_record(committer: int, blob: bytes) -> bytes:
    """The recovery checkpoint: record -2 with one Checkpoint message, then the blob outside its size."""
    return encode_record(committer, CHECKPOINT_SEQ, encode_checkpoint(len(blob))) + blob


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> Header:
    return Header(*_HEADER.unpack_from(buf, pos))


def record_messages(body: bytes | bytearray | memoryview) -> list[Message]:
    """A record body's messages; ``MalformedError`` (offset within the body) if one overruns it."""
    out = []
    pos, end = 0, len(body)
    while pos < end:
        size = body[pos]
        if size < 0x80 and size > 1 and not size & 1 and pos + 1 + (size >> 1) <= end:  # a one-byte size
            stop = pos + 1 + (size >> 1)
            out.append(Message(body[pos + 1], bytes(body[pos + 2 : stop])))
            pos = stop
            continue
        try:
            msg, pos = read_message(body, pos, end)
        except Incomplete:
            raise MalformedError(f"message {len(out) + 1} overruns the record body", pos) from None
        except MalformedError as err:
            raise MalformedError(err.reason, pos) from None
        out.append(msg)
    return out


def _short_rpcs(head: bytes, fixed: int, types: bytes) -> re.Pattern[bytes]:
    """One RPC message in its short form: a one-byte size, then ``head`` (a pattern), a one-byte
    method id >= 0 and an RPC type of ``types``; ``fixed`` bytes besides the args count in the size.
    Each size byte has its own branch, so the size fixes the match's length."""
    method = b"[" + re.escape(bytes(range(0, 0x80, 2))) + b"]"
    kinds = b"[" + re.escape(types) + b"]"
    branches = (
        re.escape(bytes((size,))) + head + method + kinds + b".{%d}" % (size // 2 - fixed)
        for size in range(2 * fixed, 0x80, 2)
    )
    return re.compile(b"|".join(branches), re.DOTALL)


def _evens(first: int, last: int) -> bytes:
    """A class of the even bytes from ``first`` to ``last`` (one-byte ZigZag integers >= 0)."""
    return b"[" + re.escape(bytes(range(first, last + 1, 2))) + b"]"


#: An incoming RPC (IC -> LB): size, type RPC, reserved (any byte), method id, RPC type, args.
_INCOMING_RPC = _short_rpcs(b"\\x00.", 4, bytes((ASYNC, FORK, IMPULSE)))
#: A self call (LB -> IC) that is not an Impulse: size, type RPC, destination "", reserved, method, type.
_SELF_CALL = _short_rpcs(b"\\x00\\x00.", 5, bytes((ASYNC, FORK)))
_ONE_BYTE = _evens(0, 0x7E)
#: A batch's head, in groups: its size (one or two bytes), then RPCBatch and its
#: count, or CountReplayableRPCBatch, its count and its replayable count (one byte each).
_BATCH_HEAD = re.compile(
    b"(" + _evens(2, 0x7E) + b"|" + _evens(0x80, 0xFE) + b"[\\x01-\\x7f])"
    b"(?:(\\x05)(" + _ONE_BYTE + b")|(\\x0d)(" + _ONE_BYTE + b")(" + _ONE_BYTE + b"))",
    re.DOTALL,
)
#: Each RPC as a group, after the head of the batch it opens if it does (a second group, else
#: None): ``split`` gives both and anything else between two, which must be nothing. A batch
#: head is tried first where the RPC would start: a plain RPC's second byte is 0, a head's not.
_HEADED_RPC_SPLIT = re.compile(
    b"((?:" + _evens(2, 0x7E) + b"|" + _evens(0x80, 0xFE) + b"[\\x01-\\x7f])"
    b"(?:\\x05" + _ONE_BYTE + b"|\\x0d" + _ONE_BYTE + _ONE_BYTE + b"))?"
    b"(" + _INCOMING_RPC.pattern + b")",
    re.DOTALL,
)
#: A batch head's size field (each one- and two-byte form the head takes): the size.
_SIZE_VALUES = {bytes((b,)): b >> 1 for b in range(2, 0x80, 2)} | {
    bytes((low, high)): ((low & 0x7F) | high << 7) >> 1
    for low in range(0x80, 0x100, 2)
    for high in range(1, 0x80)
}
_METHOD_BYTE = itemgetter(3)
_RPC_TYPE_BYTE = itemgetter(4)
_SIZE_BYTE = itemgetter(0)
_SELF_CALL_REST = itemgetter(slice(3, None))
_INCOMING_ARGS = itemgetter(slice(5, None))
_HALVE = bytes(b >> 1 for b in range(256))  # a one-byte ZigZag integer >= 0 (an even byte): its value
#: An incoming RPC's size byte and type, by the size byte of the same RPC sent as a self call.
_INCOMING_HEAD = [bytes((size - 2, RPC)) if size >= 2 else b"" for size in range(0x80)]


def scan_rpcs(body: bytes) -> tuple[bytes, list[bytes]] | None:
    """A record body of plain incoming RPCs read in one pass: (method ids, one a byte; args).

    It takes only the common short form (a one-byte size, type RPC, a one-byte
    method id >= 0, RPC type 0 to 2) and returns None when any message has
    another shape, so the general path (``record_messages``) reads and judges
    that body instead. No message objects: one regular-expression pass.
    """
    found = _INCOMING_RPC.findall(body)
    if len(b"".join(found)) != len(body):  # matches tile the body only if every message is one
        return None
    return bytes(map(_METHOD_BYTE, found)).translate(_HALVE), list(map(_INCOMING_ARGS, found))


def scan_batched_rpcs(body: bytes) -> tuple[bytes, list[bytes]] | None:
    """``scan_rpcs`` for a body that may also hold RPCBatch and CountReplayableRPCBatch messages of
    such RPCs (mock-ic's default, as a busy IC logs them): every RPC in order, as if plain.

    One regular-expression pass splits the body into RPCs, each after the head of the batch it
    opens if it does; each batch is then checked as ``Session._batch`` checks it (its size, its
    count, its replayable count), so a body comes back only where the general path finds nothing
    wrong; None otherwise. The loop runs once a batch, not once an RPC.
    """
    parts = _HEADED_RPC_SPLIT.split(body)
    if any(parts[0::3]):  # bytes that are neither an RPC nor a batch's head
        return None
    heads = parts[1::3]  # before each RPC: the head of the batch it opens, or None
    rpcs = parts[2::3]
    methods = bytes(map(_METHOD_BYTE, rpcs)).translate(_HALVE)
    if any(heads):
        total = len(rpcs)
        after = 0  # the index of the RPC after the last batch
        types = None
        known = _HEADS.get
        for first in compress(range(total), heads):
            fields = known(heads[first]) or _batch_head(heads[first])
            if fields is None or first < after:  # a head inside the batch before
                return None
            inner, count, replayable = fields
            after = first + count
            if after > total or len(b"".join(rpcs[first:after])) != inner:
                return None
            if replayable >= 0:
                if types is None:
                    types = bytes(map(_RPC_TYPE_BYTE, rpcs))
                if types.count(IMPULSE, first, after) != count - replayable:
                    return None
    return methods, list(map(_INCOMING_ARGS, rpcs))


#: Batch heads seen, by their bytes: (the bytes of their RPCs, their count, the replayable count or -1).
_HEADS: dict[bytes, tuple[int, int, int]] = {}


def _batch_head(head: bytes) -> tuple[int, int, int] | None:
    """A batch head's fields (see ``_HEADS``), None if ``head`` is not exactly one."""
    match = _BATCH_HEAD.fullmatch(head)
    if match is None:
        return None
    size, _, count, counted, counted_count, replayable = match.groups()
    if counted:
        fields = (_SIZE_VALUES[size] - 3, counted_count[0] >> 1, replayable[0] >> 1)
    else:
        fields = (_SIZE_VALUES[size] - 2, count[0] >> 1, -1)
    if len(_HEADS) >= 1 << 16:
        _HEADS.clear()
    _HEADS[head] = fields
    return fields


def scan_self_calls(data: bytes) -> list[bytes] | None:
    """An RPCBatch's data (from the LB) of plain self calls, each re-encoded as the IC delivers it.

    None unless the count matches and every inner message is a non-Impulse RPC
    to "" in the short form; the general path judges the rest.
    """
    try:
        count, pos = read_zz(data, 0, len(data))
    except (Incomplete, MalformedError):
        return None
    found = _SELF_CALL.findall(data, pos)
    if len(found) != count or len(b"".join(found)) != len(data) - pos:
        return None
    # each: the incoming head for its size byte, then its bytes from the reserved byte on
    heads = map(_INCOMING_HEAD.__getitem__, map(_SIZE_BYTE, found))
    return list(map(operator.add, heads, map(_SELF_CALL_REST, found)))


# --- stream splitters ---------------------------------------------------------------------------------


class RecordFrame(NamedTuple):
    """One log record as read from the IC -> LB stream."""

    offset: int
    header: Header
    body: bytes


class MessageFrame(NamedTuple):
    """One bare message as read from the LB -> IC stream."""

    offset: int
    length: int
    message: Message


class Blob(NamedTuple):
    """A piece of a checkpoint's raw bytes; ``remaining`` after it (0: the blob's last piece)."""

    offset: int
    data: bytes
    remaining: int


class Garbage(NamedTuple):
    """Bytes that cannot be framed: the stream is unusable from ``offset`` on (until a resync)."""

    offset: int
    reason: str


DEFAULT_MAX_RECORD = 64 * 1024 * 1024


class _Splitter:
    """Shared buffer handling: bytes in, frames out, blob pieces streamed without buffering them."""

    def __init__(self, max_size: int = DEFAULT_MAX_RECORD) -> None:
        self.buf = bytearray()
        self.pos = 0  # consumed bytes of buf
        self.offset = 0  # stream offset of buf[0]
        self.blob_left = 0
        self.max_size = max_size
        self.broken: str | None = None

    def _take_blob(self, out: list) -> None:
        avail = len(self.buf) - self.pos
        n = min(avail, self.blob_left)
        if n:
            self.blob_left -= n
            out.append(Blob(self.offset + self.pos, bytes(self.buf[self.pos : self.pos + n]), self.blob_left))
            self.pos += n

    def _compact(self) -> None:
        if self.pos:
            del self.buf[: self.pos]
            self.offset += self.pos
            self.pos = 0

    def gap(self, missing: int) -> None:
        """``missing`` bytes were lost: frames cannot be found again (no sync marker in this format)."""
        self.buf.clear()
        self.offset += missing
        self.pos = 0
        if self.blob_left >= missing:
            self.blob_left -= missing
        else:
            self.blob_left = 0
            self.broken = f"{missing} bytes lost: no way back to a frame boundary"

    @property
    def pending(self) -> int:
        return len(self.buf) - self.pos


class RecordSplitter(_Splitter):
    """The IC -> LB stream into ``RecordFrame``s and the ``Blob`` after a checkpoint record."""

    def feed(self, data: bytes) -> list:
        out: list = []
        if self.broken:
            return out
        self.buf += data
        buf = self.buf
        while True:
            if self.blob_left:
                self._take_blob(out)
                if self.blob_left:
                    break
            pos = self.pos
            if len(buf) - pos < HEADER_SIZE:
                break
            header = Header(*_HEADER.unpack_from(buf, pos))
            size = header.size
            if size < HEADER_SIZE or size > self.max_size:
                self.broken = (
                    f"record size {size} is below the 24-byte header"
                    if size < HEADER_SIZE
                    else f"record size {size} is above the {self.max_size}-byte limit"
                )
                out.append(Garbage(self.offset + pos, self.broken))
                break
            if len(buf) - pos < size:
                break
            body = bytes(buf[pos + HEADER_SIZE : pos + size])
            out.append(RecordFrame(self.offset + pos, header, body))
            self.pos = pos + size
            if header.seq == CHECKPOINT_SEQ:
                self.blob_left = _blob_after(body)
        self._compact()
        return out


def _blob_after(body: bytes) -> int:
    """The blob length a checkpoint record's body announces (0 if it does not parse: its judge says why)."""
    try:
        msgs = record_messages(body)
        if len(msgs) == 1 and msgs[0].type == CHECKPOINT:
            return checkpoint_length(msgs[0])
    except MalformedError:
        pass
    return 0


class MessageSplitter(_Splitter):
    """The LB -> IC stream into ``MessageFrame``s and the ``Blob`` after each Checkpoint."""

    def feed(self, data: bytes) -> list:
        out: list = []
        if self.broken:
            return out
        self.buf += data
        buf = self.buf
        end = len(buf)
        while True:
            if self.blob_left:
                self._take_blob(out)
                if self.blob_left:
                    break
            pos = self.pos
            if pos >= end:
                break
            try:
                size, after = read_zz(buf, pos, end)
                if size < 1 or size > self.max_size:
                    raise MalformedError(
                        f"message size {size} " + ("is below 1" if size < 1 else f"is above {self.max_size}"),
                        pos,
                    )
            except Incomplete:
                break
            except MalformedError as err:
                self.broken = err.reason
                out.append(Garbage(self.offset + pos, err.reason))
                break
            stop = after + size
            if stop > end:
                break
            message = Message(buf[after], bytes(buf[after + 1 : stop]))
            out.append(MessageFrame(self.offset + pos, stop - pos, message))
            self.pos = stop
            if message.type == CHECKPOINT:
                try:
                    self.blob_left = checkpoint_length(message)
                except MalformedError:
                    self.blob_left = 0
        self._compact()
        return out
