"""Captures as a Spark data source: ``spark.read.format("wallaroo-capture").load(paths)``.

A Python data source (Spark 4's ``pyspark.sql.datasource``). The driver lists
the captures and plans one partition per capture part (``plan.plan_tasks``:
a capture much larger than its share of the cluster is split by connection);
each executor task dissects its part with the dissector's own
``capture.dissector.iter_records`` and hands Spark whole Arrow record batches, so no
Python row is converted one by one in the JVM. A load reads one table
(``protocols.schema.spark_schema(table)``, nothing named here): ``frames``, what every
frame has; ``<protocol>_frames``, the frame key and one plug-in's own fields, of
that protocol's connections only (the others are not dissected); or ``all``, the
common fields and one struct column per protocol (spark-replay's single read).
Unsigned 64-bit values (``u64`` fields) are ``long`` columns holding their 64
bits; ``ts`` is a ``timestamp``.

    from wallaroo_proto.spark.datasource import register
    register(spark)  # once per session; ships the package to a cluster's executors
    dcp = spark.read.format("wallaroo-capture").option("table", "dcp_frames").load("captures/")
    frames = spark.read.format("wallaroo-capture").load("s3://bucket/prefix/")  # any fsspec URL: remote.py

Options (all optional):

``table``
    ``frames`` (default), ``<protocol>_frames`` or ``all`` (``protocols.schema.table_names()``).

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
``pushFilters``
    ``true``: the query's filters on ``capture``, ``protocol``, ``conn_index`` and ``ts``
    let tasks skip captures, connections and frames (``pushdown``); Spark requires
    ``spark.sql.python.filterPushdown.enabled`` for it. Default: that setting's value when
    ``register`` ran (spark-replay's session turns it on).
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
from wallaroo_proto.capture.dissector import iter_records
from wallaroo_proto.capture.frame_block import SHARED, FrameBlock
from wallaroo_proto.capture.pcap import CaptureError
from wallaroo_proto.protocols import get_plugin
from wallaroo_proto.protocols.schema import field_types, spark_schema, structs, table_names
from wallaroo_proto.spark import plan, remote
from wallaroo_proto.spark.pushdown import Skip
from wallaroo_proto.spark.session import ship_package

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

NAME = "wallaroo-capture"
#: Spark's switch for Python data sources' filter pushdown (PySpark 4.1+).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
PROBLEM_COLUMN = plan.PROBLEM_COLUMN
DEFAULT_BATCH_ROWS = 8192


class OptionError(ValueError):
    """An option of the data source has a value it cannot use: which one and why."""


@dataclass(frozen=True)
class ReadOptions:
    """The data source's options, checked once on the driver."""

    paths: tuple[str, ...]
    table: str = records.FRAMES_TABLE
    ports: tuple[int, ...] | None = None
    protocol: str | None = None
    max_frame_size: int | None = None
    mode: str = "PERMISSIVE"
    parallelism: int = 1
    split_bytes: int | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    #: The ``pushFilters`` option: None leaves it to the session (``CaptureDataSource.push_filters``).
    push_filters: bool | None = None

    @property
    def protocols(self) -> tuple[str, ...] | None:
        """The protocols whose connections a read of ``table`` dissects (None: every one)."""
        if self.table in (records.FRAMES_TABLE, records.ALL_TABLE):
            return None
        return (self.table.removesuffix("_frames"),)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """From Spark's options (case-insensitive keys); ``path`` or ``paths`` is what ``load`` gave."""
        get = {k.lower(): v for k, v in options.items()}.get
        if get("paths"):
            paths = tuple(json.loads(get("paths")))
        elif get("path"):
            paths = (get("path"),)
        else:
            paths = plan.DEFAULT_PATHS
        mode = (get("mode") or "PERMISSIVE").upper()
        if mode not in MODES:
            raise OptionError(f"option mode={get('mode')!r}: expected one of {', '.join(MODES)}")
        table = get("table") or records.FRAMES_TABLE
        if table not in table_names():
            raise OptionError(f"option table={table!r}: expected one of {', '.join(table_names())}")
        protocol = get("protocol") or None
        if protocol is not None:
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
            table=table,
            ports=ports,
            protocol=protocol,
            max_frame_size=_optional_number(get, "maxFrameSize", 1),
            mode=mode,
            parallelism=_optional_number(get, "parallelism", 1) or os.cpu_count() or 1,
            split_bytes=_optional_number(get, "splitBytes", 1),
            batch_rows=_optional_number(get, "batchRows", 1) or DEFAULT_BATCH_ROWS,
            push_filters=_optional_bool(get, "pushFilters"),
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


