"""The ``frames`` DataFrame: captures read and dissected by the executors.

The driver only lists the capture files and plans tasks (``plan``); each task is a
``(path, name, part, nparts)`` tuple that an executor turns into frame records
with the dissector's own ``capture.dissector.iter_records`` (the ``wallaroo-capture``
data source, ``datasource``, does the reading). A capture larger than its
share of the cluster is split into ``nparts`` tasks that each read the file but
reassemble only the connections whose ``flow_hash`` falls in their part, so one
big capture's connections are decoded in parallel (connections whose dissection
shares state, as an AMBROSIA LB's two sockets, have one part key and one task). Rows follow
``protocols.schema.spark_schema()``: the same fields as ``dissect --format jsonl``.

A capture that cannot be read (missing, not a capture, truncated, damaged) does
not stop the others: its records before the damage are kept, and one row in
``problems`` names it and says where. ``fail_fast`` makes the first such
capture fail the job instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wallaroo_proto import records
from wallaroo_proto.spark import datasource
from wallaroo_proto.spark.plan import (
    DEFAULT_PATHS,
    FAIL_FAST_MARK,
    PROBLEM_COLUMN,
    CaptureFailed,
    CaptureFile,
    Problem,
    list_captures,
    plan_tasks,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class Frames:
    """The frames of a set of captures, and the captures that could not be read."""

    frames: DataFrame
    problems: DataFrame
    captures: list[CaptureFile]
    listing_problems: list[Problem]
    tasks: int


def load_frames(
    spark: SparkSession,
    paths: Sequence[str] = DEFAULT_PATHS,
    *,
    ports: Iterable[int] | None = None,
    fail_fast: bool = False,
    split_bytes: int | None = None,
    persist: bool = True,
) -> Frames:
    """Plan the read of ``paths`` through the data source and return lazy DataFrames.

    ``problems`` has columns capture, error, packet, offset: the captures that
    could not be read and the paths that named none. With ``fail_fast``, the
    first action raises a Spark error carrying ``FAIL_FAST_MARK`` and the capture name.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F  # noqa: N812

    captures, listing_problems = list_captures(paths)
    if fail_fast and listing_problems:
        first = listing_problems[0]
        raise CaptureFailed(f"{first.capture}: {first.error}")
    parallelism = spark.sparkContext.defaultParallelism
    tasks = plan_tasks(captures, parallelism, split_bytes)
    datasource.register(spark)
    reader = (
        spark.read.format(datasource.NAME)
        .option("table", records.ALL_TABLE)
        .option("mode", "FAILFAST" if fail_fast else "PERMISSIVE")
        .option("parallelism", parallelism)
    )
    if ports is not None:
        reader = reader.option("ports", ",".join(str(p) for p in ports))
    if split_bytes is not None:
        reader = reader.option("splitBytes", split_bytes)
    raw = reader.load(list(paths))
    if persist:
        raw = raw.persist(StorageLevel.MEMORY_AND_DISK)
    if fail_fast:
        return Frames(raw, _no_problems(spark), captures, listing_problems, len(tasks))
    problem = F.col(PROBLEM_COLUMN)
    frames = raw.where(problem.isNull()).drop(PROBLEM_COLUMN)
    problems = raw.where(problem.isNotNull()).select("capture", problem.alias("error"), "packet", "offset")
    return Frames(frames, problems, captures, listing_problems, len(tasks) + len(listing_problems))


def _no_problems(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], "capture string, error string, packet long, offset long")


def fail_fast_message(err: BaseException) -> str | None:
    """The capture and reason from a Spark error raised by --fail-fast, or None."""
    text = str(err)
    at = text.find(FAIL_FAST_MARK)
    if at < 0:
        return None
    return text[at + len(FAIL_FAST_MARK) :].strip().splitlines()[0]
