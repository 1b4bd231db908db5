"""Replay for Couchbase DCP: a recorded packet follows the live peer's values.

The adapter keeps two ``core.Connection`` views of the conversation, the one the dissector
judges with: ``recorded`` fed with the recording's packets of both sides (when playing the
consumer), and ``live`` with the live peer's packets and the adapted packets sent. What the two
views hold apart is what the replay adapts, each packet re-encoded with the codec. The bulk,
the producer's items and snapshot markers, is only counted (their size, for flow control):

Playing the consumer (``--play client`` against a producer):

* the recorded NOOP replies are not sent: each live NOOP is answered with its opaque as it comes
  (``owed``), since when and how often a producer sends NOOPs is its timer's, not the
  conversation's (NOOPs are neither expected nor compared: ``units``);
* a STREAM_REQ names the live node's vbucket uuid: that of the live failover entry beginning
  at the same seqno as the recorded uuid's entry in the recorded log (the live log learnt from
  its STREAM_REQ and GET_FAILOVER_LOG answers; before any, the adapter asks the live node with
  a DCP_GET_FAILOVER_LOG of its own, whose answer is not compared); after a ROLLBACK the
  request resumes from no later than the live rollback seqno;
* a BUFFER_ACK acknowledges the live counterparts of the stream messages the recorded one
  acknowledged (the n-th live for the n-th recorded), never more than the live producer sent,
  and goes without waiting for the recorded messages once the live window is full;
* SCRAM is redone, not replayed: a new client-first (the recorded user, a fresh nonce of the
  recorded one's length), the proof for the live server's nonce and salt, with the password
  from ``WALLAROO_PROTO_DCP_PASSWORD`` (PLAIN, which has no nonce, goes as recorded).

Playing the producer (``--play server`` to a consumer):

* an answer echoes the opaque of the live request it answers (the n-th recorded request of
  a kind, per vbucket or control key, is the live n-th), and a stream's messages carry the
  opaque of the live STREAM_REQ that opened it; a request is forgotten once answered (a
  stream's once it ended), and a BUFFER_ACK, which has no answer, is never kept, so a long
  conversation holds only what is still open;
* a stream message waits while the live consumer's flow-control buffer is full (``Hold``),
  and the items at or below the seqno the live consumer resumes from are not sent;
* a bucket config (GET_CLUSTER_CONFIG's answer, NOT_MY_VBUCKET's body) names the port the
  live client connected to where the recording's named the recorded node's, so the client
  finds its vbuckets on this node;
* SCRAM answers are computed for the live client's nonce and proof (``sasl.ScramServer``),
  with the account from ``WALLAROO_PROTO_DCP_USERNAME`` / ``WALLAROO_PROTO_DCP_PASSWORD``
  (default: the mocks' ``Administrator`` / ``password``); a wrong proof is answered
  AUTH_ERROR, as a node would.

Either way, the random connection id a client puts in its HELLO and DCP_OPEN names
(java-dcp-client's ``"i":"..."``) is masked in both records before they are compared.
"""

from __future__ import annotations

import base64
import bisect
import json
import os
import re
import secrets
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from wallaroo_proto.replay.adapter import SKIP, Ask, Hold
from wallaroo_proto.replay.adapter import Adapter as PlainAdapter

from . import codec, sasl
from .codec import Packet, ProtocolError, StreamReq, decode_packet
from .core import CONSUMER, PRODUCER, Connection

#: The account SCRAM is redone with, when the environment names none (the mocks' defaults).
DEFAULT_USERNAME, DEFAULT_PASSWORD = "Administrator", "password"
#: Opaques of the adapter's own questions (DCP_GET_FAILOVER_LOG): far from a client's counter.
_OWN_OPAQUE = 0xD0C0_0000
_VBUCKET_REQUESTS = frozenset((codec.STREAM_REQ, codec.CLOSE_STREAM, codec.GET_FAILOVER_LOG))
#: A consumer's requests a producer never answers: nothing to pair or keep.
_UNANSWERED = frozenset((codec.BUFFER_ACK,))
_ITEMS = frozenset((codec.MUTATION, codec.DELETION, codec.EXPIRATION, codec.SEQNO_ADVANCED))
#: The producer's stream messages a replay only counts the bytes of (the bulk of a conversation).
_COUNTED = _ITEMS | {codec.SNAPSHOT_MARKER}


