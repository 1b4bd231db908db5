"""Statistics over dissected frames, as tshark's ``-z io,stat``, ``-z conv,tcp`` and ``-z expert`` give.

Accumulators are fed frame by frame, each a record dict (``add``) or a whole
``FrameBlock`` (``add_block``, which reads the block's shared values and rows
and makes no dict per frame), and give plain data (``result``) for JSON and for
the CLI's tables. Counts are protocol frames and their bytes on the wire (the
record's ``length``), not TCP packets.

Times are relative to an origin: the first frame fed unless ``origin_ns`` is set
first (dissect sets it to the capture's first frame, so a filter does not move
the intervals). Memory is bounded: ``IoStats`` keeps one row per non-empty
interval and refuses (``StatsError`` from ``result``) a span of more than
``MAX_INTERVALS`` intervals, since every interval between the first and the last
frame is a row of the output; ``ConvStats`` keeps one row per connection, as the
dissector keeps one summary per connection.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from functools import cache
from typing import Any

from wallaroo_proto.findings import SEVERITIES, has_findings, of_record

from .frame_block import SHARED, FrameBlock

#: The most rows an io table may have: a day at 1 s, or a week at 10 s, fits; a table longer than
#: that is read by nobody, and a mistyped interval (0.0001 over days) would be gigabytes.
MAX_INTERVALS = 100_000
#: The most distinct findings ``--stats expert`` lists; a capture with more is broken throughout,
#: and the first ones say how.
MAX_FINDINGS = 10_000
#: The record fields a finding lives in.
_FINDING_FIELDS = frozenset({"violations", "notes", "finding"})
_NS = 1_000_000_000


class StatsError(ValueError):
    """A statistic that cannot be given: a bad ``--stats`` value, or an io table too long."""


def parse_spec(value: str) -> tuple[str, float | None]:
    """``io,SECONDS`` -> ("io", seconds), 0 meaning one row for the whole capture; ``conv`` and
    ``expert`` -> (that, None).

    A ``StatsError`` says what is wrong with any other value."""
    kind, _, arg = value.strip().partition(",")
    kind = kind.strip().lower()
    if kind in ("conv", "expert"):
        if arg:
            raise StatsError(f"{value!r}: {kind} takes no argument")
        return kind, None
    if kind == "io":
        if not arg:
            raise StatsError(f"{value!r}: give the interval, io,SECONDS (io,0 for the whole capture)")
        try:
            seconds = float(arg)
        except ValueError:
            raise StatsError(f"{value!r}: {arg!r} is not a number of seconds") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise StatsError(f"{value!r}: the interval must be a finite number of seconds, 0 or more")
        if seconds and round(seconds * _NS) < 1:
            raise StatsError(f"{value!r}: the interval is shorter than a nanosecond")
        return "io", seconds
    raise StatsError(f"{value!r}: give io,SECONDS, conv or expert")


def make(value: str) -> IoStats | ConvStats | ExpertStats:
    """The accumulator a ``--stats`` value asks for (``StatsError`` when it is not one)."""
    kind, seconds = parse_spec(value)
    if kind == "io":
        return IoStats(seconds)
    return ConvStats() if kind == "conv" else ExpertStats()


@cache
def _columns(layout: tuple[tuple[str, str], ...]) -> dict[str, int]:
    """A block layout's non-shared fields and their positions in a row."""
    names = [name for name, kind in layout if kind != SHARED]
    return {name: i for i, name in enumerate(names)}


def _values(block: FrameBlock, name: str) -> list[Any] | tuple[Any, ...]:
    """One field's value for each row of a block (``None`` where a frame lacks it)."""
    if name in block.shared:
        return (block.shared[name],) * len(block.rows)
    i = _columns(block.layout).get(name)
    if i is None:
        return (None,) * len(block.rows)
    return [row[i] for row in block.rows]


