"""Fuzzing the MultiLangDaemon protocol: its lines' fields, what a peer owes, how it refuses.

A line is one JSON object (``codec.py``; ../shared/protocols/mld.md §2): a field's offset is
where its value's text starts in the line, and a new value re-encodes the line in its writer's
style (the MLD's compact JSON, kclpy's ``json.dumps``), its line end kept. A number stays
within a Java ``long`` (the MLD cannot write more). Text values are numbered: an action by its
place in ``ACTIONS``, a checkpoint error by ``ERRORS``, a sentinel sequence number by ``WORDS``
(past the end: a decimal sequence number).

Owed: each request of the daemon is owed a ``status`` (a checkpoint may come first); each
checkpoint of the processor a reply. Neither side has an error reply to an illegal line: kclpy
dies on a line it cannot read and the Java MLD exits on a bad status (mld.md §4), so refusing
is closing; a checkpoint reply with an error is the daemon's refusal of that checkpoint.
"""

from __future__ import annotations

import json
import re

from wallaroo_proto.fuzz.hooks import Field, Owed

from .codec import (
    CHECKPOINT_ERRORS,
    REQUESTS,
    SENTINELS,
    Checkpoint,
    Initialize,
    ProcessRecords,
    Record,
    ShardEnded,
    ShutdownRequested,
    Status,
    encode,
    encode_kclpy,
    is_sequence_number,
)
from .codec import LeaseLost as _LeaseLost
from .core import DAEMON, PROCESSOR

#: Every action, numbered for the ``action`` and ``responseFor`` fields.
ACTIONS = (*REQUESTS, "checkpoint", "status", "record")
#: A checkpoint reply's ``error``: 0 is null (success).
ERRORS = (None, *CHECKPOINT_ERRORS)
#: A sequence number that is not a number: 0 is null.
WORDS = (None, *SENTINELS)
#: Records in a batch: the KCL reads at most 10,000 a call; 14 bits go past it.
_COUNT_BITS = 14


def _line(raw: bytes) -> tuple[bytes, dict | None, bytes]:
    """The line's leading whitespace, its object (None if it is none), and what follows it."""
    body = raw.strip()
    start = raw.find(body) if body else len(raw)
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return raw, None, b""
    return raw[:start], obj if isinstance(obj, dict) else None, raw[start + len(body) :]


def _at(raw: bytes, key: str, last: bool = False) -> int | None:
    """The offset of ``key``'s value in the line (the last one's with ``last``: a batch's last record)."""
    found = list(re.finditer(rb'"' + key.encode() + rb'"\s*:\s*', raw))
    return (found[-1] if last else found[0]).end() if found else None


def _number(name: str, kind: str, value: object, offset: int | None, bits: int = 63) -> Field | None:
    """A number the MLD writes from a Java ``long``: 63 bits, the most it can write."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return Field(name, kind, value, max(bits, value.bit_length()), offset)


def _sequence(name: str, value: object, offset: int | None) -> Field | None:
    """A sequence number: a decimal number (an ``id``: around the last one sent matters) or a word."""
    if is_sequence_number(value):
        number = int(value)  # type: ignore[arg-type]
        return Field(name, "id", number, max(128, (number.bit_length() + 15) // 8 * 8), offset)
    if value in WORDS:
        return Field(name, "enum", WORDS.index(value), 8, offset)
    return None


def _enum(name: str, table: tuple, value: object, offset: int | None) -> Field | None:
    return Field(name, "enum", table.index(value), 8, offset) if value in table else None


def fields(record: dict, raw: bytes) -> list[Field]:
    """The line's action and, by action, its numbers, sequence numbers and names, where they lie."""
    _, obj, _ = _line(raw)
    if obj is None:
        return []
    action = obj.get("action")
    out = [_enum("action", ACTIONS, action, _at(raw, "action"))]
    if action == "status":
        out.append(_enum("responseFor", ACTIONS, obj.get("responseFor"), _at(raw, "responseFor")))
    elif action in ("initialize", "checkpoint"):
        out.append(_sequence("sequenceNumber", obj.get("sequenceNumber"), _at(raw, "sequenceNumber")))
        out.append(
            _number("subSequenceNumber", "id", obj.get("subSequenceNumber"), _at(raw, "subSequenceNumber"))
        )
        if "error" in obj:  # the daemon's reply
            out.append(_enum("error", ERRORS, obj.get("error"), _at(raw, "error")))
    elif action == "processRecords":
        records = obj.get("records")
        if isinstance(records, list):
            out.append(Field("records", "count", len(records), _COUNT_BITS, _at(raw, "records")))
        if isinstance(records, list) and records and isinstance(records[-1], dict):
            last = records[-1]
            out.append(
                _sequence("last.sequenceNumber", last.get("sequenceNumber"), _at(raw, "sequenceNumber", True))
            )
            for key in ("subSequenceNumber", "approximateArrivalTimestamp"):
                kind = "id" if key == "subSequenceNumber" else "uint"
                out.append(_number(f"last.{key}", kind, last.get(key), _at(raw, key, True)))
        out.append(
            _number(
                "millisBehindLatest", "uint", obj.get("millisBehindLatest"), _at(raw, "millisBehindLatest")
            )
        )
    return [f for f in out if f is not None]


