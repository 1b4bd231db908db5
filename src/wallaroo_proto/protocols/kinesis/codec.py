"""Lines and messages of the KCL MultiLangDaemon protocol (sans-IO).

The daemon (MLD) and its record processor exchange one JSON object per line;
the MLD writes to the processor's stdin and reads its stdout (erlmld carries the
same lines over TCP). This module turns bytes into lines, and lines into
message values, reading each direction the way its real reader does:

- the processor's lines as the Java MLD reads them: blank lines skipped
  silently; non-JSON, unknown actions and unknown fields skipped with a note
  (Jackson fails on them, the MLD logs and carries on); trailing text after
  the object and leading spaces accepted; a number for ``sequenceNumber`` and
  a digit string for ``subSequenceNumber`` coerced;
- the daemon's lines as ``amazon_kclpy`` reads them: any line that is not a
  whole JSON object with the keys kclpy indexes is fatal to it (it crashes with
  a traceback), blank lines included.

Three dialects are read: ``current`` (KCL 2.1 and later: leaseLost,
shardEnded), ``v2`` (KCL 1.7.2 to 2.0: ``shutdown`` with a reason,
sequence and subsequence numbers everywhere) and ``v1`` (KCL 1.7.1 and
earlier: the ``checkpoint`` field, no subsequence numbers). Encoding writes
the MLD's own bytes: compact JSON, ``action`` first, Jackson's field order,
nulls written, non-ASCII unescaped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from operator import itemgetter
from typing import Any, NamedTuple

CURRENT, V2, V1 = "current", "v2", "v1"
DIALECTS = (CURRENT, V2, V1)

#: Requests the daemon sends; each waits for one ``status`` naming it.
REQUESTS = ("initialize", "processRecords", "leaseLost", "shardEnded", "shutdownRequested", "shutdown")
#: Exception names the MLD puts in a checkpoint reply's ``error``.
CHECKPOINT_ERRORS = (
    "ThrottlingException",
    "ShutdownException",
    "InvalidStateException",
    "KinesisClientLibDependencyException",
    "IllegalArgumentException",
)
#: Sentinel sequence numbers (``initialize`` and the lease table use them).
SENTINELS = ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP", "SHARD_END")


class Record(NamedTuple):
    """One Kinesis record as the MLD sends it (``data`` is base64 text)."""

    data: str | None
    partition_key: str
    sequence_number: str
    approximate_arrival_timestamp: int | None = None
    sub_sequence_number: int | None = 0


class LazyRecords(Sequence[Record]):
    """A batch's records, each made into a ``Record`` only when looked at.

    A peer that checks a batch and counts it (a daemon, a mock processor not
    writing records out) then costs no object per record beyond the JSON.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class _Rows(LazyRecords):
    __slots__ = ("rows",)

    def __init__(self, rows: list[tuple]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(map(_as_record, self.rows[i]))
        return _as_record(self.rows[i])

    def __iter__(self):
        return map(_as_record, self.rows)


class Initialize(NamedTuple):
    shard_id: str
    sequence_number: str | None = None
    sub_sequence_number: int | None = None
    action = "initialize"


class ProcessRecords(NamedTuple):
    records: Sequence[Record]
    millis_behind_latest: int | None = None
    action = "processRecords"


class LeaseLost(NamedTuple):
    action = "leaseLost"


class ShardEnded(NamedTuple):
    action = "shardEnded"


class ShutdownRequested(NamedTuple):
    action = "shutdownRequested"


class Shutdown(NamedTuple):
    """The V1/V2 end of a lease: ``TERMINATE`` (shard ended) or ``ZOMBIE`` (lease lost)."""

    reason: str
    action = "shutdown"


class Status(NamedTuple):
    response_for: str | None
    action = "status"


class Checkpoint(NamedTuple):
    """A checkpoint request (processor) or its reply (daemon, with ``error``)."""

    sequence_number: str | None = None
    sub_sequence_number: int | None = None
    error: str | None = None
    action = "checkpoint"


Message = (
    Initialize | ProcessRecords | LeaseLost | ShardEnded | ShutdownRequested | Shutdown | Status | Checkpoint
)


class Skipped(ValueError):
    """A line the reader passes over: says why (the MLD logs it and reads on)."""


class Fatal(ValueError):
    """A line its reader cannot survive (kclpy crashes on it): says why."""


# --------------------------------------------------------------------------- encoding

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_kclpy_dumps = json.JSONEncoder().encode


def record_dict(record: Record, dialect: str = CURRENT) -> dict[str, Any]:
    """A record as the MLD writes it (Jackson order); V1 has three fields only."""
    if dialect == V1:
        return {
            "data": record.data,
            "partitionKey": record.partition_key,
            "sequenceNumber": record.sequence_number,
        }
    return {
        "data": record.data,
        "partitionKey": record.partition_key,
        "sequenceNumber": record.sequence_number,
        "approximateArrivalTimestamp": record.approximate_arrival_timestamp,
        "subSequenceNumber": record.sub_sequence_number,
        "action": "record",
    }


def message_dict(msg: Message, dialect: str = CURRENT, *, reply: bool = False) -> dict[str, Any]:
    """The JSON object for ``msg``; ``reply`` marks a daemon's checkpoint answer (has ``error``)."""
    action = msg.action
    if action == "initialize":
        if dialect == V1:
            return {"action": action, "shardId": msg.shard_id}
        return {
            "action": action,
            "shardId": msg.shard_id,
            "sequenceNumber": msg.sequence_number,
            "subSequenceNumber": msg.sub_sequence_number,
        }
    if action == "processRecords":
        body = {"action": action, "records": [record_dict(r, dialect) for r in msg.records]}
        if dialect != V1:
            body["millisBehindLatest"] = msg.millis_behind_latest
        return body
    if action == "shutdown":
        return {"action": action, "reason": msg.reason}
    if action == "status":
        return {"action": action, "responseFor": msg.response_for}
    if action == "checkpoint":
        if dialect == V1:
            body = {"action": action, "checkpoint": msg.sequence_number}
        else:
            body = {
                "action": action,
                "sequenceNumber": msg.sequence_number,
                "subSequenceNumber": msg.sub_sequence_number,
            }
        if reply:
            body["error"] = msg.error
        return body
    return {"action": action}


def encode(msg: Message, dialect: str = CURRENT, *, reply: bool = False) -> bytes:
    """One line exactly as the Java MLD writes it: compact JSON and ``\\n``."""
    if msg.action == "processRecords" and dialect != V1:
        try:
            records = ",".join([_record_json(r) for r in msg.records])
        except TypeError:  # a field of an unexpected type: the general encoder decides
            pass
        else:
            millis = msg.millis_behind_latest
            tail = "null" if millis is None else _dumps(millis)
            return (
                f'{{"action":"processRecords","records":[{records}],"millisBehindLatest":{tail}}}\n'.encode()
            )
    return (_dumps(message_dict(msg, dialect, reply=reply)) + "\n").encode("utf-8")


def records_line(records_json: str, millis_behind_latest: int | None) -> bytes:
    """A processRecords line around records already encoded (``RECORD_JSON``, comma-separated)."""
    tail = "null" if millis_behind_latest is None else _int(millis_behind_latest)
    return f'{{"action":"processRecords","records":[{records_json}],"millisBehindLatest":{tail}}}\n'.encode()


_string = json.encoder.encode_basestring  # what the compact encoder writes for a str, non-ASCII kept
#: One record in a processRecords line, Jackson's field order; each %s an encoded JSON value.
RECORD_JSON = (
    '{"data":%s,"partitionKey":%s,"sequenceNumber":%s,"approximateArrivalTimestamp":%s,'
    '"subSequenceNumber":%s,"action":"record"}'
)


def _record_json(r: Record) -> str:
    """``record_dict`` through the compact encoder, without the dict: the per-record cost of a batch."""
    data, stamp, sub = r[0], r[3], r[4]
    return RECORD_JSON % (
        "null" if data is None else _string(data),
        _string(r[1]),
        _string(r[2]),
        "null" if stamp is None else _int(stamp),
        "null" if sub is None else _int(sub),
    )


def _int(value: int) -> str:
    if value.__class__ is not int:
        raise TypeError(value)
    return str(value)


def encode_kclpy(msg: Message, dialect: str = CURRENT) -> bytes:
    """One processor line exactly as kclpy writes it: ``json.dumps`` wrapped in ``\\n...\\n``."""
    return ("\n" + _kclpy_dumps(message_dict(msg, dialect)) + "\n").encode("utf-8")


# --------------------------------------------------------------------------- line splitting


class Line(NamedTuple):
    """One line of a byte stream: 1-based number, byte offset of its first byte, bytes without the end."""

    number: int
    offset: int
    data: bytes
    #: Set on the first line after a gap: what was lost and where decoding resumed.
    note: str | None = None


class LineSplitter:
    """Splits one direction's byte stream into lines, as Java's ``BufferedReader.readLine`` does.

    ``\\n``, ``\\r\\n`` and a bare ``\\r`` end a line, in any chunking. ``gap(n)``
    says ``n`` bytes were lost (a capture's missing segment): the unfinished line
    is dropped and splitting resumes after the next line end, since a line's
    middle cannot be trusted. ``max_line`` bounds memory for a peer that never
    ends its line: the excess is dropped and the line says so in its note.
    """

    def __init__(self, *, max_line: int = 64 * 1024 * 1024) -> None:
        self.max_line = max_line
        self.offset = 0  # stream offset of the next byte fed
        self.lines = 0
        self._buf = bytearray()  # the unfinished line
        self._start = 0  # stream offset of the unfinished line's first byte
        self._dropped = 0  # bytes of the unfinished line beyond max_line
        self._skip_lf = False  # the last line ended with \r: a leading \n belongs to it
        self._resync: str | None = None  # after a gap: drop bytes up to the next line end
        self._note: str | None = None  # for the next line

    @property
    def held(self) -> int:
        """Bytes kept of the unfinished line."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[Line]:
        """Bytes in, whole lines out; the unfinished tail is kept for the next call."""
        out: list[Line] = []
        base = self.offset
        size = len(chunk)
        self.offset += size
        pos = 0
        if size and self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                pos = 1
        has_cr = b"\r" in chunk
        find = chunk.find
        while pos < size:
            end = find(b"\n", pos)
            if has_cr:
                cr = find(b"\r", pos, end if end >= 0 else size)
                if cr >= 0:
                    end = cr
            if end < 0:
                if self._resync is None:
                    self._keep(chunk[pos:], base + pos)
                break
            if self._resync is not None:
                self._note, self._resync = self._resync, None
            else:
                if self._buf or self._dropped:
                    data, start = self._take(chunk[pos:end])
                else:
                    data, start = chunk[pos:end], base + pos
                self.lines += 1
                note = self._note
                if note is not None:
                    self._note = None
                out.append(Line(self.lines, start, data, note))
            pos = end + 1
            if chunk[end] == 0x0D:
                if pos == size:
                    self._skip_lf = True
                elif chunk[pos] == 0x0A:
                    pos += 1
        return out

    def gap(self, missing: int) -> None:
        """``missing`` bytes never arrived: resync at the next line end."""
        lost = len(self._buf) + self._dropped
        self._buf.clear()
        self._dropped = 0
        self._skip_lf = False
        self._resync = (
            f"{missing} bytes missing at offset {self.offset}"
            + (f" ({lost} bytes of an unfinished line dropped)" if lost else "")
            + "; resynced at the next line end"
        )
        self.offset += missing

    def end(self) -> list[Line]:
        """The stream closed: an unterminated last line is still a line (``readLine`` returns it)."""
        if self._resync is not None or not (self._buf or self._dropped):
            self._buf.clear()
            return []
        data, start = self._take(b"")
        self.lines += 1
        note, self._note = self._note, None
        return [Line(self.lines, start, data, note)]

    def pending(self) -> int:
        """Bytes held for an unfinished line."""
        return len(self._buf)

    def unfinished(self, size: int = 32) -> bytes:
        """The first bytes of the unfinished line (empty after a gap, until the next line end)."""
        return b"" if self._resync is not None else bytes(self._buf[:size])

    def _keep(self, data: bytes, offset: int) -> None:
        if not self._buf and not self._dropped:
            self._start = offset
        room = self.max_line - len(self._buf)
        if len(data) > room:
            self._dropped += len(data) - room
            data = data[:room]
        self._buf += data

    def _take(self, rest: bytes) -> tuple[bytes, int]:
        self._keep(rest, self._start)
        data, start = bytes(self._buf), self._start
        if self._dropped:
            cut = f"line longer than {self.max_line} bytes: {self._dropped} bytes dropped"
            self._note = f"{self._note}; {cut}" if self._note else cut
        self._buf.clear()
        self._dropped = 0
        return data, start


def split_lines(data: bytes, *, offset: int = 0) -> list[Line]:
    """All lines of a complete byte stream (the last one may lack its line end)."""
    splitter = LineSplitter()
    splitter.offset = offset
    return splitter.feed(data) + splitter.end()


# --------------------------------------------------------------------------- decoding

_PROCESSOR_FIELDS = {
    "status": {"action", "responseFor"},
    "checkpoint": {"action", "sequenceNumber", "subSequenceNumber", "error"},
}
#: Actions the MLD's message class knows; from the processor they are decoded and ignored.
_KNOWN_ACTIONS = {
    "initialize": {"action", "shardId", "sequenceNumber", "subSequenceNumber"},
    "processRecords": {"action", "records", "millisBehindLatest"},
    "leaseLost": {"action"},
    "shardEnded": {"action"},
    "shutdownRequested": {"action"},
    "shutdown": {"action", "reason"},
    **_PROCESSOR_FIELDS,
}
_raw_decode = json.JSONDecoder().raw_decode
#: The range of a Java ``long``, the type of the MLD's subsequence numbers.
_LONG = (-(2**63), 2**63 - 1)


def _json(text: str, error: type[ValueError], *, trailing: bool = False) -> tuple[Any, int]:
    """``(value, end)`` of the JSON starting ``text``; ``error`` with the reason when it cannot be read.

    Python's reader stops on more than the JSON syntax: nesting deeper than
    its recursion limit, and integers longer than its digit limit. Jackson
    (the MLD) has limits of its own there, kclpy has Python's; either way the
    line is not a message, so every way of failing becomes the one error.
    ``trailing`` allows text after the value (the MLD's reader does).
    """
    try:
        value, end = _raw_decode(text)
    except json.JSONDecodeError as err:
        raise error(f"not JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise error("not readable JSON: nested too deeply") from None
    except ValueError as err:  # the integer digit limit
        raise error(f"not readable JSON: a number too long ({str(err).partition(':')[0]})") from None
    if not trailing and text[end:].strip():
        raise error(f"not JSON (Extra data at column {end + 1})")
    return value, end


def peek_object(data: bytes | str) -> dict | None:
    """The JSON object a line holds, or None for any other line; never raises (for guessing, not judging)."""
    try:
        obj, _ = _json(_text(data).strip(), ValueError)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def is_sequence_number(value: Any) -> bool:
    """A decimal sequence number (ASCII digits: ``str.isdigit`` also takes other scripts' digits)."""
    return isinstance(value, str) and value.isascii() and value.isdigit()


def _text(data: bytes | str) -> str:
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="replace")


def _seq(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # Jackson coerces a number to a string field
    raise Skipped(f"{where}: sequenceNumber must be a string, got {_brief(value)}")


def _subseq(value: Any, where: str) -> int | None:
    if isinstance(value, str) and is_sequence_number(value.strip().removeprefix("-")):
        digits = value.strip()
        if len(digits) <= 20:
            value = int(digits)  # Jackson coerces a digit string to a long
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and _LONG[0] <= value <= _LONG[1]:
        return value
    raise Skipped(f"{where}: subSequenceNumber must be an integer (a Java long), got {_brief(value)}")


def _brief(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) and len(value) > limit else json.dumps(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def decode_from_processor(data: bytes | str, dialect: str = CURRENT) -> tuple[Message, str | None] | None:
    """A processor's line as the MLD reads it: ``(message, note)``, or None for an empty line.

    Raises ``Skipped`` with the reason for a line the MLD passes over. The note
    tells about leniency the MLD allows (trailing text, coercions).
    """
    text = _text(data)
    if text == "":
        return None
    stripped = text.strip()
    if not stripped:
        raise Skipped("whitespace-only line")
    obj, end = _json(stripped, Skipped, trailing=True)
    note = "text after the JSON object ignored" if end < len(stripped) else None
    if obj is None:
        raise Skipped("a bare null (the Java MLD may stop on it)")
    if not isinstance(obj, dict):
        raise Skipped(f"a JSON {type(obj).__name__.replace('list', 'array')}, not an object")
    action = obj.get("action")
    if "action" not in obj:
        raise Skipped("no 'action' field")
    fields = _KNOWN_ACTIONS.get(action) if isinstance(action, str) else None
    if fields is None:
        raise Skipped(f"unknown action {json.dumps(action)} (known: {', '.join(_KNOWN_ACTIONS)})")
    where = f"{action}"
    if action == "checkpoint" and "checkpoint" in obj and dialect == V1:
        extra = set(obj) - {"action", "checkpoint", "error"}
        if extra:
            raise Skipped(f"unknown field {sorted(extra)[0]!r} in a V1 checkpoint (known: checkpoint, error)")
        return Checkpoint(_seq(obj["checkpoint"], where), None, None), note
    extra = set(obj) - fields
    if extra:
        name = sorted(extra)[0]
        if action == "checkpoint" and name == "checkpoint":
            raise Skipped("the V1 checkpoint form ('checkpoint' field) is an unknown field to this MLD")
        known = ", ".join(sorted(fields - {"action"}))
        raise Skipped(f"unknown field {name!r} in {action} (known: {known}; Jackson fails on unknown fields)")
    if action == "status":
        response_for = obj.get("responseFor")
        if response_for is not None and not isinstance(response_for, str):
            raise Skipped(f"status: responseFor must be a string, got {json.dumps(response_for)}")
        return Status(response_for), note
    if action == "checkpoint":
        error = obj.get("error")
        return (
            Checkpoint(
                _seq(obj.get("sequenceNumber"), where),
                _subseq(obj.get("subSequenceNumber"), where),
                error if isinstance(error, str) else None,
            ),
            note,
        )
    # A daemon-side action from the processor: decodable, and ignored by the MLD.
    return _ANY_MESSAGE.get(action, lambda o: LeaseLost())(obj), note


def _record(obj: Any, index: int, dialect: str) -> Record:
    if not isinstance(obj, dict):
        raise Fatal(f"records[{index}] is not an object")
    if dialect != V1 and obj.get("action") != "record":
        raise Fatal(f'records[{index}] lacks "action":"record" (kclpy decodes each object by its action)')
    try:
        if dialect == V1:
            return Record(obj["data"], obj["partitionKey"], obj["sequenceNumber"], None, None)
        stamp = obj["approximateArrivalTimestamp"]
        if stamp is None:
            raise Fatal(f"records[{index}]: approximateArrivalTimestamp is null (kclpy applies int() to it)")
        return Record(
            obj["data"], obj["partitionKey"], obj["sequenceNumber"], stamp, obj["subSequenceNumber"]
        )
    except KeyError as err:
        raise Fatal(f"records[{index}] lacks {err.args[0]!r}") from None


_RECORD_FIELDS = itemgetter(
    "data", "partitionKey", "sequenceNumber", "approximateArrivalTimestamp", "subSequenceNumber"
)
_ACTION = itemgetter("action")
_STAMP = itemgetter(3)
_as_record = partial(tuple.__new__, Record)


def _records(records: list, dialect: str) -> Sequence[Record]:
    """Every record as kclpy needs it; ``_record``'s checks as C-level passes over the batch."""
    if dialect != V1:
        try:
            rows = list(map(_RECORD_FIELDS, records))
            if set(map(_ACTION, records)) <= {"record"} and None not in map(_STAMP, rows):
                return _Rows(rows)
        except (KeyError, TypeError):
            pass
    return [_record(r, i, dialect) for i, r in enumerate(records)]  # raises, naming the record


def _need(obj: dict, *keys: str) -> None:
    for key in keys:
        if key not in obj:
            raise Fatal(f"{obj['action']} lacks {key!r}")


def _initialize(obj: dict) -> Initialize:
    return Initialize(obj.get("shardId"), obj.get("sequenceNumber"), obj.get("subSequenceNumber"))


def _loose_records(obj: dict) -> ProcessRecords:
    """A processRecords from the processor (the MLD decodes it, then ignores it): records as ``Record``."""
    records = obj.get("records") or []
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise Skipped("processRecords: 'records' is not a list of objects")
    fields = ("data", "partitionKey", "sequenceNumber", "approximateArrivalTimestamp", "subSequenceNumber")
    rows = [Record(*map(r.get, fields)) for r in records]
    return ProcessRecords(rows, obj.get("millisBehindLatest"))


_ANY_MESSAGE = {
    "initialize": _initialize,
    "processRecords": _loose_records,
    "leaseLost": lambda o: LeaseLost(),
    "shardEnded": lambda o: ShardEnded(),
    "shutdownRequested": lambda o: ShutdownRequested(),
    "shutdown": lambda o: Shutdown(o.get("reason")),
}


def detect_dialect(obj: dict) -> str | None:
    """The dialect a daemon's object shows, or None when any dialect could send it."""
    action = obj.get("action")
    if action == "shutdown":
        return V2 if "millisBehindLatest" in obj else None
    if action == "initialize":
        return V2 if "sequenceNumber" in obj else V1
    if action == "processRecords":
        return V2 if "millisBehindLatest" in obj else V1
    if action == "checkpoint" and "checkpoint" in obj:
        return V1
    return None


def doomed_daemon_line(head: bytes) -> str | None:
    """Why a daemon line, of which only ``head`` came so far, cannot be read by kclpy whatever follows.

    A line that does not open a JSON object is fatal once it ends; a reader need
    not wait for an end that a peer sending garbage may never write.
    """
    start = head.lstrip(b" \t")
    if start and start[:1] != b"{":
        return f"not JSON (a line starting {_text(start[:16])!r} is no JSON object)"
    return None


def decode_from_daemon(data: bytes | str, dialect: str | None = None) -> Message:
    """A daemon's line as kclpy reads it; raises ``Fatal`` for what would crash kclpy.

    ``dialect`` None reads whichever form the line has (V1 lacks the keys that
    V2 and later require).
    """
    text = _text(data)
    if not text.strip():
        raise Fatal("a blank line (kclpy does not skip blank lines: json.loads fails)")
    obj, _ = _json(text.strip(" \t\r\n"), Fatal)  # json.loads's whitespace
    if not isinstance(obj, dict):
        raise Fatal(f"a JSON {type(obj).__name__.replace('list', 'array')}, not an object")
    if "action" not in obj:
        raise Fatal("no 'action' field")
    action = obj["action"]
    if dialect is None:
        dialect = detect_dialect(obj) or CURRENT
    if action == "initialize":
        _need(obj, "shardId")
        if dialect != V1:
            _need(obj, "sequenceNumber", "subSequenceNumber")
        return _initialize(obj)
    if action == "processRecords":
        _need(obj, "records")
        if dialect != V1:
            _need(obj, "millisBehindLatest")
        records = obj["records"]
        if not isinstance(records, list):
            raise Fatal("processRecords: 'records' is not a list")
        return ProcessRecords(_records(records, dialect), obj.get("millisBehindLatest"))
    if action == "checkpoint":
        if dialect == V1 and "checkpoint" in obj:
            return Checkpoint(obj["checkpoint"], None, obj.get("error"))
        _need(obj, "sequenceNumber", "subSequenceNumber")
        return Checkpoint(obj["sequenceNumber"], obj["subSequenceNumber"], obj.get("error"))
    if action == "shutdown":
        _need(obj, "reason")
        return Shutdown(obj["reason"])
    if action in ("leaseLost", "shardEnded", "shutdownRequested"):
        return _ANY_MESSAGE[action](obj)
    if action == "record":
        raise Fatal("a bare record outside processRecords")
    known = ", ".join([*_ANY_MESSAGE, "checkpoint"])
    raise Fatal(f"unknown action {json.dumps(action)} (known: {known}; kclpy raises MalformedAction)")
