"""How ``kinesis mock-daemon`` shows its summary: ``--format json`` for scripts, tables for people."""

from __future__ import annotations

from rich.table import Table
from wallaroo_proto_cli.options import plural
from wallaroo_proto_cli.serving import json_summary
from wallaroo_proto_cli.tables import stdout_console


def print_daemon_summary(summary_: dict, fmt: str) -> None:
    """The run for people: totals on one line, a row per shard, then each failure."""
    if json_summary(summary_, fmt):
        return
    out = stdout_console()
    out.print(
        f"kinesis mock-daemon summary: {plural(summary_['records_delivered'], 'record')} delivered "
        f"({summary_['records_redelivered']:,} again), {summary_['records_checkpointed']:,} checkpointed, "
        f"{plural(summary_['checkpoints'], 'checkpoint')}, "
        f"{plural(summary_['checkpoint_errors'], 'checkpoint error')}, {summary_['seconds']:.1f}s in all, "
        f"{summary_['delivery_seconds']:.3f}s delivering ({summary_['records_per_second']:,.0f} records/s)"
    )
    table = Table(title="shards")
    columns = (
        "shard",
        "records",
        "delivered",
        "checkpointed",
        "checkpoints",
        "errors",
        "checkpoint",
        "end",
        "processors",
    )
    for col in columns:
        table.add_column(col)
    for s in summary_["shards"]:
        reasons = s["checkpoint_error_reasons"]
        errors = ", ".join(
            f"{k} {v}" + (f" (last: {reasons[k]})" if k in reasons else "")
            for k, v in s["checkpoint_errors"].items()
        )
        table.add_row(
            s["shard_id"],
            f"{s['records']:,}",
            f"{s['delivered']:,}",
            f"{s['checkpointed']:,}",
            str(s["checkpoints"]),
            errors,
            "" if s["checkpoint"] is None else f"{s['checkpoint']}/{s['sub_sequence_number']}",
            s["end"],
            f"{s['spawns']}" + (f" ({s['kills']} killed)" if s["kills"] else ""),
        )
    out.print(table)
    for failure in summary_["failures"]:
        out.print(f"[bold red]FAILED[/] {failure}")
