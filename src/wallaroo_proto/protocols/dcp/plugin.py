"""The Couchbase DCP plug-in: memcached binary packets, the connection judge, per-vbucket reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from wallaroo_proto.protocols import DEFAULT_MAX_FRAME_SIZE, ProtocolPlugin, as_hex

from . import codec
from .codec import PacketSplitter, decode_packet
from .core import Connection
from .dissect import PORTS, DcpTracker, looks_like_dcp
from .report import DcpSignals

#: Its record fields (name, type, meaning), beside the common ones; ``protocols.schema.fields()`` joins them.
RECORD_FIELDS = (
    # Couchbase DCP (one memcached binary protocol packet is one frame; `type` is its opcode name,
    # with _RESPONSE for a response; `status` a response's status name)
    ("dcp_magic", "int", "DCP: the header magic (0x80 request, 0x81 response, 0x08/0x18 with frame infos)"),
    ("dcp_opcode", "int", "DCP: the opcode"),
    ("opaque", "long", "DCP: the opaque, read big-endian (a stream's messages carry its request's)"),
    ("vbucket", "int", "DCP: the request's vbucket (a ROLLBACK answer: its request's)"),
    ("status", "string", "DCP response status: SUCCESS, ROLLBACK, NOT_MY_VBUCKET, ..."),
    ("dcp_key", "string", "DCP: the key (document key, control key, DCP_OPEN connection name)"),
    ("value_len", "long", "DCP: value bytes"),
    ("dcp_stream_id", "int", "DCP: the stream-id frame info, if any"),
    ("seqno", "u64", "DCP mutation, deletion, expiration, seqno advanced: by_seqno"),
    ("rev_seqno", "u64", "DCP mutation, deletion, expiration: revision seqno"),
    ("snap_start", "u64", "DCP snapshot marker; stream request: snapshot start"),
    ("snap_end", "u64", "DCP snapshot marker; stream request: snapshot end"),
    ("snap_flags", "int", "DCP snapshot marker flags (1 memory, 2 disk, 4 checkpoint, 8 ack)"),
    ("start_seqno", "u64", "DCP stream request: start seqno"),
    ("end_seqno", "u64", "DCP stream request: end seqno"),
    ("vb_uuid", "u64", "DCP stream request: vbucket uuid; its answer: the newest failover entry's"),
    ("rollback_seqno", "u64", "DCP ROLLBACK answer: the seqno to roll back to"),
    ("end_reason", "string", "DCP stream end: ok, closed, state_changed, too_slow, ..."),
    ("ack_bytes", "long", "DCP buffer acknowledgement: bytes acknowledged"),
    ("outstanding", "long", "DCP flow control: unacknowledged bytes after this packet"),
    ("control_key", "string", "DCP control: key"),
    ("control_value", "string", "DCP control: value"),
    ("dcp_event", "string", "DCP: what the packet did: snapshot complete, rollback to N, buffer full, ..."),
    ("config_rev", "long", "DCP bucket config (GET_CLUSTER_CONFIG, NOT_MY_VBUCKET's body): its rev"),
    ("error_map_version", "int", "DCP GET_ERROR_MAP: the version asked for; its answer: the map's"),
    ("error_map_revision", "int", "DCP GET_ERROR_MAP answer: the map's revision"),
)
TYPE_NAMES = (
    *codec.OPCODES.values(),
    *(f"{name}_RESPONSE" for name in codec.OPCODES.values()),
    "INVALID",
)
TITLES = {
    "vbuckets": "DCP vbucket streams",
    "flow_control": "DCP flow control",
    "violations": "DCP protocol violations",
}


#: Shown in hex everywhere, as Wireshark's couchbase dissector shows them (BASE_HEX).
HEX_FIELDS = {"opaque": 8, "vb_uuid": 16}


def describe(r: dict) -> str:
    """The record's own fields, as ``dissect``'s table shows them."""
    if r.get("type") == "INVALID":
        return ""
    keys = (
        ("vb", "vbucket"),
        ("status", "status"),
        ("key", "dcp_key"),
        ("seqno", "seqno"),
        ("snap", None),
        ("start", "start_seqno"),
        ("uuid", "vb_uuid"),
        ("rollback", "rollback_seqno"),
        ("reason", "end_reason"),
        ("ack", "ack_bytes"),
        ("value", "control_value"),
        ("sid", "dcp_stream_id"),
        ("outstanding", "outstanding"),
        ("config_rev", "config_rev"),
        ("error_map", "error_map_version"),
        ("error_map_rev", "error_map_revision"),
    )
    parts = [f"opaque={as_hex(r['opaque'], 8)}"] if r.get("opaque") is not None else []
    for label, k in keys:
        if k is None:
            if r.get("snap_start") is not None and r.get("start_seqno") is None:
                end, flags = r.get("snap_end", "?"), r.get("snap_flags") or 0
                parts.append(f"snap={r['snap_start']}..{end}/0x{flags:x}")
        elif r.get(k) is not None:
            parts.append(f"{label}={as_hex(int(r[k]), 16)}" if label == "uuid" else f"{label}={r[k]}")
    if r.get("dcp_event"):
        parts.append(f"({r['dcp_event']})")
    return " ".join(parts)


def print_summary(console: Console, s: dict) -> None:
    """One DCP connection: its name, controls, streams per vbucket, rollbacks, flow control, violations."""
    title = f"connection #{s['conn_index']}  {s['connection']}  (dcp {s['name'] or '?'})"
    console.rule(Text(title, style="bold"))
    info = Table(show_header=False, box=None, pad_edge=False)
    info.add_column(style="bold")
    info.add_column()
    info.add_row(
        "packets", f"{s['first_packet']}..{s['last_packet']} over {s['duration']:.6f} s, {s['closed']}"
    )
    info.add_row("consumer", s["consumer"] or "unknown")
    info.add_row("by type", ", ".join(f"{k} {v}" for k, v in s["packets_by_type"].items()) or "none")
    info.add_row("controls", ", ".join(f"{k}={v}" for k, v in s["controls"].items()) or "none")
    rollbacks = ", ".join(f"vb {r['vbucket']} to {r['seqno']}" for r in s["rollbacks"])
    info.add_row("rollbacks", rollbacks or "none")
    info.add_row(
        "flow control",
        f"buffer {s['buffer_size']} bytes, {s['acked_bytes']} acknowledged, {s['flow_control_stalls']} stalls"
        if s["buffer_size"]
        else "off",
    )
    info.add_row("noops", str(s["noops"]))
    info.add_row("violations", Text(str(s["violations"]), style="bold red" if s["violations"] else "green"))
    console.print(info)
    if s["streams"]:
        table = Table(title="streams")
        for col in ("vbucket", "opaque", "from", "last seqno", "items", "snapshots", "complete", "end"):
            table.add_column(col)
        for st in s["streams"]:
            table.add_row(
                str(st["vbucket"]),
                f"0x{st['opaque']:08x}",
                str(st["start"]),
                str(st["last_seqno"]),
                str(st["items"]),
                str(st["snapshots"]),
                str(st["snapshots_complete"]),
                st["end"],
            )
        console.print(table)
    for v in s["violation_list"][:50]:
        console.print(Text(f"  packet {v['packet']} {v['type']}: {v['reason']}", style="red"))
    if len(s["violation_list"]) > 50:
        console.print(Text(f"  ... {s['violations'] - 50} more", style="red"))
    for note in s["capture_notes"]:
        console.print(Text(f"  note: {note}", style="yellow"))


def _spark_reports() -> Mapping[str, Any]:
    from . import spark

    return {"vbuckets": spark.vbuckets, "flow_control": spark.flow_control, "violations": spark.violations}


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
    name="dcp",
    default_ports=PORTS,
    detect=looks_like_dcp,
    max_frame_size=DEFAULT_MAX_FRAME_SIZE,  # detect's bound; the splitter keeps the codec's 20 MiB
    framer=PacketSplitter,
    decode=decode_packet,
    judge=Connection,
    tracker=DcpTracker,
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
    report_signals=DcpSignals,
    hex_fields=HEX_FIELDS,
)
