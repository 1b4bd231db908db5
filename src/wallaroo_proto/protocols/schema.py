"""The joined record schema: the common fields (``records``) and every registered plug-in's.

``fields()`` is the columns of ``dissect --format jsonl`` and of Spark's ``all`` table, in
order: the connection fields, each plug-in's ``connection_fields``, the frame fields, then
each plug-in's ``record_fields`` (``records.join_fields``). It is made on first call, not on
import: the plug-ins' own modules import the capture machinery that reads this schema.
The Spark tables (``table_names()``) and their schemas (``spark_schema``) follow from it.
"""

from __future__ import annotations

from functools import cache

from wallaroo_proto.protocols import get_plugin, names, plugins
from wallaroo_proto.records import (
    ALL_TABLE,
    COMMON_FIELDS,
    FRAME_KEY,
    FRAMES_TABLE,
    TIMESTAMP_FIELDS,
    Field,
    Struct,
    join_fields,
    join_structs,
    protocol_table,
    spark_type,
)


@cache
def fields() -> list[Field]:
    """Every column in order, (name, type, meaning) each."""
    return join_fields(plugins())


@cache
def structs() -> dict[str, Struct]:
    """The structs the ``array<struct:K>`` fields hold, K -> its (key, type) pairs."""
    return join_structs(plugins())


@cache
def field_names() -> tuple[str, ...]:
    return tuple(name for name, _, _ in fields())


@cache
def field_types() -> dict[str, str]:
    return {name: kind for name, kind, _ in fields()}


def own_fields(protocol: str) -> list[Field]:
    """A plug-in's own fields (its connection fields, then its frame fields), as Spark's tables hold them."""
    plugin = get_plugin(protocol)
    return [*plugin.connection_fields, *plugin.record_fields]


def table_names() -> tuple[str, ...]:
    """The tables the data source reads (``option("table", ...)``), ``all`` first."""
    return (ALL_TABLE, FRAMES_TABLE, *(protocol_table(name) for name in names()))


def table_fields(table: str) -> list[Field]:
    """The fields of ``frames`` or of ``<protocol>_frames`` (``ValueError`` naming the known tables)."""
    if table == FRAMES_TABLE:
        return list(COMMON_FIELDS)
    protocol = table.removesuffix("_frames")
    if table != protocol_table(protocol) or protocol not in names():
        known = ", ".join(t for t in table_names() if t != ALL_TABLE)
        raise ValueError(f"unknown table {table!r} (known: {known})")
    key = [field for field in COMMON_FIELDS if field[0] in FRAME_KEY]
    return key + own_fields(protocol)


def _spark_fields(fields: list[Field]) -> list:
    from pyspark.sql import types as T  # noqa: N812

    return [
        T.StructField(
            name, T.TimestampType() if name in TIMESTAMP_FIELDS else spark_type(kind, structs()), True
        )
        for name, kind, _ in fields
    ]


def spark_schema(table: str = ALL_TABLE):
    """The ``pyspark.sql.types.StructType`` of a Spark table (``table_names()``; imports pyspark)."""
    from pyspark.sql import types as T  # noqa: N812

    if table != ALL_TABLE:
        return T.StructType(_spark_fields(table_fields(table)))
    structs = [T.StructField(name, T.StructType(_spark_fields(own_fields(name))), True) for name in names()]
    return T.StructType([*_spark_fields(list(COMMON_FIELDS)), *structs])
