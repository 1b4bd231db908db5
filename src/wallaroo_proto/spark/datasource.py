"""Captures as a Spark data source: ``spark.read.format("wallaroo-capture").load(paths)``.

A Python data source (Spark 4's ``pyspark.sql.datasource``). The driver lists
the captures and plans one partition per capture part (``frames.plan_tasks``:
a capture much larger than its share of the cluster is split by connection);
each executor task dissects its part with the dissector's own
``records.iter_records`` and hands Spark whole Arrow record batches, so no
Python row is converted one by one in the JVM. The schema is
``records.spark_schema()``: every field of every protocol plug-in, nothing
named here. Unsigned 64-bit values (``u64`` fields) are ``decimal(20,0)``.

    from wallaroo_proto.spark.datasource import register
    register(spark)  # once per session; ships the package to a cluster's executors
    frames = spark.read.format("wallaroo-capture").option("ports", "7100,7200").load("captures/")
    frames = spark.read.format("wallaroo-capture").load("s3://bucket/prefix/")  # any fsspec URL: remote.py

Options (all optional):

``ports``
    comma-separated TCP ports to read (default: each protocol's own; connections
    that open with a known protocol are found on any port).
``protocol``
    read every connection as this protocol (``protocols.names()``), as ``dissect --protocol``.
``maxFrameSize``
    frames longer than this many bytes are taken for damage (the dissector's resync).
``mode``
    what a capture that cannot be read (missing, not a capture, truncated) does, as
    Spark's CSV and JSON readers name it: ``PERMISSIVE`` (default) keeps its frames
    before the damage and adds one row naming it, with the reason in the
    ``_problem`` column (null on every frame); ``DROPMALFORMED`` keeps the frames
    and leaves the reason out (no ``_problem`` column); ``FAILFAST`` fails the query.
``parallelism``
    the cluster's task slots, for splitting big captures (default: the driver's CPUs).
``splitBytes``
    split captures into parts of about this size instead.
``batchRows``
    rows per Arrow batch (default 8192).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from wallaroo_proto import records
from wallaroo_proto.spark import frames as frames_mod
from wallaroo_proto.spark import remote

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from wallaroo_proto.capture.frame_block import FrameBlock

NAME = "wallaroo-capture"
MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
PROBLEM_COLUMN = frames_mod.PROBLEM_COLUMN
DEFAULT_BATCH_ROWS = 8192


class OptionError(ValueError):
    """An option of the data source has a value it cannot use: which one and why."""


@dataclass(frozen=True)
class ReadOptions:
    """The data source's options, checked once on the driver."""

    paths: tuple[str, ...]
    ports: tuple[int, ...] | None = None
    protocol: str | None = None
    max_frame_size: int | None = None
    mode: str = "PERMISSIVE"
    parallelism: int = 1
    split_bytes: int | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """From Spark's options (case-insensitive keys); ``path`` or ``paths`` is what ``load`` gave."""
        get = {k.lower(): v for k, v in options.items()}.get
        if get("paths"):
            paths = tuple(json.loads(get("paths")))
        elif get("path"):
            paths = (get("path"),)
        else:
            paths = frames_mod.DEFAULT_PATHS
        mode = (get("mode") or "PERMISSIVE").upper()
        if mode not in MODES:
            raise OptionError(f"option mode={get('mode')!r}: expected one of {', '.join(MODES)}")
        protocol = get("protocol") or None
        if protocol is not None:
            from wallaroo_proto.protocols import get_plugin

            try:
                get_plugin(protocol)
            except KeyError as err:
                raise OptionError(f"option protocol: {err.args[0]}") from None
        ports = None
        if get("ports"):
            ports = tuple(
                _number("ports", part, 1, 65535) for part in get("ports").split(",") if part.strip()
            )
        return cls(
            paths=paths,
            ports=ports,
            protocol=protocol,
            max_frame_size=_optional_number(get, "maxFrameSize", 1),
            mode=mode,
            parallelism=_optional_number(get, "parallelism", 1) or os.cpu_count() or 1,
            split_bytes=_optional_number(get, "splitBytes", 1),
            batch_rows=_optional_number(get, "batchRows", 1) or DEFAULT_BATCH_ROWS,
        )


