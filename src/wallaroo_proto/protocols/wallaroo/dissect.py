"""The Wallaroo plug-in's per-connection tracker: frame bodies in, validated records out.

The capture driver (``capture.dissector.Dissector``) reads captures, reassembles TCP and
hands each direction's bytes to a ``resync.DirectionFramer``; this tracker
decodes the frames it splits (the codec), judges each one with the shared
protocol core (``protocol.Connection``) and makes its record
(``protocols.schema.fields()``) and the connection's summary.

A connection's first frames settle its use: HELLO version ``v0.0.1`` or 2PC
messages on stream 0 mark the sink protocol. Frames seen before the use is
known wait for it, since it decides their sender. The common case, well-formed
MESSAGEs on a settled source connection, goes one loop with no per-frame dict
under ``jsonl_batches``.
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from wallaroo_proto.capture.frame_block import COLUMN, MAX_ROWS, PLAIN, SHARED, FrameBlock
from wallaroo_proto.capture.pcap import format_address
from wallaroo_proto.findings import mark
from wallaroo_proto.judge import Kind
from wallaroo_proto.records import to_json

from .codec import decode
from .errors import ProtocolError
from .frames import (
    DEFAULT_MAX_FRAME_SIZE,
    SINK_VERSION,
    SOURCE_VERSION,
    Ack,
    EosMessage,
    Error,
    Frame,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    WorkersLeft,
    show_text,
    type_name,
)
from .protocol import Connection, ConnState, Side, StreamState, Use
from .resync import DirectionFramer
from .summary import ConnectionSummary, TxnSummary
from .twopc import (
    TWOPC_STREAM,
    ListUncommitted,
    Phase1,
    Phase2,
    Reply,
    ReplyUncommitted,
    TwoPCWorkersLeft,
    decode_twopc,
)
from .wire import U32

if TYPE_CHECKING:
    from wallaroo_proto.capture.dissector import Dissector

_MSG_HEAD = struct.Struct(">QQqH").unpack_from
_new_tuple = tuple.__new__
_MESSAGE = 5
#: The fields of a block of accepted MESSAGEs after the direction's own, in record order.
_MESSAGE_LAYOUT = (
    *((name, COLUMN) for name in ("ts", "ts_ns", "packet", "offset", "length")),
    ("type", SHARED),
    ("frame_index", COLUMN),
    ("verdict", SHARED),
    *((name, COLUMN) for name in ("stream_id", "message_id", "event_time")),
    ("key_b64", PLAIN),
    ("key_len", COLUMN),
    ("payload_b64", PLAIN),
    ("payload_len", COLUMN),
)
#: Frames held while it is not yet known whether a connection speaks source or sink.
_HOLD_LIMIT = 32
#: Per-connection caps on stored detail (counts stay exact).
_KEEP = 1000
_TYPE_NAMES = {
    cls: cls.TYPE.name
    for cls in (Hello, Ok, Error, Notify, NotifyAck, Message, Ack, Restart, EosMessage, WorkersLeft)
}


_b2a = binascii.b2a_base64


def _b64(data: bytes) -> str:
    return _b2a(data, newline=False).decode("ascii")


def _key_text(known: dict[bytes, str], key: bytes) -> str:
    """A MESSAGE key's base64, remembered in ``known``: keys repeat, a few thousand cover most streams."""
    if not key:
        return ""
    text = known.get(key)
    if text is None:
        text = _b2a(key, newline=False).decode()
        if len(known) < 4096:
            known[key] = text
    return text


def _where(where: list[dict]) -> str:
    return ", ".join(f"stream {w['stream_id']} {w['start_por']}..{w['end_por']}" for w in where)


def _text(value) -> str:
    return show_text(value)


# --- per connection ------------------------------------------------------------------