def _round_up(x: float) -> float:
    """``x`` rounded up to two significant digits, for a suggestion a person types."""
    scale = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / scale) * scale


class IoStats:
    """Frames and bytes per interval of ``seconds`` (0: one interval, the whole capture)."""

    kind = "io"

    def __init__(self, seconds: float, max_intervals: int = MAX_INTERVALS) -> None:
        self.seconds = seconds
        self.step = round(seconds * _NS)  # ns; 0: one interval
        self.max_intervals = max_intervals
        self.origin_ns: int | None = None
        #: interval number -> [frames, bytes, {type: frames}], only for intervals with frames.
        self._rows: dict[int, list] = {}
        #: The interval numbers the rows run from and to (the origin's, 0, always among them).
        self._low = self._high = 0
        #: The last row used and its interval, [start, end) in ns: most frames fall in it.
        self._current: list = []
        self._start = self._end = 0
        #: The first and last frame's times, for the whole-capture row.
        self._first_ns = self._last_ns = 0

    def _row(self, ts_ns: int) -> list:
        """The row of the interval holding ``ts_ns``, made the current one (the slow path)."""
        if self.origin_ns is None:
            self.origin_ns = ts_ns
        step = self.step
        if not step:
            if not self._rows:
                self._first_ns = self._last_ns = ts_ns
            self._first_ns, self._last_ns = min(self._first_ns, ts_ns), max(self._last_ns, ts_ns)
            return self._rows.setdefault(0, [0, 0, {}])
        index = (ts_ns - self.origin_ns) // step
        row = self._rows.get(index)
        if row is None:
            self._low, self._high = min(self._low, index), max(self._high, index)
            row = [0, 0, {}]
            if self._high - self._low >= self.max_intervals:
                self._rows.clear()  # too long: only the span is kept, for the message
                return row
            self._rows[index] = row
        self._current = row
        self._start = self.origin_ns + index * step
        self._end = self._start + step
        return row

    def add(self, record: dict) -> None:
        ts_ns = record["ts_ns"]
        row = self._current if self._start <= ts_ns < self._end else self._row(ts_ns)
        row[0] += 1
        row[1] += record.get("length") or 0
        types = row[2]
        name = record.get("twopc") or record["type"]  # as the type column shows it
        types[name] = types.get(name, 0) + 1

    def add_block(self, block: FrameBlock) -> None:
        if not block.rows:
            return
        times = _values(block, "ts_ns")
        row = self._current
        if self._start <= min(times) and max(times) < self._end:  # the usual: all in the current interval
            row[0] += len(block.rows)
            row[1] += sum(length or 0 for length in _values(block, "length"))
            types = row[2]
            if "type" in block.shared:
                name = block.shared["type"]
                types[name] = types.get(name, 0) + len(block.rows)
            else:
                for name in _values(block, "type"):
                    types[name] = types.get(name, 0) + 1
            return
        columns = zip(times, _values(block, "length"), _values(block, "type"), strict=True)
        row_of = self._row
        for ts_ns, length, name in columns:
            row = self._current if self._start <= ts_ns < self._end else row_of(ts_ns)
            row[0] += 1
            row[1] += length or 0
            types = row[2]
            types[name] = types.get(name, 0) + 1

    def result(self) -> dict:
        """``{"stats": "io", "interval": seconds, "rows": [...]}``, every interval from the origin's
        to the last frame's, empty ones included (``StatsError`` when there are too many)."""
        needed = self._high - self._low + 1
        if needed > self.max_intervals:
            raise StatsError(
                f"io,{self.seconds:g}: the frames span {needed:,} intervals of {self.seconds:g} s, "
                f"more than the {self.max_intervals:,} an io table may have; give an interval of at least "
                f"{_round_up(self.seconds * needed / self.max_intervals):.6g} s"
            )
        rows = []
        if self._rows:
            for index in range(self._low, self._high + 1):
                frames, size, types = self._rows.get(index) or (0, 0, {})
                if self.step:
                    start, end = index * self.step, (index + 1) * self.step
                else:
                    start, end = self._first_ns - self.origin_ns, self._last_ns - self.origin_ns
                rows.append(
                    {
                        "start": start / _NS,
                        "end": end / _NS,
                        "frames": frames,
                        "bytes": size,
                        "types": dict(sorted(types.items())),
                    }
                )
        return {"stats": "io", "interval": self.seconds, "rows": rows}


