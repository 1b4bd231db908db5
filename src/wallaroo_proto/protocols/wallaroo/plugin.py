"""The Wallaroo plug-in: the connector protocol's framer, codec, core, tracker, views and reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wallaroo_proto.protocols import ProtocolPlugin
from wallaroo_proto.protocols.wallaroo.codec import decode
from wallaroo_proto.protocols.wallaroo.dissect import _Tracker, looks_like_hello
from wallaroo_proto.protocols.wallaroo.frames import DEFAULT_MAX_FRAME_SIZE, DEFAULT_PORTS, FrameType
from wallaroo_proto.protocols.wallaroo.protocol import Connection
from wallaroo_proto.protocols.wallaroo.reader import FrameReader
from wallaroo_proto.protocols.wallaroo.twopc import TwoPCTag

from .report import WallarooSignals
from .views import describe, print_summary

#: What its ``acks`` and ``where`` fields hold (``array<struct:ack>``, ``array<struct:where>``).
STRUCTS = {
    "ack": (("stream_id", "u64"), ("point_of_ref", "u64")),
    "where": (("stream_id", "u64"), ("start_por", "u64"), ("end_por", "u64")),
}

#: Fields about the connection: joined among the common connection fields, after the endpoints.
CONNECTION_FIELDS = (("use", "string", "'source' or 'sink' protocol"),)

#: Its record fields (name, type, meaning), beside the common ones; ``protocols.schema.fields()`` joins them.
RECORD_FIELDS = (
    # HELLO
    ("version", "string", "HELLO version"),
    ("cookie_b64", "string", "HELLO cookie, base64"),
    ("cookie_len", "int", "HELLO cookie length"),
    ("program_name", "string", "HELLO program name"),
    ("instance_name", "string", "HELLO instance name"),
    # OK, ERROR, NOTIFY, NOTIFY_ACK
    ("initial_credits", "long", "OK credits"),
    ("reason", "string", "ERROR reason"),
    ("stream_id", "u64", "NOTIFY, NOTIFY_ACK, MESSAGE, EOS_MESSAGE stream id"),
    ("stream_name", "string", "NOTIFY stream name"),
    ("point_of_ref", "u64", "NOTIFY, NOTIFY_ACK point of reference"),
    ("success", "boolean", "NOTIFY_ACK success"),
    # MESSAGE
    ("message_id", "u64", "MESSAGE / EOS_MESSAGE message id (EOS: null in the shipped form)"),
    ("event_time", "long", "MESSAGE event time"),
    ("key_b64", "string", "MESSAGE key, base64 ('' = no key)"),
    ("key_len", "int", "MESSAGE key length"),
    ("payload_b64", "string", "MESSAGE payload, base64"),
    ("payload_len", "long", "MESSAGE payload length"),
    # ACK, RESTART, WORKERS_LEFT
    ("credits", "long", "ACK credits granted"),
    ("acks", "array<struct:ack>", "ACK (stream_id, point_of_ref) checkpoint pairs"),
    ("address", "string", "RESTART address (shipped form); absent in the spec's empty RESTART"),
    ("rtag", "u64", "WORKERS_LEFT / 2PC LIST_UNCOMMITTED, REPLY_UNCOMMITTED request tag"),
    ("worker_names", "array<string>", "WORKERS_LEFT worker names"),
    # 2PC (stream-0 MESSAGE of the sink protocol)
    ("twopc", "string", "2PC message: LIST_UNCOMMITTED, REPLY_UNCOMMITTED, PHASE1, REPLY, PHASE2, ..."),
    ("txn_id", "string", "2PC transaction id"),
    ("txn_ids", "array<string>", "2PC REPLY_UNCOMMITTED transaction ids"),
    ("where", "array<struct:where>", "2PC PHASE1 (stream_id, start_por, end_por) ranges"),
    ("commit", "boolean", "2PC REPLY vote / PHASE2 decision: true = commit"),
)

TITLES = {
    "audit": "Delivery audit per stream",
    "flow_control": "Flow control",
    "restarts": "RESTARTs and reconnects",
    "twopc": "2PC rounds",
}


def _spark_reports() -> Mapping[str, Any]:
    from . import spark  # imports pyspark only when a report is built

    return spark.REPORTS


def _conformance_suites() -> tuple[Any, ...]:
    from .conformance import SUITES

    return SUITES


def _proxy_faults() -> Any:
    from . import proxy_faults

    return proxy_faults


def _replay_adapter() -> Any:
    from . import replay

    return replay


def _fuzz_hooks() -> Any:
    from . import fuzz

    return fuzz


PLUGIN = ProtocolPlugin(
    name="wallaroo",
    default_ports=DEFAULT_PORTS,
    detect=looks_like_hello,
    max_frame_size=DEFAULT_MAX_FRAME_SIZE,
    framer=FrameReader,
    decode=decode,
    judge=Connection,
    tracker=_Tracker,
    record_fields=RECORD_FIELDS,
    connection_fields=CONNECTION_FIELDS,
    type_names=tuple(sorted({t.name for t in FrameType} | {t.name for t in TwoPCTag} | {"INVALID"})),
    print_summary=print_summary,
    describe=describe,
    spark_reports=_spark_reports,
    conformance_suites=_conformance_suites,
    proxy_faults=_proxy_faults,
    replay_adapter=_replay_adapter,
    fuzz_hooks=_fuzz_hooks,
    report_titles=TITLES,
    report_signals=WallarooSignals,
    plain_table_names=True,
    reports_always_printed=True,
    use_field="use",
    structs=STRUCTS,
)
