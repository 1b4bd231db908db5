"""Encode frame values to wire bytes and decode frame bodies back to values.

A frame on the wire is ``u32 length`` (big endian, counting every byte after
itself), ``u8 type`` and the type's fields. ``encode`` returns the whole frame;
``decode`` takes the body (type byte onwards) that the length prefix delimits.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from .errors import EncodeError, MalformedFrame, UnknownFrameType
from .frames import (
    Ack,
    EosMessage,
    Error,
    Frame,
    FrameType,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    WorkersLeft,
    type_name,
)
from .wire import MESSAGE_HEAD, U32, Cursor, Writer, as_text


def encode_body(frame: Frame) -> bytes:
    """The frame's bytes after the length prefix; raises EncodeError on bad values."""
    encoder = _ENCODERS.get(type(frame))
    if encoder is None:
        raise EncodeError(f"not a frame value: {frame!r}")
    w = Writer(frame.TYPE.name)
    w.int("u8", int(frame.TYPE), "type")
    encoder(w, frame)
    return w.getvalue()


def encode(frame: Frame) -> bytes:
    """The whole frame as it goes on the wire, length prefix included."""
    if type(frame) is Message and type(frame.key) is bytes and type(frame.payload) is bytes:
        # Fast path for the hot frame; any value struct refuses goes the checked way below.
        key = frame.key
        try:
            head = MESSAGE_HEAD.pack(
                27 + len(key) + len(frame.payload),
                5,
                frame.stream_id,
                frame.message_id,
                frame.event_time,
                len(key),
            )
        except struct.error:
            pass
        else:
            return head + key + frame.payload
    body = encode_body(frame)
    if len(body) > 0xFFFF_FFFF:
        raise EncodeError(f"{frame.TYPE.name} body of {len(body)} bytes exceeds a u32 length")
    return U32.pack(len(body)) + body


def encode_messages(messages: list[Message]) -> bytes:
    """A run of MESSAGEs as one buffer: what ``encode`` gives each, joined, in one pass."""
    pack = MESSAGE_HEAD.pack
    try:
        return b"".join(
            [pack(27 + len(k) + len(p), 5, s, i, t, len(k)) + k + p for s, i, t, k, p in messages]
        )
    except (struct.error, TypeError):  # a value the fast path cannot take: the checked way, frame by frame
        return b"".join(map(encode, messages))


def decode(body: bytes) -> Frame:
    """Decode one frame body; any defect raises a ProtocolError subclass."""
    if not body:
        raise MalformedFrame("empty frame body: no type byte", field_offset=0)
    type_byte = body[0]
    decoder = _DECODERS.get(type_byte)
    if decoder is None:
        raise UnknownFrameType(
            f"unknown frame type {type_byte} (known: 0-{int(max(_DECODERS))})",
            frame_type=type_name(type_byte),
            field_offset=0,
        )
    name = FrameType(type_byte).name
    return decoder(Cursor(body, 1, name))


# --- encoders ---------------------------------------------------------------


def _enc_hello(w: Writer, f: Hello) -> None:
    w.short_bytes(f.version, "version")
    w.short_bytes(f.cookie, "cookie")
    w.short_bytes(f.program_name, "program_name")
    w.short_bytes(f.instance_name, "instance_name")


def _enc_ok(w: Writer, f: Ok) -> None:
    w.int("u32", f.initial_credits, "initial_credits")


def _enc_error(w: Writer, f: Error) -> None:
    w.short_bytes(f.reason, "reason")


def _enc_notify(w: Writer, f: Notify) -> None:
    w.int("u64", f.stream_id, "stream_id")
    w.short_bytes(f.stream_name, "stream_name")
    w.int("u64", f.point_of_ref, "point_of_ref")


def _enc_notify_ack(w: Writer, f: NotifyAck) -> None:
    w.int("u8", 1 if f.success else 0, "success")
    w.int("u64", f.stream_id, "stream_id")
    w.int("u64", f.point_of_ref, "point_of_ref")


def _enc_message(w: Writer, f: Message) -> None:
    w.int("u64", f.stream_id, "stream_id")
    w.int("u64", f.message_id, "message_id")
    w.int("i64", f.event_time, "event_time")
    w.short_bytes(f.key, "key")
    w.rest(f.payload, "payload")


