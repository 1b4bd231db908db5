"""Fuzzing the Wallaroo connector protocol: its frames' fields, what a peer owes, how it refuses.

The layout is the codec's (``codec.py``): a u32 length (of what follows), a u8 type, then
the body; strings are a u16 length and bytes. What a peer owes is the spec's: a HELLO gets
OK or ERROR, a NOTIFY a NOTIFY_ACK, a 2PC PHASE1 a REPLY, a LIST_UNCOMMITTED a
REPLY_UNCOMMITTED, a RESTART a new connection (PROTOCOL-NOTES.md: close, reconnect, HELLO
again). A worker refuses with ERROR.
"""

from __future__ import annotations

import struct

from wallaroo_proto.fuzz.hooks import Field, Owed, integer_at, laid_out

from .codec import encode
from .frames import Ack, EosMessage, Error, Hello, Message, Notify, NotifyAck, Ok, Restart

_U16 = struct.Struct(">H")


def fields(record: dict, raw: bytes) -> list[Field]:
    """The frame's length and type, and its body's numbers and lengths, where they lie."""
    layout: list[tuple[str, str, int, int]] = [("length", "length", 0, 32), ("type", "enum", 4, 8)]
    kind = record.get("type")
    if kind == "OK":
        layout.append(("initial_credits", "credit", 5, 32))
    elif kind in ("HELLO", "ERROR"):
        layout.append(("string_length", "length", 5, 16))
    elif kind == "NOTIFY":
        name = integer_at(raw, 13, 16)
        layout += [("stream_id", "id", 5, 64), ("stream_name_length", "length", 13, 16)]
        if name is not None:
            layout.append(("point_of_ref", "id", 15 + name, 64))
    elif kind == "NOTIFY_ACK":
        layout += [("success", "enum", 5, 8), ("stream_id", "id", 6, 64), ("point_of_ref", "id", 14, 64)]
    elif kind == "MESSAGE":
        layout += [("stream_id", "id", 5, 64), ("message_id", "id", 13, 64), ("key_length", "length", 29, 16)]
    elif kind == "ACK":
        layout += [("credits", "credit", 5, 32), ("count", "count", 9, 32)]
        if len(raw) >= 29:
            layout += [("ack_stream_id", "id", 13, 64), ("ack_point_of_ref", "id", 21, 64)]
    elif kind == "EOS_MESSAGE":
        layout.append(("stream_id", "id", 5, 64))
        if len(raw) >= 21:
            layout.append(("message_id", "id", 13, 64))
    elif kind == "RESTART" and len(raw) >= 9:
        layout.append(("address_length", "length", 5, 32))
    return laid_out(raw, layout)


def templates(side: str) -> dict[str, bytes]:
    """One well-formed frame of each type, for either side: a frame of the other side's or out of
    state is what a fuzzer sends where the core expects something else."""
    frames = {
        "HELLO": Hello("0.0.1", b"", "fuzz", "fuzz"),
        "OK": Ok(500),
        "ERROR": Error("fuzz"),
        "NOTIFY": Notify(1, "fuzz", 0),
        "NOTIFY_ACK": NotifyAck(True, 1, 0),
        "MESSAGE": Message(1, 1, 0, b"", b"fuzz"),
        "ACK": Ack(10, ((1, 1),)),
        "RESTART": Restart(None),
        "EOS_MESSAGE": EosMessage(1, 1),
    }
    return {name: encode(frame) for name, frame in frames.items()}


def owed(record: dict) -> Owed | None:
    kind = record.get("type")
    if kind == "HELLO":
        return Owed(frozenset({"OK", "ERROR"}))
    if kind == "NOTIFY":
        return Owed(frozenset({"NOTIFY_ACK", "ERROR"}))
    if kind == "MESSAGE" and record.get("twopc") in ("PHASE1", "LIST_UNCOMMITTED"):
        # its REPLY (REPLY_UNCOMMITTED) rides a stream-0 MESSAGE: each is owed its own, or a
        # REPLY_UNCOMMITTED still in flight would pass for a PHASE1's REPLY
        return Owed(frozenset({"MESSAGE", "ERROR"}))
    if kind == "RESTART":
        return Owed(reconnect=True)
    return None


def refusal(record: dict) -> bool:
    return record.get("type") == "ERROR"


#: A worker answers an illegal frame with ERROR, then closes (PROTOCOL-NOTES.md).
REPLY_BEFORE_CLOSE = frozenset({"worker"})
