"""What a protocol adds to a connection's report: time series, shaded spans, markers, latencies.

A plug-in's ``report_signals`` makes one collector per connection; the report
feeds it every record of the connection in order (``feed``) and draws what
``finish`` returns. Everything here is bounded, whatever the capture's size: a
series is thinned, a distribution keeps a fixed-size uniform sample beside its
exact count, minimum and maximum, and lists keep their first entries and count
the rest, so the report can say what it left out.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

MAX_POINTS = 2000
MAX_SAMPLE = 5000
MAX_ITEMS = 500


@dataclass
class Series:
    """A value over capture time (seconds since the epoch); ``step``: it holds until the next point."""

    name: str
    unit: str = ""
    step: bool = True
    points: list[tuple[float, float]] = field(default_factory=list)
    #: Points merged away to keep the series bounded (each kept point is then its interval's lowest).
    thinned: int = 0

    def add(self, ts: float, value: float, max_points: int = MAX_POINTS) -> None:
        points = self.points
        if points and points[-1][1] == value and self.step:
            return  # a step series only needs its changes
        points.append((ts, value))
        if len(points) > 2 * max_points:
            # Keep the lower value of each pair: a fall to zero credits must not vanish.
            merged = [min(points[i], points[i + 1], key=lambda p: p[1]) for i in range(0, len(points) - 1, 2)]
            if len(points) % 2:
                merged.append(points[-1])
            self.thinned += len(points) - len(merged)
            self.points = merged


@dataclass
class Span:
    """A shaded interval, such as a spell with zero credits."""

    start: float
    end: float
    label: str


@dataclass
class Marker:
    """A moment worth a vertical line: a checkpoint, a RESTART, an error."""

    ts: float
    kind: str
    label: str
    frame_index: int | None = None


@dataclass
class Distribution:
    """Latencies (or other values) in seconds: exact count, min, max and mean; a uniform sample."""

    name: str
    unit: str = "s"
    count: int = 0
    total: float = 0.0
    low: float | None = None
    high: float | None = None
    sample: list[float] = field(default_factory=list)

    def add(self, value: float, max_sample: int = MAX_SAMPLE, rng: random.Random | None = None) -> None:
        self.count += 1
        self.total += value
        self.low = value if self.low is None else min(self.low, value)
        self.high = value if self.high is None else max(self.high, value)
        if len(self.sample) < max_sample:
            self.sample.append(value)
        else:  # reservoir sampling: every value has the same chance to be kept
            slot = (rng or _RNG).randrange(self.count)
            if slot < max_sample:
                self.sample[slot] = value

    def merge(self, other: Distribution, max_sample: int = MAX_SAMPLE) -> None:
        """Add another distribution of the same quantity (the sample stays a sample of both)."""
        if not other.count:
            return
        if self.count + other.count and len(self.sample) + len(other.sample) > max_sample:
            share = round(max_sample * self.count / (self.count + other.count))
            self.sample = _RNG.sample(self.sample, min(share, len(self.sample))) + _RNG.sample(
                other.sample, min(max_sample - share, len(other.sample))
            )
        else:
            self.sample = self.sample + other.sample
        self.count += other.count
        self.total += other.total
        self.low = other.low if self.low is None else min(self.low, other.low)
        self.high = other.high if self.high is None else max(self.high, other.high)

    @property
    def sampled(self) -> bool:
        return len(self.sample) < self.count


_RNG = random.Random(16)


@dataclass
class Signals:
    """One connection's protocol signals, as its plug-in reads them from the records."""

    series: list[Series] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    distributions: list[Distribution] = field(default_factory=list)
    #: Title of the shaded spans (e.g. "zero credits"), for the legend.
    span_label: str = ""
    #: What was left out to stay bounded, in words the report prints.
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Signals:
        return cls(
            series=[Series(**{**s, "points": [tuple(p) for p in s["points"]]}) for s in data["series"]],
            spans=[Span(**s) for s in data["spans"]],
            markers=[Marker(**m) for m in data["markers"]],
            distributions=[Distribution(**d) for d in data["distributions"]],
            span_label=data.get("span_label", ""),
            notes=list(data.get("notes", ())),
        )

    def add_span(self, span: Span, max_items: int = MAX_ITEMS) -> bool:
        """Keep the span unless the list is full; False when it was left out."""
        if len(self.spans) < max_items:
            self.spans.append(span)
            return True
        return False

    def add_marker(self, marker: Marker, max_items: int = MAX_ITEMS) -> bool:
        if len(self.markers) < max_items:
            self.markers.append(marker)
            return True
        return False


class SignalCollector(Protocol):
    """A plug-in's per-connection reader of records for the report."""

    def feed(self, record: dict) -> None: ...

    def finish(self) -> Signals: ...


__all__ = ["Distribution", "Marker", "Series", "SignalCollector", "Signals", "Span"]
