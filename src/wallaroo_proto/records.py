"""The per-frame record: one schema for `dissect --format jsonl` and `spark-replay`.

A field is (name, type, meaning). Every record has the common fields defined
here (``CONNECTION_FIELDS``, ``FRAME_FIELDS``); each protocol plug-in declares
its own (``ProtocolPlugin.connection_fields`` and ``record_fields``), and
``join_fields`` joins them: ``protocols.schema.fields()`` is the join of the
registered plug-ins. This module imports no other of the package: it is the
vocabulary the others share. Records are plain dicts holding the
fields that apply to their frame (others are absent, which JSON readers and
Spark read as null). Types are ``string``, ``int`` (32-bit),
``long`` (signed 64-bit), ``u64`` (unsigned 64-bit protocol values: stream and
message ids, points of reference; Spark has no unsigned long, so its tables hold
them as a ``long`` of the same 64 bits, ``spark_type``), ``double``,
``boolean``, ``array<string>`` and arrays of the structs the plug-ins declare
(``ProtocolPlugin.structs``: JSON objects with those keys, e.g. Wallaroo's
``"acks": [{"stream_id": 1, "point_of_ref": 9}]``).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

#: A record field: (name, type, meaning).
Field = tuple[str, str, str]
#: What an ``array<struct:K>`` field holds: struct K's (key, scalar type) pairs, in order.
Struct = tuple[tuple[str, str], ...]

#: The types a struct's key may have.
SCALAR_KINDS = frozenset({"string", "int", "long", "u64", "double", "boolean"})
#: The types a field may have, besides ``array<struct:K>`` for each K a plug-in declares
#: (``ProtocolPlugin.structs``).
FIELD_KINDS = SCALAR_KINDS | {"array<string>"}

#: Every record's fields about its connection: the first columns, then the plug-ins' connection fields.
CONNECTION_FIELDS: tuple[Field, ...] = (
    ("capture", "string", "capture file name (as given)"),
    (
        "protocol",
        "string",
        "the connection's protocol: wallaroo, kinesis, dcp, ambrosia, tremor (protocols.names())",
    ),
    ("connection", "string", "connection id: 'initiator addr:port > responder addr:port'"),
    ("conn_index", "int", "connection number in the capture, 1-based, in the order recognised"),
    ("initiator_addr", "string", "address of the side that sent HELLO (or opened TCP)"),
    ("initiator_port", "int", "its TCP port"),
    ("responder_addr", "string", "address of the other side"),
    ("responder_port", "int", "its TCP port"),
)

#: Every record's fields about its frame: after the connection fields, then the plug-ins' own fields.
FRAME_FIELDS: tuple[Field, ...] = (
    ("sender", "string", "'connector' or 'worker': the side that sent the frame"),
    ("direction", "string", "'initiator>responder' or 'responder>initiator'"),
    ("ts", "double", "capture timestamp of the packet completing the frame, seconds since epoch"),
    ("ts_ns", "long", "the same in nanoseconds (exact for pcapng/ns pcap)"),
    ("packet", "long", "packet number (1-based) completing the frame (see docs/dissect.md)"),
    ("offset", "long", "byte offset of the frame's length prefix in its direction's stream"),
    ("length", "long", "frame bytes on the wire, 4-byte length prefix included"),
    ("frame_index", "long", "frame number in the connection, 0-based, both directions, in capture order"),
    ("type", "string", "frame type name: HELLO, OK, ..., WORKERS_LEFT, or UNKNOWN(n)"),
    ("verdict", "string", "protocol core verdict: accepted, replayed, ignored, violation, malformed"),
    ("violations", "array<string>", "protocol violations found at this frame"),
    ("notes", "array<string>", "capture notes: gap or mid-connection start before it, resync"),
    ("severity", "string", "the plug-in's finding at this frame, if any: error, warning or note"),
    ("finding", "string", "what this frame shows happened and why (a rollback and its cause, ...)"),
)

COMMON_FIELDS: tuple[Field, ...] = CONNECTION_FIELDS + FRAME_FIELDS


class FieldClash(ValueError):
    """Plug-ins' field declarations that cannot be joined into one schema."""


def join_structs(plugins: Iterable[Any]) -> dict[str, Struct]:
    """The plug-ins' structs (``ProtocolPlugin.structs``) in one table: a name two declare is one
    struct, and they must declare it alike."""
    joined: dict[str, Struct] = {}
    owner: dict[str, str] = {}
    for plugin in plugins:
        for name, keys in plugin.structs.items():
            where = f"protocol {plugin.name!r} struct {name!r}"
            if any(kind not in SCALAR_KINDS for _, kind in keys):
                raise FieldClash(f"{where}: a key's type is not one of {', '.join(sorted(SCALAR_KINDS))}")
            if name in joined and joined[name] != tuple(keys):
                raise FieldClash(f"{where} differs from protocol {owner[name]!r}'s")
            joined.setdefault(name, tuple(keys))
            owner.setdefault(name, plugin.name)
    return joined


