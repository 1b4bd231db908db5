"""The AMBROSIA plug-in: an LB's two sockets paired, records and messages judged, pair reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from wallaroo_proto.protocols import DEFAULT_MAX_FRAME_SIZE, ProtocolPlugin

from .codec import TYPE_NAMES as MESSAGE_TYPES
from .codec import RecordSplitter, read_header
from .core import Session
from .dissect import PORTS, AmbrosiaTracker, looks_like_ambrosia, pair_key
from .report import AmbrosiaSignals

#: Its record fields (name, type, meaning), beside the common ones; ``protocols.schema.fields()`` joins them.
RECORD_FIELDS = (
    # AMBROSIA IC <-> LB (a frame is a log record, an LB message or a checkpoint's raw bytes)
    ("ambrosia_socket", "string", "AMBROSIA: 'receive' (LB -> IC messages) or 'send' (IC -> LB records)"),
    ("lb", "string", "AMBROSIA: the language binding's pair of sockets the frame belongs to"),
    ("phase", "string", "AMBROSIA: start, first-start, replay, upgrade-test or normal, after the frame"),
    ("seq_id", "long", "AMBROSIA log record sequence id (-1 control, -2 checkpoint)"),
    ("committer_id", "long", "AMBROSIA log record committer id"),
    ("check_bytes", "string", "AMBROSIA log record check bytes, 16 hex digits"),
    ("record_size", "long", "AMBROSIA log record size, header included (blob excluded)"),
    ("message_count", "long", "AMBROSIA: messages in the log record"),
    ("message_types", "array<string>", "AMBROSIA: the log record's message types"),
    ("rpc_count", "long", "AMBROSIA: RPCs in the record, batch or message"),
    ("destination", "string", "AMBROSIA outgoing RPC destination ('' = self call)"),
    ("method_id", "long", "AMBROSIA RPC method id"),
    ("rpc_type", "string", "AMBROSIA RPC type: async, fork or impulse"),
    ("checkpoint_length", "long", "AMBROSIA Checkpoint: the raw bytes' length"),
)
TYPE_NAMES = (
    *MESSAGE_TYPES.values(),
    "Record",
    "CheckpointRecord",
    "ControlRecord",
    "CheckpointBytes",
    "UNEXPECTED",
    "INVALID",
    "EOF",
)
TITLES = {
    "pairs": "AMBROSIA language bindings (IC <-> LB pairs)",
    "violations": "AMBROSIA protocol violations",
}


def describe(r: dict) -> str:
    """The record's own fields, as ``dissect``'s table shows them."""
    keys = (
        ("seq", "seq_id"),
        ("committer", "committer_id"),
        ("size", "record_size"),
        ("msgs", "message_count"),
        ("rpcs", "rpc_count"),
        ("to", "destination"),
        ("method", "method_id"),
        ("rpc", "rpc_type"),
        ("checkpoint", "checkpoint_length"),
        ("phase", "phase"),
    )
    parts = [
        f"{label}={r[k]!r}" if k == "destination" else f"{label}={r[k]}"
        for label, k in keys
        if r.get(k) is not None
    ]
    return " ".join(parts)


def print_summary(console: Console, s: dict) -> None:
    """One socket of an LB: what its pair's session saw."""
    console.rule(
        Text(f"connection #{s['conn_index']}  {s['connection']}  (ambrosia {s['socket']} port)", style="bold")
    )
    info = Table(show_header=False, box=None, pad_edge=False)
    info.add_column(style="bold")
    info.add_column()
    info.add_row(
        "packets", f"{s['first_packet']}..{s['last_packet']} over {s['duration']:.6f} s, {s['closed']}"
    )
    info.add_row(
        "pair", f"{s['lb'] or 'unknown'}" + ("" if s["paired"] else " (its other socket is not here)")
    )
    info.add_row("start", f"{s['start']}, committer id {s['committer_id']}, phase {s['phase']}")
    info.add_row("frames", ", ".join(f"{k} {v}" for k, v in s["frames_by_type"].items()) or "none")
    info.add_row("records", f"{s['records']} ({s['replayed']} replayed), last sequence id {s['last_seq']}")
    info.add_row("RPCs", f"{s['rpcs_in']} to the LB, {s['rpcs_out']} from it")
    requests = ", ".join(f"{k} {v}" for k, v in s["requests"].items()) or "none"
    info.add_row("checkpoints", f"{s['checkpoints_from_lb']} from the LB; IC asked: {requests}")
    info.add_row("expecting", s["expecting"])
    info.add_row("violations", Text(str(s["violations"]), style="bold red" if s["violations"] else "green"))
    console.print(info)
    for v in s["violation_list"][:50]:
        console.print(Text(f"  packet {v['packet']} {v['type']}: {v['reason']}", style="red"))
    for note in s["capture_notes"]:
        console.print(Text(f"  note: {note}", style="yellow"))


def decode(frame: bytes) -> Any:
    """A record's bytes to (header, body)."""
    header = read_header(frame)
    return header, frame[24 : header.size]


def _spark_reports() -> Mapping[str, Any]:
    from . import spark

    return {"pairs": spark.pairs, "violations": spark.violations}


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
    name="ambrosia",
    default_ports=PORTS,
    detect=looks_like_ambrosia,
    max_frame_size=DEFAULT_MAX_FRAME_SIZE,  # the splitters take at least 1 MiB
    framer=RecordSplitter,
    decode=decode,
    judge=Session,
    tracker=AmbrosiaTracker,
    record_fields=RECORD_FIELDS,
    type_names=TYPE_NAMES,
    print_summary=print_summary,
    describe=describe,
    spark_reports=_spark_reports,
    conformance_suites=_conformance_suites,
    proxy_faults=_proxy_faults,
    report_titles=TITLES,
    report_signals=AmbrosiaSignals,
    part_key=pair_key,
    replay_adapter=_replay_adapter,
    fuzz_hooks=_fuzz_hooks,
)
