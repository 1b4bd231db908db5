"""A capture report's content, built from the dissector's records with bounded memory.

``ReportBuilder.feed(record)`` takes the records of one or more captures in the
order the dissector (or Spark, per connection in ``frame_index`` order) gives
them; every protocol works alike, because only the common record fields are
read here, and a plug-in's ``report_signals`` adds its own signals. Per
connection it keeps totals, throughput in at most ``MAX_BINS`` time bins, the
first and last ``ReportLimits.ladder_frames // 2`` frames for the ladder
diagram (and, between them, a few frames around each of its first findings, so
that every listed finding can be drawn), and its findings (``wallaroo_proto.findings``:
violations, capture notes and the plug-in's own) up to a limit per severity; connections past
``ReportLimits.connections`` get totals only. The content travels as JSON
(``to_dict``/``from_dict``), so Spark executors can build it and the driver draw it.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from wallaroo_proto import findings
from wallaroo_proto.protocols import get_plugin

from .signals import Signals

MAX_BINS = 600
#: The first bin width: 10 µs, doubled whenever the connection outgrows MAX_BINS bins.
FIRST_BIN_S = 0.00001
#: Frames kept before and after a finding outside the ladder's first and last halves.
CONTEXT = 3


@dataclass(frozen=True)
class ReportLimits:
    """How much a report keeps: the bounds that keep a huge capture's report small."""

    #: Frames kept per connection for the ladder (first half and last half of the connection).
    ladder_frames: int = 1000
    #: Frames shown first: the first and the last this many.
    shown_frames: int = 20
    #: Connections with a ladder diagram and charts; the rest get a summary row.
    connections: int = 20
    #: Findings listed per connection and severity (all are counted); also the frames kept around
    #: findings in the middle of a connection.
    listed: int = 200
    #: Rows of the report's findings table, over all connections.
    findings: int = 100


class Throughput:
    """Frames and bytes per direction in time bins that widen as the connection lasts."""

    def __init__(self, start: float, width: float = FIRST_BIN_S) -> None:
        self.start = start
        self.width = width
        self.bins: dict[int, list[int]] = {}  # bin -> [frames >, bytes >, frames <, bytes <]

    def add(self, ts: float, outbound: bool, length: int) -> None:
        index = int((ts - self.start) / self.width) if ts > self.start else 0
        while index >= MAX_BINS:
            self._widen()
            index //= 2
        cell = self.bins.get(index)
        if cell is None:
            cell = self.bins[index] = [0, 0, 0, 0]
        at = 0 if outbound else 2
        cell[at] += 1
        cell[at + 1] += length

    def coarsened(self, at_most: int) -> Throughput:
        """The same counts in at most ``at_most`` bins (widths doubled): a short connection's chart."""
        made = Throughput(self.start, self.width)
        made.bins = dict(self.bins)
        while made.bins and max(made.bins) >= at_most:
            made._widen()
        return made

    def _widen(self) -> None:
        merged: dict[int, list[int]] = {}
        for index, cell in self.bins.items():
            into = merged.setdefault(index // 2, [0, 0, 0, 0])
            for i in range(4):
                into[i] += cell[i]
        self.bins = merged
        self.width *= 2

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "width": self.width, "bins": sorted(self.bins.items())}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Throughput:
        made = cls(data["start"], data["width"])
        made.bins = {int(i): list(c) for i, c in data["bins"]}
        return made