def _counted(raw: bytes) -> bool:
    """Is ``raw`` a stream message whose header is all the adapter reads of it (its size)?"""
    return len(raw) >= codec.HEADER_SIZE and raw[0] in (codec.REQ, codec.ALT_REQ) and raw[1] in _COUNTED


@dataclass
class _Flow:
    """One run's stream messages not yet acknowledged, as the cumulative byte count each ends at."""

    ends: list[int] = field(default_factory=list)
    base: int = 0  # where the first of ``ends`` begins
    total: int = 0
    acked: int = 0

    def add(self, size: int) -> None:
        self.total += size
        self.ends.append(self.total)

    def take(self, acked: int) -> None:
        """Bytes up to ``acked`` were acknowledged: the messages they hold whole are done."""
        whole = bisect.bisect_right(self.ends, acked)
        if whole:
            self.base = self.ends[whole - 1]
            del self.ends[:whole]
        self.acked = acked


#: A client's random connection id in its HELLO agent name and DCP_OPEN name (java-dcp-client's).
_CONNECTION_ID = re.compile(r'"i":"[^"]*"')
_NAMED = frozenset(("HELLO", "DCP_OPEN"))


def _masked(record: dict) -> dict:
    """The record with a client's random connection id in its name masked (changed in place)."""
    key = record.get("dcp_key")
    if record.get("type") in _NAMED and key:
        record["dcp_key"] = _CONNECTION_ID.sub('"i":"..."', key)
    return record


def _moved(node: Any, recorded_port: int, live_port: int) -> Any:
    """A bucket config's JSON with the recorded node's KV port changed to the live one."""
    if isinstance(node, dict):
        return {
            k: live_port
            if k in ("kv", "direct") and v == recorded_port
            else _moved(v, recorded_port, live_port)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_moved(v, recorded_port, live_port) for v in node]
    if isinstance(node, str) and node.endswith(f":{recorded_port}"):
        return f"{node[: -len(str(recorded_port))]}{live_port}"
    return node


def bucket_config_for(value: bytes, recorded_port: int, live_port: int) -> bytes:
    """A recorded bucket config naming ``live_port`` for the node at ``recorded_port`` (the value as
    it is when it is no JSON config)."""
    try:
        config = json.loads(value)
    except ValueError:
        return value
    if not isinstance(config, dict) or "nodeLocator" not in config:
        return value
    return json.dumps(_moved(config, recorded_port, live_port), separators=(",", ":")).encode()


def _scram_like(client_first: bytes, username: str, password: str, mechanism: str) -> sasl.ScramClient:
    """A new SCRAM exchange like the recorded one: its user (unless the environment names one) and
    a fresh nonce of the recorded nonce's length (the server's answers echo it: same lengths)."""
    recorded = dict(
        part.split("=", 1) for part in client_first.decode("utf-8", "replace").split(",")[2:] if "=" in part
    )
    if "WALLAROO_PROTO_DCP_USERNAME" not in os.environ and recorded.get("n"):
        username = recorded["n"].replace("=2C", ",").replace("=3D", "=")
    size = len(recorded.get("r", "")) or 24
    nonce = base64.b64encode(secrets.token_bytes(size)).decode()[:size]
    return sasl.ScramClient(username, password, mechanism, nonce)


def credentials() -> tuple[str, str]:
    """The account a SCRAM login is redone with: the environment's, else the mocks'."""
    return (
        os.environ.get("WALLAROO_PROTO_DCP_USERNAME", DEFAULT_USERNAME),
        os.environ.get("WALLAROO_PROTO_DCP_PASSWORD", DEFAULT_PASSWORD),
    )


def _packet(raw: bytes) -> Packet | None:
    try:
        return decode_packet(raw)
    except ProtocolError:
        return None


def _slot(p: Packet) -> tuple:
    """What makes a consumer request the n-th of its kind: its opcode and vbucket or control key."""
    if p.opcode in _VBUCKET_REQUESTS:
        return (p.opcode, p.vbucket)
    if p.opcode == codec.CONTROL:
        return (p.opcode, p.key)
    return (p.opcode,)