def _enc_ack(w: Writer, f: Ack) -> None:
    w.int("u32", f.credits, "credits")
    w.int("u32", len(f.acks), "count")
    for stream_id, point_of_ref in f.acks:
        w.int("u64", stream_id, "stream_id")
        w.int("u64", point_of_ref, "point_of_ref")


def _enc_restart(w: Writer, f: Restart) -> None:
    if f.address is None:
        return
    raw = f.address.encode("utf-8") if isinstance(f.address, str) else bytes(f.address)
    w.int("u32", len(raw), "address length")
    w.rest(raw, "address")


def _enc_eos(w: Writer, f: EosMessage) -> None:
    w.int("u64", f.stream_id, "stream_id")
    if f.message_id is not None:
        w.int("u64", f.message_id, "message_id")


def _enc_workers_left(w: Writer, f: WorkersLeft) -> None:
    w.int("u64", f.rtag, "rtag")
    w.int("u32", len(f.worker_names), "count")
    for name in f.worker_names:
        w.short_bytes(name, "worker_name")


_ENCODERS: dict[type, Callable] = {
    Hello: _enc_hello,
    Ok: _enc_ok,
    Error: _enc_error,
    Notify: _enc_notify,
    NotifyAck: _enc_notify_ack,
    Message: _enc_message,
    Ack: _enc_ack,
    Restart: _enc_restart,
    EosMessage: _enc_eos,
    WorkersLeft: _enc_workers_left,
}


# --- decoders ---------------------------------------------------------------


def _dec_hello(c: Cursor) -> Hello:
    frame = Hello(c.text("version"), c.short_bytes("cookie"), c.text("program_name"), c.text("instance_name"))
    c.end()
    return frame


def _dec_ok(c: Cursor) -> Ok:
    frame = Ok(c.u32("initial_credits"))
    c.end()
    return frame


def _dec_error(c: Cursor) -> Error:
    frame = Error(c.text("reason"))
    c.end()
    return frame


def _dec_notify(c: Cursor) -> Notify:
    frame = Notify(c.u64("stream_id"), c.text("stream_name"), c.u64("point_of_ref"))
    c.end()
    return frame


def _dec_notify_ack(c: Cursor) -> NotifyAck:
    frame = NotifyAck(c.flag("success"), c.u64("stream_id"), c.u64("point_of_ref"))
    c.end()
    return frame


def _dec_message(c: Cursor) -> Message:
    return Message(
        c.u64("stream_id"), c.u64("message_id"), c.i64("event_time"), c.short_bytes("key"), c.rest()
    )


def _dec_ack(c: Cursor) -> Ack:
    credits = c.u32("credits")
    n = c.count("count", 16)
    acks = tuple((c.u64("stream_id"), c.u64("point_of_ref")) for _ in range(n))
    c.end()
    return Ack(credits, acks)


def _dec_restart(c: Cursor) -> Restart:
    if c.remaining() == 0:
        return Restart(None)
    size = c.u32("address length")
    frame = Restart(as_text(c.raw(size, "address")))
    c.end()
    return frame


def _dec_eos(c: Cursor) -> EosMessage:
    size = c.remaining()
    if size not in (8, 16):
        raise MalformedFrame(
            f"EOS_MESSAGE body of {size} bytes: the spec's form has 16 (stream_id, message_id), "
            "the shipped form 8 (stream_id)",
            frame_type="EOS_MESSAGE",
            field_offset=1,
        )
    stream_id = c.u64("stream_id")
    return EosMessage(stream_id, c.u64("message_id") if size == 16 else None)


def _dec_workers_left(c: Cursor) -> WorkersLeft:
    rtag = c.u64("rtag")
    n = c.count("count", 2)
    frame = WorkersLeft(rtag, tuple(c.text("worker_name") for _ in range(n)))
    c.end()
    return frame


_DECODERS: dict[int, Callable[[Cursor], Frame]] = {
    FrameType.HELLO: _dec_hello,
    FrameType.OK: _dec_ok,
    FrameType.ERROR: _dec_error,
    FrameType.NOTIFY: _dec_notify,
    FrameType.NOTIFY_ACK: _dec_notify_ack,
    FrameType.MESSAGE: _dec_message,
    FrameType.ACK: _dec_ack,
    FrameType.RESTART: _dec_restart,
    FrameType.EOS_MESSAGE: _dec_eos,
    FrameType.WORKERS_LEFT: _dec_workers_left,
}
