"""The MultiLangDaemon's lines for the proxy's fault rules: frames, their fields, its own faults.

A frame is one line with its line end, split as the MLD's reader splits them
(``LineSplitter``); past a line longer than the reader takes, the rest of that direction
passes as it comes, each read an ``INVALID`` frame. The blank lines a processor writes around its JSON (kclpy
writes ``\\n{...}\\n``) are not records in ``dissect``; here they open the next
line's frame, so frame for frame the proxy counts what ``dissect`` records.
Each line goes through the shard's ``Conversation``, as ``dissect`` judges it,
which names it (its action, ``SKIPPED`` or ``INVALID``) and gives its fields.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from typing import Any

from wallaroo_proto.proxy.faultkit import FaultError, Frame, NamedFault, Send

from .codec import Checkpoint, Initialize, Line, LineSplitter, ProcessRecords, Shutdown, Status, peek_object
from .core import DAEMON, PROCESSOR, Conversation, Kind
from .dissect import daemon_is_client

#: Rewritable fields: dissect's name -> (the JSON key, the actions that carry it; None: any).
_KEYS: dict[str, tuple[str, frozenset[str] | None]] = {
    "type": ("action", None),
    "checkpoint_error": ("error", frozenset({"checkpoint"})),
    "sequence_number": ("sequenceNumber", frozenset({"initialize", "checkpoint"})),
    "sub_sequence_number": ("subSequenceNumber", frozenset({"initialize", "checkpoint"})),
    "response_for": ("responseFor", frozenset({"status"})),
    "shard_id": ("shardId", frozenset({"initialize"})),
    "reason": ("reason", frozenset({"shutdown"})),
    "millis_behind_latest": ("millisBehindLatest", frozenset({"processRecords"})),
}
_LINE_ENDS = b"\r\n"


class _Side:
    """One direction: its splitter, the bytes not yet framed, the lines of frames not yet named."""

    __slots__ = ("splitter", "buf", "start", "held", "named", "broken")

    def __init__(self) -> None:
        self.splitter = LineSplitter()
        self.buf = bytearray()
        self.start = 0  # stream offset of buf[0]
        self.held: list[Line] = []  # blank lines opening the next frame
        self.named: deque[list[Line]] = deque()  # per frame handed out: its lines, for fields()
        self.broken = False  # a line too long to read: the rest passes as it comes

    def give_up(self) -> list[bytes]:
        """No more lines: what is held goes on as one frame, and every later read as its own."""
        self.broken = True
        rest = bytes(self.buf)
        self.buf.clear()
        if not rest:
            return []
        self.named.append([])
        return [rest]


class KinesisAdapter:
    """One proxied MLD connection (one shard's conversation), for the fault rules."""

    def __init__(self) -> None:
        self.sides = {True: _Side(), False: _Side()}
        self.daemon_client: bool | None = None
        self.conv = Conversation()

    def _sender(self, from_client: bool) -> str:
        daemon_client = True if self.daemon_client is None else self.daemon_client  # dissect's fallback
        return DAEMON if from_client == daemon_client else PROCESSOR

    def frames(self, from_client: bool, data: bytes) -> list[bytes]:
        side = self.sides[from_client]
        buf = side.buf
        buf += data
        if side.broken:
            return side.give_up()
        out = []
        cut = 0  # where the next frame starts in buf
        for line in side.splitter.feed(data):
            if self.daemon_client is None:
                self.daemon_client = daemon_is_client(line.data, from_client, True)
            if not line.data.strip() and self._sender(from_client) == PROCESSOR:
                side.held.append(line)  # skipped and not recorded: it opens the next frame
                continue
            end = line.offset + len(line.data) - side.start
            if end >= len(buf) or buf[end] not in _LINE_ENDS:
                del buf[:cut]
                return out + side.give_up()  # a line longer than the reader takes, cut short by it
            end += 2 if buf[end : end + 2] == b"\r\n" else 1
            out.append(bytes(buf[cut:end]))
            cut = end
            side.named.append([*side.held, line])
            side.held = []
        del buf[:cut]
        side.start += cut
        if len(buf) > side.splitter.max_line:
            return out + side.give_up()  # no line end within what the reader takes
        return out

    def tail(self, from_client: bool) -> bytes:
        """The bytes of this direction not yet in a frame: blank lines held to open the next
        frame, and a last line without its line end."""
        return bytes(self.sides[from_client].buf)

    def fields(self, frame: bytes, from_client: bool) -> dict[str, Any]:
        lines = self.sides[from_client].named.popleft()
        sender = self._sender(from_client)
        if not lines:
            return {"type": "INVALID", "sender": sender}  # bytes after a line too long to read
        for line in lines:
            verdict = self.conv.feed(sender, line)
        msg, kind = verdict.message, verdict.kind
        out: dict[str, Any] = {
            "type": msg.action if msg is not None else "INVALID" if kind is Kind.VIOLATION else "SKIPPED",
            "sender": sender,
            "verdict": kind.value,
            "line_number": lines[-1].number,
        }
        if self.conv.shard_id is not None:
            out["shard_id"] = self.conv.shard_id
        if isinstance(msg, Initialize | Checkpoint):
            out["sequence_number"] = msg.sequence_number
            out["sub_sequence_number"] = msg.sub_sequence_number
            if isinstance(msg, Checkpoint) and sender == DAEMON:
                out["checkpoint_error"] = msg.error
        elif isinstance(msg, ProcessRecords):
            out["record_count"] = len(msg.records)
            out["millis_behind_latest"] = msg.millis_behind_latest
            if msg.records:
                out["sequence_number"] = msg.records[-1].sequence_number
                out["sub_sequence_number"] = msg.records[-1].sub_sequence_number
        elif isinstance(msg, Shutdown):
            out["reason"] = msg.reason
        elif isinstance(msg, Status):
            out["response_for"] = msg.response_for
        return out

    def rewrite(self, frame: Frame, field_name: str, value: Any) -> bytes:
        if field_name not in _KEYS:
            raise FaultError(f"field {field_name!r} cannot be rewritten in an MLD line; these can: {_can()}")
        core = frame.data.rstrip(_LINE_ENDS)
        line_end = frame.data[len(core) :]
        opening = max(core.rfind(b"\n"), core.rfind(b"\r")) + 1  # after any blank lines
        head, body = core[:opening], core[opening:]
        obj = peek_object(body)
        if obj is None:
            raise FaultError(f"line {frame.fields.get('line_number')} is no JSON object: nothing to rewrite")
        key, actions = _KEYS[field_name]
        if actions is not None and obj.get("action") not in actions:
            raise FaultError(f"{field_name} is not a field of a {obj.get('action')!r} line")
        if key == "sequenceNumber" and "checkpoint" in obj:
            key = "checkpoint"  # a V1 checkpoint
        obj[key] = value
        return head + _dumps_like(body, obj) + line_end

    def error_frame(self, reason: str, to_client: bool) -> bytes | None:
        return None  # the MLD has no error message: a broken conversation just ends


def _can() -> str:
    return ", ".join(_KEYS)


def _dumps_like(body: bytes, obj: dict) -> bytes:
    """``obj`` as JSON in the sender's own style: kclpy's ``json.dumps`` or the MLD's compact Jackson."""
    if body.lstrip().startswith(b'{"action": '):
        return json.dumps(obj).encode()
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def adapter() -> KinesisAdapter:
    return KinesisAdapter()


def _checkpoint_error(frame: Frame, params: Mapping[str, Any], adapter: KinesisAdapter) -> list[Send]:
    """The daemon's checkpoint reply, with the error the KCL's checkpointer would have thrown."""
    data = adapter.rewrite(frame, "checkpoint_error", params["error"])
    return [Send(frame.from_client, data, f"the checkpoint reply with error {params['error']}")]


NAMED_FAULTS: dict[str, NamedFault] = {
    "checkpoint-error": NamedFault(
        help="the daemon's answer to a checkpoint carries an error (param error: the exception's name, "
        "e.g. ThrottlingException, ShutdownException, InvalidStateException)",
        where='type == "checkpoint" and sender == "daemon"',
        params={"error": (str, "ThrottlingException")},
        act=_checkpoint_error,
    ),
    "delay-status": NamedFault(
        help="the processor's status lines held back (param ms), as a slow record processor's",
        where='type == "status"',
        params={"ms": (int, 500)},
        action="delay",
    ),
}
