"""``dissect --stats``: the option's check and the tables (``capture.stats`` counts)."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table
from wallaroo_proto_cli.tables import print_table

from wallaroo_proto.capture.stats import StatsError, parse_spec


def check_stats(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """Each ``--stats`` value is io,SECONDS or conv (a usage error, exit 2, otherwise)."""
    for value in values:
        try:
            parse_spec(value)
        except StatsError as err:
            raise click.BadParameter(str(err), ctx=ctx, param=param) from None
    return values


def _seconds(value: float) -> str:
    return f"{value:.6f}".rstrip("0").rstrip(".") if value else "0"


def print_stats(console: Console, result: dict, capture: str) -> None:
    """One statistic (``IoStats.result`` or ``ConvStats.result``) as a table."""
    if result["stats"] == "io":
        interval = result["interval"]
        title = f"io, {_seconds(interval)} s intervals" if interval else "io, whole capture"
        heading = f"{title}: {capture}"
        table = Table(box=None, header_style="bold")
        for name in ("start", "end", "frames", "bytes"):
            table.add_column(name, justify="right")
        table.add_column("types")
        for row in result["rows"]:
            types = ", ".join(f"{name} {n:,}" for name, n in row["types"].items())
            table.add_row(
                _seconds(row["start"]), _seconds(row["end"]), f"{row['frames']:,}", f"{row['bytes']:,}", types
            )
    else:
        heading = f"conversations: {capture}"
        table = Table(box=None, header_style="bold")
        table.add_column("conn", justify="right")
        table.add_column("protocol")
        table.add_column("A (initiator)")
        table.add_column("B (responder)")
        names = ("frames_ab", "bytes_ab", "frames_ba", "bytes_ba", "frames", "bytes")
        for name in ("A→B frames", "A→B bytes", "B→A frames", "B→A bytes", "frames", "bytes"):
            table.add_column(name, justify="right")
        for name in ("start", "duration", "violations"):
            table.add_column(name, justify="right")
        for row in result["rows"]:
            table.add_row(
                f"#{row['conn_index']}",
                row["protocol"] or "",
                row["a"],
                row["b"],
                *(f"{row[name]:,}" for name in names),
                _seconds(row["start"]),
                _seconds(row["duration"]),
                str(row["violations"]),
            )
    print_table(console, table, heading)