class Adapter(PlainAdapter):
    #: ``opaque``: picked by whichever side sends a request (a consumer's counter, the producer's
    #: NOOP counter); the core checks that each answer echoes its request's, so the value itself
    #: says nothing. ``vb_uuid``: a node draws a random uuid per vbucket when it takes it over.
    #: ``outstanding``: the unacknowledged bytes after a packet depend on when the consumer's
    #: acknowledgements arrive between the producer's messages. ``ack_bytes``: a consumer
    #: acknowledges what its reads have taken when they cross a mark, and reads follow the
    #: TCP segmentation, which differs from run to run. ``dcp_event``: the judge's note on what a
    #: packet did, made of fields compared anyway (seqnos, snapshot ranges, status, end reason),
    #: but for "buffer full", which marks where the unacknowledged bytes reached the window and so
    #: when the acknowledgements arrived.
    NOISE: ClassVar[frozenset[str]] = frozenset(
        {"opaque", "vb_uuid", "outstanding", "ack_bytes", "dcp_event"}
    )

    def __init__(self, side: str) -> None:
        super().__init__(side)
        self.recorded = Connection()
        self.live = Connection()
        self.peer = PRODUCER if side == CONSUMER else CONSUMER
        self.username, self.password = credentials()
        self._fed = -1  # the last recorded frame of ours fed to ``recorded``
        # playing the consumer
        self.scram: sasl.ScramClient | None = None
        self.server_first: bytes | None = None
        self.live_noops: deque[int] = deque()  # opaques of live NOOPs not yet answered
        self.noop_record: dict | None = None  # the live record of the last (where to answer)
        self.asked: dict[int, int] = {}  # vbucket -> opaque of our own GET_FAILOVER_LOG
        self.own_answers: set[int] = set()  # opaques of our questions still unanswered
        self.recorded_flow, self.live_flow = _Flow(), _Flow()
        # playing the producer
        self.recorded_slots: dict[tuple, deque[int]] = {}
        self.live_slots: dict[tuple, deque[int]] = {}
        self.request_opaques: dict[int, Packet] = {}  # recorded opaque -> the recorded request
        self.opaques: dict[int, int] = {}  # recorded request opaque -> the live one
        self.live_requests: dict[int, Packet] = {}  # live opaque -> the live request
        self.live_starts: dict[int, int] = {}  # live stream opaque -> the seqno it resumes from
        self.scram_server: sasl.ScramServer | None = None
        self.account = sasl.Account(self.username, self.password)
        #: The producer's port in the recording and live (a bucket config names it).
        self.recorded_port: int | None = None
        self.live_port: int | None = None

    # ------------------------------------------------------------------ what the peer sent

    def incoming(self, record: dict, raw: bytes) -> bool:
        """A live packet of the peer: fed to the live view; True for an answer to the adapter's own
        question (not the recording's, so not compared)."""
        if self.side == CONSUMER and _counted(raw):
            if self.live.buffer_size:  # counted only under flow control: the acks bound what is kept
                self.live_flow.add(len(raw))
                self.live.count_sent(len(raw))
            return False
        _masked(record)
        self.live_port = record.get("responder_port", self.live_port)
        p = _packet(raw)
        if p is None:
            return False
        self.live.feed(self.peer, p)
        if self.side == CONSUMER:
            if p.is_request and p.opcode in codec.STREAM_MESSAGES and self.live.buffer_size:
                self.live_flow.add(p.size)
            if p.is_request and p.opcode == codec.NOOP:
                self.live_noops.append(p.opaque)
                self.noop_record = record
            elif not p.is_request and p.opcode == codec.SASL_AUTH and p.status == codec.AUTH_CONTINUE:
                self.server_first = p.value
            elif not p.is_request and p.opaque in self.own_answers:
                self.own_answers.discard(p.opaque)
                return True
            return False
        if p.is_request and p.opcode not in _UNANSWERED:
            slot = _slot(p)
            self.live_slots.setdefault(slot, deque()).append(p.opaque)
            self.live_requests[p.opaque] = p
            self._pair(slot)
        return False

    def expected(self, frame: Any) -> dict:
        """The recorded packet of the peer, as the recorded view sees it (the fields compared are the
        record's; the noise covers what the live peer picks)."""
        if self.side == CONSUMER and _counted(frame.raw):
            if self.recorded.buffer_size:
                self.recorded_flow.add(len(frame.raw))
            return frame.record
        p = _packet(frame.raw)
        if p is not None and self.side == CONSUMER:
            self.recorded.feed(self.peer, p)
            if p.is_request and p.opcode in codec.STREAM_MESSAGES and self.recorded.buffer_size:
                self.recorded_flow.add(p.size)
        elif p is not None and p.is_request and p.opcode not in _UNANSWERED:
            slot = _slot(p)  # the recorded consumer's request: its place among its kind
            self.recorded_slots.setdefault(slot, deque()).append(p.opaque)
            self.request_opaques[p.opaque] = p
            self._pair(slot)
        self.recorded_port = frame.record.get("responder_port", self.recorded_port)
        return _masked(dict(frame.record))

    def _pair(self, slot: tuple) -> None:
        recorded, live = self.recorded_slots.get(slot), self.live_slots.get(slot)
        while recorded and live:
            self.opaques[recorded.popleft()] = live.popleft()

    # ------------------------------------------------------------------ what we send

    def outgoing(self, frame: Any) -> bytes | Hold | Ask:
        p = _packet(frame.raw)
        if p is None:
            return frame.raw  # the recording's own bad bytes go as recorded: the judge names them
        if self.side == CONSUMER and frame.index > self._fed:
            self._fed = frame.index
            self.recorded.feed(self.side, p)
        out = self._consumer(p) if self.side == CONSUMER else self._producer(p)
        if not isinstance(out, Packet):
            return out
        if out.is_request and out.opcode in _COUNTED:
            self.live.count_sent(out.size)
        else:
            self.live.feed(self.side, out)
        return codec.encode(out)

    def _consumer(self, p: Packet) -> Packet | Hold | Ask | bytes:
        op = p.opcode
        if not p.is_request:
            return SKIP if op == codec.NOOP else p  # a live NOOP is answered as it comes (``owed``)
        if op == codec.SASL_AUTH and p.key.startswith(b"SCRAM-"):
            mechanism = p.key.decode("ascii", "replace")
            self.scram = _scram_like(p.value, self.username, self.password, mechanism)
            self.server_first = None
            return replace(p, value=self.scram.first())
        if op == codec.SASL_STEP and self.scram is not None:
            if self.server_first is None:
                return Hold("the live server's SCRAM nonce (its AUTH_CONTINUE) has not come")
            try:
                return replace(p, value=self.scram.final(self.server_first))
            except sasl.AuthFailed as err:
                return Hold(f"the live server's SCRAM answer cannot be used: {err}")
        if op == codec.STREAM_REQ:
            return self._stream_req(p)
        if op == codec.BUFFER_ACK:
            return self._buffer_ack(p)
        return p

    def _stream_req(self, p: Packet) -> Packet | Ask:
        req: StreamReq = codec.parse(p)
        vb = p.vbucket
        if req.vbucket_uuid:
            live_log = self.live.failover_logs.get(vb)
            if not live_log:
                if vb not in self.asked:
                    self.asked[vb] = opaque = _OWN_OPAQUE + len(self.asked)
                    self.own_answers.add(opaque)
                    ask = codec.request(codec.GET_FAILOVER_LOG, vbucket=vb, opaque=opaque)
                    self.live.feed(CONSUMER, decode_packet(ask))
                    return Ask(ask, f"the live node's failover log of vbucket {vb}")
                if self.asked[vb] in self.own_answers:
                    return Hold(f"the live node's failover log of vbucket {vb} has not come")
            else:
                req = replace(req, vbucket_uuid=self._live_uuid(vb, req.vbucket_uuid, live_log))
        rolled = self._live_rollback(vb)
        if rolled is not None and req.start > rolled:
            req = replace(req, start=rolled, snap_start=min(req.snap_start, rolled), snap_end=rolled)
        return replace(p, extras=decode_packet(codec.stream_req_request(vb, p.opaque, req)).extras)

    def _live_uuid(self, vb: int, uuid: int, live_log: list[tuple[int, int]]) -> int:
        """The live node's uuid for the history the recorded ``uuid`` named: the live failover entry
        that begins at the same seqno as the recorded one (an entry is a branch of history from
        its seqno on), else the one as many entries from the oldest; the newest when the
        recording never showed the log ``uuid`` came from."""
        recorded_log = self.recorded.failover_logs.get(vb) or []
        place = next((i for i, (u, _) in enumerate(recorded_log) if u == uuid), None)
        if place is None:
            return live_log[0][0]
        seqno = recorded_log[place][1]
        same = next((u for u, s in live_log if s == seqno), None)
        if same is not None:
            return same
        from_oldest = len(recorded_log) - 1 - place
        return live_log[max(0, len(live_log) - 1 - from_oldest)][0]

    def _live_rollback(self, vb: int) -> int | None:
        """The live ROLLBACK's seqno for ``vb`` when it differs from the recorded one at that point."""
        live = [s for v, s in self.live.rollbacks if v == vb]
        recorded = [s for v, s in self.recorded.rollbacks if v == vb]
        if live and (len(live) != len(recorded) or live[-1] != recorded[-1]):
            return live[-1]
        return None

    def waits(self, frame: Any) -> bool:
        """A consumer's BUFFER_ACK waits for the stream messages recorded before it only while the
        live producer may send them: not once the live window is full."""
        return not (
            self.side == CONSUMER
            and frame.record.get("type") == "DCP_BUFFER_ACKNOWLEDGEMENT"
            and self._window_full()
        )

    def _window_full(self) -> bool:
        return bool(self.live.buffer_size) and self.live.outstanding >= self.live.buffer_size

    def _buffer_ack(self, p: Packet) -> Packet | bytes:
        """Acknowledge the live counterparts of the stream messages the recording acknowledged (the
        n-th live for the n-th recorded), or all the live producer sent when fewer came or its
        window is full (it sends no more until acknowledged); never more than it sent, and
        nothing when it sent nothing new."""
        recorded, live = self.recorded_flow, self.live_flow
        target = recorded.acked + codec.parse(p).nbytes
        whole = bisect.bisect_right(recorded.ends, target)
        past = target - (recorded.ends[whole - 1] if whole else recorded.base)
        if len(live.ends) >= whole:
            live_target = min((live.ends[whole - 1] if whole else live.base) + past, live.total)
        else:
            live_target = live.total
        if self._window_full() and live_target <= live.acked:
            live_target = live.total
        recorded.take(target)
        if live_target <= live.acked:
            return SKIP
        acked = live_target - live.acked
        live.take(live_target)
        return replace(p, extras=decode_packet(codec.buffer_ack(acked)).extras)

    def owed(self) -> tuple[dict, bytes] | None:
        """The reply to a live NOOP (consumer played), else None: a node closes a connection that
        leaves its NOOP unanswered for about two intervals, whatever the recording did then."""
        if not self.live_noops or self.noop_record is None:
            return None
        reply = decode_packet(codec.response(codec.NOOP, opaque=self.live_noops.popleft()))
        self.live.feed(self.side, reply)
        return self.noop_record, codec.encode(reply)

    def _producer(self, p: Packet) -> Packet | Hold | bytes:
        opaque = p.opaque
        asked = self.request_opaques.get(opaque)
        if asked is None:
            return self._answer(p)
        live = self.opaques.get(opaque)
        if live is None:
            return Hold(f"the live consumer has not sent the request opaque 0x{opaque:08x} stands for")
        out = self._answer(replace(p, opaque=live))
        if isinstance(out, Hold):
            return out
        if self._done(asked, p):
            self._forget(opaque)
        if asked.opcode == codec.CLOSE_STREAM and not p.is_request:
            self._stream_closed(asked.vbucket)
        return out

    def _forget(self, opaque: int) -> None:
        """Recorded request ``opaque`` is over: nothing will name it again."""
        del self.request_opaques[opaque]
        live = self.opaques.pop(opaque)
        self.live_requests.pop(live, None)
        self.live_starts.pop(live, None)

    def _done(self, asked: Packet, p: Packet) -> bool:
        """Is recorded request ``asked`` over once ``p`` is sent: answered, or its stream ended
        (or refused, or closed by the consumer with no STREAM_END to follow)?"""
        if asked.opcode != codec.STREAM_REQ:
            return not p.is_request
        if p.opcode == codec.STREAM_END:
            return True
        return p.opcode == codec.STREAM_REQ and not p.is_request and p.status != codec.SUCCESS

    def _stream_closed(self, vb: int) -> None:
        """The consumer closed ``vb``'s stream: forget its STREAM_REQ unless a STREAM_END follows."""
        if self.live.controls.get("send_stream_end_on_client_close_stream") == "true":
            return
        for opaque, asked in list(self.request_opaques.items()):
            if asked.opcode == codec.STREAM_REQ and asked.vbucket == vb and opaque in self.opaques:
                self._forget(opaque)

    def _answer(self, p: Packet) -> Packet | Hold | bytes:
        if p.is_request and p.opcode in codec.STREAM_MESSAGES:
            return self._stream_message(p)
        if not p.is_request and p.opcode in (codec.SASL_AUTH, codec.SASL_STEP):
            return self._sasl_answer(p)
        moved = self.recorded_port and self.live_port and self.recorded_port != self.live_port
        if moved and not p.is_request and p.value and p.datatype & codec.DATATYPE_JSON:
            return replace(p, value=bucket_config_for(p.value, self.recorded_port, self.live_port))
        return p

    def _stream_message(self, p: Packet) -> Packet | Hold | bytes:
        start = self.live_starts.get(p.opaque)
        if start is None:
            live_req = self.live_requests.get(p.opaque)
            is_stream = live_req is not None and live_req.opcode == codec.STREAM_REQ
            start = self.live_starts[p.opaque] = codec.parse(live_req).start if is_stream else 0
        if start:
            msg = codec.parse(p)
            if p.opcode in _ITEMS and msg.seqno <= start:
                return SKIP  # the live consumer holds it already
            if p.opcode == codec.SNAPSHOT_MARKER and msg.end <= start:
                return SKIP
        if not self.live.may_send():
            return Hold(
                f"the live consumer's flow-control buffer is full: {self.live.outstanding} of "
                f"{self.live.buffer_size} bytes unacknowledged"
            )
        return p

    def _sasl_answer(self, p: Packet) -> Packet | Hold:
        """SCRAM answered for the live client's messages (PLAIN checked against the account)."""
        asked = self.live_requests.get(p.opaque)
        if asked is None:
            return p
        mechanism = asked.key.decode("ascii", "replace")
        try:
            if p.opcode == codec.SASL_AUTH and mechanism == "PLAIN":
                self.account.plain(asked.value)
                return replace(p, vbucket=codec.SUCCESS, value=b"")
            if p.opcode == codec.SASL_AUTH:
                self.scram_server = sasl.ScramServer(self.account, mechanism)
                value = self.scram_server.first(asked.value)
                return replace(p, vbucket=codec.AUTH_CONTINUE, value=value)
            if self.scram_server is None:
                return p
            return replace(p, vbucket=codec.SUCCESS, value=self.scram_server.final(asked.value))
        except sasl.AuthFailed:
            return replace(p, vbucket=codec.AUTH_ERROR, value=b"")


def units(record: dict) -> list[dict]:
    """A NOOP and its reply are not compared: a producer sends them on its timer, so how many
    come and where among the stream's messages is timing, which no two runs share."""
    return [] if (record.get("type") or "").startswith("DCP_NOOP") else [record]


def match_key(record: dict) -> tuple:
    """An item is itself by its vbucket and seqno, a snapshot marker by its vbucket and start;
    a stream's request, answer and end by the vbucket; a control by its key."""
    kind = record.get("type") or ""
    if record.get("seqno") is not None:
        return (record.get("vbucket"), record["seqno"])
    if kind == "DCP_SNAPSHOT_MARKER":
        return (record.get("vbucket"), record.get("snap_start"))
    if kind.startswith(("DCP_STREAM_REQ", "DCP_STREAM_END", "DCP_CLOSE_STREAM", "DCP_GET_FAILOVER_LOG")):
        return (record.get("vbucket"),)
    if kind == "DCP_CONTROL":
        return (record.get("control_key"),)
    return ()


__all__ = ["Adapter", "match_key", "units"]
