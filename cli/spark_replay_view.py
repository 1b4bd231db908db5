"""How ``spark-replay`` shows a run: rich tables of the first rows, or every row as JSON lines, with
per-stage progress and one-line notes on stderr."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from decimal import Decimal

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from wallaroo_proto_cli.tables import print_table

#: Columns left out of the printed tables (they are in --output and the views).
HIDDEN = {
    "connections": ("first_ts", "last_ts"),
    "restarts": ("restart_ts",),
    "twopc": ("phase1_packet", "phase2_packet"),
    "violations": ("offset", "verdict"),
    "findings": ("ts",),
}
CONN_COLUMNS = ("capture", "connection", "conn_index")


def short_connection(frame):
    """Print 'capture#n' instead of the capture, connection and index columns (see Connections)."""
    from pyspark.sql import functions as F  # noqa: N812

    if not all(c in frame.columns for c in CONN_COLUMNS):
        return frame
    conn = F.concat(F.element_at(F.split("capture", "/"), -1), F.lit("#"), F.col("conn_index").cast("string"))
    rest = [c for c in frame.columns if c not in CONN_COLUMNS]
    return frame.select(conn.alias("conn"), *rest)


def votes(frame):
    """2PC votes and decisions as the words people use."""
    from pyspark.sql import functions as F  # noqa: N812

    for column in ("vote", "decision"):
        if column in frame.columns:
            word = F.when(F.col(column), "commit").when(~F.col(column), "abort")
            frame = frame.withColumn(column, word)
    return frame


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value[:24]).decode("utf-8", "replace")
        return text + ("…" if len(value) > 24 else "")
    if isinstance(value, list):
        return ", ".join(_cell(tuple(v) if hasattr(v, "asDict") else v) for v in value)
    if isinstance(value, tuple):
        return "(" + " ".join(_cell(v) for v in value) + ")"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _plain(value: object) -> object:
    """A Spark value as JSON: rows become objects, binary base64, timestamps ISO text."""
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):  # a u64 id (decimal(20,0)): a JSON integer, every digit kept
        return int(value) if value == value.to_integral_value() else float(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def emit_jsonl(name: str, frame) -> None:
    """Every row of ``frame`` as one JSON line tagged with its table, streamed (not collected)."""
    for row in frame.toLocalIterator():
        click.echo(json.dumps({"table": name, **_plain(row)}, separators=(",", ":")))


def fetch(frame, rows: int, hidden: Sequence[str] = ()) -> tuple[list[str], list]:
    """The columns and up to ``rows + 1`` rows of ``frame`` (one more tells that some are left out)."""
    columns = [c for c in frame.columns if c not in hidden]
    return columns, frame.select(*columns).limit(rows + 1).collect()


def show(console: Console, title: str, columns: Sequence[str], got: Sequence, rows: int) -> int:
    """Print up to ``rows`` of ``got`` as a table; returns how many rows were shown."""
    if not got:
        console.print(f"[dim]{escape(title)}: none[/dim]", soft_wrap=True)
        return 0
    table = Table(header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in got[:rows]:
        table.add_row(*(escape(_cell(v)) for v in row))
    print_table(console, table, title)
    if len(got) > rows:
        console.print("[dim]… more rows not shown (--rows, or --output DIR for all of them)[/dim]")
    return min(len(got), rows)


class ConsoleShow:
    """A run shown on consoles: tables on ``out``, problems on ``err``, progress and notes on ``info``;
    ``rows`` None prints every row as JSON lines (wallaroo_proto.spark.replay.Show)."""

    def __init__(self, spark, out: Console, err: Console, info: Console, rows: int | None, name: str) -> None:
        self.spark, self.out, self.err, self.info, self.rows, self.name = spark, out, err, info, rows, name

    def stage(self, description: str) -> AbstractContextManager[None]:
        from wallaroo_proto.spark.session import stage_progress

        return stage_progress(self.spark, description, self.info)

    def problem(self, *parts: str) -> None:
        self.err.print(f"[red]{self.name}: {''.join(escape(p) for p in parts)}[/red]")

    def note(self, text: str) -> None:
        self.info.print(f"[dim]{text}[/dim]")

    def done(self, text: str, detail: str = "") -> None:
        self.info.print(f"[green]{text}[/green]" + (f" {detail}" if detail else ""))

    def table(self, name: str, title: str, frame, answer: bool) -> None:
        rows = self.rows
        if rows is None and self.out.is_terminal:  # --jsonl rows streamed to the terminal: no bar among them
            emit_jsonl(name, frame)
            return
        if rows is None:
            with self.stage(f"table {name}"):
                emit_jsonl(name, frame)
            return
        if not answer and name != "connections":  # 'capture#n' (Connections names them)
            frame = votes(short_connection(frame))
        with self.stage(f"table {name}"):  # ended before the table prints over its line
            columns, got = fetch(frame, rows, HIDDEN.get(name, ()))
        show(self.out, title, columns, got, rows)