def _name(table: tuple, value: int) -> str | None:
    return table[value] if value < len(table) else f"{table[-1] or 'x'}{value}"


def with_value(record: dict, raw: bytes, field: Field, value: int) -> bytes:
    """The line with ``field`` set to ``value`` (see the module's docstring), re-encoded in its style."""
    head, obj, tail = _line(raw)
    if obj is None:
        return raw
    target, key = obj, field.name
    if key.startswith("last."):
        records = obj.get("records") or [{}]
        target, key = records[-1], key.removeprefix("last.")
    new: object = value
    if key == "records":
        records = obj["records"]
        filler = records[-1] if records else _record_dict()
        new = (records + [filler] * value)[:value]
    elif key in ("action", "responseFor"):
        new = _name(ACTIONS, value)
    elif key == "error":
        new = _name(ERRORS, value)
    elif key == "sequenceNumber":
        new = str(value) if field.kind == "id" or value >= len(WORDS) else WORDS[value]
    target[key] = new
    kclpy = b'": ' in raw or b'", "' in raw
    text = json.dumps(obj) if kclpy else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return head + text.encode() + tail


def _record_dict() -> dict:
    return json.loads(encode(ProcessRecords([_RECORD], 0)))["records"][0]


_RECORD = Record(
    "ZnV6eg==", "fuzz", "49590338000000000000000000000000000000000000000001000000", 1_700_000_000_000, 0
)


def templates(side: str) -> dict[str, bytes]:
    """One well-formed line of each type ``side`` sends, in its writer's bytes. The V1/V2
    ``shutdown`` is left out: no current MLD sends it, and kclpy 3 cannot read it."""
    if side == PROCESSOR:
        return {
            "status": encode_kclpy(Status("processRecords")),
            "checkpoint": encode_kclpy(Checkpoint(None, None)),
        }
    frames = {
        "initialize": Initialize("shardId-000000000000", "TRIM_HORIZON", 0),
        "processRecords": ProcessRecords([_RECORD], 0),
        "leaseLost": _LeaseLost(),
        "shardEnded": ShardEnded(),
        "shutdownRequested": ShutdownRequested(),
    }
    out = {name: encode(frame) for name, frame in frames.items()}
    out["checkpoint"] = encode(Checkpoint(None, None, None), reply=True)
    return out


def owed(record: dict) -> Owed | None:
    """A request, and the daemon's reply to a checkpoint during one, are owed the processor's
    next step: its ``status``, or a checkpoint (which waits for our reply); a processor's
    checkpoint is owed the daemon's reply."""
    kind = record.get("type")
    if kind in REQUESTS or (kind == "checkpoint" and record.get("sender") == DAEMON):
        return Owed(frozenset({"status", "checkpoint"}))
    if kind == "checkpoint":
        return Owed(frozenset({"checkpoint"}))
    return None


def refusal(record: dict) -> bool:
    """The daemon's checkpoint reply with an error: the only refusal the protocol has."""
    return (
        record.get("sender") == DAEMON
        and record.get("type") == "checkpoint"
        and bool(record.get("checkpoint_error"))
    )


#: A line sent before the peer's answer to the one before it: out of turn in capture order, but
#: each side reads its lines in order, so by the time the peer reads it, it is in turn.
_IN_TURN_WHEN_READ = (
    "still awaits its status",
    "a second checkpoint before the reply",
    "with no request pending",
)


def tolerated(record: dict) -> bool:
    """A pipelined line (a request before the last one's status, a second checkpoint, a status or
    checkpoint crossing the daemon's next request): no peer can tell it from one in turn."""
    return any(text in v for v in record.get("violations") or () for text in _IN_TURN_WHEN_READ)


#: Neither side answers an illegal line before closing: kclpy dies, the Java MLD exits (mld.md §4).
REPLY_BEFORE_CLOSE: frozenset[str] = frozenset()
#: ... and that exit is each side's refusal, by design, not a crash.
REFUSE_BY_EXIT = frozenset({DAEMON, PROCESSOR})