class _Tracker:
    """One TCP connection: both directions, the protocol core, the summary."""

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
        #: MESSAGE key -> its base64, shared by the connection's frames (bounded).
        self.key_text: dict[bytes, str] = {}
        self.capture = dissector.capture_name
        self.with_raw = dissector.with_raw
        #: False (``drain``, the proxy's checker): accepted MESSAGEs are counted, never made records.
        self.want_records = dissector.want_records
        self.canon: tuple = ()
        max_size = dissector.frame_limit("wallaroo")
        self.ends = {True: client, False: server}
        self.dirs = {
            True: DirectionFramer(self, True, max_size),
            False: DirectionFramer(self, False, max_size),
        }
        ports = dissector.ports
        if client_known:
            self.initiator_is_client = True
        elif (server[1] in ports) != (client[1] in ports):
            self.initiator_is_client = server[1] in ports
        else:
            self.initiator_is_client = client[1] >= server[1]
        self.initiator_fixed = False
        self.conn: Connection | None = None
        self.use: Use | None = None
        #: Records waiting for the use, which decides their sender: (emitting method, its arguments).
        self.held: list[tuple[Callable[..., None], tuple]] = []
        #: The dissector's waiting list: records of later packets wait while frames here do.
        self.hold_back = dissector.hold_back
        self.midstream = False
        self.summary = ConnectionSummary(index, "")
        self.findings: list[dict] = []  # findings.mark's, for the summary
        self._set_label()

    # identity -----------------------------------------------------------------------

    def _endpoint(self, client: bool) -> tuple[str, int]:
        addr, port = self.ends[client]
        return format_address(addr), port

    def _set_label(self) -> None:
        ia, ip = self._endpoint(self.initiator_is_client)
        ra, rp = self._endpoint(not self.initiator_is_client)
        fmt = lambda a, p: f"[{a}]:{p}" if ":" in a else f"{a}:{p}"  # noqa: E731
        self.label = f"{fmt(ia, ip)} > {fmt(ra, rp)}"
        self.summary.connection = self.label
        for direction in getattr(self, "dirs", {}).values():
            direction.base = None
            direction.fast = False
        self.ident = {
            "capture": self.capture,
            "protocol": "wallaroo",
            "connection": self.label,
            "conn_index": self.summary.conn_index,
            "initiator_addr": ia,
            "initiator_port": ip,
            "responder_addr": ra,
            "responder_port": rp,
        }

    def side_of(self, direction: DirectionFramer) -> Side:
        from_initiator = direction.client == self.initiator_is_client
        if self.use is Use.SINK:
            return Side.WORKER if from_initiator else Side.CONNECTOR
        return Side.CONNECTOR if from_initiator else Side.WORKER

    def _base(self, direction: DirectionFramer) -> dict:
        return direction.base if direction.base is not None else self._prepare(direction)

    # events from the directions -----------------------------------------------------------

    def midstream_start(self, direction: DirectionFramer, packet: int) -> None:
        self.midstream = True
        for d in self.dirs.values():
            d.fast = False
        self.summary.midstream = True
        self.summary.capture_notes.append(
            f"packet {packet}: capture starts mid-connection ({self._dir_label(direction)}); resyncing"
        )

    def gap_noted(
        self, direction: DirectionFramer, offset: int, missing: int, packet: int, note: str
    ) -> None:
        self.summary.capture_notes.append(f"{self._dir_label(direction)}: {note}")

    def resynced(self, direction: DirectionFramer, offset: int, skipped: int) -> None:
        if skipped:
            label = self._dir_label(direction)
            self.summary.capture_notes.append(
                f"{label}: resynced at stream offset {offset} after skipping {skipped} bytes"
            )

    def _dir_label(self, direction: DirectionFramer) -> str:
        return (
            "initiator>responder" if direction.client == self.initiator_is_client else "responder>initiator"
        )

    def broken(self, direction: DirectionFramer, err: ProtocolError, packet: int, ts: int) -> None:
        """Framing itself failed (length 0 or above the maximum): a record, then resync.

        Like a frame, it waits while the use is unknown: the use (and a later HELLO,
        which fixes the initiator) decide its sender, direction and connection id.
        """
        notes, direction.notes = direction.notes, []
        args = (direction, err.offset, f"packet {packet}: {err}; resyncing", packet, ts, notes)
        if self.conn is None:
            self._hold(self._broken, args)
        else:
            self._broken(*args)

    def _unjudged_index(self) -> int | None:
        """A frame the core never judges (malformed, or bytes that are no frame) still takes the next
        frame number, so that (capture, conn_index, frame_index) names one frame (Spark's frame key)."""
        conn = self.conn
        if conn is None:
            return None
        index = conn.frame_index
        conn.frame_index = index + 1
        return index

    def _broken(
        self, direction: DirectionFramer, offset: int, reason: str, packet: int, ts: int, notes: list
    ) -> None:
        record = self._base(direction).copy()
        record.update(
            ts=ts / 1e9,
            ts_ns=ts,
            packet=packet,
            offset=offset,
            frame_index=self._unjudged_index(),
            type="INVALID",
            verdict="malformed",
            violations=[reason],
        )
        if notes:
            record["notes"] = notes
        s = self.summary
        s.malformed += 1
        s.violations += 1
        if len(s.violation_list) < _KEEP:
            s.violation_list.append({"packet": packet, "offset": offset, "type": "INVALID", "reason": reason})
        self.out.append(to_json(record) if self.jsonl else record)

    # frames -------------------------------------------------------------------------

    def frame(self, direction: DirectionFramer, offset: int, body: bytes, packet: int, ts: int) -> None:
        error = None
        frame: Frame | None
        if body[0] == _MESSAGE and len(body) >= 27:
            stream_id, message_id, event_time, key_len = _MSG_HEAD(body, 1)
            key_end = 27 + key_len
            if key_end <= len(body):
                frame = _new_tuple(
                    Message, (stream_id, message_id, event_time, body[27:key_end], body[key_end:])
                )
            else:
                frame, error = self._decode(body)
        else:
            frame, error = self._decode(body)
        notes = direction.notes
        if notes:
            direction.notes = []
        if self.conn is None and not self._decide(direction, frame):
            # Its own list: an empty one is still the direction's, which later notes go to.
            self._hold(self._emit, (direction, offset, body, frame, error, packet, ts, notes or []))
            return
        self._emit(direction, offset, body, frame, error, packet, ts, notes)

    def _hold(self, emit: Callable[..., None], args: tuple) -> None:
        if not self.held:
            self.hold_back(self)
        self.held.append((emit, args))
        if len(self.held) >= _HOLD_LIMIT:
            self._settle(Use.SOURCE)

    @property
    def pending(self) -> bool:
        """Frames wait for the connection's use (their packets come before others' shown since)."""
        return bool(self.held)

    def flush(self, packet: int, ts: int) -> None:
        """The dissector waited a whole window: read the connection as a source, as after
        ``_HOLD_LIMIT`` frames."""
        if self.held:
            self._settle(Use.SOURCE)

    @staticmethod
    def _decode(body: bytes) -> tuple[Frame | None, str | None]:
        try:
            return decode(body), None
        except ProtocolError as err:
            return None, str(err)

    def _decide(self, direction: DirectionFramer, frame: Frame | None) -> bool:
        """Settle source or sink use (and the initiator) once the frames tell; False: hold."""
        if type(frame) is Hello:
            if direction.client != self.initiator_is_client and not self.initiator_fixed:
                self.initiator_is_client = direction.client
                self._set_label()
            self.initiator_fixed = True
            if frame.version == SINK_VERSION:
                self._settle(Use.SINK)
                return True
            if frame.version == SOURCE_VERSION:
                self._settle(Use.SOURCE)
                return True
            return False
        if type(frame) is Message:
            if frame.stream_id == TWOPC_STREAM:
                try:
                    decode_twopc(frame.payload)
                except ProtocolError:
                    self._settle(Use.SOURCE)
                else:
                    self._settle(Use.SINK)
            else:
                self._settle(Use.SOURCE)
            return True
        return False

    def _settle(self, use: Use) -> None:
        self.use = use
        self.summary.use = use.value
        for direction in self.dirs.values():
            direction.base = None
            direction.fast = False
        conn = self.conn = Connection(use=use)
        if self.midstream and conn.state is ConnState.CONNECTED:
            conn.state = ConnState.STREAMING
        held, self.held = self.held, []
        for emit, args in held:
            emit(*args)

    def _seed_streams(self, frame: Frame) -> None:
        """Mid-connection start: assume streams the capture never saw opened were open."""
        conn = self.conn
        ids: list[int] = []
        if type(frame) in (Message, EosMessage):
            if not (self.use is Use.SINK and frame.stream_id == TWOPC_STREAM):
                ids = [frame.stream_id]
        elif type(frame) is Ack:
            ids = [sid for sid, _ in frame.acks]
        elif type(frame) is NotifyAck and frame.stream_id not in conn.streams:
            conn.stream(frame.stream_id).state = StreamState.NOTIFY_SENT
        for sid in ids:
            if sid not in conn.streams:
                conn.stream(sid).state = StreamState.OPEN

    def _emit(
        self,
        direction: DirectionFramer,
        offset: int,
        body: bytes,
        frame: Frame | None,
        error: str | None,
        packet: int,
        ts: int,
        notes: list,
    ) -> None:
        base = direction.base
        if base is None:
            base = self._prepare(direction)
        record = base.copy()
        length = len(body) + 4
        seconds = ts / 1e9
        record["ts"] = seconds
        record["ts_ns"] = ts
        record["packet"] = packet
        record["offset"] = offset
        record["length"] = length
        s = self.summary
        if not s.first_packet:
            s.first_packet, s.first_ts = packet, seconds
        s.last_packet = packet
        s.last_ts = seconds
        s.frames += 1
        direction.bytes += length
        if notes:
            record["notes"] = notes
        if self.with_raw:
            record["_raw"] = U32.pack(len(body)) + body
        conn = self.conn
        if frame is None:
            name = type_name(body[0])
            record["frame_index"] = self._unjudged_index()
            record["type"] = name
            record["verdict"] = "malformed"
            reason = f"malformed {name}: {error}"
            record["violations"] = [reason]
            s.frames_by_type[name] += 1
            s.malformed += 1
            s.violations += 1
            if len(s.violation_list) < _KEEP:
                s.violation_list.append({"packet": packet, "offset": offset, "type": name, "reason": reason})
            self.out.append(to_json(record) if self.jsonl else record)
            return
        ftype = type(frame)
        name = _TYPE_NAMES[ftype]
        record["type"] = name
        counts = s.frames_by_type
        counts[name] = counts.get(name, 0) + 1
        if self.midstream:
            self._seed_streams(frame)
        credits_before = conn.credits
        outcome = conn.feed(direction.side, frame)
        index = outcome.frame_index
        record["frame_index"] = index if index >= 0 else conn.frame_index - 1
        verdict = outcome.kind
        record["verdict"] = verdict._value_
        if verdict is not Kind.ACCEPTED:
            if verdict is Kind.VIOLATION:
                record["violations"] = [outcome.reason]
                s.violations += 1
                if len(s.violation_list) < _KEEP:
                    s.violation_list.append(
                        {"packet": packet, "offset": offset, "type": name, "reason": outcome.reason}
                    )
            elif verdict is Kind.IGNORED:
                s.ignored += 1
        if direction.data_side and credits_before is not None:
            s.credits_spent += 1
        if ftype is Message:
            self._message(record, frame, outcome, s, verdict)
        else:
            s.credits_left = conn.credits
            self._other(record, frame, s, packet)
        self.out.append(to_json(record) if self.jsonl else record)

    def _fast_messages(
        self, direction: DirectionFramer, bodies: list, start: int, packet: int, ts: int
    ) -> int:
        """The common case in one loop: plain MESSAGEs on a settled source connection.

        Takes ``bodies[start:]`` while they are well-formed MESSAGEs and returns the
        index of the first it leaves to ``frame``. Same records and summary as
        ``_emit`` + ``_message`` (a test compares both paths' output); only the
        per-frame call and lookup overhead is gone. Accepted MESSAGEs go out as
        rows of a ``FrameBlock`` (a frame with another verdict, as its dict, between
        two blocks), never as a dict each; under ``jsonl_batches`` as their JSON
        text, made in this loop (measured: a quarter faster than rows formatted after).
        """
        s = self.summary
        conn = self.conn
        feed = conn.feed
        side = direction.side
        spend = direction.data_side
        append = self.out.append
        jsonl = self.jsonl
        streams = s.streams
        accepted = Kind.ACCEPTED
        seconds = ts / 1e9
        # Everything up to "packet" is the same for all frames of this packet.
        head = f'{direction.json_prefix},"ts":{seconds!r},"ts_ns":{ts},"packet":{packet},' if jsonl else ""
        block = direction.block
        if block is None or not block.extends(self.out):
            block = None
        rows: list[tuple] = [] if block is None else block.rows
        add = rows.append
        key_text = self.key_text
        records = self.want_records
        nbytes = 0
        count = len(bodies)
        i = start
        while i < count:
            offset, body = bodies[i]
            size = len(body)
            if body[0] != _MESSAGE or size < 27:
                break
            stream_id, message_id, event_time, key_len = _MSG_HEAD(body, 1)
            key_end = 27 + key_len
            if key_end > size:
                break
            i += 1
            key = body[27:key_end]
            payload = body[key_end:]
            length = size + 4
            nbytes += length
            if spend and conn.credits is not None:
                s.credits_spent += 1
            outcome = feed(side, _new_tuple(Message, (stream_id, message_id, event_time, key, payload)))
            index = outcome.frame_index
            if index < 0:
                index = conn.frame_index - 1
            verdict = outcome.kind
            plen = size - key_end
            if verdict is accepted:
                st = streams.get(stream_id)
                if st is None:
                    st = s.stream(stream_id)
                st.messages += 1
                st.payload_bytes += plen
                if st.first_id is None:
                    st.first_id = message_id
                expected = st.next_expected
                if expected is not None and message_id > expected:
                    st.gaps += 1
                    st.missing_ids += message_id - expected
                st.last_id = message_id
                st.next_expected = message_id + 1  # source ids count up by one
                if not records:
                    continue
                key_b64 = _key_text(key_text, key)
                payload_b64 = _b2a(payload, newline=False).decode()
                if jsonl:
                    # Exactly the object to_json(record) would write, keys in the same order.
                    append(
                        f'{head}"offset":{offset},"length":{length},"type":"MESSAGE","frame_index":{index},'
                        f'"verdict":"accepted","stream_id":{stream_id},"message_id":{message_id},'
                        f'"event_time":{event_time},"key_b64":"{key_b64}","key_len":{key_len},'
                        f'"payload_b64":"{payload_b64}","payload_len":{plen}}}'
                    )
                    continue
                add(
                    (
                        seconds,
                        ts,
                        packet,
                        offset,
                        length,
                        index,
                        stream_id,
                        message_id,
                        event_time,
                        key_b64,
                        key_len,
                        payload_b64,
                        plen,
                    )
                )
                if block is None:
                    block = direction.block = FrameBlock(direction.block_layout, direction.block_shared, rows)
                    append(block)
                elif len(rows) >= MAX_ROWS:
                    block, rows = None, []
                    add = rows.append
                continue
            block, rows = None, []
            add = rows.append
            key_b64 = _key_text(key_text, key)
            payload_b64 = _b2a(payload, newline=False).decode()
            record = direction.base.copy()
            record["ts"] = seconds
            record["ts_ns"] = ts
            record["packet"] = packet
            record["offset"] = offset
            record["length"] = length
            record["type"] = "MESSAGE"
            record["frame_index"] = index
            record["verdict"] = verdict._value_
            if verdict is Kind.VIOLATION:
                record["violations"] = [outcome.reason]
                s.violations += 1
                if len(s.violation_list) < _KEEP:
                    s.violation_list.append(
                        {"packet": packet, "offset": offset, "type": "MESSAGE", "reason": outcome.reason}
                    )
            elif verdict is Kind.REPLAYED:
                s.stream(stream_id).replays += 1
            elif verdict is Kind.IGNORED:
                s.ignored += 1
            if stream_id not in streams:
                s.stream(stream_id)  # as _message: every MESSAGE's stream is listed
            record["stream_id"] = stream_id
            record["message_id"] = message_id
            record["event_time"] = event_time
            record["key_b64"] = key_b64
            record["key_len"] = len(key)
            record["payload_b64"] = payload_b64
            record["payload_len"] = len(payload)
            append(to_json(record) if jsonl else record)
        direction.bytes += nbytes
        done = i - start
        if done:
            s.frames += done
            counts = s.frames_by_type
            counts["MESSAGE"] = counts.get("MESSAGE", 0) + done
            s.last_packet = packet
            s.last_ts = seconds
        return i

    def _prepare(self, direction: DirectionFramer) -> dict:
        """Per-direction constants, fixed once the use and the initiator are known."""
        from_initiator = direction.client == self.initiator_is_client
        side = direction.side = self.side_of(direction)
        direction.data_side = self.conn is not None and side is self.conn.data_side
        base = dict(self.ident)
        base["use"] = self.use.value if self.use else "unknown"
        base["sender"] = side.value
        base["direction"] = "initiator>responder" if from_initiator else "responder>initiator"
        direction.base = base
        direction.json_prefix = to_json(base)[:-1]
        direction.block_layout = (*((name, SHARED) for name in base), *_MESSAGE_LAYOUT)
        direction.block_shared = {**base, "type": "MESSAGE", "verdict": "accepted"}
        direction.block = None
        # The fast MESSAGE path: settled source use, no 2PC, nothing held back, no raw bytes wanted.
        direction.fast = self.use is Use.SOURCE and not self.midstream and not self.with_raw
        return base

    def _message(self, record: dict, frame: Message, outcome, s: ConnectionSummary, verdict: Kind) -> None:
        sid = frame.stream_id
        record["stream_id"] = sid
        record["message_id"] = frame.message_id
        record["event_time"] = frame.event_time
        key = frame.key
        payload = frame.payload
        record["key_b64"] = _b64(key) if key else ""
        record["key_len"] = len(key)
        record["payload_b64"] = _b64(payload)
        record["payload_len"] = len(payload)
        msg = outcome.twopc
        if msg is not None:
            self._twopc(record, msg, s)
            return
        st = s.streams.get(sid)
        if st is None:
            st = s.stream(sid)
        if verdict is Kind.REPLAYED:
            st.replays += 1
            return
        if verdict is not Kind.ACCEPTED:
            return
        mid = frame.message_id
        st.messages += 1
        st.payload_bytes += len(payload)
        if st.first_id is None:
            st.first_id = mid
        expected = st.next_expected
        if expected is not None and mid > expected:
            st.gaps += 1
            st.missing_ids += mid - expected
        st.last_id = mid
        # Sink data streams number messages by byte offset; source streams count them.
        st.next_expected = mid + len(payload) if self.use is Use.SINK else mid + 1

    def _twopc(self, record: dict, msg, s: ConnectionSummary) -> None:
        record["twopc"] = msg.TAG.name
        packet = record["packet"]
        if isinstance(msg, (ListUncommitted, TwoPCWorkersLeft, ReplyUncommitted)):
            record["rtag"] = msg.rtag
            if isinstance(msg, ListUncommitted):
                s.list_uncommitted += 1
            elif isinstance(msg, ReplyUncommitted):
                record["txn_ids"] = [_text(t) for t in msg.txn_ids]
            else:
                record["worker_names"] = [_text(t) for t in msg.worker_names]
            return
        txn_id = _text(msg.txn_id)
        record["txn_id"] = txn_id
        txn = s.txns.get(txn_id)
        if txn is None and len(s.txns) < 10 * _KEEP:
            txn = s.txns[txn_id] = TxnSummary(txn_id)
        if isinstance(msg, Phase1):
            record["where"] = [{"stream_id": a, "start_por": b, "end_por": c} for a, b, c in msg.where]
            if txn:
                txn.where = record["where"]
                txn.phase1_packet = packet
        elif isinstance(msg, (Reply, Phase2)):
            record["commit"] = msg.commit
            if txn:
                if isinstance(msg, Reply):
                    txn.vote = msg.commit
                else:
                    txn.decision = msg.commit
                    txn.phase2_packet = packet
            if not msg.commit:
                # Where, not which packet: a finding reads the same however the capture was cut.
                asked = f" (its PHASE1: {_where(txn.where)})" if txn and txn.where else ""
                if isinstance(msg, Reply):
                    text = f"the {record['sender']} votes to abort transaction {txn_id}{asked}"
                else:
                    text = f"the {record['sender']} aborts transaction {txn_id}: its data is to be sent again"
                mark(record, "warning", text, self.findings)

    def _other(self, record: dict, frame: Frame, s: ConnectionSummary, packet: int) -> None:
        ftype = type(frame)
        if ftype is Ack:
            record["credits"] = frame.credits
            record["acks"] = [{"stream_id": sid, "point_of_ref": por} for sid, por in frame.acks]
            s.credits_granted += frame.credits
            for sid, por in frame.acks:
                st = s.stream(sid)
                st.checkpoints += 1
                st.last_acked = por
        elif ftype is Hello:
            record["version"] = _text(frame.version)
            record["cookie_b64"] = _b64(frame.cookie)
            record["cookie_len"] = len(frame.cookie)
            record["program_name"] = _text(frame.program_name)
            record["instance_name"] = _text(frame.instance_name)
            s.hello = {
                "version": record["version"],
                "program_name": record["program_name"],
                "instance_name": record["instance_name"],
                "cookie_len": len(frame.cookie),
            }
        elif ftype is Ok:
            record["initial_credits"] = frame.initial_credits
            s.credits_granted += frame.initial_credits
        elif ftype is Error:
            record["reason"] = _text(frame.reason)
            s.errors.append({"packet": packet, "sender": record["sender"], "reason": record["reason"]})
            mark(
                record,
                "error",
                f"the {record['sender']} ends the connection: ERROR {record['reason']!r}",
                self.findings,
            )
        elif ftype is Notify:
            record["stream_id"] = frame.stream_id
            record["stream_name"] = _text(frame.stream_name)
            record["point_of_ref"] = frame.point_of_ref
            st = s.stream(frame.stream_id)
            st.name = record["stream_name"]
            st.notifies += 1
        elif ftype is NotifyAck:
            record["success"] = frame.success
            record["stream_id"] = frame.stream_id
            record["point_of_ref"] = frame.point_of_ref
            st = s.stream(frame.stream_id)
            if not frame.success:
                st.notify_failures += 1
                named = f" ({st.name})" if st.name else ""
                mark(
                    record,
                    "warning",
                    f"the {record['sender']} refuses stream {frame.stream_id}{named}: NOTIFY_ACK false, "
                    "so nothing may be sent on it (another connection may hold it)",
                    self.findings,
                )
            st.next_expected = None
        elif ftype is EosMessage:
            record["stream_id"] = frame.stream_id
            record["message_id"] = frame.message_id
            s.stream(frame.stream_id).eos += 1
        elif ftype is Restart:
            if frame.address is not None:
                record["address"] = _text(frame.address)
            s.restarts.append(
                {"packet": packet, "sender": record["sender"], "address": record.get("address")}
            )
            at = f" at {record['address']}" if record.get("address") else ""
            mark(
                record,
                "warning",
                f"the {record['sender']} asks for a restart{at}: the connector reconnects and resends "
                "from the last acknowledged points of reference",
                self.findings,
            )
        elif ftype is WorkersLeft:
            record["rtag"] = frame.rtag
            record["worker_names"] = [_text(t) for t in frame.worker_names]

    def live_state(self) -> dict:
        """The protocol state a live view shows mid-stream: the use, credits, open streams, checkpoints,
        the 2PC round under way (the summary's credits are settled only at the end)."""
        conn, summary = self.conn, self.summary
        if conn is None:
            return {"use": "unknown"}
        state = {
            "use": conn.use.value,
            "state": conn.state.value,
            "credits": conn.credits,
            "streams": sum(1 for st in conn.streams.values() if st.state is StreamState.OPEN),
            "checkpoints": sum(st.checkpoints for st in summary.streams.values()),
        }
        if summary.txns:
            state["2pc_rounds"] = len(summary.txns)
        if conn.phase1_txn is not None:
            state["phase1"] = _text(conn.phase1_txn)
        return state

    def held_bytes(self) -> int:
        """Bytes kept of frames not yet whole (or scanned for a frame's start after lost bytes),
        both ways: the live checker bounds their sum."""
        return sum(
            (d.reader.buffered if d.reader is not None else 0) + len(d.resync_buf) for d in self.dirs.values()
        )

    def release(self) -> None:
        """The connection is over and finished: free its buffers."""
        for direction in self.dirs.values():
            direction.half = None
            direction.reader = None
            direction.resync_buf = bytearray()

    def finish(self) -> None:
        """The connection or the capture ended: settle held frames, note loose ends."""
        for direction in self.dirs.values():
            half = direction.half
            if half is not None:
                half.flush(self.summary.last_packet, int(self.summary.last_ts * 1e9))
        if self.conn is None and self.held:
            self._settle(Use.SOURCE)
        for direction in self.dirs.values():
            direction.finish()
        tcp = {}
        for direction in self.dirs.values():
            half = direction.half
            if half is None:
                continue
            tcp[self._dir_label(direction)] = {
                "bytes": half.offset,
                "retransmitted": half.retransmitted,
                "overlapping": half.overlapped,
                "out_of_order": half.out_of_order,
                "gaps": half.gaps,
                "lost_bytes": half.lost_bytes,
                "syn": half.syn_seen,
                "fin": half.fin_seen,
                "rst": half.rst_seen,
            }
        self.summary.tcp = tcp
        for direction in self.dirs.values():
            if direction.bytes:
                self.summary.bytes_by_direction[self._dir_label(direction)] = direction.bytes
        if self.conn is not None:
            self.summary.credits_left = self.conn.credits
        halves = [d.half for d in self.dirs.values() if d.half is not None]
        if any(h.rst_seen for h in halves):
            self.summary.closed = "reset"
        elif halves and all(h.fin_seen for h in halves):
            self.summary.closed = "closed"
        else:
            self.summary.closed = "open at end of capture"
        for direction in self.dirs.values():
            direction.block = None  # handed out: a finished tracker kept for its summary holds no rows


def looks_like_hello(
    payload: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, final: bool = True
) -> bool | None:
    """Do these bytes start with a plausible HELLO frame (length, type 0, short version)?

    ``None`` when not ``final`` and the bytes end before the version does.
    """
    if len(payload) >= 4:
        (length,) = U32.unpack_from(payload, 0)
        if not 9 <= length <= max_frame_size:
            return False
    if len(payload) >= 5 and payload[4] != 0:
        return False
    if len(payload) < 7:
        return False if final else None
    version_len = (payload[5] << 8) | payload[6]
    if version_len > 64 or version_len + 2 > length - 1:
        return False
    version = payload[7 : 7 + version_len]
    if not all(32 <= b < 127 for b in version):
        return False
    return True if final or len(version) == version_len else None


__all__ = ["looks_like_hello"]
