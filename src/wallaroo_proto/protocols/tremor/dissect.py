"""One Tremor session in a capture: the HTTP upgrade, WebSocket frames and JSON messages, judged.

The capture driver reassembles each direction of a TCP connection and feeds
it here. Each direction first reads its HTTP head (the client's upgrade
request, the server's 101), then ``wsframes.FrameSplitter`` splits frames
(resyncing after lost bytes), ``wsframes.MessageAssembler`` applies RFC 6455's
framing rules and reassembles messages, and ``core.Session`` judges each text
message as the node and the client judge them. One record per HTTP head and
per frame; the frame that completes a message carries the message's fields.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from wallaroo_proto.capture.tracker import KEEP_VIOLATIONS, ConnectionTracker
from wallaroo_proto.findings import mark
from wallaroo_proto.records import to_json

from .core import CLIENT, SERVER, Session
from .wsframes import (
    BINARY,
    CLOSE,
    TEXT,
    FrameSplitter,
    Handshake,
    MessageAssembler,
    head_length,
    looks_like_upgrade,
    opcode_name,
    read_request,
    read_response,
)

if TYPE_CHECKING:
    from wallaroo_proto.capture.dissector import Dissector

#: The prototype's network port.
PORTS = (9899,)
#: An HTTP head longer than this is not one.
_MAX_HEAD = 64 * 1024
_MAX_JSON_FIELD = 4096


def detect(payload: bytes, max_frame_size: int = 0, final: bool = True) -> bool | None:
    """A connection opening with a WebSocket upgrade request.

    ``None`` when not ``final`` and the request's head may still be coming.
    """
    if looks_like_upgrade(payload):
        return True
    if final or len(payload) >= 4096 or b"\r\n\r\n" in payload:
        return False
    return None if b"GET ".startswith(payload[:4]) else False


def verdict_fields(record: dict, verdict: Any) -> None:
    """The fields a session's verdict on a text message gives its record."""
    if verdict.alias is not None:
        record["alias"] = verdict.alias
    if verdict.protocol is not None:
        record["tremor_protocol"] = verdict.protocol
    if verdict.code is not None:
        record["status_code"] = verdict.code
    elif verdict.type == "error-close":
        record["status_code"] = verdict.message.code


#: Close codes of an orderly end (RFC 6455 7.4.1): normal closure and going away.
_ROUTINE_CLOSES = frozenset({1000, 1001})
_CLOSE_MEANINGS = {
    1002: "protocol error",
    1003: "data it cannot accept",
    1007: "invalid payload data",
    1008: "policy violation",
    1009: "message too big",
    1010: "an extension the server did not agree to",
    1011: "the server's internal error",
}

#: A client frame the capture has before the server's answer to the upgrade.
EARLY_FRAME = (
    "sent before the server's 101 (RFC 6455 4.1: the client must wait for the handshake's answer "
    "before it sends)"
)


class _Direction:
    __slots__ = ("tracker", "client", "half", "phase", "head", "splitter", "assembler", "bytes")

    def __init__(self, tracker: TremorTracker, client: bool) -> None:
        self.tracker = tracker
        self.client = client
        self.half: Any = None
        self.phase = "http"  # -> frames, or body (no WebSocket: a refused upgrade)
        self.head = bytearray()
        self.splitter = FrameSplitter(client=client)
        self.assembler = MessageAssembler(client=client)
        self.bytes = 0

    def data(self, offset: int, payload: bytes, packet: int, ts: int) -> None:
        self.bytes += len(payload)
        if self.phase == "http":
            self.head += payload
            end = head_length(bytes(self.head[:_MAX_HEAD]))
            if end is None:
                if len(self.head) > _MAX_HEAD:
                    self.tracker.no_head(self, packet, ts, f"in the first {_MAX_HEAD} bytes")
                return
            head, rest = bytes(self.head[:end]), bytes(self.head[end:])
            self.head = bytearray()
            self.phase = self.tracker.handshake(self, head, packet, ts)
            self.splitter.offset = offset + len(payload) - len(rest)
            payload = rest
            if not payload:
                return
        if self.phase == "frames":
            for frame in self.splitter.feed(payload):
                self.tracker.frame(self, frame, packet, ts)
            if self.splitter.broken:
                self.tracker.note(
                    f"{self.tracker.dir_label(self)}: {self.splitter.broken}; the rest is skipped"
                )
                self.phase = "body"

    def gap(self, offset: int, missing: int | None, packet: int, ts: int) -> None:
        label = self.tracker.dir_label(self)
        if missing is None:
            self.tracker.note(
                f"packet {packet}: capture starts mid-connection ({label}); resyncing on frames"
            )
            self.phase = "frames"
            self.splitter.gap(0)
            self.splitter.offset = offset
            self.tracker.session.lost()
            return
        self.tracker.note(
            f"{label}: {missing} bytes missing at stream offset {offset} "
            f"(lost segment before packet {packet}); resynced at the next frame that starts a JSON message; "
            "answers are no longer judged (what was asked is unknown)"
        )
        self.tracker.session.lost()
        if self.phase == "frames":
            self.splitter.gap(missing)
            self.assembler.opcode = None
            self.assembler.parts = []


