"""The data source's Arrow batches from blocks of frames equal those from the same records as dicts.

``read_part`` takes each plug-in's blocks (Wallaroo's accepted MESSAGEs, the DCP
producer's stream) straight to Arrow columns; the reference here is the record
dicts of the same capture converted by ``to_batch``, Arrow's own dict reader. No
Spark session is needed: the batches are what the executors hand Spark.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from wallaroo_proto import records
from wallaroo_proto.spark.datasource import (
    CapturePart,
    ReadOptions,
    _Batcher,
    arrow_types,
    frame_schema,
    read_part,
    to_batch,
)

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SAMPLES = sorted(p.name for p in CAPTURES.glob("*.pcap*"))


def _table(batches) -> pa.Table:
    return pa.Table.from_batches(list(batches))


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("batch_rows", [7, 8192])
def test_batches_from_blocks_equal_batches_from_records(name, batch_rows):
    path = str(CAPTURES / name)
    schema = frame_schema("PERMISSIVE")
    target, build = arrow_types(schema)
    options = ReadOptions(paths=(path,), batch_rows=batch_rows)
    got = _table(read_part(CapturePart(path, path, 0, 1), options, schema))
    expected = to_batch(list(records.iter_records(path)), target, build)
    assert got.num_rows == expected.num_rows > 0
    assert got.equals(pa.Table.from_batches([expected])), name
    sizes = [batch.num_rows for batch in read_part(CapturePart(path, path, 0, 1), options, schema)]
    assert all(size == batch_rows for size in sizes[:-1]) and 0 < sizes[-1] <= batch_rows


def test_blocks_reach_the_data_source():
    """The samples hold blocks, so the comparison above covers them."""
    kinds = {
        type(item).__name__
        for name in SAMPLES
        for item in records.iter_records(str(CAPTURES / name), blocks=True)
    }
    assert kinds == {"dict", "FrameBlock"}


def test_a_narrower_schema_takes_only_its_fields():
    """A reader given fewer columns (``.schema(...)``) gets them, and gathers nothing else."""
    from pyspark.sql import types as T  # noqa: N812

    path = str(CAPTURES / "source-session.pcap")
    fields = [T.StructField("capture", T.StringType()), T.StructField("message_id", T.DecimalType(20, 0))]
    schema = T.StructType(fields)
    target, build = arrow_types(schema)
    options = ReadOptions(paths=(path,), batch_rows=5)
    got = _table(read_part(CapturePart(path, path, 0, 1), options, schema))
    expected = to_batch(list(records.iter_records(path)), target, build)
    assert got.equals(pa.Table.from_batches([expected])) and got.num_rows > 5
    assert got.column_names == ["capture", "message_id"]
    batcher = _Batcher(target, build, 10**9)  # one batch: everything stays gathered until the end
    for item in records.iter_records(path, blocks=True):
        list(batcher.add(item))
    batcher._settle()
    assert set(batcher.columns) <= {"capture", "message_id"} and len(batcher) > 5
