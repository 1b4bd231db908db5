"""``spark-replay --report``: the report's content built on Spark, drawn on the driver.

Each connection's frames meet in one task (repartitioned by connection, sorted
in capture order: by ``packet``, then ``frame_index``); the task streams them through the same
``model.ConnectionBuilder`` as ``report`` does and sends the driver only the
bounded ``ConnectionReport`` as JSON. So the driver's memory depends on the
number of connections and the report's limits, never on the frames.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from .model import CaptureReport, ConnectionBuilder, ConnectionReport, Report, ReportLimits

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Columns the report never reads: the bulk of a frame's bytes stays on the executors.
_UNUSED = ("payload_b64", "cookie_b64")


def _connection_reports(rows: Iterable, detailed: frozenset, limits: ReportLimits) -> Iterator[str]:
    """One task's connections, each one's rows consecutive and in capture order, as JSON reports."""
    builder = key = None
    for row in rows:
        record = row.asDict(recursive=True)
        this = (record["capture"], record["conn_index"])
        if this != key:
            if builder is not None:
                yield json.dumps(builder.finish().to_dict())
            key = this
            builder = ConnectionBuilder(record, this in detailed, limits)
        builder.feed(record)
    if builder is not None:
        yield json.dumps(builder.finish().to_dict())


def build_report(
    frames: DataFrame,
    capture_names: Sequence[str],
    *,
    errors: dict[str, str] | None = None,
    limits: ReportLimits | None = None,
    title: str | None = None,
) -> Report:
    """The report of ``frames`` (spark-replay's DataFrame); ``errors``: capture -> why it stopped."""
    from pyspark.sql import functions as F  # noqa: N812

    limits = limits or ReportLimits()
    # The first connections in the captures' given order, as the local report (fed in that order) draws.
    given_order = F.array_position(F.array(*(F.lit(name) for name in capture_names)), F.col("capture"))
    first = (
        frames.select("capture", "conn_index")
        .distinct()
        .orderBy(given_order, "conn_index")
        .limit(limits.connections)
        .collect()
    )
    detailed = frozenset((r["capture"], r["conn_index"]) for r in first)
    columns = [c for c in frames.columns if c not in _UNUSED]
    ordered = (
        frames.select(*columns)
        .repartition("capture", "conn_index")
        .sortWithinPartitions("capture", "conn_index", "packet", "frame_index")
    )
    built = ordered.rdd.mapPartitions(lambda rows: _connection_reports(rows, detailed, limits))
    by_capture: dict[str, list[ConnectionReport]] = {name: [] for name in capture_names}
    for text in built.toLocalIterator():
        conn = ConnectionReport.from_dict(json.loads(text))
        by_capture.setdefault(conn.capture, []).append(conn)
    errors = errors or {}
    captures = [
        CaptureReport(name, sorted(conns, key=lambda c: c.conn_index), errors.get(name))
        for name, conns in by_capture.items()
    ]
    report = Report(captures, limits, source="spark")
    if title:
        report.title = title
    return report