class TremorTracker(ConnectionTracker):
    """One TCP connection carrying one Tremor session."""

    protocol = "tremor"

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
        self.session = Session()
        self.request: Handshake | None = None
        self.response: Handshake | None = None
        self.frames = Counter()
        self.messages = 0
        self.close_codes: dict[str, int | None] = {}

    def _record(
        self, direction: _Direction, packet: int, ts: int, offset: int, length: int, type_: str
    ) -> dict:
        if not self.first_packet:
            self.first_packet, self.first_ts = packet, ts / 1e9
        self.last_packet, self.last_ts = packet, ts / 1e9
        record = dict(self.ident)
        record.update(
            sender=CLIENT if direction.client else SERVER,
            direction=self.dir_label(direction),
            ts=ts / 1e9,
            ts_ns=ts,
            packet=packet,
            offset=offset,
            length=length,
            frame_index=self.frame_index,
            type=type_,
            verdict="accepted",
        )
        self.frame_index += 1
        self.types[type_] += 1
        if self.notes:
            record["notes"] = self.notes
            self.notes = []
        return record

    def _emit(self, record: dict, problems: list[str]) -> None:
        if problems:
            record["verdict"] = "violation"
            record["violations"] = problems
            self.violations += 1
            if len(self.violation_list) < KEEP_VIOLATIONS:
                for reason in problems:
                    self.violation_list.append(
                        {
                            "packet": record["packet"],
                            "offset": record["offset"],
                            "type": record["type"],
                            "reason": reason,
                        }
                    )
        self.out.append(to_json(record) if self.jsonl else record)

    # the upgrade ----------------------------------------------------------------------

    def handshake(self, direction: _Direction, head: bytes, packet: int, ts: int) -> str:
        """Judge one HTTP head; what the direction reads next."""
        if direction.client:
            hs = self.request = read_request(head)
            record = self._record(direction, packet, ts, 0, len(head), "UPGRADE_REQUEST")
            record["http_target"] = hs.target
            phase = "frames"
        else:
            hs = self.response = read_response(head, self.request)
            record = self._record(direction, packet, ts, 0, len(head), "UPGRADE_RESPONSE")
            record["http_status"] = hs.status
            phase = "frames" if hs.status == 101 else "body"
            if hs.status is not None and hs.status != 101:
                self.note(f"the server refused the upgrade (HTTP {hs.status}): no WebSocket follows")
        self._emit(record, hs.problems)
        return phase

    def no_head(self, direction: _Direction, packet: int, ts: int, where: str) -> None:
        """Bytes that never made an HTTP head: a violation, not silence (the connection must
        open with the upgrade, RFC 6455 §4.1); the rest of the direction is skipped."""
        who = "client" if direction.client else "server"
        what = "upgrade request" if direction.client else "answer to the upgrade"
        record = self._record(direction, packet, ts, 0, len(direction.head), "INVALID")
        self._emit(
            record, [f"no HTTP {what} {where}: the {who} sent {len(direction.head)} bytes that are none"]
        )
        direction.head = bytearray()
        direction.phase = "body"

    # frames -----------------------------------------------------------------------------

    def frame(self, direction: _Direction, f, packet: int, ts: int) -> None:
        self.frames[opcode_name(f.opcode)] += 1
        message, problems = direction.assembler.frame(f)
        type_ = opcode_name(f.opcode)
        record = self._record(direction, packet, ts, f.offset, f.wire_length, type_)
        record.update(
            ws_opcode=f.opcode,
            ws_fin=f.fin,
            ws_masked=f.masked,
            ws_length_bits=f.length_bits,
            ws_payload_len=len(f.payload),
        )
        if direction.client and self.request is not None and self.response is None:
            problems.append(EARLY_FRAME)
        if f.opcode == CLOSE:
            code = direction.assembler.close_code if len(f.payload) >= 2 else None
            record["ws_close_code"] = code
            side = CLIENT if direction.client else SERVER
            echo = (SERVER if direction.client else CLIENT) in self.close_codes  # answers the other's close
            self.close_codes[side] = code
            if code is not None and code not in _ROUTINE_CLOSES and not echo:
                meaning = _CLOSE_MEANINGS.get(code, "not one RFC 6455 defines")
                said = direction.assembler.close_reason
                why = f": {said!r}" if said else ""
                mark(
                    record,
                    "warning",
                    f"the {side} closes the WebSocket with {code} ({meaning}){why}",
                    self.findings,
                )
        if message is not None:
            if message.opcode == BINARY:
                problems.append(
                    "binary message (RFC 0019: data goes in text frames; the connection is closed)"
                )
            elif message.opcode == TEXT and message.text is not None:
                self._message(direction, record, message.text, problems)
        self._emit(record, problems)

    def _message(self, direction: _Direction, record: dict, text: str, problems: list[str]) -> None:
        self.messages += 1
        session = self.session
        other = self.dirs[not direction.client].half
        if other is not None and other.pending and not session.uncertain:
            # The other direction has a hole its later bytes wait behind: what it said is unknown.
            self.note(
                f"{self.dir_label(self.dirs[not direction.client])}: bytes missing; answers no longer judged"
            )
            session.lost()
        verdict = session.feed(CLIENT if direction.client else SERVER, text)
        record["type"] = verdict.type
        self.types[verdict.type] += 1
        record["message_json"] = text if len(text) <= _MAX_JSON_FIELD else text[:_MAX_JSON_FIELD] + "..."
        verdict_fields(record, verdict)
        if verdict.type == "error-close":
            mark(
                record,
                "warning",
                f"the server ends the session with an error: {verdict.message.text!r}",
                self.findings,
            )
        if not verdict.ok:
            problems.append(verdict.reason or "violation")

    # the end ------------------------------------------------------------------------------

    def finish(self) -> None:
        for direction in self.dirs.values():
            half = direction.half
            if half is not None:
                half.flush(self.last_packet, int(self.last_ts * 1e9))
        for direction in self.dirs.values():
            half = direction.half
            if (
                direction.phase == "http"
                and direction.head
                and half is not None
                and (half.fin_seen or half.rst_seen)
            ):
                self.no_head(direction, self.last_packet, int(self.last_ts * 1e9), "before its end")
        halves = [d.half for d in self.dirs.values() if d.half is not None]
        if any(h.rst_seen for h in halves):
            self.closed = "reset"
        elif halves and all(h.fin_seen for h in halves):
            self.closed = "closed"

    def held_bytes(self) -> int:
        """Bytes kept of a head, frames and messages not yet whole, both ways (the live checker
        bounds their sum)."""
        return sum(
            len(d.head) + len(d.splitter.buf) + sum(map(len, d.assembler.parts)) for d in self.dirs.values()
        )

    def release(self) -> None:
        for direction in self.dirs.values():
            direction.half = None
            direction.splitter = FrameSplitter(client=direction.client)
            direction.head = bytearray()

    def live_state(self) -> dict:
        """The protocol state a live view shows mid-stream: the session's state and open streams."""
        s = self.session
        return {
            "state": s.state,
            "streams": len(s.streams),
            "messages": self.messages,
            "expecting": s.expects().text,
        }

    def as_dict(self) -> dict:
        s = self.session
        streams = [{"alias": a, "protocol": p, "end": how} for a, p, how in s.history]
        streams += [{"alias": st.alias, "protocol": st.protocol, "end": "open"} for st in s.streams.values()]
        return {
            "conn_index": self.conn_index,
            "connection": self.label,
            "protocol": "tremor",
            "first_packet": self.first_packet,
            "last_packet": self.last_packet,
            "duration": round(self.last_ts - self.first_ts, 6),
            "target": self.request.target if self.request else None,
            "http_status": self.response.status if self.response else None,
            "frames_by_opcode": dict(self.frames),
            "types": dict(self.types),
            "messages": self.messages,
            "client_messages": s.client_messages,
            "server_messages": s.server_messages,
            "streams": streams,
            "state": s.state,
            "error_close": s.error_close,
            "close_codes": self.close_codes,
            "expecting": s.expects().text,
            "violations": self.violations,
            "violation_list": self.violation_list,
            "capture_notes": self.capture_notes,
            "closed": self.closed,
        }
