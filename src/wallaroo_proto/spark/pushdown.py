"""What a query's filters let a capture task skip (Spark's ``pushFilters``, PySpark 4.1+).

Spark hands the data source the conjuncts of a query's filter it can express
(``EqualTo``, ``In``, comparisons). Those on ``capture``, ``protocol``,
``conn_index`` and ``ts``/``ts_ns`` become a ``Skip``: a capture no filter
lets through is not opened, a connection of another protocol or number is not
dissected, and a frame outside the time range is not converted. Spark still
evaluates every filter after the scan (they are all returned to it): the skip
only ever drops what the filter would drop, and rows naming an unreadable
capture, which hold no protocol or time, stay. The data source works the same
with pushdown off (``spark.sql.python.filterPushdown.enabled``), only slower.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Columns a ``Skip`` acts on; a filter on any other column is left to Spark alone.
COLUMNS = frozenset({"capture", "protocol", "conn_index", "ts", "ts_ns"})


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)


def _ns(column: str, value: Any) -> int | None:
    """A ``ts`` (timestamp) or ``ts_ns`` (long) filter value in nanoseconds since the epoch."""
    if column == "ts_ns":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, dt.datetime):  # PySpark hands an aware UTC time; a naive one is local
        aware = value if value.tzinfo is not None else value.astimezone()
        return (aware - _EPOCH) // _MICROSECOND * 1000
    return None


@dataclass
class Skip:
    """What a task may leave out. ``None`` everywhere: nothing (no filter, or none it can use)."""

    captures: frozenset[str] | None = None
    protocols: frozenset[str] | None = None
    conn_indexes: frozenset[int] | None = None
    #: Frames outside [first_ns, last_ns] are not converted (bounds inclusive, widened to whole
    #: microseconds: a ``ts`` filter compares microseconds).
    first_ns: int | None = None
    last_ns: int | None = None
    used: list[Any] = field(default_factory=list)

    def take(self, filters: Iterable[Any]) -> None:
        """Narrow by each filter it understands (all are still evaluated by Spark)."""

        for f in filters:
            path = getattr(f, "attribute", ())
            if len(path) != 1 or path[0] not in COLUMNS:
                continue
            column = path[0]
            if self._take(f, column):
                self.used.append(f)

    def _take(self, f: Any, column: str) -> bool:
        """Narrow by one filter on a column of ``COLUMNS``; False when its value is of no use."""
        from pyspark.sql.datasource import (
            EqualTo,
            GreaterThan,
            GreaterThanOrEqual,
            In,
            LessThan,
            LessThanOrEqual,
        )

        timed = column in ("ts", "ts_ns")
        if isinstance(f, (EqualTo, In)):
            values = (f.value,) if isinstance(f, EqualTo) else tuple(f.value)
            if not timed:
                self._only(column, values)
                return True
            stamps = [_ns(column, v) for v in values]
            if not stamps or None in stamps:
                return False
            self._bound(min(stamps), max(stamps) + (999 if column == "ts" else 0))
            return True
        if not timed or not isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
            return False
        ns = _ns(column, f.value)
        if ns is None:
            return False
        if isinstance(f, (GreaterThan, GreaterThanOrEqual)):
            self._bound(ns, None)
        else:
            self._bound(None, ns + (999 if column == "ts" else 0))
        return True

    def _only(self, column: str, values: tuple) -> None:
        kept = frozenset(v for v in values if v is not None)
        if column == "conn_index":
            kept = frozenset(v for v in kept if isinstance(v, int))
        attr = {"capture": "captures", "protocol": "protocols", "conn_index": "conn_indexes"}[column]
        old = getattr(self, attr)
        setattr(self, attr, kept if old is None else old & kept)

    def _bound(self, low: int | None, high: int | None) -> None:
        if low is not None:
            self.first_ns = low if self.first_ns is None else max(self.first_ns, low)
        if high is not None:
            self.last_ns = high if self.last_ns is None else min(self.last_ns, high)

    @property
    def by_time(self) -> bool:
        return self.first_ns is not None or self.last_ns is not None

    def in_time(self, ts_ns: int | None) -> bool:
        if ts_ns is None:
            return True
        return (self.first_ns is None or ts_ns >= self.first_ns) and (
            self.last_ns is None or ts_ns <= self.last_ns
        )


__all__ = ["COLUMNS", "Skip"]
