"""``wallaroo-proto report``: captures into one self-contained HTML report (thin CLI).

The work lives in ``wallaroo_proto.report``. Exit codes: 0 written; 2 bad usage,
a capture that could not be read to its end (the report still shows what came
before the damage), or a report that could not be written.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from wallaroo_proto_cli.options import Command, examples, open_failure, output_option, usage_error, verbosity

from wallaroo_proto.capture.pcap import CUT_NOTE
from wallaroo_proto.display_filter import FilterError, compile_filter
from wallaroo_proto.findings import SEVERITIES
from wallaroo_proto.main_thread_signals import entered_without_signals
from wallaroo_proto.protocols import names
from wallaroo_proto.report.model import ReportLimits

NAME = "wallaroo-proto report"
EXIT_PROBLEM = 1
EXIT_UNUSABLE = 2


@click.command(
    name="report",
    cls=Command,
    epilog=examples(
        "wallaroo-proto report capture.pcap",
        "wallaroo-proto report captures/*.pcap -o run-42.html --title 'run 42'",
        "wallaroo-proto report sink.pcap --frames 50 --max-connections 5",
        "wallaroo-proto report sink.pcap -Y 'stream_id == 1 or type in {RESTART ERROR}'",
    ),
)
@click.argument("captures", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@output_option(
    "The HTML file to write (it opens offline: scripts and styles are inside).",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("report.html"),
    show_default=True,
)
@click.option(
    "--port",
    "ports",
    type=click.IntRange(1, 65535),
    multiple=True,
    help="TCP port to read (repeat) [default: each protocol's]; connections that open with a known "
    "protocol are found on any port.",
)
@click.option(
    "--protocol", type=click.Choice(names()), default=None, help="Read every connection as this protocol."
)
@click.option("--frames", "shown", type=click.IntRange(1), default=20, show_default=True,
              help="A ladder without findings opens on its first and last N frames.")  # fmt: skip
@click.option("--max-frames", type=click.IntRange(2), default=1000, show_default=True,
              help="Frames kept per connection for paging (its first and last halves).")  # fmt: skip
@click.option("--max-connections", type=click.IntRange(0), default=20, show_default=True,
              help="Connections drawn; the rest get a row in the summary table.")  # fmt: skip
@click.option(
    "-Y",
    "--display-filter",
    "display_filter",
    metavar="EXPR",
    help="Draw only the frames the expression matches (as dissect -Y).",
)
@click.option(
    "--title", default="wallaroo-proto capture report", show_default=True, help="The report's heading."
)
@verbosity(
    quiet="No progress and no counts line: errors and the report's path.",
    verbose="Also a line per capture: its connections, frames and violations.",
)
def command(
    captures, output, ports, protocol, shown, max_frames, max_connections, display_filter, title, verbosity
) -> None:
    """Draw pcap/pcapng CAPTURES as one HTML file that opens offline: the findings first, each
    linked to its frame, then a ladder diagram per connection, throughput and the protocol's
    signals over time, latency distributions and the summary tables. Prints the report's path.

    Exit 0 when written; 1 when a capture was cut short; 2 when a capture cannot be read
    or the report cannot be written.
    """
    from wallaroo_proto.report.collect import build_report
    from wallaroo_proto.report.html import write_report

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        keep = None if display_filter is None else compile_filter(display_filter)
    except FilterError as err:
        raise usage_error(f"-Y: {err}") from None
    limits = ReportLimits(ladder_frames=max_frames, shown_frames=shown, connections=max_connections)
    status = console.status("dissecting…") if verbosity >= 0 else contextlib.nullcontext()
    with entered_without_signals(status):
        report = build_report(
            captures, ports=ports or None, protocol=protocol, limits=limits, title=title, keep=keep
        )
    try:
        size = write_report(report, output)
    except OSError as err:
        raise usage_error(open_failure(err, "--output")) from None
    conns = [c for cap in report.captures for c in cap.connections]
    violations = sum(c.violations for c in conns)
    for capture in report.captures:
        if capture.cut:
            console.print(f"[yellow]{NAME}:[/] {escape(capture.name)}: {escape(capture.error)} {CUT_NOTE}")
        elif capture.error:
            console.print(f"[bold red]{NAME}:[/] {escape(capture.name)}: {escape(capture.error)}")
        elif not capture.connections and verbosity >= 0:
            console.print(f"{NAME}: {escape(capture.name)}: no protocol connections found")
        elif verbosity > 0:
            mine = capture.connections
            console.print(
                f"{NAME}: {escape(capture.name)}: {len(mine)} connection(s), {sum(c.frames for c in mine)} "
                f"frames, {sum(c.violations for c in mine)} with violations"
            )
    if verbosity >= 0:
        found = Counter()
        for c in conns:
            found.update(c.finding_counts)
        said = ", ".join(f"{found[s]} {s}{'s' if found[s] != 1 else ''}" for s in SEVERITIES if found[s])
        console.print(
            f"{len(report.captures)} capture(s), {len(conns)} connection(s), "
            f"{sum(c.frames for c in conns)} frames, {violations} with violations; "
            f"findings: {said or 'none'}; {size / 1024:.0f} KiB"
        )
    click.echo(os.path.abspath(output))
    if any(c.error and not c.cut for c in report.captures):
        raise SystemExit(EXIT_UNUSABLE)
    if any(c.cut for c in report.captures):
        raise SystemExit(EXIT_PROBLEM)
