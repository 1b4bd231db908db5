"""The Kinesis MultiLangDaemon plug-in: lines, the per-shard conversation judge, shard reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from wallaroo_proto.protocols import DEFAULT_MAX_FRAME_SIZE, ProtocolPlugin

from .codec import REQUESTS, LineSplitter, decode_from_daemon
from .core import Conversation
from .dissect import PORTS, KinesisTracker, looks_like_mld
from .report import KinesisSignals

#: Its record fields (name, type, meaning), beside the common ones; ``protocols.schema.fields()`` joins them.
RECORD_FIELDS = (
    # Kinesis MultiLangDaemon (one line is one frame; `type` is its action, `reason` a shutdown's)
    ("line_number", "long", "MLD: the line's number in its direction, 1-based"),
    ("shard_id", "string", "MLD: the conversation's shard, from its initialize"),
    ("sequence_number", "string", "MLD initialize, checkpoint; processRecords: its last record's"),
    ("sub_sequence_number", "long", "MLD: the same's subsequence number"),
    ("record_count", "long", "MLD processRecords: records in the batch"),
    ("millis_behind_latest", "long", "MLD processRecords: how far behind the shard's newest"),
    ("response_for", "string", "MLD status: the request it answers"),
    ("latency", "double", "MLD status: seconds since the request it answers"),
    ("checkpoint_error", "string", "MLD checkpoint reply: the exception name, null on success"),
    ("reason", "string", "MLD shutdown reason (TERMINATE, ZOMBIE)"),
)
TYPE_NAMES = (*REQUESTS, "status", "checkpoint", "SKIPPED", "INVALID", "EOF")
TITLES = {
    "shards": "Kinesis shards",
    "violations": "Kinesis protocol violations",
}


def describe(r: dict) -> str:
    """The record's own fields, as ``dissect``'s table shows them."""
    if r.get("type") in ("INVALID", "SKIPPED", "EOF"):
        return ""  # no message: its violation or note rows say why
    keys = (
        ("shard", "shard_id"),
        ("line", "line_number"),
        ("for", "response_for"),
        ("seq", "sequence_number"),
        ("sub", "sub_sequence_number"),
        ("records", "record_count"),
        ("behind_ms", "millis_behind_latest"),
        ("reason", "reason"),
        ("error", "checkpoint_error"),
    )
    parts = [f"{label}={r[k]}" for label, k in keys if r.get(k) is not None]
    if r.get("latency") is not None:
        parts.append(f"latency={r['latency'] * 1000:.3f}ms")
    return " ".join(parts)


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value * 1000:.3f} ms"


def print_summary(console: Console, s: dict) -> None:
    """One shard's conversation: records, checkpoints, latency, violations."""
    title = f"connection #{s['conn_index']}  {s['connection']}  (kinesis {s['shard_id'] or '?'})"
    console.rule(Text(title, style="bold"))
    info = Table(show_header=False, box=None, pad_edge=False)
    info.add_column(style="bold")
    info.add_column()
    info.add_row(
        "packets", f"{s['first_packet']}..{s['last_packet']} over {s['duration']:.6f} s, {s['closed']}"
    )
    info.add_row("shard", s["shard_id"] or "unknown (no initialize seen)")
    info.add_row("daemon", f"{s['daemon'] or 'unknown'} (dialect {s['dialect'] or 'unknown'})")
    info.add_row("lines", ", ".join(f"{k} {v}" for k, v in s["lines_by_type"].items()) or "none")
    info.add_row("requests", str(s["requests"]))
    info.add_row("records", str(s["records"]))
    errors = ", ".join(f"{k} {v}" for k, v in s["checkpoint_error_names"].items())
    info.add_row(
        "checkpoints",
        f"{s['checkpoints']}, errors {s['checkpoint_errors']}"
        + (f" ({errors})" if errors else "")
        + (f", last at {s['last_checkpoint']}" if s["last_checkpoint"] else ""),
    )
    lat = s["latency"]
    info.add_row(
        "request to status",
        f"p50 {_ms(lat['p50'])}, p99 {_ms(lat['p99'])}, max {_ms(lat['max'])} ({lat['count']})"
        if lat["count"]
        else "none",
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

    return {"shards": spark.shards, "violations": spark.violations}


def _conformance_suites() -> tuple[Any, ...]:
    from .conformance import SUITES

    return SUITES


def _proxy_faults() -> Any:
    from . import proxy_faults

    return proxy_faults


def _fuzz_hooks() -> Any:
    from . import fuzz

    return fuzz


def _replay_adapter() -> Any:
    from . import replay

    return replay


PLUGIN = ProtocolPlugin(
    name="kinesis",
    default_ports=PORTS,
    detect=looks_like_mld,
    max_frame_size=DEFAULT_MAX_FRAME_SIZE,  # unread: LineSplitter bounds a line itself
    framer=LineSplitter,
    decode=decode_from_daemon,
    judge=Conversation,
    tracker=KinesisTracker,
    record_fields=RECORD_FIELDS,
    type_names=TYPE_NAMES,
    print_summary=print_summary,
    describe=describe,
    spark_reports=_spark_reports,
    conformance_suites=_conformance_suites,
    proxy_faults=_proxy_faults,
    report_titles=TITLES,
    report_signals=KinesisSignals,
    replay_adapter=_replay_adapter,
    fuzz_hooks=_fuzz_hooks,
)
