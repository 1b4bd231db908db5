"""One LB's two sockets in a capture: records and messages judged together, as one pair.

Each TCP connection is a tracker; which socket it is shows in its first bytes:
the IC's log records come from the responder on the send port, the LB's
messages from the initiator on the receive port. The two sockets of one LB
(same LB and IC addresses, opened in turn) share one ``Session``, so rules
that span them (no record while a checkpoint is asked for, InitialMessage
before the first checkpoint) are judged in the order the packets came. A
socket whose partner is not in the capture is judged alone; a capture split
across tasks keeps an LB's two sockets in one task (``pair_key``).

Every log record and every LB message is a row; so is each checkpoint's raw
bytes (``CheckpointBytes``), which are skipped, never read as messages.
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import TYPE_CHECKING, Any

from xxhash import xxh64_intdigest

from wallaroo_proto.capture.pcap import format_address
from wallaroo_proto.findings import mark
from wallaroo_proto.judge import End, Kind
from wallaroo_proto.records import to_json

from .codec import (
    CHECKPOINT,
    CHECKPOINT_SEQ,
    CONTROL,
    CONTROL_SEQ,
    FROM_LB,
    HEADER_SIZE,
    RPC,
    RPC_BATCH,
    RPC_TYPE_NAMES,
    TAKE_CHECKPOINT,
    Blob,
    Garbage,
    Incomplete,
    MalformedError,
    MessageFrame,
    MessageSplitter,
    RecordFrame,
    RecordSplitter,
    checkpoint_length,
    decode_rpc,
    read_header,
    read_message,
    read_zz,
    type_name,
)
from .core import IC, LB, Phase, Session

if TYPE_CHECKING:
    from wallaroo_proto.capture.dissector import Dissector

#: The Node binding's default IC ports (receive, send).
PORTS = (2000, 2001)
RECEIVE, SEND = "receive", "send"
_KEEP = 1000
#: An LB's first message longer than this is not waited for whole: the connection is not taken.
_DETECT_LIMIT = 64 * 1024


def _opens_records(prefix: bytes) -> bool | None:
    """Do these first bytes start the IC's records: a short record numbered -1 or -2 (its first
    ever), or a normal record whose check bytes are xxHash64 of its body (a socket seen mid-run)?

    A control or checkpoint record's size (bytes 4 to 8) is 26 to 40 and its sequence id (16 to
    24) -1 or -2; a normal record's size is below ``_DETECT_LIMIT`` and its id below 2**40, and it
    is taken only whole, its check bytes matched. A few bytes often rule it out; ``None``: a
    header's start, or a record not all here yet: more may tell.
    """
    size, seq = prefix[4:8], prefix[16:24]
    short = (not seq or (seq[0] in (0xFF, 0xFE) and all(b == 0xFF for b in seq[1:]))) and (
        not size or (HEADER_SIZE + 2 <= size[0] <= HEADER_SIZE + 16 and not any(size[1:]))
    )
    normal = not any(size[2:]) and not any(seq[5:])
    if len(size) == 4 and int.from_bytes(size, "little") < HEADER_SIZE + 2:
        normal = False
    if len(prefix) < HEADER_SIZE:
        return None if short or normal else False
    if short or not normal:
        return short
    end = int.from_bytes(size, "little")
    if len(prefix) < end:
        return None
    return xxh64_intdigest(prefix[HEADER_SIZE:end]) == int.from_bytes(prefix[8:16], "little")


def looks_like_ambrosia(payload: bytes, max_frame_size: int = 0, final: bool = True) -> bool | None:
    """A connection's first bytes: the IC's first record (-1 or -2), or an LB's first whole message.

    Not ``final``, ``None`` while the bytes could still be either, or a message
    cut short cannot say its type yet.
    """
    records = _opens_records(payload)
    if records is None and not final:
        return None
    if records:
        header = read_header(payload)
        try:
            msg, _ = read_message(payload, HEADER_SIZE, min(header.size, len(payload)))
        except Incomplete:
            return False if final else None
        except MalformedError:
            return False
        if header.seq >= 0:
            return True  # its check bytes matched
        return msg.type in CONTROL if header.seq == CONTROL_SEQ else msg.type == CHECKPOINT
    try:
        msg, _ = read_message(payload, 0, len(payload))
    except Incomplete:
        return False if final or len(payload) >= _DETECT_LIMIT else None
    except MalformedError:
        return False
    return msg.type in FROM_LB


class _Pair:
    """One LB's session, shared by its two sockets; its label is fixed when its first socket is seen."""

    def __init__(self, label: str) -> None:
        self.session = Session()
        self.label = label
        self.ports: dict[str, int] = {}  # role -> the IC's port

    @property
    def roles(self) -> set[str]:
        return set(self.ports)

    def describe(self) -> str:
        ports = ", ".join(f"{role} port {port}" for role, port in sorted(self.ports.items()))
        return f"{self.label} ({ports})"


