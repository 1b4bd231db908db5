"""AMBROSIA's IC <-> LB sockets for the proxy's fault rules: frames, their fields, a cut between records.

The language binding (LB) connects to the IC's two ports, so on a proxied
connection the client is the LB and the upstream the IC: what the LB sends
are bare messages (the receive port, ``MessageSplitter``), what the IC sends
are log records (the send port, ``RecordSplitter``). A checkpoint's raw bytes
follow their Checkpoint message or record outside any frame; they come out
as ``CheckpointBytes`` frames, a piece at a time as they arrive (``dissect``
records only the piece that ends them), so a large checkpoint is never held
whole. Bytes that cannot be framed (a record size below its header, a message
size of 0) and all after them pass as they come, each read an ``INVALID`` frame.
Fields are those ``dissect`` gives a frame, without the pair's
``phase`` and ``lb`` (one connection here does not see its partner's).
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

from wallaroo_proto.proxy.faultkit import FaultError, Frame, NamedFault

from .codec import (
    CHECKPOINT,
    CHECKPOINT_SEQ,
    CONTROL_SEQ,
    COUNT_REPLAYABLE_RPC_BATCH,
    HEADER_SIZE,
    RPC,
    RPC_BATCH,
    RPC_TYPE_NAMES,
    Blob,
    Garbage,
    MalformedError,
    Message,
    MessageFrame,
    MessageSplitter,
    RecordFrame,
    RecordSplitter,
    decode_rpc,
    read_header,
    record_messages,
)
from .core import IC, LB
from .dissect import RECEIVE, SEND, _batch_count, _length

#: A log record's header fields that can be rewritten: dissect's name -> the header's field.
_HEADER_FIELDS = {"committer_id": "committer", "check_bytes": "check", "seq_id": "seq"}
_HEADER = struct.Struct("<iiQq")


class _Side:
    __slots__ = ("splitter", "buf", "start", "parts", "blob_length")

    def __init__(self, splitter: RecordSplitter | MessageSplitter) -> None:
        self.splitter = splitter
        self.buf = bytearray()
        self.start = 0  # stream offset of buf[0]
        self.parts: deque[Any] = deque()  # per frame handed out: the splitter's value, for fields()
        self.blob_length = 0  # the checkpoint whose bytes are coming

    def give_up(self) -> list[bytes]:
        """Not framed any more: what is held goes on as one frame, each later read as its own."""
        rest = bytes(self.buf)
        self.buf.clear()
        if not rest:
            return []
        self.parts.append(None)
        return [rest]


class AmbrosiaAdapter:
    """One proxied socket of an LB (the client) and its IC (the upstream), for the fault rules."""

    def __init__(self) -> None:
        self.sides = {True: _Side(MessageSplitter()), False: _Side(RecordSplitter())}
        self.socket: str | None = None

    def frames(self, from_client: bool, data: bytes) -> list[bytes]:
        side = self.sides[from_client]
        if self.socket is None:
            self.socket = RECEIVE if from_client else SEND
        side.buf += data
        if side.splitter.broken:
            return side.give_up()
        out: list[bytes] = []
        end = 0
        for part in side.splitter.feed(data):
            if type(part) is Garbage:
                del side.buf[:end]
                return out + side.give_up()  # no frame boundary can be found again
            offset, length = _span(part)
            end = offset + length - side.start
            out.append(bytes(side.buf[offset - side.start : end]))
            side.parts.append(part)
        del side.buf[:end]
        side.start += end
        return out

    def tail(self, from_client: bool) -> bytes:
        """The bytes of this direction not yet in a frame: a record or message cut short."""
        return bytes(self.sides[from_client].buf)

    def fields(self, frame: bytes, from_client: bool) -> dict[str, Any]:
        side = self.sides[from_client]
        part = side.parts.popleft()
        out: dict[str, Any] = {"sender": LB if from_client else IC, "ambrosia_socket": self.socket}
        if part is None:
            out["type"] = "INVALID"  # bytes past what cannot be framed
        elif type(part) is Blob:
            out["type"] = "CheckpointBytes"
            out["checkpoint_length"] = side.blob_length
        elif type(part) is RecordFrame:
            _record_fields(out, part, side)
        else:
            _message_fields(out, part.message, side)
        return out

    def rewrite(self, frame: Frame, field_name: str, value: Any) -> bytes:
        if field_name not in _HEADER_FIELDS:
            raise FaultError(
                f"field {field_name!r} cannot be rewritten in AMBROSIA; these can (a log record's header): "
                + ", ".join(_HEADER_FIELDS)
            )
        if "seq_id" not in frame.fields:
            raise FaultError(f"{field_name} is a log record's field; a {frame.fields.get('type')} has none")
        if field_name == "check_bytes" and isinstance(value, str):
            try:
                value = int(value, 16)
            except ValueError:
                raise FaultError(f"check_bytes is 16 hex digits, not {value!r}") from None
        header = read_header(frame.data)._replace(**{_HEADER_FIELDS[field_name]: value})
        try:
            return _HEADER.pack(*header) + frame.data[HEADER_SIZE:]
        except struct.error:
            raise FaultError(f"{value!r} does not fit {field_name}") from None

    def error_frame(self, reason: str, to_client: bool) -> bytes | None:
        return None  # neither side has an error message: the IC and the LB just close


def _span(part: Any) -> tuple[int, int]:
    """Where a splitter's value lies in its stream: (offset, length)."""
    if type(part) is RecordFrame:
        return part.offset, part.header.size
    if type(part) is MessageFrame:
        return part.offset, part.length
    return part.offset, len(part.data)


