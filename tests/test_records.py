"""The record schema: the common fields joined with each protocol plug-in's own, in a fixed column order."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
from pathlib import Path

import pytest

from wallaroo_proto import protocols, records
from wallaroo_proto.capture.dissector import iter_records
from wallaroo_proto.protocols import get_plugin, plugins
from wallaroo_proto.protocols.schema import (
    field_names,
    field_types,
    fields,
    spark_schema,
    structs,
    table_names,
)
from wallaroo_proto.records import COMMON_FIELDS, FieldClash, join_fields

CAPTURES = Path(__file__).resolve().parent.parent / "captures"

# The columns of `dissect --format jsonl` and spark-replay's `frames`, in their order, with
# their types: Spark tables and readers of the columns rely on both, so they never move.
COLUMNS = """
capture string
protocol string
connection string
conn_index int
initiator_addr string
initiator_port int
responder_addr string
responder_port int
use string
sender string
direction string
ts double
ts_ns long
packet long
offset long
length long
frame_index long
type string
verdict string
violations array<string>
notes array<string>
severity string
finding string
version string
cookie_b64 string
cookie_len int
program_name string
instance_name string
initial_credits long
reason string
stream_id u64
stream_name string
point_of_ref u64
success boolean
message_id u64
event_time long
key_b64 string
key_len int
payload_b64 string
payload_len long
credits long
acks array<struct:ack>
address string
rtag u64
worker_names array<string>
twopc string
txn_id string
txn_ids array<string>
where array<struct:where>
commit boolean
line_number long
shard_id string
sequence_number string
sub_sequence_number long
record_count long
millis_behind_latest long
response_for string
latency double
checkpoint_error string
dcp_magic int
dcp_opcode int
opaque long
vbucket int
status string
dcp_key string
value_len long
dcp_stream_id int
seqno u64
rev_seqno u64
snap_start u64
snap_end u64
snap_flags int
start_seqno u64
end_seqno u64
vb_uuid u64
rollback_seqno u64
end_reason string
ack_bytes long
outstanding long
control_key string
control_value string
dcp_event string
config_rev long
error_map_version int
error_map_revision int
ambrosia_socket string
lb string
phase string
seq_id long
committer_id long
check_bytes string
record_size long
message_count long
message_types array<string>
rpc_count long
destination string
method_id long
rpc_type string
checkpoint_length long
ws_opcode int
ws_fin boolean
ws_masked boolean
ws_length_bits int
ws_payload_len long
ws_close_code int
http_target string
http_status int
alias string
tremor_protocol string
status_code string
message_json string
"""
EXPECTED = [tuple(line.split()) for line in COLUMNS.strip().splitlines()]

# Each type as Spark shows it (u64: bigint holding the 64 bits; ts alone a timestamp).
SPARK_TYPES = {
    "string": "string",
    "int": "int",
    "long": "bigint",
    "u64": "bigint",
    "double": "double",
    "boolean": "boolean",
    "array<string>": "array<string>",
    "array<struct:ack>": "array<struct<stream_id:bigint,point_of_ref:bigint>>",
    "array<struct:where>": "array<struct<stream_id:bigint,start_por:bigint,end_por:bigint>>",
}


def _spark(name: str, kind: str) -> tuple[str, str]:
    return name, "timestamp" if name == "ts" else SPARK_TYPES[kind]


def test_the_spark_tables_keep_the_columns():
    """frames: the common columns; each protocol's table: the frame key and its own; together all."""
    common = [name for name, _, _ in records.COMMON_FIELDS]
    kinds = dict(EXPECTED)
    shown = {
        table: [(f.name, f.dataType.simpleString()) for f in spark_schema(table).fields]
        for table in table_names()
        if table != "all"
    }
    assert shown["frames"] == [_spark(name, kinds[name]) for name in common]
    seen = set(common)
    for protocol in ("wallaroo", "kinesis", "dcp", "ambrosia", "tremor"):
        table = shown[f"{protocol}_frames"]
        assert [name for name, _ in table[:3]] == ["capture", "conn_index", "frame_index"]
        assert all(kind == _spark(name, kinds[name])[1] for name, kind in table)
        seen |= {name for name, _ in table}
    assert seen == set(kinds)
    everything = spark_schema("all")
    assert everything.names == [*common, "wallaroo", "kinesis", "dcp", "ambrosia", "tremor"]


def test_a_field_two_plugins_share_is_one_column_with_both_meanings():
    assert field_names().count("reason") == 1
    assert (
        dict((n, m) for n, _, m in fields())["reason"]
        == "ERROR reason; MLD shutdown reason (TERMINATE, ZOMBIE)"
    )
    assert ("reason", "string", "ERROR reason") in get_plugin("wallaroo").record_fields
    assert ("reason", "string", "MLD shutdown reason (TERMINATE, ZOMBIE)") in get_plugin(
        "kinesis"
    ).record_fields


def _fake(name: str, record_fields=(), connection_fields=()):
    return dataclasses.replace(
        get_plugin("tremor"),
        name=name,
        record_fields=tuple(record_fields),
        connection_fields=tuple(connection_fields),
    )