def _optional_bool(get, option: str) -> bool | None:
    text = get(option.lower())
    if text in (None, ""):
        return None
    if text.strip().lower() not in ("true", "false"):
        raise OptionError(f"option {option}={text!r}: expected true or false")
    return text.strip().lower() == "true"


def _optional_number(get, option: str, low: int) -> int | None:
    text = get(option.lower())
    return None if text in (None, "") else _number(option, text, low)


def frame_schema(mode: str = "PERMISSIVE", table: str = records.FRAMES_TABLE) -> StructType:
    """A table's schema (``protocols.schema.spark_schema``); PERMISSIVE mode adds the ``_problem``
    column last."""
    from pyspark.sql import types as T  # noqa: N812

    struct = spark_schema(table)
    if mode != "PERMISSIVE":
        return struct
    return T.StructType([*struct.fields, T.StructField(PROBLEM_COLUMN, T.StringType(), True)])


class CapturePart(InputPartition):
    """One task: part ``part`` of ``nparts`` of a capture, or a path that named nothing (``problem``)."""

    def __init__(self, path: str, name: str, part: int, nparts: int, problem: str | None = None) -> None:
        super().__init__((path, part))
        self.path, self.name, self.part, self.nparts, self.problem = path, name, part, nparts, problem


def plan_partitions(options: ReadOptions) -> list[CapturePart]:
    """Driver side: the captures' parts, largest first, then one per path that named nothing."""
    captures, listing_problems = plan.list_captures(options.paths)
    if listing_problems and options.mode == "FAILFAST":
        first = listing_problems[0]
        raise plan.CaptureFailed(f"{plan.FAIL_FAST_MARK} {first.capture}: {first.error}")
    tasks = plan.plan_tasks(captures, options.parallelism, options.split_bytes)
    parts = [CapturePart(*task) for task in tasks]
    if options.mode == "PERMISSIVE":
        parts += [CapturePart("", p.capture, 0, 1, p.error) for p in listing_problems]
    return parts


class CaptureReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.skip = Skip()

    def partitions(self) -> list[CapturePart]:
        parts = plan_partitions(self.options)
        wanted = self.skip.captures
        return parts if wanted is None else [part for part in parts if part.name in wanted]

    def read(self, partition: CapturePart) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, CapturePart):  # Spark's stand-in when no capture is left to read
            return iter(())
        return read_part(partition, self.options, self.schema, self.skip)


class FilteringCaptureReader(CaptureReader):
    """A reader that takes the query's filters: Spark refuses a reader with ``pushFilters`` while
    ``spark.sql.python.filterPushdown.enabled`` is off, so this one is used only when it is on."""

    def pushFilters(self, filters: list) -> Iterator:  # noqa: N802 - Spark's name
        """Use what the filters say of captures, protocols, connections and times to skip work
        (``pushdown.Skip``); every filter is returned, so Spark still applies each one."""
        self.skip.take(filters)
        yield from filters


class CaptureDataSource(DataSource):
    """``spark.read.format("wallaroo-capture")``: the frame records of pcap and pcapng captures."""

    #: Whether filters are pushed when no ``pushFilters`` option says: the session's
    #: ``spark.sql.python.filterPushdown.enabled`` when ``register`` ran.
    push_filters = False

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.read_options = ReadOptions.parse(options)

    def schema(self) -> StructType:
        return frame_schema(self.read_options.mode, self.read_options.table)

    def reader(self, schema: StructType) -> CaptureReader:
        push = self.read_options.push_filters
        if push is None:
            push = self.push_filters
        return (FilteringCaptureReader if push else CaptureReader)(self.read_options, schema)


