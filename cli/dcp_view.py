"""How ``dcp mock-producer`` shows its summary: ``--format json`` for scripts, tables for people."""

from __future__ import annotations

from rich.table import Table
from wallaroo_proto_cli.options import plural
from wallaroo_proto_cli.serving import json_summary
from wallaroo_proto_cli.tables import stdout_console


def print_producer_summary(s: dict, fmt: str, verbosity: int) -> None:
    """The run for people: the counts on one line, then (unless -q) a row per vbucket and the violations."""
    if json_summary(s, fmt):
        return
    out = stdout_console()
    ends = ", ".join(f"{k} {v}" for k, v in s["stream_ends"].items()) or "none"
    out.print(
        f"dcp mock-producer summary: {plural(s['connections'], 'connection')}, "
        f"{plural(s['streams'], 'stream')}, {plural(s['items_sent'], 'item')} in "
        f"{plural(s['snapshots'], 'snapshot')}, {plural(s['rollbacks'], 'rollback')}, "
        f"{s['not_my_vbucket']:,} NOT_MY_VBUCKET, {plural(len(s['moved']), 'vbucket')} moved, "
        f"stream ends: {ends}, {plural(s['noops'], 'noop')} answered, "
        f"{plural(s['flow_control_stalls'], 'flow-control stall')}, "
        f"{plural(s['dropped_connections'], 'connection')} dropped, {plural(s['timeouts'], 'timeout')}"
    )
    if verbosity < 0:
        return
    table = Table(title="vbuckets")
    for col in ("vbucket", "uuid", "high seqno", "failover entries", "items sent"):
        table.add_column(col)
    for v in s["vbuckets"]:
        table.add_row(
            str(v["vbucket"]),
            f"{v['uuid']:#018x}",
            str(v["high_seqno"]),
            str(v["failover_entries"]),
            f"{v['items_sent']:,}",
        )
    out.print(table)
    for violation in s["violations"] if verbosity > 0 else s["violations"][:50]:
        out.print(f"[bold red]VIOLATION[/] {violation}")
