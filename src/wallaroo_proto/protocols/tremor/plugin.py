"""The Tremor network-protocol plug-in: WebSocket frames, the session judge, its reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from wallaroo_proto.protocols import DEFAULT_MAX_FRAME_SIZE, ProtocolPlugin

from .core import Session
from .dissect import PORTS, TremorTracker, detect
from .messages import OPS, parse
from .report import TremorSignals
from .wsframes import OPCODE_NAMES, FrameSplitter

#: Its record fields (name, type, meaning), beside the common ones; ``protocols.schema.fields()`` joins them.
RECORD_FIELDS = (
    # Tremor network protocol (one WebSocket frame or HTTP head is one record; `type` is the message's)
    ("ws_opcode", "int", "Tremor: the WebSocket frame's opcode (0 continuation, 1 text, 8 close...)"),
    ("ws_fin", "boolean", "Tremor: the WebSocket frame's FIN bit"),
    ("ws_masked", "boolean", "Tremor: the frame was masked (client frames must be)"),
    ("ws_length_bits", "int", "Tremor: the payload length form used: 7, 16 or 64"),
    ("ws_payload_len", "long", "Tremor: the frame's payload bytes"),
    ("ws_close_code", "int", "Tremor: a close frame's status code (null: none)"),
    ("http_target", "string", "Tremor: the upgrade request's target"),
    ("http_status", "int", "Tremor: the upgrade response's status (101 switches)"),
    ("alias", "string", "Tremor: the message's stream alias"),
    ("tremor_protocol", "string", "Tremor: the stream's sub-protocol (echo, pubsub, api)"),
    ("status_code", "string", "Tremor: the status code of a violation or an error close (0.207)"),
    ("message_json", "string", "Tremor: the JSON text of the message this frame completes (cut at 4 KiB)"),
)
TYPE_NAMES = (
    "UPGRADE_REQUEST",
    "UPGRADE_RESPONSE",
    *OPCODE_NAMES.values(),
    *OPS,
    "echo",
    "api",
    "pubsub",
    "pubsub:subscribe",
    "pubsub:unsubscribe",
    "pubsub:publish",
    "pubsub:unpublish",
    "pubsub:send",
    "pubsub:list",
    "pubsub:version",
    "pubsub:data",
    "pubsub:subscribe-ack",
    "pubsub:unsubscribe-ack",
    "pubsub:publish-ack",
    "pubsub:unpublish-ack",
    "INVALID",
)
TITLES = {
    "sessions": "Tremor sessions",
    "streams": "Tremor streams",
    "messages": "Tremor messages",
    "violations": "Tremor protocol violations",
}


def describe(r: dict) -> str:
    """The record's own fields, as ``dissect``'s table shows them."""
    parts = []
    for label, key in (
        ("target", "http_target"),
        ("status", "http_status"),
        ("alias", "alias"),
        ("protocol", "tremor_protocol"),
        ("code", "status_code"),
        ("close", "ws_close_code"),
    ):
        if r.get(key) is not None:
            parts.append(f"{label}={r[key]}")
    if r.get("ws_payload_len") is not None:
        flags = ("fin " if r.get("ws_fin") else "") + ("masked " if r.get("ws_masked") else "")
        parts.append(f"{flags}len={r['ws_payload_len']}/{r.get('ws_length_bits')}bit")
    if r.get("message_json"):
        text = r["message_json"]
        parts.append(text if len(text) <= 80 else text[:77] + "...")
    return " ".join(parts)


def print_summary(console: Console, s: dict) -> None:
    """One session: the upgrade, frames, messages, streams, how it ended, violations."""
    console.rule(Text(f"connection #{s['conn_index']}  {s['connection']}  (tremor)", style="bold"))
    info = Table(show_header=False, box=None, pad_edge=False)
    info.add_column(style="bold")
    info.add_column()
    info.add_row(
        "packets", f"{s['first_packet']}..{s['last_packet']} over {s['duration']:.6f} s, {s['closed']}"
    )
    info.add_row("upgrade", f"GET {s['target'] or '?'} -> {s['http_status'] or 'no answer seen'}")
    info.add_row("frames", ", ".join(f"{k} {v}" for k, v in s["frames_by_opcode"].items()) or "none")
    info.add_row(
        "messages", f"{s['messages']} (client {s['client_messages']}, server {s['server_messages']})"
    )
    streams = ", ".join(f"{x['alias']} ({x['protocol']}, {x['end']})" for x in s["streams"])
    info.add_row("streams", streams or "none")
    info.add_row("session", s["state"] + (f", error close {s['error_close']!r}" if s["error_close"] else ""))
    if s["close_codes"]:
        info.add_row(
            "close frames",
            ", ".join(f"{k} {v if v is not None else 'no code'}" for k, v in s["close_codes"].items()),
        )
    info.add_row("expecting", s["expecting"])
    info.add_row("violations", Text(str(s["violations"]), style="bold red" if s["violations"] else "green"))
    console.print(info)
    for v in s["violation_list"][:50]:
        console.print(Text(f"  packet {v['packet']} {v['type']}: {v['reason']}", style="red"))
    if len(s["violation_list"]) > 50:
        console.print(Text(f"  ... {s['violations'] - 50} more", style="red"))
    for note in s["capture_notes"]:
        console.print(Text(f"  note: {note}", style="yellow"))


def _spark_reports() -> Mapping[str, Any]:
    from . import spark

    return {
        "sessions": spark.sessions,
        "streams": spark.streams,
        "messages": spark.messages,
        "violations": spark.violations,
    }


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
    name="tremor",
    default_ports=PORTS,
    detect=detect,
    max_frame_size=DEFAULT_MAX_FRAME_SIZE,  # unread: the WebSocket reader bounds a frame itself
    framer=FrameSplitter,
    decode=parse,
    judge=Session,
    tracker=TremorTracker,
    record_fields=RECORD_FIELDS,
    type_names=TYPE_NAMES,
    print_summary=print_summary,
    describe=describe,
    spark_reports=_spark_reports,
    conformance_suites=_conformance_suites,
    proxy_faults=_proxy_faults,
    replay_adapter=_replay_adapter,
    fuzz_hooks=_fuzz_hooks,
    report_titles=TITLES,
    report_signals=TremorSignals,
)