def test_the_join_puts_connection_fields_after_the_endpoints_and_record_fields_last():
    a = _fake("a", [("x", "long", "a's x"), ("y", "string", "a's y")], [("kind", "string", "a's kind")])
    b = _fake("b", [("z", "int", "b's z"), ("x", "long", "b's x")])
    joined = join_fields([a, b])
    common = [name for name, _, _ in COMMON_FIELDS]
    assert [name for name, _, _ in joined] == [*common[:8], "kind", *common[8:], "x", "y", "z"]
    assert ("x", "long", "a's x; b's x") in joined


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        (
            [("x", "long", "")],
            [("x", "string", "")],
            "protocol 'b' field 'x' is string, but protocol 'a' declares it long",
        ),
        ([("ts", "double", "")], [], "protocol 'a' field 'ts': every record has it already (a common field)"),
        ([("x", "long", ""), ("x", "long", "")], [], "protocol 'a' field 'x': declared twice"),
        ([("x", "uint", "")], [], "protocol 'a' field 'x': unknown type 'uint'"),
    ],
)
def test_fields_that_do_not_join_are_a_clear_error(a, b, message):
    with pytest.raises(FieldClash) as raised:
        join_fields([_fake("a", a), _fake("b", b)])
    assert str(raised.value).startswith(message)


def test_the_registry_refuses_plugins_whose_fields_clash(monkeypatch):
    clash = types.ModuleType("clashing_plugin")
    clash.PLUGIN = _fake("clash", [("reason", "long", "a number")])
    monkeypatch.setitem(sys.modules, "clashing_plugin", clash)
    monkeypatch.setattr(protocols, "_PLUGIN_MODULES", (*protocols._PLUGIN_MODULES, "clashing_plugin"))
    plugins.cache_clear()
    try:
        with pytest.raises(
            FieldClash, match="protocol 'clash' field 'reason' is long, but protocol 'wallaroo'"
        ):
            plugins()
    finally:
        plugins.cache_clear()


def test_importing_the_schema_does_not_import_the_plugins():
    """The plug-ins' trackers import the capture machinery, which imports the schema: it joins them
    on first use, not on import."""
    code = (
        "import sys, wallaroo_proto.protocols.schema as s\n"
        "loaded = lambda: sorted(m for m in sys.modules if m.endswith('.plugin'))\n"
        "assert loaded() == [], loaded()\n"
        "assert len(s.field_names()) > 100 and len(loaded()) == 5, loaded()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


_PYTHON_TYPES = {"string": str, "int": int, "long": int, "u64": int, "double": float, "boolean": bool}


def _fits(kind: str, value: object) -> bool:
    """Whether a record's value has the field's declared type (None: the field is null)."""
    if value is None:
        return True
    if kind in _PYTHON_TYPES:
        return isinstance(value, _PYTHON_TYPES[kind]) and (kind == "boolean" or not isinstance(value, bool))
    if kind == "array<string>":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    keys = [name for name, _ in structs()[kind.removeprefix("array<struct:").removesuffix(">")]]
    return isinstance(value, list) and all(isinstance(item, dict) and list(item) == keys for item in value)


def test_each_plugins_records_carry_only_the_common_and_its_own_fields_with_their_types():
    common = {name for name, _, _ in COMMON_FIELDS}
    own = {p.name: {name for name, _, _ in (*p.connection_fields, *p.record_fields)} for p in plugins()}
    seen: dict[str, set[str]] = {p.name: set() for p in plugins()}
    captures = sorted(CAPTURES.glob("*.pcap*"))
    assert len(captures) >= 5
    for capture in captures:
        for record in iter_records(capture):
            protocol = record["protocol"]
            fields = {k for k in record if not k.startswith("_")}
            assert fields <= common | own[protocol], (capture.name, protocol, fields - common - own[protocol])
            seen[protocol] |= fields - common
            wrong = {k: record[k] for k in fields if not _fits(field_types()[k], record[k])}
            assert not wrong, (capture.name, protocol, wrong)
    # every protocol has a sample capture, and it shows most of its own fields
    for name, fields in seen.items():
        assert len(fields) * 2 > len(own[name]), (name, sorted(own[name] - fields))


def test_structs_are_the_plugins_declarations_joined():
    """An ``array<struct:K>`` field needs a plug-in that declares K, and two that declare it agree."""
    a = dataclasses.replace(_fake("a", [("xs", "array<struct:s>", "")]), structs={"s": (("k", "long"),)})
    assert ("xs", "array<struct:s>", "") in join_fields([a])
    with pytest.raises(FieldClash, match="unknown type 'array<struct:s>'"):
        join_fields([_fake("b", [("xs", "array<struct:s>", "")])])
    other = dataclasses.replace(_fake("c"), structs={"s": (("k", "string"),)})
    with pytest.raises(FieldClash, match="protocol 'c' struct 's' differs from protocol 'a'"):
        join_fields([a, other])
    assert structs() == {
        "ack": (("stream_id", "u64"), ("point_of_ref", "u64")),
        "where": (("stream_id", "u64"), ("start_por", "u64"), ("end_por", "u64")),
    }
