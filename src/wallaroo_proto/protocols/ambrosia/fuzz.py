"""Fuzzing AMBROSIA's IC <-> LB protocol: its records' and messages' fields, what a peer owes.

The layout is the protocol notes' (``codec.py``): an IC record is a 24-byte little-endian
header (committer id i32, size i32, check bytes u64, sequence id i64) and a body of messages;
an LB message is ``[size: ZigZagInt][type][data]``. Header fields are patched in place (the
check bytes hash the body alone, so they stay right); a field inside a body is a varint or
sits behind one, so ``with_value`` re-encodes the message with the codec and, for a record,
the record too (its size and check bytes follow): the change is the field's, not a framing
accident. The first message of a body is the one changed.

What a peer owes: a checkpoint request of the IC (TakeCheckpoint, TakeBecomingPrimaryCheckpoint,
UpgradeTakeCheckpoint) is owed the LB's Checkpoint; an LB's TakeCheckpoint is owed the IC's
TakeCheckpoint back (``MoveServiceToNextLogFileAsync``) once the IC's own request, if one is
outstanding, is answered. Neither side has an error reply: the IC dies on a broken rule
(``OnError``: its exit is its refusal), an LB throws, so refusing is closing. A template
inserted before an IC's record is fitted to it (its committer id, the sequence id due).
"""

from __future__ import annotations

import struct
from typing import Any

from wallaroo_proto.fuzz.hooks import Field, Owed

from .codec import (
    BECOMING_PRIMARY,
    CHECKPOINT,
    CONTROL_SEQ,
    COUNT_REPLAYABLE_RPC_BATCH,
    FORK,
    HEADER_SIZE,
    INITIAL_MESSAGE,
    RPC,
    RPC_BATCH,
    TAKE_BECOMING_PRIMARY_CHECKPOINT,
    TAKE_CHECKPOINT,
    TYPE_NAMES,
    UPGRADE_SERVICE,
    UPGRADE_TAKE_CHECKPOINT,
    Incomplete,
    MalformedError,
    checkpoint_record,
    control_record,
    encode_attach,
    encode_batch,
    encode_checkpoint,
    encode_incoming_rpc,
    encode_message,
    encode_outgoing_rpc,
    encode_record,
    read_header,
    read_zz,
    zz32,
    zz64,
)
from .core import IC, LB

#: Header fields: (name, kind, offset, bits), little-endian.
_HEADER_FIELDS = (
    ("committer_id", "id", 0, 32),
    ("record_size", "length", 4, 32),
    ("check_bytes", "uint", 8, 64),
    ("seq_id", "id", 16, 64),
)
_BROKEN = (MalformedError, Incomplete, struct.error, IndexError, ValueError)
_ASKS = ("TakeCheckpoint", "TakeBecomingPrimaryCheckpoint", "UpgradeTakeCheckpoint")


def _signed(value: int, bits: int) -> int:
    value %= 1 << bits
    return value - (1 << bits) if value >> (bits - 1) else value


def _message_fields(raw: bytes, at: int, outgoing: bool) -> list[tuple[str, str, int, int, int]]:
    """The first message at ``at``: its size and type, and the fields of an RPC, batch or Checkpoint
    as (name, kind, value, bits, offset); the data's varints read as the codec reads them."""
    out: list[tuple[str, str, int, int, int]] = []
    size, pos = read_zz(raw, at, len(raw))
    out.append(("message_size", "length", size, 32, at))
    if pos >= len(raw):
        return out
    kind = raw[pos]
    out.append(("message_type", "enum", kind, 8, pos))
    data, end = pos + 1, min(len(raw), pos + size)
    if kind == RPC:
        if outgoing:
            length, after = read_zz(raw, data, end)
            out.append(("destination_length", "length", length, 32, data))
            data = after + max(0, length)
        method, after = read_zz(raw, data + 1, end)
        out.append(("method_id", "id", method % (1 << 32), 32, data + 1))
        if after < end:
            out.append(("rpc_type", "enum", raw[after], 8, after))
    elif kind in (RPC_BATCH, COUNT_REPLAYABLE_RPC_BATCH):
        count, after = read_zz(raw, data, end)
        out.append(("batch_count", "count", count, 32, data))
        if kind == COUNT_REPLAYABLE_RPC_BATCH:
            replayable, _ = read_zz(raw, after, end)
            out.append(("replayable_count", "count", replayable, 32, after))
    elif kind == CHECKPOINT:
        length, _ = read_zz(raw, data, end, 64)
        out.append(("checkpoint_length", "length", length % (1 << 64), 64, data))
    return out


