"""The Wallaroo plug-in: the connector protocol's framer, codec, core, tracker, views and reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wallaroo_proto.protocols import ProtocolPlugin
from wallaroo_proto.protocols.wallaroo.codec import decode
from wallaroo_proto.protocols.wallaroo.dissect import _Tracker, looks_like_hello
from wallaroo_proto.protocols.wallaroo.frames import FrameType
from wallaroo_proto.protocols.wallaroo.protocol import Connection
from wallaroo_proto.protocols.wallaroo.reader import FrameReader
from wallaroo_proto.protocols.wallaroo.twopc import TwoPCTag
from wallaroo_proto.records import DEFAULT_PORTS

from .report import WallarooSignals
from .views import describe, print_summary

#: Its fields of ``records.FIELDS``: from ``version`` (HELLO) to ``commit`` (2PC), and ``use``.
RECORD_FIELDS = (
    "use",
    "version",
    "cookie_b64",
    "cookie_len",
    "program_name",
    "instance_name",
    "initial_credits",
    "reason",
    "stream_id",
    "stream_name",
    "point_of_ref",
    "success",
    "message_id",
    "event_time",
    "key_b64",
    "key_len",
    "payload_b64",
    "payload_len",
    "credits",
    "acks",
    "address",
    "rtag",
    "worker_names",
    "twopc",
    "txn_id",
    "txn_ids",
    "where",
    "commit",
)

TITLES = {
    "connections": "Connections",
    "audit": "Delivery audit per stream",
    "flow_control": "Flow control",
    "restarts": "RESTARTs and reconnects",
    "twopc": "2PC rounds",
    "violations": "Protocol violations",
}


def _spark_reports() -> Mapping[str, Any]:
    from wallaroo_proto.spark import reports  # imports pyspark only when a report is built

    return {"messages": reports.messages, **reports.REPORTS}


PLUGIN = ProtocolPlugin(
    name="wallaroo",
    default_ports=DEFAULT_PORTS,
    detect=looks_like_hello,
    framer=FrameReader,
    decode=decode,
    judge=Connection,
    tracker=_Tracker,
    record_fields=RECORD_FIELDS,
    type_names=tuple(sorted({t.name for t in FrameType} | {t.name for t in TwoPCTag} | {"INVALID"})),
    print_summary=print_summary,
    describe=describe,
    spark_reports=_spark_reports,
    report_titles=TITLES,
    report_signals=WallarooSignals,
)