def _number(option: str, text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {option}={text!r}: not a whole number") from None
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f"at least {low}"
        raise OptionError(f"option {option}={text!r}: must be {bound}")
    return value


def _optional_number(get, option: str, low: int) -> int | None:
    text = get(option.lower())
    return None if text in (None, "") else _number(option, text, low)


def frame_schema(mode: str = "PERMISSIVE") -> StructType:
    """The frames' schema; in ``PERMISSIVE`` mode with the ``_problem`` column last."""
    from pyspark.sql import types as T  # noqa: N812

    schema = records.spark_schema()
    if mode != "PERMISSIVE":
        return schema
    return T.StructType([*schema.fields, T.StructField(PROBLEM_COLUMN, T.StringType(), True)])


class CapturePart(InputPartition):
    """One task: part ``part`` of ``nparts`` of a capture, or a path that named nothing (``problem``)."""

    def __init__(self, path: str, name: str, part: int, nparts: int, problem: str | None = None) -> None:
        super().__init__((path, part))
        self.path, self.name, self.part, self.nparts, self.problem = path, name, part, nparts, problem


def plan_partitions(options: ReadOptions) -> list[CapturePart]:
    """Driver side: the captures' parts, largest first, then one per path that named nothing."""
    captures, listing_problems = frames_mod.list_captures(options.paths)
    if listing_problems and options.mode == "FAILFAST":
        first = listing_problems[0]
        raise frames_mod.CaptureFailed(f"{frames_mod.FAIL_FAST_MARK} {first.capture}: {first.error}")
    tasks = frames_mod.plan_tasks(captures, options.parallelism, options.split_bytes)
    parts = [CapturePart(*task) for task in tasks]
    if options.mode == "PERMISSIVE":
        parts += [CapturePart("", p.capture, 0, 1, p.error) for p in listing_problems]
    return parts


class CaptureReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[CapturePart]:
        return plan_partitions(self.options)

    def read(self, partition: CapturePart) -> Iterator[pa.RecordBatch]:
        return read_part(partition, self.options, self.schema)


class CaptureDataSource(DataSource):
    """``spark.read.format("wallaroo-capture")``: the frame records of pcap and pcapng captures."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.read_options = ReadOptions.parse(options)

    def schema(self) -> StructType:
        return frame_schema(self.read_options.mode)

    def reader(self, schema: StructType) -> CaptureReader:
        return CaptureReader(self.read_options, schema)


# --- executor side -------------------------------------------------------------------------


def arrow_types(schema: StructType) -> tuple[pa.StructType, pa.StructType]:
    """The Arrow row type Spark expects for ``schema``, and the one records are built in.

    They differ only where a ``u64`` is ``decimal(20,0)``: records hold Python
    ints, which Arrow takes as ``uint64`` in C and casts to the decimal exactly.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    target = pa.struct(list(to_arrow_schema(schema, timezone="UTC")))
    u64 = pa.decimal128(20, 0)

    def built(kind: pa.DataType) -> pa.DataType:
        if kind == u64:
            return pa.uint64()
        if pa.types.is_list(kind):
            return pa.list_(kind.value_field.with_type(built(kind.value_type)))
        if pa.types.is_struct(kind):
            return pa.struct([field.with_type(built(field.type)) for field in kind])
        return kind

    return target, built(target)


def to_batch(rows: list[dict], target: pa.StructType, build: pa.StructType) -> pa.RecordBatch:
    """Record dicts to one Arrow batch: each field looked up by name in C (absent keys are nulls)."""
    import pyarrow as pa

    array = pa.array(rows, type=build)
    if build != target:
        array = array.cast(target)
    return pa.RecordBatch.from_struct_array(array)


class _Batcher:
    """Record dicts and blocks of frames, in order, to Arrow batches of ``size`` rows (the last fewer).

    A batch of dicts only is converted as before, each field looked up by name in
    C. Once a block comes, each field's values are gathered into one Python list,
    which Arrow converts in one call: a block gives its column as it is and its
    shared values repeated, the dicts before it the fields they hold; a field no
    frame of the batch has is one null array. No dict is made for a block's
    frames, and no call is made per frame and field.
    """

    def __init__(self, target: pa.StructType, build: pa.StructType, size: int) -> None:
        self.target, self.build, self.size = target, build, size
        self.wanted = frozenset(field.name for field in build)  # a narrower schema takes fewer fields
        self.dicts: list[dict] = []  # dicts not yet in ``columns``
        self.columns: dict[str, list] = {}  # the fields some frame has, padded with None
        self.count = 0  # rows in ``columns``

    def add(self, item: dict | FrameBlock) -> Iterator[pa.RecordBatch]:
        if type(item) is dict:
            self.dicts.append(item)
        else:
            self._settle()
            size = len(item)
            wanted = self.wanted
            for name, values in item.columns().items():
                if name in wanted:
                    self._column(name).extend(values)
            for name, value in item.shared.items():
                if name in wanted:
                    self._column(name).extend([value] * size)
            self._pad(size)
        while self.count + len(self.dicts) >= self.size:
            yield self.flush()

    def _column(self, name: str) -> list:
        column = self.columns.get(name)
        if column is None:
            column = self.columns[name] = [None] * self.count
        return column

    def _pad(self, added: int) -> None:
        self.count += added
        for column in self.columns.values():
            if len(column) < self.count:
                column.extend([None] * (self.count - len(column)))

    def _settle(self) -> None:
        """The waiting dicts into ``columns``, one list comprehension a field they hold."""
        dicts = self.dicts
        if dicts:
            for name in self.wanted & set().union(*dicts):
                self._column(name).extend([record.get(name) for record in dicts])
            self._pad(len(dicts))
            self.dicts = []

    def flush(self) -> pa.RecordBatch:
        """The first ``size`` rows (all of them, when fewer) as one batch; the rest stay."""
        import pyarrow as pa

        if self.count:
            self._settle()
            size = min(self.size, self.count)
            arrays = []
            for field in self.build:
                column = self.columns.get(field.name)
                if column is None:
                    arrays.append(pa.nulls(size, type=field.type))
                else:
                    arrays.append(pa.array(column[:size], type=field.type))
                    del column[:size]
            self.count -= size
            if not self.count:
                self.columns = {}  # the next batch may be dicts only again
            array = pa.StructArray.from_arrays(arrays, fields=list(self.build))
        else:
            array = pa.array(self.dicts[: self.size], type=self.build)
            del self.dicts[: self.size]
        if self.build != self.target:
            array = array.cast(self.target)
        return pa.RecordBatch.from_struct_array(array)

    def __len__(self) -> int:
        return self.count + len(self.dicts)


def read_part(part: CapturePart, options: ReadOptions, schema: StructType) -> Iterator[pa.RecordBatch]:
    """The frames of one capture part as Arrow batches, then the row naming its damage if any.

    Only part 0 names a damaged capture, so each capture is named once.
    """
    from wallaroo_proto.capture.pcap import CaptureError

    target, build = arrow_types(schema)
    if part.problem is not None:
        yield to_batch([{"capture": part.name, PROBLEM_COLUMN: part.problem}], target, build)
        return
    connection_filter = None if part.nparts == 1 else frames_mod.PartFilter(part.part, part.nparts)
    batcher = _Batcher(target, build, options.batch_rows)
    try:
        with contextlib.ExitStack() as stack:
            source = part.path
            if remote.is_url(source):  # read in ranged blocks as the dissector goes, not fetched first
                source = stack.enter_context(remote.open_url(source))
            for item in records.iter_records(
                source,
                ports=options.ports,
                protocol=options.protocol,
                connection_filter=connection_filter,
                capture_name=part.name,
                max_frame_size=options.max_frame_size,
                blocks=True,
            ):
                yield from batcher.add(item)
    except (CaptureError, OSError) as err:
        message = str(err) if isinstance(err, CaptureError) else f"cannot read: {err}"
        if options.mode == "FAILFAST":
            raise frames_mod.CaptureFailed(f"{frames_mod.FAIL_FAST_MARK} {part.name}: {message}") from None
        if part.part == 0 and options.mode == "PERMISSIVE":
            problem = {"capture": part.name, PROBLEM_COLUMN: message}
            if isinstance(err, CaptureError):
                problem.update(packet=err.packet, offset=err.offset)
            yield from batcher.add(problem)
    while len(batcher):
        yield batcher.flush()


def register(spark: SparkSession) -> None:
    """Make ``format("wallaroo-capture")`` known to this session.

    The Python workers that plan and read import this package; a session not
    started by ``session.build_session`` is given it as a zip (``addPyFile``)
    first, so they find it on any master without installing anything. They
    still need pyarrow: set ``PYSPARK_PYTHON`` to an interpreter that has it.
    """
    from wallaroo_proto.spark.session import ship_package

    ship_package(spark.sparkContext)
    spark.dataSource.register(CaptureDataSource)
