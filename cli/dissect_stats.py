"""``dissect --stats``: the option's check and the tables (``capture.stats`` counts)."""

from __future__ import annotations

from collections import Counter

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text
from wallaroo_proto_cli.tables import print_table

from wallaroo_proto.capture.stats import StatsError, parse_spec
from wallaroo_proto.findings import SEVERITIES, of_summary


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
    if result["stats"] == "expert":
        heading, table = _expert(result, capture)
    elif result["stats"] == "io":
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


#: How each severity looks (Wireshark's expert colours: red, yellow, cyan).
SEVERITY_STYLES = {"error": "bold red", "warning": "yellow", "note": "cyan"}


def findings_table(rows: list[dict], with_count: bool) -> Table:
    """Findings as rows: severity, (count,) connection, packet, type, protocol, finding."""
    table = Table(box=None, header_style="bold")
    table.add_column("severity")
    if with_count:
        table.add_column("count", justify="right")
    table.add_column("conn", justify="right")
    table.add_column("packet", justify="right")
    table.add_column("type")
    table.add_column("protocol")
    table.add_column("finding")
    for row in rows:
        severity = row["severity"]
        cells = [Text(severity, style=SEVERITY_STYLES[severity])]
        if with_count:
            cells.append(f"{row['count']:,}")
        packet = row.get("packet")
        cells += [
            f"#{row['conn_index']}",
            "" if packet is None else str(packet),
            row.get("type") or "",
            row.get("protocol") or "",
            row["finding"],
        ]
        table.add_row(*cells)
    return table


def _expert(result: dict, capture: str) -> tuple[str, Table]:
    counts = ", ".join(f"{severity}s {n:,}" for severity, n in result["counts"].items())
    left_out = sum(result["left_out"].values())
    more = (
        f"; {left_out:,} more findings, past the first {len(result['rows']):,} distinct ones"
        if left_out
        else ""
    )
    return f"expert: {capture} ({counts}{more})", findings_table(result["rows"], with_count=True)


#: Findings ``--summary`` lists before the connections (``--stats expert`` lists them all).
SUMMARY_FINDINGS = 40
#: Columns a summary is laid out in when not on a terminal: every plug-in's tables fit whole.
SUMMARY_WIDTH = 200


def summary_console(console: Console) -> Console:
    """``console`` made ready for connection summaries (dissect's and the proxy's, alike): piped or
    in a file, wide enough that no plug-in's table is cut at 80 columns."""
    if not console.is_terminal and console.width < SUMMARY_WIDTH:
        console.width = SUMMARY_WIDTH
    return console


def print_summary_findings(console: Console, summaries: list[dict], capture: str) -> None:
    """``--summary`` opens on what went wrong or explains the rest: the connections' findings."""
    rows = [row for s in summaries for row in of_summary(s)]
    if not rows:
        console.print(f"findings: none in {capture}", style="italic", soft_wrap=True)
        return
    counts = Counter(row["severity"] for row in rows)
    said = ", ".join(f"{severity}s {counts[severity]:,}" for severity in SEVERITIES if counts[severity])
    console.print(f"findings: {capture} ({said})", style="bold", soft_wrap=True)
    print_table(console, findings_table(rows[:SUMMARY_FINDINGS], with_count=False))
    if len(rows) > SUMMARY_FINDINGS:
        console.print(
            f"... {len(rows) - SUMMARY_FINDINGS:,} more: dissect --stats expert lists them all",
            style="italic",
        )