def join_fields(plugins: Iterable[Any]) -> list[Field]:
    """The common fields and the plug-ins' in one schema, in the order of ``FIELDS``.

    The connection fields, each plug-in's ``connection_fields``, the frame fields,
    then each plug-in's ``record_fields``, plug-ins in the order given. A name two
    plug-ins declare is one column, where it first comes, with their meanings
    joined by "; "; they must give it the same type.
    """
    plugins = tuple(plugins)
    kinds = FIELD_KINDS | {f"array<struct:{name}>" for name in join_structs(plugins)}
    common = {name for name, _, _ in COMMON_FIELDS}
    joined: dict[str, Field] = {}
    owner: dict[str, str] = {}
    declared: set[tuple[str, str]] = set()

    def add(protocol: str, fields: Iterable[Field]) -> None:
        for name, kind, meaning in fields:
            where = f"protocol {protocol!r} field {name!r}"
            if name in common:
                raise FieldClash(f"{where}: every record has it already (a common field)")
            if (protocol, name) in declared:
                raise FieldClash(f"{where}: declared twice")
            declared.add((protocol, name))
            if kind not in kinds:
                raise FieldClash(f"{where}: unknown type {kind!r} (known: {', '.join(sorted(kinds))})")
            if name not in joined:
                joined[name], owner[name] = (name, kind, meaning), protocol
            elif kind != joined[name][1]:
                raise FieldClash(
                    f"{where} is {kind}, but protocol {owner[name]!r} declares it {joined[name][1]}"
                )
            else:
                joined[name] = (name, kind, f"{joined[name][2]}; {meaning}")

    joined.update((field[0], field) for field in CONNECTION_FIELDS)
    for plugin in plugins:
        add(plugin.name, plugin.connection_fields)
    joined.update((field[0], field) for field in FRAME_FIELDS)
    for plugin in plugins:
        add(plugin.name, plugin.record_fields)
    return list(joined.values())


class ConnectionKey(NamedTuple):
    """Direction-independent id of a TCP connection: the lower endpoint first."""

    addr_a: str
    port_a: int
    addr_b: str
    port_b: int


def flow_hash(key: tuple) -> int:
    """A hash of a connection's part key (str and int values) that is the same in every process."""
    return zlib.crc32("|".join(map(str, key)).encode())


#: The columns that name one frame in every Spark table: ``frames`` and each ``<protocol>_frames``
#: join on them (a connection's number is unique within its capture, a frame's within its connection).
FRAME_KEY = ("capture", "conn_index", "frame_index")

#: What Spark's tables are made of: ``frames`` (the common fields of every frame), and one
#: table per protocol (the frame key and that plug-in's own fields). ``ALL`` is the read
#: spark-replay makes once: the common fields and one struct column per protocol, named by
#: it, holding that plug-in's fields (null on the other protocols' rows).
FRAMES_TABLE, ALL_TABLE = "frames", "all"


def protocol_table(protocol: str) -> str:
    return f"{protocol}_frames"


def spark_type(kind: str, structs: Mapping[str, Struct]):
    """A field type as Spark's (imports pyspark); ``structs`` holds the structs its arrays may hold.

    ``u64`` is a ``long`` holding the same 64 bits: exact, and a value from 2^63 up reads
    negative (add 2^64, or use ``spark.u64``). ``ts`` alone is a ``timestamp``
    (see ``protocols.schema.spark_schema``).
    """
    from pyspark.sql import types as T  # noqa: N812

    scalars = {
        "string": T.StringType(),
        "int": T.IntegerType(),
        "long": T.LongType(),
        "u64": T.LongType(),
        "double": T.DoubleType(),
        "boolean": T.BooleanType(),
    }
    if kind in scalars:
        return scalars[kind]
    if kind == "array<string>":
        return T.ArrayType(T.StringType())
    struct_name = kind[len("array<struct:") : -1]
    fields = [T.StructField(n, scalars[k]) for n, k in structs[struct_name]]
    return T.ArrayType(T.StructType(fields))


#: Fields that are times: Spark ``timestamp`` columns (microseconds, UTC); ``ts_ns`` keeps nanoseconds.
TIMESTAMP_FIELDS = frozenset({"ts"})


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def to_json(record: dict) -> str:
    """One JSONL line (without the newline); private keys (leading '_') are left out."""
    if "_raw" in record:
        record = {k: v for k, v in record.items() if not k.startswith("_")}
    return _encode(record)