#: A conversation's counters: frames and bytes initiator to responder, then back; first and last
#: frame's time; frames with violations.
_FRAMES_AB, _BYTES_AB, _FRAMES_BA, _BYTES_BA, _FIRST, _LAST, _VIOLATIONS = range(7)


class ConvStats:
    """One row per connection: endpoints, frames and bytes each way, start, duration, violations."""

    kind = "conv"

    def __init__(self) -> None:
        self.origin_ns: int | None = None
        #: conn_index -> (what the connection is, its counters).
        self._rows: dict[int, tuple[dict, list[int]]] = {}

    def _new(self, conn_index: int, connection: str, protocol: str | None, ts_ns: int) -> list[int]:
        if self.origin_ns is None:
            self.origin_ns = ts_ns
        a, _, b = connection.partition(" > ")
        about = {"conn_index": conn_index, "protocol": protocol, "a": a, "b": b}
        counts = [0, 0, 0, 0, ts_ns, ts_ns, 0]
        self._rows[conn_index] = (about, counts)
        return counts

    def add(self, record: dict) -> None:
        known = self._rows.get(record["conn_index"])
        ts_ns = record["ts_ns"]
        if known is None:
            counts = self._new(record["conn_index"], record["connection"], record.get("protocol"), ts_ns)
        else:
            counts = known[1]
        way = 0 if record["direction"] == "initiator>responder" else 2
        counts[way] += 1
        counts[way + 1] += record.get("length") or 0
        if ts_ns > counts[_LAST]:
            counts[_LAST] = ts_ns
        elif ts_ns < counts[_FIRST]:
            counts[_FIRST] = ts_ns
        if "violations" in record and record["violations"]:
            counts[_VIOLATIONS] += 1

    def add_block(self, block: FrameBlock) -> None:
        shared = block.shared
        if not block.rows:
            return
        if "conn_index" in shared and "direction" in shared:  # as every plug-in's blocks are
            known = self._rows.get(shared["conn_index"])
            times = _values(block, "ts_ns")
            if known is None:
                first = next(iter(times))
                counts = self._new(shared["conn_index"], shared["connection"], shared.get("protocol"), first)
            else:
                counts = known[1]
            way = 0 if shared["direction"] == "initiator>responder" else 2
            counts[way] += len(block.rows)
            counts[way + 1] += sum(length or 0 for length in _values(block, "length"))
            counts[_FIRST] = min(counts[_FIRST], *times)
            counts[_LAST] = max(counts[_LAST], *times)
            counts[_VIOLATIONS] += sum(1 for v in _values(block, "violations") if v)
            return
        for record in block.records():
            self.add(record)

    def result(self) -> dict:
        """``{"stats": "conv", "rows": [...]}``, a row per connection in capture order; ``a`` is the
        initiator, ``b`` the responder; ``start`` and ``duration`` in seconds."""
        rows = []
        for conn_index in sorted(self._rows):
            about, counts = self._rows[conn_index]
            frames_ab, bytes_ab, frames_ba, bytes_ba, first, last, violations = counts
            rows.append(
                {
                    **about,
                    "frames_ab": frames_ab,
                    "bytes_ab": bytes_ab,
                    "frames_ba": frames_ba,
                    "bytes_ba": bytes_ba,
                    "frames": frames_ab + frames_ba,
                    "bytes": bytes_ab + bytes_ba,
                    "start": (first - self.origin_ns) / _NS,
                    "duration": (last - first) / _NS,
                    "violations": violations,
                }
            )
        return {"stats": "conv", "rows": rows}