def fields(record: dict, raw: bytes) -> list[Field]:
    """A record's header fields and its first message's; an LB message's size, type and data fields."""
    if record.get("type") == "CheckpointBytes" or not raw:
        return []
    out: list[Field] = []
    try:
        if record.get("sender") == LB:
            found = _message_fields(raw, 0, outgoing=True)
        else:
            for name, kind, offset, bits in _HEADER_FIELDS:
                if offset + bits // 8 <= len(raw):
                    value = int.from_bytes(raw[offset : offset + bits // 8], "little")
                    out.append(Field(name, kind, value, bits, offset, "little"))
            found = _message_fields(raw, HEADER_SIZE, outgoing=False) if len(raw) > HEADER_SIZE else []
    except _BROKEN:
        return out  # a malformed frame: its header fields only (what was read before the damage)
    return out + [Field(name, kind, value, bits, offset) for name, kind, value, bits, offset in found]


def _rewrite(raw: bytes, at: int, outgoing: bool, field: Field, value: int) -> bytes:
    """The message at ``at`` with ``field`` set, re-encoded (its size follows, unless it is the field)."""
    size, pos = read_zz(raw, at, len(raw))
    end = pos + size
    if field.name == "message_size":
        return raw[:at] + zz32(_signed(value, 32)) + raw[pos:]
    kind, data = raw[pos], raw[pos + 1 : end]
    if field.name == "message_type":
        kind = value & 0xFF
    else:
        local = field.offset - (pos + 1)  # type: ignore[operator]
        if field.name == "rpc_type":
            data = data[:local] + bytes((value & 0xFF,)) + data[local + 1 :]
        else:
            bits = 64 if field.name == "checkpoint_length" else 32
            _, after = read_zz(data, local, len(data), bits)
            number = _signed(value, bits)
            data = data[:local] + (zz64(number) if bits == 64 else zz32(number)) + data[after:]
    return raw[:at] + encode_message(kind, data) + raw[end:]


def with_value(record: dict, raw: bytes, field: Field, value: int) -> bytes:
    """Header fields patched in place; a body's field re-encoded with the codec (the record's size and
    check bytes follow, so only the field changed)."""
    if field.byteorder == "little":
        size = field.bits // 8
        data = (value % (1 << field.bits)).to_bytes(size, "little")
        return raw[: field.offset] + data + raw[field.offset + size :]  # type: ignore[operator]
    try:
        if record.get("sender") == LB:
            return _rewrite(raw, 0, True, field, value)
        header = read_header(raw)
        body = _rewrite(raw[: header.size], HEADER_SIZE, False, field, value)[HEADER_SIZE:]
        return encode_record(header.committer, header.seq, body) + raw[header.size :]
    except _BROKEN:
        return raw


def templates(side: str) -> dict[str, bytes]:
    """One well-formed frame of each kind ``side`` sends (committer id 0 for the IC's records)."""
    if side == IC:
        frames = {
            TYPE_NAMES[kind]: control_record(0, kind)
            for kind in (
                TAKE_CHECKPOINT,
                TAKE_BECOMING_PRIMARY_CHECKPOINT,
                UPGRADE_TAKE_CHECKPOINT,
                UPGRADE_SERVICE,
                BECOMING_PRIMARY,
            )
        }
        frames["CheckpointRecord"] = checkpoint_record(0, b"")
        frames["Record"] = encode_record(0, 0, encode_incoming_rpc(1, FORK, b'{"value":1}'))
        return frames
    return {
        "RPC": encode_outgoing_rpc("", 1, FORK, b'{"value":1}'),
        "AttachTo": encode_attach("fuzz"),
        "TakeCheckpoint": encode_message(TAKE_CHECKPOINT),
        "RPCBatch": encode_batch([encode_outgoing_rpc("", 1, FORK, b"{}")] * 2),
        "Checkpoint": encode_checkpoint(0),
        "InitialMessage": encode_message(INITIAL_MESSAGE, b"fuzz"),
    }


def fit(template: bytes, frame: Any) -> bytes:
    """An IC's record to insert before ``frame`` carries its committer id and, a normal record
    before a normal record, its sequence id (the one due): out of state and nothing else. Both
    are header fields the check bytes do not cover, so they are written in place."""
    if frame.record.get("sender") != IC or len(template) < HEADER_SIZE or len(frame.raw) < HEADER_SIZE:
        return template
    raw = frame.raw
    seq = raw[16:24] if read_header(template).seq >= 0 and read_header(raw).seq >= 0 else template[16:24]
    return raw[:4] + template[4:16] + seq + template[HEADER_SIZE:]


def owed(record: dict) -> Owed | None:
    """A checkpoint request of the IC is owed the LB's Checkpoint; an LB's TakeCheckpoint the IC's,
    unless the IC's own request is outstanding (``ic_asked``): it asks back only once that is
    answered, which the LB may never do."""
    kind = record.get("type")
    if record.get("sender") == IC and kind in _ASKS and record.get("seq_id") == CONTROL_SEQ:
        return Owed(frozenset({"Checkpoint"}))
    if record.get("sender") == LB and kind == "TakeCheckpoint" and not record.get("ic_asked"):
        return Owed(frozenset({"TakeCheckpoint"}))
    return None


def refusal(record: dict) -> bool:
    """No frame is an error reply: an AMBROSIA peer refuses by closing its sockets."""
    return False


def tolerated(record: dict) -> bool:
    """A binding trusts its IC: none verifies check bytes (the notes: Node leaves it commented
    out, C# reads and ignores), so an LB going on after an illegal IC record is no finding."""
    return record.get("sender") == IC


def signature(kind: str) -> str:
    """An LB's RPCs are one thing however batched: a batch is a hint, cut as the LB's reads fall."""
    return "RPCs" if kind in ("RPC", "RPCBatch") else kind


#: Neither side has an error reply to send before it closes.
REPLY_BEFORE_CLOSE: frozenset[str] = frozenset()
#: An IC dies on an LB's broken rule (``OnError``): its exit after an illegal frame is its refusal.
REFUSE_BY_EXIT: frozenset[str] = frozenset({IC})
