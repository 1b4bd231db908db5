"""Statistics over dissected frames, as tshark's ``-z io,stat`` and ``-z conv,tcp`` give for packets.

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
from collections.abc import Iterable
from functools import cache
from itertools import repeat
from typing import Any

from .frame_block import SHARED, FrameBlock

#: The most rows an io table may have: a day at 1 s, or a week at 10 s, fits; a table longer than
#: that is read by nobody, and a mistyped interval (0.0001 over days) would be gigabytes.
MAX_INTERVALS = 100_000
_NS = 1_000_000_000


class StatsError(ValueError):
    """A statistic that cannot be given: a bad ``--stats`` value, or an io table too long."""


def parse_spec(value: str) -> tuple[str, float | None]:
    """``io,SECONDS`` -> ("io", seconds), 0 meaning one row for the whole capture; ``conv`` -> ("conv", None).

    A ``StatsError`` says what is wrong with any other value."""
    kind, _, arg = value.strip().partition(",")
    kind = kind.strip().lower()
    if kind == "conv":
        if arg:
            raise StatsError(f"{value!r}: conv takes no argument")
        return "conv", None
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
    raise StatsError(f"{value!r}: give io,SECONDS or conv")


def make(value: str) -> IoStats | ConvStats:
    """The accumulator a ``--stats`` value asks for (``StatsError`` when it is not one)."""
    kind, seconds = parse_spec(value)
    return IoStats(seconds) if kind == "io" else ConvStats()


@cache
def _columns(layout: tuple[tuple[str, str], ...]) -> dict[str, int]:
    """A block layout's non-shared fields and their positions in a row."""
    names = [name for name, kind in layout if kind != SHARED]
    return {name: i for i, name in enumerate(names)}


def _values(block: FrameBlock, name: str) -> Iterable[Any]:
    """One field's value for each row of a block (``None`` where a frame lacks it)."""
    if name in block.shared:
        return repeat(block.shared[name], len(block.rows))
    i = _columns(block.layout).get(name)
    if i is None:
        return repeat(None, len(block.rows))
    return [row[i] for row in block.rows]


def _round_up(x: float) -> float:
    """``x`` rounded up to two significant digits, for a suggestion a person types."""
    scale = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / scale) * scale


def _label(record: dict) -> str:
    """The frame's name as dissect's type column shows it (a 2PC message by its phase)."""
    return record.get("twopc") or record["type"]


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
        self._low = self._high = 0
        self._first_ns: int | None = None
        self._last_ns = 0
        self._too_long = False

    def _row(self, ts_ns: int) -> list:
        if self.origin_ns is None:
            self.origin_ns = ts_ns
        if self._first_ns is None:
            self._first_ns = ts_ns
        first, last = min(self._first_ns, ts_ns), max(self._last_ns, ts_ns)
        self._first_ns, self._last_ns = first, last
        index = (ts_ns - self.origin_ns) // self.step if self.step else 0
        row = self._rows.get(index)
        if row is None:
            low, high = min(self._low, index), max(self._high, index)
            if high - low >= self.max_intervals or self._too_long:
                self._too_long = True  # keep only the span, for the message
                self._rows.clear()
                return [0, 0, {}]
            self._low, self._high = low, high
            row = self._rows[index] = [0, 0, {}]
        return row

    def add(self, record: dict) -> None:
        row = self._row(record["ts_ns"])
        row[0] += 1
        row[1] += record.get("length") or 0
        types = row[2]
        name = _label(record)
        types[name] = types.get(name, 0) + 1

    def add_block(self, block: FrameBlock) -> None:
        columns = zip(_values(block, "ts_ns"), _values(block, "length"), _values(block, "type"), strict=True)
        row_of = self._row
        for ts_ns, length, name in columns:
            row = row_of(ts_ns)
            row[0] += 1
            row[1] += length or 0
            types = row[2]
            types[name] = types.get(name, 0) + 1

    def result(self) -> dict:
        """``{"stats": "io", "interval": seconds, "rows": [...]}``, every interval from the first
        frame's to the last's, empty ones included (``StatsError`` when there are too many)."""
        if self._too_long:
            span = (max(self._last_ns, self.origin_ns) - min(self._first_ns, self.origin_ns)) / _NS
            raise StatsError(
                f"io,{self.seconds:g}: the frames span {span:,.3f} s, more than {self.max_intervals:,} "
                f"intervals of {self.seconds:g} s; give an interval of at least "
                f"{_round_up(span / max(self.max_intervals - 1, 1)):.6g} s"
            )
        rows = []
        if self._rows:
            for index in range(self._low, self._high + 1) if self.step else range(1):
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


