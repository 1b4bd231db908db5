"""A latency histogram in constant memory: log-spaced buckets, 2% apart, weighted samples."""

from __future__ import annotations

import math

_STEP = math.log(1.02)
_FLOOR = 1e-7  # seconds; anything faster counts as this


class LatencyHistogram:
    """Quantiles of many samples without keeping them: each falls in a bucket 2% wide."""

    __slots__ = ("_buckets", "count", "max")

    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.max = 0.0

    def add(self, seconds: float, weight: int = 1) -> None:
        """One sample of ``seconds`` that stands for ``weight`` events (messages of one batch)."""
        if weight <= 0:
            return
        index = int(math.log(max(seconds, _FLOOR) / _FLOOR) / _STEP)
        self._buckets[index] = self._buckets.get(index, 0) + weight
        self.count += weight
        if seconds > self.max:
            self.max = seconds

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bucket holding quantile ``q`` (0..1), in seconds; None if empty."""
        if not self.count:
            return None
        rank = q * self.count
        seen = 0
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if seen >= rank:
                return min(_FLOOR * math.exp((index + 1) * _STEP), self.max)
        return self.max

    def summary(self) -> dict:
        """Count, p50, p99 and max in milliseconds."""

        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 3)

        return {
            "count": self.count,
            "p50_ms": ms(self.quantile(0.5)),
            "p99_ms": ms(self.quantile(0.99)),
            "max_ms": ms(self.max if self.count else None),
        }