# --- executor side -------------------------------------------------------------------------


class Shape:
    """How flat record fields become the rows of one table's Arrow batches (executor side).

    Records hold Python values: a ``u64`` is built as ``uint64`` and cast to the ``long`` Spark
    reads (the same 64 bits, no decimal made per value); ``ts`` is made from ``ts_ns`` as a
    microsecond timestamp; on the ``all`` table each protocol's struct column is built from its
    plug-in's fields, and is null on the rows of other protocols.
    """

    def __init__(self, schema: StructType) -> None:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        self.target = to_arrow_schema(schema, timezone="UTC")
        kinds = field_types()
        #: The flat fields records give this table, and the Arrow type each is built in.
        self.build: dict[str, pa.DataType] = {}

        def built(name: str, kind: pa.DataType) -> pa.DataType:
            if name == "ts":
                return pa.float64()
            field_kind = kinds.get(name, "")
            if field_kind == "u64":
                return pa.uint64()
            if field_kind.startswith("array<struct:"):
                parts = structs()[field_kind[len("array<struct:") : -1]]
                u64 = {part for part, part_kind in parts if part_kind == "u64"}
                return pa.list_(
                    pa.struct([f.with_type(pa.uint64()) if f.name in u64 else f for f in kind.value_type])
                )
            return kind

        self.structs: dict[str, pa.StructType] = {}
        for field in self.target:
            if pa.types.is_struct(field.type) and field.name not in kinds:
                self.structs[field.name] = field.type
                for child in field.type:
                    self.build.setdefault(child.name, built(child.name, child.type))
            else:
                self.build[field.name] = built(field.name, field.type)
        if "ts" in self.build:
            self.build.setdefault("ts_ns", pa.int64())

    def batch(self, columns: dict[str, pa.Array]) -> pa.RecordBatch:
        """Flat arrays by field name (``build``'s types, one length) to a batch of ``target``."""
        import pyarrow as pa
        import pyarrow.compute as pc

        def final(array: pa.Array, kind: pa.DataType) -> pa.Array:
            return array if array.type == kind else array.cast(kind, safe=False)

        out = []
        for field in self.target:
            name = field.name
            if name in self.structs:
                children = [final(columns[child.name], child.type) for child in field.type]
                others = pc.fill_null(pc.not_equal(columns["protocol"], name), True)
                out.append(pa.StructArray.from_arrays(children, fields=list(field.type), mask=others))
            elif name == "ts" and pa.types.is_timestamp(field.type):  # a user's schema may ask for seconds
                out.append(pc.divide(columns["ts_ns"], 1000).cast(field.type))
            else:
                out.append(final(columns[name], field.type))
        return pa.RecordBatch.from_arrays(out, schema=self.target)

    def of_dicts(self, rows: list[dict]) -> pa.RecordBatch:
        """Record dicts to one batch: each field looked up by name in C (absent keys are nulls)."""
        import pyarrow as pa

        build = pa.struct([pa.field(name, kind) for name, kind in self.build.items()])
        array = pa.array(rows, type=build)
        return self.batch({name: array.field(name) for name in self.build})


class _Batcher:
    """Record dicts and blocks of frames, in order, to Arrow batches of ``size`` rows (the last fewer).

    A batch of dicts only is converted as before, each field looked up by name in
    C. Once a block comes, each field's values are gathered into one Python list,
    which Arrow converts in one call: a block gives its column as it is and its
    shared values repeated, the dicts before it the fields they hold; a field no
    frame of the batch has is one null array. No dict is made for a block's
    frames, and no call is made per frame and field.
    """

    def __init__(self, shape: Shape, size: int) -> None:
        self.shape, self.size = shape, size
        self.wanted = frozenset(shape.build)  # a narrower table takes fewer fields
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

        if not self.count:
            rows = self.dicts[: self.size]
            del self.dicts[: self.size]
            return self.shape.of_dicts(rows)
        self._settle()
        size = min(self.size, self.count)
        arrays = {}
        for name, kind in self.shape.build.items():
            column = self.columns.get(name)
            if column is None:
                arrays[name] = pa.nulls(size, type=kind)
            else:
                arrays[name] = pa.array(column[:size], type=kind)
                del column[:size]
        self.count -= size
        if not self.count:
            self.columns = {}  # the next batch may be dicts only again
        return self.shape.batch(arrays)

    def __len__(self) -> int:
        return self.count + len(self.dicts)


