"""The data source's Arrow batches from blocks of frames equal those from the same records as dicts.

``read_part`` takes each plug-in's blocks (Wallaroo's accepted MESSAGEs, the DCP
producer's stream) straight to Arrow columns; the reference here is the record
dicts of the same capture converted by ``Shape.of_dicts``, Arrow's own dict reader. No
Spark session is needed: the batches are what the executors hand Spark.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from wallaroo_proto.capture.dissector import iter_records
from wallaroo_proto.spark.datasource import (
    CapturePart,
    ReadOptions,
    Shape,
    _Batcher,
    frame_schema,
    read_part,
)

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SAMPLES = sorted(p.name for p in CAPTURES.glob("*.pcap*"))


def _table(batches) -> pa.Table:
    return pa.Table.from_batches(list(batches))


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("batch_rows", [7, 8192])
@pytest.mark.parametrize("table", ["all", "frames", "wallaroo_frames", "dcp_frames"])
def test_batches_from_blocks_equal_batches_from_records(name, batch_rows, table):
    path = str(CAPTURES / name)
    schema = frame_schema("PERMISSIVE", table)
    options = ReadOptions(paths=(path,), table=table, batch_rows=batch_rows)
    batches = list(read_part(CapturePart(path, path, 0, 1), options, schema))
    wanted = options.protocols
    dicts = [r for r in iter_records(path) if wanted is None or r["protocol"] in wanted]
    if not dicts:
        assert batches == []
        return
    got = _table(batches)
    expected = Shape(schema).of_dicts(dicts)
    assert got.num_rows == expected.num_rows > 0
    assert got.equals(pa.Table.from_batches([expected])), name
    sizes = [batch.num_rows for batch in read_part(CapturePart(path, path, 0, 1), options, schema)]
    assert all(size == batch_rows for size in sizes[:-1]) and 0 < sizes[-1] <= batch_rows


def test_blocks_reach_the_data_source():
    """The samples hold blocks, so the comparison above covers them."""
    kinds = {
        type(item).__name__ for name in SAMPLES for item in iter_records(str(CAPTURES / name), blocks=True)
    }
    assert kinds == {"dict", "FrameBlock"}


def test_a_narrower_schema_takes_only_its_fields():
    """A reader given fewer columns (``.schema(...)``) gets them, and gathers nothing else."""
    from pyspark.sql import types as T  # noqa: N812

    path = str(CAPTURES / "source-session.pcap")
    fields = [T.StructField("capture", T.StringType()), T.StructField("message_id", T.LongType())]
    schema = T.StructType(fields)
    options = ReadOptions(paths=(path,), batch_rows=5)
    got = _table(read_part(CapturePart(path, path, 0, 1), options, schema))
    expected = Shape(schema).of_dicts(list(iter_records(path)))
    assert got.equals(pa.Table.from_batches([expected])) and got.num_rows > 5
    assert got.column_names == ["capture", "message_id"]
    batcher = _Batcher(Shape(schema), 10**9)  # one batch: everything stays gathered until the end
    for item in iter_records(path, blocks=True):
        list(batcher.add(item))
    batcher._settle()
    assert set(batcher.columns) <= {"capture", "message_id"} and len(batcher) > 5


def test_u64_values_keep_their_64_bits_and_ts_is_a_timestamp():
    """A u64 from 2^63 up reads negative in its long (the same bits); ts comes from ts_ns in us."""
    schema = frame_schema("DROPMALFORMED", "all")
    row = {
        "capture": "c",
        "protocol": "wallaroo",
        "ts": 1.5,
        "ts_ns": 1_700_000_000_123_456_789,
        "message_id": 2**64 - 1,
        "stream_id": 2**63,
        "acks": [{"stream_id": 2**64 - 2, "point_of_ref": 7}],
    }
    batch = Shape(schema).of_dicts([row, {"capture": "d", "protocol": "dcp", "vb_uuid": 2**64 - 3}])
    wallaroo, dcp = batch.column("wallaroo").to_pylist(), batch.column("dcp").to_pylist()
    assert wallaroo[0]["message_id"] == -1 and wallaroo[0]["stream_id"] == -(2**63)
    assert wallaroo[0]["acks"] == [{"stream_id": -2, "point_of_ref": 7}]
    assert wallaroo[1] is None and dcp[0] is None and dcp[1]["vb_uuid"] == -3
    assert batch.column("ts").type == pa.timestamp("us", tz="UTC")
    assert batch.column("ts").cast(pa.int64()).to_pylist() == [1_700_000_000_123_456, None]