#: Per dissector: (LB address, IC address) -> pairs still missing a socket, oldest first.
_OPEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pair_key(key: Any) -> tuple[str, str]:
    """A split capture's part key: the two hosts, as ``_join`` pairs sockets by their LB and IC addresses.

    ``key`` is the connection's ``records.ConnectionKey`` (addresses in a fixed
    order, whichever side is the LB), so both sockets of one LB get one key.
    """
    return (key.addr_a, key.addr_b)


def _join(dissector: Any, lb_addr: str, ic_addr: str, role: str, ic_port: int) -> _Pair:
    table = _OPEN.setdefault(dissector, {})
    counts = table.setdefault("counts", Counter())
    waiting = table.setdefault((lb_addr, ic_addr), [])
    for pair in waiting:
        if role not in pair.ports:
            pair.ports[role] = ic_port
            waiting.remove(pair)
            return pair
    counts[(lb_addr, ic_addr)] += 1
    pair = _Pair(f"LB {lb_addr} -> IC {ic_addr} #{counts[(lb_addr, ic_addr)]}")
    pair.ports[role] = ic_port
    waiting.append(pair)
    return pair


class _Direction:
    __slots__ = ("tracker", "client", "half", "splitter", "blob_offset", "blob_size")

    def __init__(self, tracker: AmbrosiaTracker, client: bool) -> None:
        self.tracker = tracker
        self.client = client
        self.half: Any = None
        self.splitter: Any = None
        self.blob_offset = 0
        self.blob_size = 0

    def data(self, offset: int, payload: bytes, packet: int, ts: int) -> None:
        self.tracker.data(self, payload, packet, ts)

    def gap(self, offset: int, missing: int | None, packet: int, ts: int) -> None:
        if missing is None:
            self.tracker.note(f"packet {packet}: capture starts mid-connection; its frames cannot be found")
            self.splitter = self.splitter or RecordSplitter()
            self.splitter.broken = "capture starts mid-connection"
            return
        if self.splitter is not None:
            self.splitter.gap(missing)
        self.tracker.note(
            f"{missing} bytes missing at stream offset {offset} (lost segment before packet {packet})"
            + (
                "; the rest of this direction cannot be framed"
                if self.splitter and self.splitter.broken
                else ""
            )
        )