def _record_fields(out: dict, frame: RecordFrame, side: _Side) -> None:
    header = frame.header
    try:
        msgs = record_messages(frame.body)
    except MalformedError:
        msgs = []
    out["seq_id"] = header.seq
    out["committer_id"] = header.committer
    out["check_bytes"] = f"{header.check:016x}"
    out["record_size"] = header.size
    out["message_count"] = len(msgs)
    if header.seq == CONTROL_SEQ:
        out["type"] = msgs[0].name if len(msgs) == 1 else "ControlRecord"
    elif header.seq == CHECKPOINT_SEQ:
        out["type"] = "CheckpointRecord"
        if len(msgs) == 1 and msgs[0].type == CHECKPOINT:
            side.blob_length = out["checkpoint_length"] = _length(msgs[0])
    else:
        out["type"] = "Record"
        out["rpc_count"] = sum(
            1 if m.type == RPC else _batch_count(m)
            for m in msgs
            if m.type in (RPC, RPC_BATCH, COUNT_REPLAYABLE_RPC_BATCH)
        )
        out["message_types"] = sorted({m.name for m in msgs})


def _message_fields(out: dict, msg: Message, side: _Side) -> None:
    out["type"] = msg.name
    if msg.type == RPC:
        try:
            rpc = decode_rpc(msg.data, outgoing=True)
        except MalformedError:
            return
        out["destination"] = rpc.destination
        out["method_id"] = rpc.method_id
        out["rpc_type"] = RPC_TYPE_NAMES.get(rpc.rpc_type, str(rpc.rpc_type))
        out["rpc_count"] = 1
    elif msg.type == RPC_BATCH:
        out["rpc_count"] = _batch_count(msg)
    elif msg.type == CHECKPOINT:
        side.blob_length = out["checkpoint_length"] = _length(msg)


def adapter() -> AmbrosiaAdapter:
    return AmbrosiaAdapter()


NAMED_FAULTS: dict[str, NamedFault] = {
    "drop-between-records": NamedFault(
        help="the IC's connection to the LB cut at a log record's start, the records before it delivered",
        where='type == "Record"',
        action="cut",
        direction="client",
    ),
}
