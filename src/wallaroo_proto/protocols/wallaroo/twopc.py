"""Two-phase-commit messages of the sink protocol, carried in stream-0 MESSAGE payloads.

The first payload byte is the tag (201..206); the rest is the message body.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import NamedTuple

from .errors import EncodeError, UnknownFrameType
from .frames import Message, Text, _strict_equality
from .wire import Cursor, Writer

#: The stream that carries 2PC messages in the sink protocol.
TWOPC_STREAM = 0
#: The stream the shipped worker NOTIFYs for a sink's application output.
SINK_DATA_STREAM = 1


class TwoPCTag(IntEnum):
    LIST_UNCOMMITTED = 201
    REPLY_UNCOMMITTED = 202
    PHASE1 = 203
    REPLY = 204
    PHASE2 = 205
    WORKERS_LEFT = 206


@_strict_equality
class ListUncommitted(NamedTuple):
    rtag: int
    TAG = TwoPCTag.LIST_UNCOMMITTED


@_strict_equality
class ReplyUncommitted(NamedTuple):
    rtag: int
    txn_ids: tuple[Text, ...]
    TAG = TwoPCTag.REPLY_UNCOMMITTED


@_strict_equality
class Phase1(NamedTuple):
    """``where``: (stream_id, start_por, end_por) byte ranges the txn covers."""

    txn_id: Text
    where: tuple[tuple[int, int, int], ...]
    TAG = TwoPCTag.PHASE1


@_strict_equality
class Reply(NamedTuple):
    txn_id: Text
    commit: bool
    TAG = TwoPCTag.REPLY


@_strict_equality
class Phase2(NamedTuple):
    txn_id: Text
    commit: bool
    TAG = TwoPCTag.PHASE2


@_strict_equality
class TwoPCWorkersLeft(NamedTuple):
    """Shipped dialect only (tag 206)."""

    rtag: int
    worker_names: tuple[Text, ...]
    TAG = TwoPCTag.WORKERS_LEFT


TwoPCMessage = ListUncommitted | ReplyUncommitted | Phase1 | Reply | Phase2 | TwoPCWorkersLeft


def encode_twopc(msg: TwoPCMessage) -> bytes:
    """The MESSAGE payload that carries ``msg``."""
    encoder = _ENCODERS.get(type(msg))
    if encoder is None:
        raise EncodeError(f"not a 2PC message: {msg!r}")
    w = Writer(msg.TAG.name)
    w.int("u8", int(msg.TAG), "tag")
    encoder(w, msg)
    return w.getvalue()


def twopc_frame(msg: TwoPCMessage) -> Message:
    """A stream-0 MESSAGE as the shipped worker sends it (id 0, time 0, no key)."""
    return Message(TWOPC_STREAM, 0, 0, b"", encode_twopc(msg))


def decode_twopc(payload: bytes) -> TwoPCMessage:
    """Decode a stream-0 payload; any defect raises a ProtocolError subclass."""
    if not payload:
        raise UnknownFrameType("empty 2PC payload: no tag byte", frame_type="MESSAGE", field_offset=0)
    tag = payload[0]
    decoder = _DECODERS.get(tag)
    if decoder is None:
        known = ", ".join(f"{t} {TwoPCTag(t).name}" for t in sorted(_DECODERS))
        raise UnknownFrameType(
            f"unknown 2PC tag {tag} (known: {known})", frame_type="MESSAGE", field_offset=0
        )
    cursor = Cursor(payload, 1, f"2PC {TwoPCTag(tag).name}")
    msg = decoder(cursor)
    cursor.end()
    return msg


def _enc_rtag(w: Writer, m: ListUncommitted) -> None:
    w.int("u64", m.rtag, "rtag")


def _enc_names(field: str) -> Callable:
    def encode(w: Writer, m) -> None:
        w.int("u64", m.rtag, "rtag")
        items = getattr(m, field)
        w.int("u32", len(items), "count")
        for item in items:
            w.short_bytes(item, field)

    return encode


def _enc_phase1(w: Writer, m: Phase1) -> None:
    w.short_bytes(m.txn_id, "txn_id")
    w.int("u32", len(m.where), "count")
    for stream_id, start, end in m.where:
        w.int("u64", stream_id, "stream_id")
        w.int("u64", start, "start_por")
        w.int("u64", end, "end_por")


def _enc_decision(w: Writer, m: Reply | Phase2) -> None:
    w.short_bytes(m.txn_id, "txn_id")
    w.int("u8", 1 if m.commit else 0, "commit")


_ENCODERS: dict[type, Callable] = {
    ListUncommitted: _enc_rtag,
    ReplyUncommitted: _enc_names("txn_ids"),
    Phase1: _enc_phase1,
    Reply: _enc_decision,
    Phase2: _enc_decision,
    TwoPCWorkersLeft: _enc_names("worker_names"),
}


def _dec_names(cls: type, field: str) -> Callable[[Cursor], TwoPCMessage]:
    def decode(c: Cursor) -> TwoPCMessage:
        rtag = c.u64("rtag")
        n = c.count("count", 2)
        return cls(rtag, tuple(c.text(field) for _ in range(n)))

    return decode


def _dec_phase1(c: Cursor) -> Phase1:
    txn_id = c.text("txn_id")
    n = c.count("count", 24)
    return Phase1(txn_id, tuple((c.u64("stream_id"), c.u64("start_por"), c.u64("end_por")) for _ in range(n)))


_DECODERS: dict[int, Callable[[Cursor], TwoPCMessage]] = {
    TwoPCTag.LIST_UNCOMMITTED: lambda c: ListUncommitted(c.u64("rtag")),
    TwoPCTag.REPLY_UNCOMMITTED: _dec_names(ReplyUncommitted, "txn_ids"),
    TwoPCTag.PHASE1: _dec_phase1,
    TwoPCTag.REPLY: lambda c: Reply(c.text("txn_id"), c.flag("commit")),
    TwoPCTag.PHASE2: lambda c: Phase2(c.text("txn_id"), c.flag("commit")),
    TwoPCTag.WORKERS_LEFT: _dec_names(TwoPCWorkersLeft, "worker_names"),
}
