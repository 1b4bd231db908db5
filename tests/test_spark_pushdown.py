"""A query's filters let a capture task skip work, and never change what the query returns.

``Skip`` is built from the filter objects Spark hands ``pushFilters``; ``read_part`` with it
must give exactly the rows of a full read that the filters keep (Spark re-applies the filters,
so a skip may keep more, never less). No Spark session: these are the executors' batches.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan, StringStartsWith

from wallaroo_proto.spark.datasource import (
    CapturePart,
    FilteringCaptureReader,
    ReadOptions,
    frame_schema,
    read_part,
)
from wallaroo_proto.spark.pushdown import Skip

CAPTURES = Path(__file__).resolve().parent.parent / "captures"


def rows(path: Path, table: str = "frames", skip: Skip | None = None) -> list[dict]:
    options = ReadOptions(paths=(str(path),), table=table, batch_rows=7)
    schema = frame_schema("DROPMALFORMED", table)
    batches = list(read_part(CapturePart(str(path), path.name, 0, 1), options, schema, skip))
    return pa.Table.from_batches(batches, schema=batches[0].schema).to_pylist() if batches else []


def skip_of(*filters) -> Skip:
    skip = Skip()
    skip.take(filters)
    return skip


def test_protocol_and_connection_filters_leave_other_connections_undissected():
    path = CAPTURES / "tremor-session.pcap"
    everything = rows(path)
    assert {r["protocol"] for r in everything} == {"tremor"} and len(
        {r["conn_index"] for r in everything}
    ) > 1
    assert rows(path, skip=skip_of(EqualTo(("protocol",), "dcp"))) == []
    second = rows(path, skip=skip_of(In(("conn_index",), (2, 9))))
    assert second == [r for r in everything if r["conn_index"] == 2]


def test_a_time_range_keeps_exactly_the_frames_inside_it():
    path = CAPTURES / "dcp-rollback.pcap"  # the DCP producer's stream comes in blocks
    everything = rows(path)
    stamps = sorted(r["ts"] for r in everything)
    low, high = stamps[len(stamps) // 3], stamps[2 * len(stamps) // 3]
    # As PySpark hands them: aware UTC datetimes (a naive one is taken as local time).
    kept = rows(path, skip=skip_of(GreaterThanOrEqual(("ts",), low), LessThan(("ts",), high)))
    assert kept == [r for r in everything if low <= r["ts"] <= high]
    assert 0 < len(kept) < len(everything)
    local = [t.astimezone().replace(tzinfo=None) for t in (low, high)]
    assert (
        rows(path, skip=skip_of(GreaterThanOrEqual(("ts",), local[0]), LessThan(("ts",), local[1]))) == kept
    )


def test_filters_it_cannot_use_are_left_to_spark_and_every_filter_goes_back():
    from pyspark.sql.datasource import InputPartition

    reader = FilteringCaptureReader(ReadOptions(paths=(str(CAPTURES),)), frame_schema())
    filters = [StringStartsWith(("type",), "DCP"), EqualTo(("capture",), "x.pcap"), EqualTo(("ts_ns",), "no")]
    assert list(reader.pushFilters(filters)) == filters
    assert reader.skip.captures == {"x.pcap"} and reader.skip.used == [filters[1]]
    assert reader.partitions() == []  # no capture of that name
    # Spark then plans one stand-in partition of its own, which reads nothing.
    assert list(reader.read(InputPartition(None))) == []


@pytest.mark.parametrize("table", ["all", "dcp_frames"])
def test_a_skip_on_the_protocol_tables(table):
    path = CAPTURES / "dcp-rollback.pcap"
    first = rows(path, table, skip_of(EqualTo(("conn_index",), 1)))
    assert first == rows(path, table) and first


def test_time_bounds_take_microseconds_whole():
    at = dt.datetime(2026, 1, 1, 12, 0, 0, 5)
    skip = skip_of(LessThan(("ts",), at), GreaterThanOrEqual(("ts_ns",), 7))
    assert skip.first_ns == 7 and skip.last_ns % 1000 == 999
