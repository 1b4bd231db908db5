"""Printing a rich table whole: on a pipe or in a file, as wide as the table needs."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


def print_table(console: Console, table: Table, heading: str | None = None) -> None:
    """Print ``heading`` on its own line (a table's title wraps at a narrow table's width), then
    ``table``: at the terminal's width on a terminal, else at the table's own width, since a cut or
    folded cell would hide names and numbers from a reader and from scripts."""
    if heading is not None:
        console.print(heading, style="italic", soft_wrap=True, markup=False, highlight=False)
    if console.is_terminal:
        console.print(table)
        return
    width = console.width
    console.width = max(width, Measurement.get(console, console.options.update_width(1 << 20), table).maximum)
    try:
        with console.capture() as captured:
            console.print(table)
    finally:
        console.width = width
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def stdout_console() -> Console:
    """A summary's console on stdout: 200 columns on a pipe, so scripts get whole lines."""
    return Console(
        file=sys.stdout, highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200
    )
