"""One MultiLangDaemon conversation in a capture: a TCP connection's lines judged and recorded.

The capture driver reassembles each direction and feeds it here; a
``LineSplitter`` per direction splits lines (and resyncs at the next line end
after a lost segment), the shard's ``Conversation`` judges each one, and each
line becomes a record (the common fields plus this protocol's, see
``protocols.schema.fields()``). Blank lines the processor writes around its JSON (kclpy
does) are judged but not recorded. The summary is per shard: one connection
carries one shard's conversation.

Which side is the daemon: the one whose first line is a request or a
checkpoint reply (only the MLD's has ``error``); a first ``status``,
``checkpoint`` or blank line marks the processor; otherwise the
side on a Kinesis port is the processor, else the initiator is the daemon.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from wallaroo_proto.capture.tracker import ConnectionTracker
from wallaroo_proto.findings import mark
from wallaroo_proto.records import to_json

from .codec import (
    REQUESTS,
    Checkpoint,
    Initialize,
    Line,
    LineSplitter,
    ProcessRecords,
    Shutdown,
    Status,
    peek_object,
)
from .core import DAEMON, PROCESSOR, Conversation, Kind

if TYPE_CHECKING:
    from wallaroo_proto.capture.dissector import Dissector

#: Processor port of ``mock-daemon --record`` captures.
PORTS = (7300,)
#: Per-connection cap on stored violations (the count stays exact).


def looks_like_mld(payload: bytes, max_frame_size: int = 0, final: bool = True) -> bool | None:
    """Do a connection's first bytes open an MLD conversation (the daemon's initialize line)?

    ``None`` when not ``final`` and the bytes stop before the answer shows.
    """
    head = payload[:256].lstrip(b"\r\n \t")
    if head and not head.startswith(b"{"):
        return False
    action = head.find(b'"action"')
    if 0 < action < 16 and b'"initialize"' in head[action : action + 32]:
        return True
    if final or len(payload) >= 256 or b"\n" in head:
        return False
    cut_short = action < 0 and len(head) < 16 + 8 or 0 < action < 16 and len(head) < action + 32
    return None if not head or cut_short else False


def percentile(values: list[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least ``p`` of them at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def daemon_is_client(first_line: bytes, from_client: bool, fallback: bool) -> bool:
    """Whether the initiator is the daemon, told by a conversation's first line (see the module's doc)."""
    stripped = first_line.strip()
    obj = peek_object(stripped) if stripped else None
    action = obj.get("action") if obj is not None else None
    if action in REQUESTS or (action == "checkpoint" and "error" in obj):
        return from_client  # only the MLD's checkpoint reply has "error"
    if not stripped or action in ("status", "checkpoint"):
        return not from_client
    return fallback


class _Direction:
    """One direction's line splitter; the reassembler's consumer."""

    __slots__ = ("tracker", "client", "half", "splitter", "bytes")

    def __init__(self, tracker: KinesisTracker, client: bool) -> None:
        self.tracker = tracker
        self.client = client
        self.half: Any = None
        self.splitter = LineSplitter()
        self.bytes = 0

    def data(self, offset: int, payload: bytes, packet: int, ts: int) -> None:
        self.bytes += len(payload)
        for line in self.splitter.feed(payload):
            self.tracker.line(self, line, packet, ts)

    def gap(self, offset: int, missing: int | None, packet: int, ts: int) -> None:
        splitter = self.splitter
        if missing is None:
            self.tracker.midstream_start(self, packet)
            splitter.gap(0)
            splitter._resync = "capture starts mid-connection: earlier bytes unknown; resynced at a line end"
        else:
            splitter.gap(missing)
            self.tracker.note(
                f"{self.tracker.dir_label(self)}: {missing} bytes missing at stream offset {offset} "
                f"(lost segment before packet {packet}); resynced at the next line end"
            )


class KinesisTracker(ConnectionTracker):
    """One TCP connection carrying one shard's MLD conversation."""

    protocol = "kinesis"

    def __init__(
        self,
        dissector: Dissector,
        index: int,
        client: tuple[bytes, int],
        server: tuple[bytes, int],
        client_known: bool,
    ) -> None:
        super().__init__(dissector, index, client, server)
        self.dirs = {True: _Direction(self, True), False: _Direction(self, False)}
        self.conv = Conversation()
        self.daemon_client: bool | None = None
        #: Without a first line that tells: the initiator, unless only it is on a Kinesis port.
        self.fallback_daemon_client = not (client[1] in PORTS and server[1] not in PORTS)
        self.request_ts: int | None = None
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()

    # sides ---------------------------------------------------------------------------

    def _sender(self, direction: _Direction, data: bytes) -> str:
        if self.daemon_client is None:
            self.daemon_client = daemon_is_client(data, direction.client, self.fallback_daemon_client)
        return DAEMON if direction.client == self.daemon_client else PROCESSOR

    def midstream_start(self, direction: _Direction, packet: int) -> None:
        self.note(f"packet {packet}: capture starts mid-connection ({self.dir_label(direction)})")
        if self.conv.requests == 0:
            self.conv.requests = 1  # its initialize was before the capture

    # lines ---------------------------------------------------------------------------

    def line(self, direction: _Direction, line: Line, packet: int, ts: int) -> None:
        sender = self._sender(direction, line.data)
        conv = self.conv
        verdict = conv.feed(sender, line)
        if verdict.kind is Kind.SKIPPED and not line.data.strip():
            return  # kclpy's blank lines around each message: judged, not recorded
        seconds = ts / 1e9
        if not self.first_packet:
            self.first_packet, self.first_ts = packet, seconds
        self.last_packet, self.last_ts = packet, seconds
        record = dict(self.ident)
        record["sender"] = sender
        record["direction"] = self.dir_label(direction)
        record["ts"] = seconds
        record["ts_ns"] = ts
        record["packet"] = packet
        record["offset"] = line.offset
        record["length"] = len(line.data)
        record["frame_index"] = self.frame_index
        self.frame_index += 1
        record["line_number"] = line.number
        msg = verdict.message
        kind = verdict.kind
        name = msg.action if msg is not None else "INVALID" if kind is Kind.VIOLATION else "SKIPPED"
        record["type"] = name
        record["verdict"] = kind.value
        self.types[name] += 1
        if self.notes:
            record["notes"], self.notes = self.notes, []
        if verdict.note:
            mark(record, "note", verdict.note, self.findings)
        if kind is Kind.VIOLATION:
            self._violation(record, verdict.reason or "")
        if conv.shard_id is not None:
            record["shard_id"] = conv.shard_id
        if msg is not None:
            self._fields(record, msg, kind, ts)
        self.out.append(to_json(record) if self.jsonl else record)

    def _refused(self, reply: Checkpoint) -> str:
        """Why the daemon refused a checkpoint: what was asked, and what the checkpointer allows."""
        conv = self.conv
        asked = (
            _seq(reply.sequence_number, reply.sub_sequence_number) if reply.sequence_number else "the latest"
        )
        text = f"checkpoint at {asked} refused: {reply.error}"
        if reply.error == "InvalidStateException":
            return f"{text} (no checkpointer now: the processor is handling {conv.pending or 'no request'})"
        low = "any" if conv.last_checkpoint is None else _seq(*conv.last_checkpoint)
        high = "none delivered yet" if conv.largest_seq is None else _seq(*conv.largest_seq)
        return f"{text}; allowed: from the last checkpoint ({low}) to the largest record delivered ({high})"

    def _fields(self, record: dict, msg: Any, kind: Kind, ts: int) -> None:
        accepted = kind is Kind.ACCEPTED
        if isinstance(msg, Initialize):
            record["sequence_number"] = msg.sequence_number
            record["sub_sequence_number"] = msg.sub_sequence_number
        elif isinstance(msg, ProcessRecords):
            record["record_count"] = len(msg.records)
            record["millis_behind_latest"] = msg.millis_behind_latest
            if msg.records:
                last = msg.records[-1]
                record["sequence_number"] = last.sequence_number
                record["sub_sequence_number"] = last.sub_sequence_number
        elif isinstance(msg, Shutdown):
            record["reason"] = msg.reason
        elif isinstance(msg, Status):
            record["response_for"] = msg.response_for
            if accepted and self.request_ts is not None:
                latency = (ts - self.request_ts) / 1e9
                record["latency"] = latency
                self.latencies.append(latency)
                self.request_ts = None
        elif isinstance(msg, Checkpoint):
            record["sequence_number"] = msg.sequence_number
            record["sub_sequence_number"] = msg.sub_sequence_number
            if record["sender"] == DAEMON:
                record["checkpoint_error"] = msg.error
                if accepted and msg.error is not None:
                    self.errors[msg.error] += 1
                    mark(record, "warning", self._refused(msg), self.findings)
        if accepted and record["sender"] == DAEMON and not isinstance(msg, Checkpoint):
            self.request_ts = ts

    # the end -------------------------------------------------------------------------

    def finish(self) -> None:
        """The connection or the capture ended: last unterminated lines, a closed processor."""
        for direction in self.dirs.values():
            half = direction.half
            if half is not None:
                half.flush(self.last_packet, int(self.last_ts * 1e9))
        for direction in self.dirs.values():
            half = direction.half
            closed = half is not None and (half.fin_seen or half.rst_seen)
            if closed:
                for line in direction.splitter.end():
                    self.line(direction, line, self.last_packet, int(self.last_ts * 1e9))
        # The daemon's close first: a processor's unanswered checkpoint is no fault of its own then.
        for direction in sorted(self.dirs.values(), key=lambda d: d.client != self.daemon_client):
            half = direction.half
            if half is None or not (half.fin_seen or half.rst_seen) or self.daemon_client is None:
                continue
            sender = DAEMON if direction.client == self.daemon_client else PROCESSOR
            verdict = self.conv.end(sender)
            if verdict is not None and verdict.kind is Kind.VIOLATION:
                record = dict(self.ident)
                ts = int(self.last_ts * 1e9)
                record.update(
                    sender=sender,
                    direction=self.dir_label(direction),
                    ts=self.last_ts,
                    ts_ns=ts,
                    packet=self.last_packet,
                    offset=half.offset,
                    length=0,
                    frame_index=self.frame_index,
                    type="EOF",
                    verdict="violation",
                )
                self.frame_index += 1
                if self.conv.shard_id is not None:
                    record["shard_id"] = self.conv.shard_id
                self._violation(record, verdict.reason or "")
                self.out.append(to_json(record) if self.jsonl else record)
        halves = [d.half for d in self.dirs.values() if d.half is not None]
        if any(h.rst_seen for h in halves):
            self.closed = "reset"
        elif halves and all(h.fin_seen for h in halves):
            self.closed = "closed"

    def held_bytes(self) -> int:
        """Bytes kept of lines not yet ended, both ways (the live checker bounds their sum)."""
        return sum(direction.splitter.held for direction in self.dirs.values())

    def release(self) -> None:
        for direction in self.dirs.values():
            direction.half = None
            direction.splitter = LineSplitter()

    def live_state(self) -> dict:
        """The protocol state a live view shows mid-stream: records, checkpoints, what comes next."""
        conv = self.conv
        last = conv.last_checkpoint
        return {
            "shard": conv.shard_id,
            "records": conv.records,
            "checkpoints": conv.checkpoints,
            "checkpoint": None if last is None else last[0],
            "expecting": conv.expects().text,
        }

    def as_dict(self) -> dict:
        conv = self.conv
        last = conv.last_checkpoint
        lat = self.latencies
        return {
            "conn_index": self.conn_index,
            "connection": self.label,
            "protocol": "kinesis",
            "shard_id": conv.shard_id,
            "dialect": conv.dialect,
            "daemon": None
            if self.daemon_client is None
            else ("initiator" if self.daemon_client else "responder"),
            "first_packet": self.first_packet,
            "last_packet": self.last_packet,
            "duration": round(self.last_ts - self.first_ts, 6),
            "lines_by_type": dict(self.types),
            "requests": conv.requests,
            "records": conv.records,
            "checkpoints": conv.checkpoints,
            "checkpoint_errors": conv.checkpoint_errors,
            "checkpoint_error_names": dict(self.errors),
            "last_checkpoint": None if last is None else last[0],
            "latency": {
                "count": len(lat),
                "p50": percentile(lat, 0.5),
                "p99": percentile(lat, 0.99),
                "max": max(lat) if lat else None,
            },
            "expecting": conv.expects().text,
            "violations": self.violations,
            "violation_list": self.violation_list,
            "capture_notes": self.capture_notes,
            "closed": self.closed,
        }


def _seq(sequence_number: str, sub: int | None) -> str:
    return sequence_number if not sub else f"{sequence_number}/{sub}"