def read_part(
    part: CapturePart, options: ReadOptions, schema: StructType, skip: Skip | None = None
) -> Iterator[pa.RecordBatch]:
    """The frames of one capture part as Arrow batches, then the row naming its damage if any.

    Only part 0 names a damaged capture, so each capture is named once. ``skip`` (the query's
    filters) leaves out connections and frames the query would drop.
    """
    shape = Shape(schema)
    if part.problem is not None:
        yield shape.of_dicts([{"capture": part.name, PROBLEM_COLUMN: part.problem}])
        return
    skip = skip or Skip()
    connection_filter = None if part.nparts == 1 else plan.PartFilter(part.part, part.nparts)
    protocols = options.protocols
    if skip.protocols is not None:
        protocols = tuple(skip.protocols if protocols is None else skip.protocols & set(protocols))
    batcher = _Batcher(shape, options.batch_rows)
    try:
        with contextlib.ExitStack() as stack:
            source = part.path
            if remote.is_url(source):  # read in ranged blocks as the dissector goes, not fetched first
                source = stack.enter_context(remote.open_url(source))
            items = iter_records(
                source,
                ports=options.ports,
                protocol=options.protocol,
                protocols=protocols,
                conn_indexes=skip.conn_indexes,
                connection_filter=connection_filter,
                capture_name=part.name,
                max_frame_size=options.max_frame_size,
                blocks=True,
            )
            for item in _in_time(items, skip) if skip.by_time else items:
                yield from batcher.add(item)
    except (CaptureError, OSError) as err:
        message = str(err) if isinstance(err, CaptureError) else f"cannot read: {err}"
        if options.mode == "FAILFAST":
            raise plan.CaptureFailed(f"{plan.FAIL_FAST_MARK} {part.name}: {message}") from None
        if part.part == 0 and options.mode == "PERMISSIVE":
            problem = {"capture": part.name, PROBLEM_COLUMN: message}
            if isinstance(err, CaptureError):
                problem.update(packet=err.packet, offset=err.offset)
            yield from batcher.add(problem)
    while len(batcher):
        yield batcher.flush()


def _in_time(items: Iterator[dict | FrameBlock], skip: Skip) -> Iterator[dict | FrameBlock]:
    """The records and blocks inside ``skip``'s time range (a block cut to its rows inside it)."""
    for item in items:
        if type(item) is dict:
            if skip.in_time(item.get("ts_ns")):
                yield item
            continue
        if "ts_ns" in item.shared:
            if skip.in_time(item.shared["ts_ns"]):
                yield item
            continue
        at = [name for name, kind in item.layout if kind != SHARED].index("ts_ns")
        rows = [row for row in item.rows if skip.in_time(row[at])]
        if rows:
            yield FrameBlock(item.layout, item.shared, rows)


def register(spark: SparkSession) -> None:
    """Make ``format("wallaroo-capture")`` known to this session.

    The Python workers that plan and read import this package; a session not
    started by ``session.build_session`` is given it as a zip (``addPyFile``)
    first, so they find it on any master without installing anything. They
    still need pyarrow: set ``PYSPARK_PYTHON`` to an interpreter that has it.
    """
    ship_package(spark.sparkContext)
    pushing = spark.conf.get(PUSHDOWN_CONF, "false").strip().lower() == "true"
    # A class made here is pickled whole to the Python workers, with what the session said.
    source = type(
        "CaptureDataSource", (CaptureDataSource,), {"push_filters": pushing, "__module__": __name__}
    )
    spark.dataSource.register(source)
