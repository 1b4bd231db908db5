"""Per-connection summary values the dissector fills in, one small object per connection.

``ConnectionSummary`` holds a connection's counts and notes, with a
``StreamSummary`` per stream and a ``TxnSummary`` per two-phase-commit round;
``as_dict`` gives the JSON-ready form ``summaries()`` reports.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class StreamSummary:
    stream_id: int
    name: str = ""
    messages: int = 0
    payload_bytes: int = 0
    first_id: int | None = None
    last_id: int | None = None
    next_expected: int | None = None
    gaps: int = 0
    missing_ids: int = 0
    replays: int = 0
    eos: int = 0
    notifies: int = 0
    notify_failures: int = 0
    checkpoints: int = 0
    last_acked: int | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "next_expected"}


@dataclass
class TxnSummary:
    txn_id: str
    where: list = field(default_factory=list)
    phase1_packet: int | None = None
    vote: bool | None = None
    decision: bool | None = None
    phase2_packet: int | None = None


@dataclass
class ConnectionSummary:
    conn_index: int
    connection: str
    use: str = "unknown"
    hello: dict | None = None
    midstream: bool = False
    first_packet: int = 0
    last_packet: int = 0
    first_ts: float = 0.0
    last_ts: float = 0.0
    frames: int = 0
    frames_by_type: Counter = field(default_factory=Counter)
    bytes_by_direction: Counter = field(default_factory=Counter)
    streams: dict[int, StreamSummary] = field(default_factory=dict)
    credits_granted: int = 0
    credits_spent: int = 0
    credits_left: int | None = None
    restarts: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    list_uncommitted: int = 0
    txns: dict[str, TxnSummary] = field(default_factory=dict)
    violations: int = 0
    violation_list: list = field(default_factory=list)
    malformed: int = 0
    ignored: int = 0
    capture_notes: list = field(default_factory=list)
    tcp: dict = field(default_factory=dict)
    closed: str = ""

    def stream(self, stream_id: int) -> StreamSummary:
        s = self.streams.get(stream_id)
        if s is None:
            s = self.streams[stream_id] = StreamSummary(stream_id)
        return s

    def as_dict(self) -> dict:
        rounds = [
            {
                "txn_id": t.txn_id,
                "where": t.where,
                "phase1_packet": t.phase1_packet,
                "vote": None if t.vote is None else ("commit" if t.vote else "abort"),
                "decision": None if t.decision is None else ("commit" if t.decision else "abort"),
                "phase2_packet": t.phase2_packet,
            }
            for t in self.txns.values()
        ]
        return {
            "conn_index": self.conn_index,
            "connection": self.connection,
            "protocol": "wallaroo",
            "use": self.use,
            "hello": self.hello,
            "midstream": self.midstream,
            "first_packet": self.first_packet,
            "last_packet": self.last_packet,
            "duration": round(self.last_ts - self.first_ts, 6),
            "frames": self.frames,
            "frames_by_type": dict(self.frames_by_type),
            "bytes_by_direction": dict(self.bytes_by_direction),
            "streams": [s.as_dict() for _, s in sorted(self.streams.items())],
            "credits_granted": self.credits_granted,
            "credits_spent": self.credits_spent,
            "credits_left": self.credits_left,
            "checkpoints_acknowledged": sum(s.checkpoints for s in self.streams.values()),
            "restarts": self.restarts,
            "errors": self.errors,
            "list_uncommitted": self.list_uncommitted,
            "twopc_rounds": rounds,
            "violations": self.violations,
            "violation_list": self.violation_list,
            "malformed": self.malformed,
            "ignored": self.ignored,
            "capture_notes": self.capture_notes,
            "tcp": self.tcp,
            "closed": self.closed,
        }


__all__ = ["ConnectionSummary", "StreamSummary", "TxnSummary"]
