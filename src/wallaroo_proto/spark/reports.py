"""The tables spark-replay offers, derived from the ``frames`` DataFrame by Spark (no collect).

The views over every protocol's frames are here (``connections``, ``violations``,
``findings``); each plug-in brings its own reports (``ProtocolPlugin.spark_reports``,
in its package's ``spark.py``), which see its rows only. ``build_tables`` makes them
all from one read of the data source's ``all`` table. A connection is identified by
``(capture, connection, conn_index)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from wallaroo_proto.display_filter import u64_column
from wallaroo_proto.protocols import names, plugins, schema, table_name
from wallaroo_proto.records import COMMON_FIELDS, FRAME_KEY, protocol_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CONN = ("capture", "connection", "conn_index")


def _f():
    from pyspark.sql import functions as F  # noqa: N812

    return F


def violations(frames: DataFrame) -> DataFrame:
    """Every protocol's violations, one row each, with the frame where it happened.

    Common to every protocol, so a query over it misses none; a protocol's own ``<protocol>_violations``
    adds its fields (vbucket, shard, ...).
    """
    F = _f()  # noqa: N806
    return (
        frames.where(F.size("violations") > 0)
        .select(
            "capture",
            "protocol",
            "connection",
            "conn_index",
            "packet",
            "offset",
            "frame_index",
            "sender",
            "type",
            "verdict",
            F.explode("violations").alias("reason"),
        )
        .orderBy("capture", "conn_index", "frame_index")
    )


def findings(frames: DataFrame) -> DataFrame:
    """Every protocol's findings, one row each (``findings.of_record``): a frame's violations are
    errors, its capture notes warnings, and its plug-in's finding has the plug-in's severity."""
    F = _f()  # noqa: N806
    item = "struct<severity:string,finding:string>"
    empty = F.array().cast(f"array<{item}>")

    def each(column: str, severity: str):
        return F.transform(
            F.coalesce(F.col(column), F.array().cast("array<string>")),
            lambda text: F.struct(F.lit(severity).alias("severity"), text.alias("finding")),
        )

    own = F.when(
        F.col("finding").isNotNull(),
        F.array(F.struct(F.col("severity").alias("severity"), F.col("finding").alias("finding"))),
    ).otherwise(empty)
    about = ("capture", "protocol", "connection", "conn_index", "packet", "frame_index", "ts", "type")
    every = F.concat(each("violations", "error"), each("notes", "warning"), own)
    return (
        frames.select(*about, F.posexplode(every).alias("n", "f"))
        .orderBy("capture", "conn_index", "frame_index", "packet", "n")
        .select(*about, F.col("f.severity").alias("severity"), F.col("f.finding").alias("finding"))
    )


def connections(frames: DataFrame) -> DataFrame:
    """Per connection of every protocol: use (what it is for, as its plug-in's ``use_field`` says),
    frames (decoded ones, as the dissector counts them), bytes, violations (rows of ``violations``), span."""
    F = _f()  # noqa: N806
    use = F.coalesce(*(F.col(f"{p.name}.{p.use_field}") for p in plugins() if p.use_field))
    return (
        frames.groupBy(*CONN)
        .agg(
            F.first("protocol").alias("protocol"),
            F.first(use, ignorenulls=True).alias("use"),
            F.count(F.when(F.col("type") != "INVALID", 1)).alias("frames"),
            F.coalesce(F.sum("length"), F.lit(0)).alias("bytes"),
            F.coalesce(F.sum(F.size(F.coalesce("violations", F.array()))), F.lit(0)).alias("violations"),
            F.min("ts").alias("first_ts"),
            F.max("ts").alias("last_ts"),
        )
        .orderBy(*CONN)
    )


#: name -> (title, builder): the views over every protocol's frames, printed first.
COMMON = {
    "connections": ("Connections", connections),
    "violations": ("Protocol violations", violations),
    "findings": ("Findings: violations (error), capture notes (warning), each protocol's events", findings),
}


def view_names() -> list[str]:
    """Every view ``build_tables`` makes (and ``spark-replay`` registers), in its order."""
    names = ["frames", *(protocol_table(plugin.name) for plugin in plugins())]
    for plugin in plugins():
        names += [table_name(plugin.name, name) for name in plugin.spark_reports()]
    return [*names, *COMMON, "problems"]


def printed_views(protocols: Iterable[str]) -> list[tuple[str, str]]:
    """(view, title) of the standard tables, each title ending in its view name: the common views,
    then each protocol's reports when ``protocols`` (those in the captures) has it or its plug-in
    prints them always (``ProtocolPlugin.reports_always_printed``)."""
    present = set(protocols)
    shown = [(name, title) for name, (title, _) in COMMON.items()]
    for plugin in plugins():
        if plugin.reports_always_printed or plugin.name in present:
            shown += [(table_name(plugin.name, name), title) for name, title in plugin.report_titles.items()]
    return [(name, f"{title} ({name})") for name, title in shown]


def build_tables(everything: DataFrame, problems: DataFrame | None = None) -> dict[str, DataFrame]:
    """Every table spark-replay offers, by view name (``view_names``), from its one read of the
    data source's ``all`` table (the common fields and a struct column per protocol).

    ``frames`` holds the common fields of every frame; ``<protocol>_frames`` the frame key and the
    plug-in's own fields, of its rows (joined to ``frames`` on ``records.FRAME_KEY``). A protocol's
    reports see its rows with the common fields and its own, and are named ``<protocol>_<report>``,
    Wallaroo's by their plain names (``messages``, ``audit``, ...); the common views see every row.
    """
    F = _f()  # noqa: N806
    common = [name for name, _, _ in COMMON_FIELDS]
    tables = {"frames": everything.select(*common)}
    for plugin in plugins():
        rows = everything.where(F.col("protocol") == plugin.name)
        tables[protocol_table(plugin.name)] = rows.select(*FRAME_KEY, f"{plugin.name}.*")
    for plugin in plugins():
        mine = everything.where(F.col("protocol") == plugin.name)
        own = mine.select(
            *common, *(exact(name, F.col(f"{plugin.name}.{name}")) for name in _own(plugin.name))
        )
        for name, build in plugin.spark_reports().items():
            tables[table_name(plugin.name, name)] = build(own)
    for name, (_, build) in COMMON.items():
        tables[name] = build(everything)
    if problems is not None:
        tables["problems"] = problems
    return tables


def field_column(name: str):
    """A record field as a column of the ``all`` table: a common one as it is (``ts`` in seconds, as
    records have it), a plug-in's from the struct of each protocol that declares it."""
    F = _f()  # noqa: N806
    if name == "ts":  # as records have it: ts_ns / 1e9, the same double
        return F.col("ts_ns") / 1e9
    if any(name == common for common, _, _ in COMMON_FIELDS):
        return F.col(name)
    owners = [F.col(f"{p}.{name}") for p in names() if any(name == f for f, _, _ in schema.own_fields(p))]
    if not owners:
        raise KeyError(name)
    return owners[0] if len(owners) == 1 else F.coalesce(*owners)


def flat_columns() -> list:
    """Every field (``protocols.schema.field_names()``) as a column of the ``all`` table, as
    ``dissect --format jsonl`` records hold it: ``ts`` in seconds, u64 values exact (``exact``)."""
    F = _f()  # noqa: N806
    common = {name for name, _, _ in COMMON_FIELDS} - {"ts"}
    return [
        F.col(name) if name in common else exact(name, field_column(name)) for name in schema.field_names()
    ]


def flat_frames(everything: DataFrame) -> DataFrame:
    """The ``all`` table as flat records (``flat_columns``): for ``report``'s ladder, which reads
    any protocol's fields."""
    return everything.select(*flat_columns())


def _own(protocol: str) -> list[str]:
    return [name for name, _, _ in schema.own_fields(protocol)]


def exact(name: str, column):
    """A field's column named ``name``, its u64 values (a ``long`` of their bits in the tables) as
    exact ``decimal(20,0)``: what the reports compute on, so that their ordering, min, max and
    arithmetic hold past 2^63, and what they show."""
    F = _f()  # noqa: N806
    kind = schema.field_types().get(name, "")
    if kind == "u64":
        return u64_column(column).alias(name)
    if kind.startswith("array<struct:"):
        parts = schema.structs()[kind[len("array<struct:") : -1]]
        return F.transform(
            column,
            lambda e: F.struct(*((u64_column(e[p]) if k == "u64" else e[p]).alias(p) for p, k in parts)),
        ).alias(name)
    return column.alias(name)