@dataclass
class ConnectionReport:
    """One connection: identity, totals, and (when detailed) its ladder frames, throughput and signals."""

    capture: str
    conn_index: int
    connection: str
    protocol: str
    detailed: bool
    #: Lane titles: [initiator, responder], e.g. "connector 127.0.0.1:51000".
    lanes: list[str] = field(default_factory=lambda: ["initiator", "responder"])
    first_ts: float | None = None
    last_ts: float | None = None
    frames: int = 0
    frames_out: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    violations: int = 0
    notes: int = 0
    types_out: dict[str, int] = field(default_factory=dict)
    types_in: dict[str, int] = field(default_factory=dict)
    #: Ladder frames: [frame_index, ts, outbound, label, fields, packet, bad, violations, notes,
    #: finding (the plug-in's [severity, text] or None), seq (the frame's place among those fed)].
    head: list[list] = field(default_factory=list)
    #: Frames between head and tail kept around findings, so that their links find them.
    middle: list[list] = field(default_factory=list)
    tail: list[list] = field(default_factory=list)
    #: Listed findings, in frame order: [frame_index, packet, ts, type, severity, text].
    finding_list: list[list] = field(default_factory=list)
    #: Findings per severity, all counted.
    finding_counts: dict[str, int] = field(default_factory=dict)
    #: The frame_index of the first finding: the ladder opens there.
    first_finding: int | None = None
    throughput: dict[str, Any] | None = None
    signals: dict[str, Any] | None = None

    @property
    def ladder_sampled(self) -> bool:
        return self.frames > len(self.head) + len(self.middle) + len(self.tail)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConnectionReport:
        return cls(**data)

    def signal_values(self) -> Signals | None:
        return Signals.from_dict(self.signals) if self.signals else None


def _label(record: dict) -> str:
    return record.get("twopc") or record.get("type") or "?"