class AmbrosiaTracker:
    """One TCP connection: an LB's receive-port or send-port socket."""

    def __init__(
        self,
        dissector: Dissector,
        index: int,
        client: tuple[bytes, int],
        server: tuple[bytes, int],
        client_known: bool,
    ) -> None:
        self.dissector = dissector
        self.out = dissector.out
        self.jsonl = dissector.jsonl
        self.canon: tuple = ()
        self.initiator_fixed = False
        self.dirs = {True: _Direction(self, True), False: _Direction(self, False)}
        ia, ip = format_address(client[0]), client[1]
        ra, rp = format_address(server[0]), server[1]
        fmt = lambda a, p: f"[{a}]:{p}" if ":" in a else f"{a}:{p}"  # noqa: E731
        self.label = f"{fmt(ia, ip)} > {fmt(ra, rp)}"
        self.addrs = {True: (ia, ip), False: (ra, rp)}
        self.ic_is_client = False
        self.conn_index = index
        self.role: str | None = None
        self.pair: _Pair | None = None
        self.frame_index = 0
        self.notes: list[str] = []
        self.capture_notes: list[str] = []
        self.types: Counter[str] = Counter()
        self.violation_list: list[dict] = []
        self.violations = 0
        self.findings: list[dict] = []  # findings.mark's, for the summary
        self.first_packet = self.last_packet = 0
        self.first_ts = self.last_ts = 0.0
        self.closed = "open at end of capture"
        #: The first sender's segments until a record header's worth of bytes tells the socket.
        self._early: list[tuple[_Direction, bytes, int, int]] = []
        self.ident = {
            "capture": dissector.capture_name,
            "protocol": "ambrosia",
            "connection": self.label,
            "conn_index": index,
            "initiator_addr": ia,
            "initiator_port": ip,
            "responder_addr": ra,
            "responder_port": rp,
        }

    @property
    def summary(self) -> AmbrosiaTracker:
        return self

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.capture_notes.append(text)

    # --- bytes in -------------------------------------------------------------------------------

    def _settle(self, direction: _Direction, payload: bytes) -> None:
        """The first bytes say which socket: the IC's records (send port) or the LB's messages (receive port).

        The first sender is not always the TCP initiator here (a capture without
        the handshake makes it so), so the bytes decide, not the side.
        """
        records = bool(_opens_records(payload))
        self.role = SEND if records else RECEIVE
        self.ic_is_client = direction.client if records else not direction.client
        ic_addr, ic_port = self.addrs[self.ic_is_client]
        lb_addr, _ = self.addrs[not self.ic_is_client]
        self.pair = _join(self.dissector, lb_addr, ic_addr, self.role, ic_port)
        self.ident["ambrosia_socket"] = self.role
        limit = max(self.dissector.frame_limit("ambrosia"), 1 << 20)
        self.dirs[self.ic_is_client].splitter = RecordSplitter(max_size=limit) if records else None
        self.dirs[not self.ic_is_client].splitter = None if records else MessageSplitter(max_size=limit)

    def data(self, direction: _Direction, payload: bytes, packet: int, ts: int) -> None:
        if self.role is None:
            early = self._early
            if not early or early[0][0] is direction:
                early.append((direction, payload, packet, ts))
                if _opens_records(b"".join(item[1] for item in early)[:_DETECT_LIMIT]) is None:
                    self.dissector.hold_back(self)  # later records wait, for packet order
                    return
                self.flush()
                return
            self.flush()  # the other side speaks: the first sender's bytes so far decide
        self._feed(direction, payload, packet, ts)

    @property
    def pending(self) -> bool:
        """Whether the first bytes are held, the socket not known yet."""
        return bool(self._early)

    def flush(self, packet: int = 0, ts: int = 0) -> None:
        """Decide the socket on the bytes held (no more are coming first), then read them."""
        early, self._early = self._early, []
        if not early:
            return
        self._settle(early[0][0], b"".join(item[1] for item in early))
        for direction, payload, packet, ts in early:
            self._feed(direction, payload, packet, ts)

    def _feed(self, direction: _Direction, payload: bytes, packet: int, ts: int) -> None:
        splitter = direction.splitter
        if splitter is None:
            record = self._row(
                direction, packet, ts, direction.half.offset if direction.half else 0, len(payload)
            )
            record["type"] = "UNEXPECTED"
            who = "the LB on the send port" if self.role == SEND else "the IC on the receive port"
            self._violate(record, f"framing: {who} sends nothing, yet {len(payload)} bytes came")
            self._emit(record)
            return
        for frame in splitter.feed(payload):
            kind = type(frame)
            if kind is RecordFrame:
                self._record(direction, frame, packet, ts)
            elif kind is MessageFrame:
                self._message(direction, frame, packet, ts)
            elif kind is Blob:
                self._blob(direction, frame, packet, ts)
            else:
                self._garbage(direction, frame, packet, ts)

    def _row(self, direction: _Direction, packet: int, ts: int, offset: int, length: int) -> dict:
        seconds = ts / 1e9
        if not self.first_packet:
            self.first_packet, self.first_ts = packet, seconds
        self.last_packet, self.last_ts = packet, seconds
        record = dict(self.ident)
        record["sender"] = IC if direction.client == self.ic_is_client else LB
        record["direction"] = "initiator>responder" if direction.client else "responder>initiator"
        record["ts"] = seconds
        record["ts_ns"] = ts
        record["packet"] = packet
        record["offset"] = offset
        record["length"] = length
        record["frame_index"] = self.frame_index
        record["lb"] = self.pair.label if self.pair else None
        self.frame_index += 1
        if self.notes:
            record["notes"], self.notes = self.notes, []
        return record

    def _emit(self, record: dict) -> None:
        self.types[record["type"]] += 1
        self.out.append(to_json(record) if self.jsonl else record)

    def _violate(self, record: dict, *reasons: str) -> None:
        record["verdict"] = Kind.VIOLATION.value
        record.setdefault("violations", []).extend(reasons)
        self.violations += 1
        if len(self.violation_list) < _KEEP:
            for reason in reasons:
                self.violation_list.append(
                    {
                        "packet": record["packet"],
                        "offset": record["offset"],
                        "type": record["type"],
                        "reason": reason,
                    }
                )

    def _apply(self, record: dict, verdict) -> None:
        record["verdict"] = verdict.kind.value
        if verdict.note:
            mark(record, "note", verdict.note, self.findings)
        if not verdict.ok:
            self._violate(record, *verdict.violations)
        record["phase"] = self.pair.session.phase.value

    def _record(self, direction: _Direction, frame: RecordFrame, packet: int, ts: int) -> None:
        header = frame.header
        record = self._row(direction, packet, ts, frame.offset, header.size)
        before = self.pair.session.phase
        verdict = self.pair.session.feed(IC, (header, frame.body))
        record["seq_id"] = header.seq
        record["committer_id"] = header.committer
        record["check_bytes"] = f"{header.check:016x}"
        record["record_size"] = header.size
        msgs = verdict.messages
        record["message_count"] = len(msgs)
        if header.seq == CONTROL_SEQ:
            record["type"] = msgs[0].name if len(msgs) == 1 else "ControlRecord"
        elif header.seq == CHECKPOINT_SEQ:
            record["type"] = "CheckpointRecord"
            if len(msgs) == 1 and msgs[0].type == CHECKPOINT:
                record["checkpoint_length"] = _length(msgs[0])
                direction.blob_offset, direction.blob_size = (
                    frame.offset + header.size,
                    record["checkpoint_length"],
                )
        else:
            record["type"] = "Record"
            record["rpc_count"] = sum(
                1 if m.type == RPC else _batch_count(m) for m in msgs if m.type in (RPC, RPC_BATCH, 13)
            )
            record["message_types"] = sorted({m.name for m in msgs})
        self._apply(record, verdict)
        self._phase_finding(record, before, self.pair.session.phase)
        self._emit(record)

    def _phase_finding(self, record: dict, before: Phase, after: Phase) -> None:
        """A recovery's start and end, and a first start, said where the IC's records show them."""
        if after is before:
            return
        if after is Phase.REPLAY:
            size = record.get("checkpoint_length")
            of = f"a checkpoint of {size:,} bytes" if size is not None else "a checkpoint"
            text = f"recovery: the IC restores the LB from {of}, then replays the log records after it"
        elif before is Phase.REPLAY:
            text = f"recovery ends: {record['type']} ends the replay, and the LB goes on as primary"
        elif after is Phase.FIRST_START:
            text = "first start: no checkpoint to recover from; the LB is asked for its first checkpoint"
        else:
            return
        mark(record, "note", text, self.findings)

    def _message(self, direction: _Direction, frame: MessageFrame, packet: int, ts: int) -> None:
        msg = frame.message
        record = self._row(direction, packet, ts, frame.offset, frame.length)
        record["type"] = msg.name
        verdict = self.pair.session.feed(LB, msg)
        if msg.type == RPC:
            try:
                rpc = decode_rpc(msg.data, outgoing=True)
                record["destination"] = rpc.destination
                record["method_id"] = rpc.method_id
                record["rpc_type"] = RPC_TYPE_NAMES.get(rpc.rpc_type, str(rpc.rpc_type))
                record["rpc_count"] = 1
            except MalformedError:
                pass
        elif msg.type == RPC_BATCH:
            record["rpc_count"] = _batch_count(msg)
        elif msg.type == CHECKPOINT:
            n = _length(msg)
            if n is not None:
                record["checkpoint_length"] = n
                direction.blob_offset, direction.blob_size = frame.offset + frame.length, n
        elif msg.type == TAKE_CHECKPOINT and self.pair.session.checkpoint_asked is not None:
            # the IC asks back only once its own request is answered: one request at a time
            record["ic_asked"] = type_name(self.pair.session.checkpoint_asked)
        self._apply(record, verdict)
        self._emit(record)

    def _blob(self, direction: _Direction, blob: Blob, packet: int, ts: int) -> None:
        if blob.remaining:
            return
        record = self._row(direction, packet, ts, direction.blob_offset, direction.blob_size)
        record["type"] = "CheckpointBytes"
        record["checkpoint_length"] = direction.blob_size
        record["verdict"] = Kind.ACCEPTED.value
        self._emit(record)

    def _garbage(self, direction: _Direction, garbage: Garbage, packet: int, ts: int) -> None:
        record = self._row(direction, packet, ts, garbage.offset, 0)
        record["type"] = "INVALID"
        self._violate(record, f"framing: {garbage.reason}; the rest of this direction is not read")
        self._emit(record)

    # --- the end --------------------------------------------------------------------------------

    def finish(self) -> None:
        for direction in self.dirs.values():
            half = direction.half
            if half is not None:
                half.flush(self.last_packet, int(self.last_ts * 1e9))
        self.flush()
        halves = [d.half for d in self.dirs.values() if d.half is not None]
        for direction in self.dirs.values():
            half, splitter = direction.half, direction.splitter
            if half is None or splitter is None or self.pair is None or not (half.fin_seen or half.rst_seen):
                continue
            side = IC if direction.client == self.ic_is_client else LB
            how = End.RESET if half.rst_seen else End.CLOSED
            verdict = self.pair.session.end(side, how, blob_left=splitter.blob_left)
            if verdict is not None:
                record = self._row(direction, self.last_packet, int(self.last_ts * 1e9), half.offset, 0)
                record["type"] = "EOF"
                self._violate(record, *verdict.violations)
                self._emit(record)
        if any(h.rst_seen for h in halves):
            self.closed = "reset"
        elif halves and all(h.fin_seen for h in halves):
            self.closed = "closed"

    def held_bytes(self) -> int:
        """Bytes kept of records not yet whole, both ways (the live checker bounds their sum)."""
        return sum(len(d.splitter.buf) - d.splitter.pos for d in self.dirs.values() if d.splitter is not None)

    def release(self) -> None:
        for direction in self.dirs.values():
            direction.half = None
            direction.splitter = None

    def live_state(self) -> dict:
        """The protocol state a live view shows mid-stream: the socket, the phase, checkpoints, records."""
        s = self.pair.session if self.pair else Session()
        return {
            "socket": self.role or "unknown",
            "phase": s.phase.value,
            "records": s.records,
            "checkpoints": s.checkpoints_in + s.checkpoints_out,
            "last_seq": s.last_seq,
            "expecting": s.expects().text,
        }

    def as_dict(self) -> dict:
        s = self.pair.session if self.pair else Session()
        return {
            "conn_index": self.conn_index,
            "connection": self.label,
            "protocol": "ambrosia",
            "socket": self.role or "unknown",
            "lb": self.pair.describe() if self.pair else None,
            "paired": bool(self.pair and len(self.pair.roles) == 2),
            "first_packet": self.first_packet,
            "last_packet": self.last_packet,
            "duration": round(self.last_ts - self.first_ts, 6),
            "frames_by_type": dict(self.types),
            "committer_id": s.committer,
            "phase": s.phase.value,
            "start": "first start" if s.first_start else ("recovery" if s.checkpoints_in else "unknown"),
            "records": s.records,
            "replayed": s.replayed,
            "rpcs_in": s.rpcs_in,
            "rpcs_out": s.rpcs_out,
            "checkpoints_from_lb": s.checkpoints_out,
            "checkpoint_records": s.checkpoints_in,
            "requests": dict(s.requests),
            "last_seq": s.last_seq,
            "expecting": s.expects().text,
            "violations": self.violations,
            "violation_list": self.violation_list,
            "capture_notes": self.capture_notes,
            "closed": self.closed,
        }


def _length(msg) -> int | None:
    try:
        return checkpoint_length(msg)
    except MalformedError:
        return None


def _batch_count(msg) -> int:
    try:
        return read_zz(msg.data, 0, len(msg.data))[0] if msg.type != RPC else 1
    except (Incomplete, MalformedError):
        return 0


__all__ = ["PORTS", "AmbrosiaTracker", "looks_like_ambrosia", "pair_key"]
