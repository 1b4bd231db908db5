"""Replay for the Wallaroo connector protocol: a recorded frame follows the live peer's values.

The played side keeps its own ``protocol.Connection`` (the core the dissector judges with),
fed with the live peer's frames and with what it sends, so:

* a source connector never sends a frame beyond the credits the live worker granted (it
  waits for the worker's ACK: ``Hold``);
* it resumes each stream from the point of reference the live worker acknowledged, as
  the shipped connector must: a recorded MESSAGE at or below it is not sent (the worker
  would drop it as a replay);
* a played worker grants credits as the live connector spends them (``owed``), not where
  the recording did, and sends the recorded checkpoint ACKs without their credits;
* a connector sink answers the live worker's 2PC transactions: a REPLY names the live
  PHASE1's txn id (the recording's n-th PHASE1 maps to the live n-th), and a
  REPLY_UNCOMMITTED echoes the live LIST_UNCOMMITTED's rtag.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

from wallaroo_proto.replay.adapter import SKIP, Hold
from wallaroo_proto.replay.adapter import Adapter as PlainAdapter

from .codec import decode, encode
from .frames import Ack, Message
from .protocol import Connection, Use
from .twopc import Reply, ReplyUncommitted, decode_twopc, twopc_frame


def _frame(raw: bytes) -> Any:
    return decode(raw[4:])


class Adapter(PlainAdapter):
    #: ``credits``: an ACK tops the connector's credits up to the worker's maximum, so what it
    #: grants depends on how many frames were in flight when it was sent: timing, not behaviour.
    #: (``initial_credits``, the maximum, is compared.)
    NOISE: ClassVar[frozenset[str]] = frozenset({"credits"})

    def __init__(self, side: str) -> None:
        super().__init__(side)
        self.core: Connection | None = None
        self.peer = "worker" if side == "connector" else "connector"
        #: stream id -> the point of reference the live worker acknowledged (NOTIFY_ACK, ACK).
        self.resume_from: dict[int, int] = {}
        self.recorded_txns: list[str] = []
        self.live_txns: list[str] = []
        self.live_rtag: int | None = None
        #: A played worker's OK credits: what ``owed`` tops the connector up to.
        self.max_credits: int | None = None
        #: The last live frame's record: ``owed`` answers on its connection.
        self.last_live: dict | None = None

    def _core(self, record: dict) -> Connection:
        if self.core is None:
            self.core = Connection(use=Use.SINK if record.get("use") == "sink" else Use.SOURCE)
        return self.core

    def incoming(self, record: dict, raw: bytes) -> None:
        if len(raw) < 5:
            return
        try:
            frame = _frame(raw)
        except Exception:  # noqa: BLE001 - a malformed live frame is the judge's to report, not ours
            return
        self._core(record).feed(self.peer, frame)
        self.last_live = record
        kind = record.get("type")
        if kind == "NOTIFY_ACK" and record.get("success"):
            self.resume_from[record["stream_id"]] = record.get("point_of_ref") or 0
        elif kind == "ACK":
            for stream_id, point in getattr(frame, "acks", ()):
                self.resume_from[stream_id] = max(point, self.resume_from.get(stream_id, 0))
        elif record.get("twopc") == "PHASE1":
            self.live_txns.append(record["txn_id"])
        elif record.get("twopc") == "LIST_UNCOMMITTED":
            self.live_rtag = record.get("rtag")

    def expected(self, frame: Any) -> dict:
        if frame.record.get("twopc") == "PHASE1":
            self.recorded_txns.append(frame.record["txn_id"])
        return frame.record

    def outgoing(self, frame: Any) -> bytes | Hold:
        record = frame.record
        core = self._core(record)
        raw = frame.raw
        source = core.use is Use.SOURCE
        if source and self.side == "connector":
            if record.get("type") == "MESSAGE":
                resume = self.resume_from.get(record["stream_id"])
                if resume is not None and record["message_id"] <= resume:
                    return SKIP  # the live worker holds it already
            if core.credits is None and record.get("type") != "HELLO":
                return Hold("no credits yet: the live worker has not answered the HELLO with OK")
            if core.credits is not None and core.credits <= 0:
                return Hold("no credits left: the live worker has not sent an ACK granting more")
        elif source and record.get("type") == "ACK":  # the worker: credits are given by owed()
            ack = _frame(raw)
            if not ack.acks:
                return SKIP
            raw = encode(Ack(0, ack.acks))
        elif source and record.get("type") == "OK":
            self.max_credits = record.get("initial_credits")
        elif not source and self.side == "connector" and record.get("twopc"):
            raw = self._twopc(record, raw)
        if source and record.get("type") == "MESSAGE" and record.get("verdict") == "accepted":
            # what the core reads of a source's MESSAGE (its stream and id, a credit), without
            # decoding the bytes again: most of a replay's frames
            core.feed(self.side, Message(record["stream_id"], record["message_id"], 0, b"", b""))
            return raw
        with contextlib.suppress(Exception):  # the recording's own bad bytes go out as recorded
            core.feed(self.side, _frame(raw))
        return raw

    def owed(self) -> tuple[dict, bytes] | None:
        """A played worker tops the live connector's credits back up to its OK's once half are
        spent: when the recorded worker refilled depends on how the recorded connector's frames
        came, which the live one need not repeat (two streams interleave as its threads run)."""
        core = self.core
        if core is None or self.side != "worker" or core.use is not Use.SOURCE or not self.max_credits:
            return None
        if core.credits is None or core.credits > self.max_credits // 2 or self.last_live is None:
            return None
        ack = Ack(self.max_credits - core.credits, ())
        core.feed("worker", ack)
        return self.last_live, encode(ack)

    def _twopc(self, record: dict, raw: bytes) -> bytes:
        """A sink's 2PC answer, named as the live worker named what it answers."""
        message = _frame(raw)
        if not isinstance(message, Message):
            return raw
        answer = decode_twopc(message.payload)
        if isinstance(answer, Reply) and answer.txn_id in self.recorded_txns:
            nth = self.recorded_txns.index(answer.txn_id)
            if nth < len(self.live_txns) and self.live_txns[nth] != answer.txn_id:
                return encode(twopc_frame(answer._replace(txn_id=self.live_txns[nth])))
        elif (
            isinstance(answer, ReplyUncommitted)
            and self.live_rtag is not None
            and answer.rtag != self.live_rtag
        ):
            return encode(twopc_frame(answer._replace(rtag=self.live_rtag)))
        return raw


def units(record: dict) -> list[dict]:
    """An ACK is compared by its points of reference, one each: its credits only top up (the
    worker sends a refill ACK when the connector's credits fall to its threshold as it reads),
    and whether two streams' points come in one ACK or two is how the worker batched its reads."""
    if record.get("type") != "ACK":
        return [record]
    return [
        {**record, "acks": None, "stream_id": ack["stream_id"], "point_of_ref": ack["point_of_ref"]}
        for ack in record.get("acks") or ()
    ]


def match_key(record: dict) -> tuple:
    """A MESSAGE is itself by its stream and id (and a 2PC message by its txn); NOTIFY and its
    ACK by the stream."""
    kind = record.get("type")
    if kind == "MESSAGE":
        return (record.get("stream_id"), record.get("message_id"), record.get("twopc"), record.get("txn_id"))
    if kind in ("NOTIFY", "NOTIFY_ACK", "EOS_MESSAGE", "ACK"):
        return (record.get("stream_id"),)
    return ()


__all__ = ["Adapter", "match_key", "units"]