class ExpertStats:
    """The frames' findings (``findings.of_record``), as tshark's ``-z expert``: each distinct
    finding of a protocol once, with its count and the first frame that had it, the most severe first.

    Memory: at most ``MAX_FINDINGS`` distinct findings are kept; the rest are counted per severity.
    """

    kind = "expert"

    def __init__(self, max_findings: int = MAX_FINDINGS) -> None:
        self.origin_ns: int | None = None
        self.max_findings = max_findings
        #: (severity, protocol, text) -> [count, conn_index, connection, packet, frame_index, type]
        self._rows: dict[tuple[str, str, str], list] = {}
        self._counts: Counter[str] = Counter()
        self._left_out: Counter[str] = Counter()

    def add(self, record: dict) -> None:
        if not has_findings(record):
            return
        protocol = record.get("protocol") or ""
        for severity, text in of_record(record):
            self._counts[severity] += 1
            row = self._rows.get((severity, protocol, text))
            if row is not None:
                row[0] += 1
            elif len(self._rows) < self.max_findings:
                self._rows[(severity, protocol, text)] = [
                    1,
                    record["conn_index"],
                    record["connection"],
                    record.get("packet"),
                    record.get("frame_index"),
                    record.get("type"),
                ]
            else:
                self._left_out[severity] += 1

    def add_block(self, block: FrameBlock) -> None:
        if _FINDING_FIELDS.isdisjoint(_columns(block.layout)) and _FINDING_FIELDS.isdisjoint(block.shared):
            return  # the fast paths' blocks: accepted frames, no findings
        for record in block.records():
            self.add(record)

    def result(self) -> dict:
        rank = {severity: i for i, severity in enumerate(SEVERITIES)}
        ordered = sorted(self._rows.items(), key=lambda kv: (rank[kv[0][0]], kv[1][1], kv[1][4] or 0))
        rows = [
            {
                "severity": severity,
                "protocol": protocol,
                "finding": text,
                "count": count,
                "conn_index": conn_index,
                "connection": connection,
                "packet": packet,
                "frame_index": frame_index,
                "type": type_,
            }
            for (severity, protocol, text), (
                count,
                conn_index,
                connection,
                packet,
                frame_index,
                type_,
            ) in ordered
        ]
        counts = {severity: self._counts[severity] for severity in SEVERITIES}
        return {"stats": "expert", "counts": counts, "rows": rows, "left_out": dict(self._left_out)}


def add_item(accumulators: Iterable[IoStats | ConvStats | ExpertStats], item: dict | FrameBlock) -> None:
    """Feed one item of ``Dissector.frames`` (a record or a block) to each accumulator."""
    if type(item) is FrameBlock:
        for acc in accumulators:
            acc.add_block(item)
    else:
        for acc in accumulators:
            acc.add(item)


def feed(
    accumulators: list[IoStats | ConvStats | ExpertStats],
    items: Iterable[dict | FrameBlock],
    limit: int | None = None,
) -> int:
    """Feed ``Dissector.frames`` items, at most ``limit`` frames (a block cut to fit); frames fed."""
    fed = 0
    for item in items:
        size = len(item) if type(item) is FrameBlock else 1
        if limit is not None and fed + size > limit:
            if type(item) is not FrameBlock:
                break
            item = FrameBlock(item.layout, item.shared, item.rows[: limit - fed])
            size = len(item)
        add_item(accumulators, item)
        fed += size
        if fed == limit:
            break
    return fed


__all__ = [
    "MAX_FINDINGS",
    "MAX_INTERVALS",
    "ConvStats",
    "ExpertStats",
    "IoStats",
    "StatsError",
    "add_item",
    "feed",
    "make",
    "parse_spec",
]