class ConvStats:
    """One row per connection: endpoints, frames and bytes each way, start, duration, violations."""

    kind = "conv"

    def __init__(self) -> None:
        self.origin_ns: int | None = None
        #: conn_index -> the row being counted, with first and last ts_ns.
        self._rows: dict[int, dict] = {}

    def _row(self, conn_index: int, connection: str, protocol: str | None, ts_ns: int) -> dict:
        if self.origin_ns is None:
            self.origin_ns = ts_ns
        row = self._rows.get(conn_index)
        if row is None:
            a, _, b = connection.partition(" > ")
            row = self._rows[conn_index] = {
                "conn_index": conn_index,
                "protocol": protocol,
                "a": a,
                "b": b,
                "frames_ab": 0,
                "bytes_ab": 0,
                "frames_ba": 0,
                "bytes_ba": 0,
                "first_ns": ts_ns,
                "last_ns": ts_ns,
                "violations": 0,
            }
        elif ts_ns < row["first_ns"]:
            row["first_ns"] = ts_ns
        elif ts_ns > row["last_ns"]:
            row["last_ns"] = ts_ns
        return row

    def add(self, record: dict) -> None:
        row = self._row(record["conn_index"], record["connection"], record.get("protocol"), record["ts_ns"])
        way = "ab" if record["direction"] == "initiator>responder" else "ba"
        row["frames_" + way] += 1
        row["bytes_" + way] += record.get("length") or 0
        if record.get("violations"):
            row["violations"] += 1

    def add_block(self, block: FrameBlock) -> None:
        columns = zip(
            _values(block, "conn_index"),
            _values(block, "connection"),
            _values(block, "protocol"),
            _values(block, "direction"),
            _values(block, "ts_ns"),
            _values(block, "length"),
            _values(block, "violations"),
            strict=True,
        )
        for conn_index, connection, protocol, direction, ts_ns, length, violations in columns:
            row = self._row(conn_index, connection, protocol, ts_ns)
            way = "ab" if direction == "initiator>responder" else "ba"
            row["frames_" + way] += 1
            row["bytes_" + way] += length or 0
            if violations:
                row["violations"] += 1

    def result(self) -> dict:
        """``{"stats": "conv", "rows": [...]}``, a row per connection in capture order; ``a`` is the
        initiator, ``b`` the responder; ``start`` and ``duration`` in seconds."""
        rows = []
        for conn_index in sorted(self._rows):
            row = dict(self._rows[conn_index])
            first, last = row.pop("first_ns"), row.pop("last_ns")
            violations = row.pop("violations")
            row["frames"] = row["frames_ab"] + row["frames_ba"]
            row["bytes"] = row["bytes_ab"] + row["bytes_ba"]
            row["start"] = (first - self.origin_ns) / _NS
            row["duration"] = (last - first) / _NS
            row["violations"] = violations
            rows.append(row)
        return {"stats": "conv", "rows": rows}


def add_item(accumulators: Iterable[IoStats | ConvStats], item: dict | FrameBlock) -> None:
    """Feed one item of ``Dissector.frames`` (a record or a block) to each accumulator."""
    if type(item) is FrameBlock:
        for acc in accumulators:
            acc.add_block(item)
    else:
        for acc in accumulators:
            acc.add(item)


def feed(
    accumulators: list[IoStats | ConvStats], items: Iterable[dict | FrameBlock], limit: int | None = None
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


__all__ = ["MAX_INTERVALS", "ConvStats", "IoStats", "StatsError", "add_item", "feed", "make", "parse_spec"]