class ConnectionBuilder:
    """Reads one connection's records into its ``ConnectionReport``."""

    def __init__(self, record: dict, detailed: bool, limits: ReportLimits) -> None:
        protocol = record.get("protocol") or "wallaroo"
        self.limits = limits
        self.report = ConnectionReport(
            capture=record.get("capture") or "",
            conn_index=int(record.get("conn_index") or 0),
            connection=record.get("connection") or "",
            protocol=protocol,
            detailed=detailed,
            lanes=[
                f"{record.get('initiator_addr')}:{record.get('initiator_port')}",
                f"{record.get('responder_addr')}:{record.get('responder_port')}",
            ],
        )
        self.plugin = get_plugin(protocol)
        self.named = [False, False]
        self.types_out: Counter = Counter()
        self.types_in: Counter = Counter()
        half = max(limits.ladder_frames // 2, 1)
        self.tail: deque = deque(maxlen=half)
        self.half = half
        self.middle: dict[int, tuple] = {}  # seq -> the frame's arguments to _frame
        self.after = 0  # frames still to keep after the last finding in the middle
        self.throughput: Throughput | None = None
        make = self.plugin.report_signals
        self.signals = make() if detailed and make is not None else None

    def feed(self, r: dict) -> None:
        rep = self.report
        ts = float(r.get("ts") or 0.0)
        outbound = r.get("direction") != "responder>initiator"
        side = 0 if outbound else 1
        if not self.named[side] and r.get("sender"):
            rep.lanes[side] = f"{r['sender']} {rep.lanes[side]}"
            self.named[side] = True
        if rep.first_ts is None:
            rep.first_ts = ts
        rep.last_ts = ts
        length = int(r.get("length") or 0)
        label = _label(r)
        index = r.get("frame_index")
        index = rep.frames if index is None else int(index)
        rep.frames += 1
        if outbound:
            rep.frames_out += 1
            rep.bytes_out += length
            self.types_out[label] += 1
        else:
            rep.bytes_in += length
            self.types_in[label] += 1
        rep.violations += bool(r.get("violations"))
        rep.notes += bool(r.get("notes"))
        found = findings.has_findings(r)
        if found:
            self._list_findings(r, index, ts, label)
        if not rep.detailed:
            return
        if self.throughput is None:
            self.throughput = Throughput(ts)
        self.throughput.add(ts, outbound, length)
        kept = (r, index, ts, outbound, label, rep.frames - 1)
        if len(rep.head) < self.half:
            rep.head.append(self._frame(*kept))
        else:  # described only if it is still among the last ones at the end
            self._keep_around_findings(kept, found)
            self.tail.append(kept)
        if self.signals is not None:
            self.signals.feed(r)

    def _list_findings(self, r: dict, index: int, ts: float, label: str) -> None:
        rep = self.report
        if rep.first_finding is None:
            rep.first_finding = index
        counts = rep.finding_counts
        for severity, text in findings.of_record(r):
            counts[severity] = counts.get(severity, 0) + 1
            if counts[severity] <= self.limits.listed:
                rep.finding_list.append([index, r.get("packet"), ts, label, severity, text])

    def _keep_around_findings(self, kept: tuple, found: bool) -> None:
        """Keep a finding past the ladder's first half, and CONTEXT frames each side, while
        ``limits.listed`` frames are not yet kept so (the last ones before come from the tail)."""
        if found and len(self.middle) < self.limits.listed:
            for before in islice(reversed(self.tail), CONTEXT):
                self.middle.setdefault(before[-1], before)
            self.middle[kept[-1]] = kept
            self.after = CONTEXT
        elif self.after and len(self.middle) < self.limits.listed + CONTEXT:
            self.middle[kept[-1]] = kept
            self.after -= 1

    def _frame(self, r: dict, index: int, ts: float, outbound: bool, label: str, seq: int) -> list:
        violations = list(r.get("violations") or ())
        bad = bool(violations) or r.get("verdict") in ("violation", "malformed")
        notes = list(r.get("notes") or ())
        finding = None if r.get("finding") is None else [r.get("severity"), r["finding"]]
        fields = self._fields(r)
        return [index, ts, outbound, label, fields, r.get("packet"), bad, violations, notes, finding, seq]

    def _fields(self, r: dict) -> str:
        try:
            text = self.plugin.describe(r)
        except (KeyError, TypeError, ValueError):  # a damaged record: its violation says why
            text = ""
        return text if len(text) <= 160 else text[:159] + "…"

    def finish(self) -> ConnectionReport:
        rep = self.report
        rep.types_out = dict(self.types_out.most_common())
        rep.types_in = dict(self.types_in.most_common())
        rep.tail = [self._frame(*kept) for kept in self.tail]
        first_in_tail = self.tail[0][-1] if self.tail else rep.frames
        rep.middle = [self._frame(*kept) for seq, kept in sorted(self.middle.items()) if seq < first_in_tail]
        if self.throughput is not None:
            rep.throughput = self.throughput.to_dict()
        if self.signals is not None:
            rep.signals = self.signals.finish().to_dict()
        return rep


@dataclass
class CaptureReport:
    """One capture's connections, and the error that stopped its reading, if any."""

    name: str
    connections: list[ConnectionReport] = field(default_factory=list)
    error: str | None = None
    #: The error is only that the file ends mid-packet: what came before is whole.
    cut: bool = False

    @property
    def start(self) -> float | None:
        starts = [c.first_ts for c in self.connections if c.first_ts is not None]
        return min(starts) if starts else None


@dataclass
class Report:
    captures: list[CaptureReport]
    limits: ReportLimits
    title: str = "wallaroo-proto capture report"
    #: Where the figures were made: "dissect" (this process) or "spark" (aggregated on Spark).
    source: str = "dissect"


class ReportBuilder:
    """Feeds records to one builder per connection; the first ``limits.connections`` are detailed."""

    def __init__(self, limits: ReportLimits | None = None) -> None:
        self.limits = limits or ReportLimits()
        self.builders: dict[tuple[str, int], ConnectionBuilder] = {}
        self.detailed = 0

    def feed(self, record: dict, detailed: bool | None = None) -> None:
        key = (record.get("capture") or "", int(record.get("conn_index") or 0))
        builder = self.builders.get(key)
        if builder is None:
            if detailed is None:
                detailed = self.detailed < self.limits.connections
            self.detailed += detailed
            builder = self.builders[key] = ConnectionBuilder(record, detailed, self.limits)
        builder.feed(record)

    def finish(self) -> list[ConnectionReport]:
        reports = [b.finish() for b in self.builders.values()]
        self.builders.clear()
        return sorted(reports, key=lambda c: (c.capture, c.conn_index))


__all__ = [
    "CaptureReport",
    "ConnectionBuilder",
    "ConnectionReport",
    "Report",
    "ReportBuilder",
    "ReportLimits",
    "Throughput",
]
