"""``wallaroo-proto dissect``: show, filter and validate the frames in captures.

Thin: the options become a ``wallaroo_proto.capture.reading.Reading`` (which frames, which
form), ``reading.run`` reads the captures, and ``dissect_view`` renders (rich table, hex dump,
lines, each plug-in's summary). Exit codes: 0 ok, 1 violations under --strict, 2 a capture
that could not be read (everything before the damage is still shown).
"""

from __future__ import annotations

import shlex
import sys

import click
from rich.console import Console
from wallaroo_proto_cli.dissect_stats import check_stats, summary_console
from wallaroo_proto_cli.dissect_view import TerminalView, text_line
from wallaroo_proto_cli.options import (
    AliasChoice,
    Command,
    CommandError,
    examples,
    open_failure,
    quiet_broken_pipe,
    usage_error,
    verbosity,
)

from wallaroo_proto.capture.reading import EXIT_UNUSABLE, FrameFilter, Reading, Stopped, run
from wallaroo_proto.capture.views import (
    TIME_FORMATS,
    FieldRows,
    JsonArray,
    PacketExport,
    StreamNames,
    TimeFormat,
    UsageError,
)
from wallaroo_proto.protocols import DEFAULT_MAX_FRAME_SIZE, plugins
from wallaroo_proto.protocols import names as protocol_names
from wallaroo_proto.records import to_json

_TYPE_CHOICES = sorted({name.lower() for plugin in plugins() for name in plugin.type_names})


@click.command(
    name="dissect",
    cls=Command,
    sections={
        "Which frames": [
            "ports",
            "protocol",
            "display_filter",
            "streams",
            "types",
            "connections",
            "since",
            "until",
        ],
        "What is shown": [
            "fmt",
            "fields",
            "field_options",
            "time_format",
            "hexdump",
            "summary",
            "stats",
            "count",
            "write",
        ],
    },
    epilog=examples(
        "wallaroo-proto dissect capture.pcap",
        "wallaroo-proto dissect capture.pcap --summary",
        "wallaroo-proto dissect -c 20 captures/*.pcap",
        "wallaroo-proto dissect capture.pcap --type error --type restart -x",
        "wallaroo-proto dissect capture.pcap -Y 'type == MESSAGE and stream_id in {1 2}'",
        "wallaroo-proto dissect -q --stats io,1 --stats conv capture.pcap",
        "wallaroo-proto dissect captures/*.pcap --format jsonl --strict > frames.jsonl",
        "tcpdump -i lo -U -w - tcp port 7100 | wallaroo-proto dissect -",
    ),
)
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--port",
    "ports",
    type=click.IntRange(1, 65535),
    multiple=True,
    help="TCP port to read (repeat) [default: each protocol's: wallaroo 7100 and 7200, kinesis 7300, "
    "dcp 11210, ambrosia 2000 and 2001, tremor 9899]. "
    "Connections whose first bytes open a known protocol are found on any port.",
)
@click.option(
    "--protocol",
    type=click.Choice(protocol_names()),
    default=None,
    help="Read every connection on the ports (default: the protocol's) as this protocol "
    "[default: detected per connection, by port, then first bytes].",
)
@click.option(
    "-T",
    "--format",
    "fmt",
    type=AliasChoice(["text", "jsonl", "json", "fields"], aliases={"rich": "text"}),
    default="text",
    show_default=True,
    help="text: tables on a terminal, one line a frame otherwise; jsonl: one JSON object a frame "
    "(or a summary with --summary); json: the same as one JSON array; fields: the -e fields.",
)
@click.option(
    "-e",
    "fields",
    multiple=True,
    metavar="FIELD",
    help="With -T fields: a field to write (repeat), named as in jsonl; 'time' is the time column.",
)
@click.option(
    "-E",
    "field_options",
    multiple=True,
    metavar="OPT=V",
    help="With -T fields: separator=,|/t|/s (tab by default), header=y, quote=d|s|n.",
)
@click.option(
    "-t",
    "time_format",
    type=click.Choice(TIME_FORMATS),
    default="u",
    show_default=True,
    help="Time column: a/ad local time (d: with date), u/ud UTC, e epoch seconds, r seconds since "
    "the first frame, d since the previous frame shown.",
)
@click.option(
    "-w",
    "write",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    metavar="FILE",
    help="Write the packets of the frames shown (each frame's completing packet) as a pcap, "
    "instead of showing them ('-': stdout).",
)
@click.option("-x", "--hex", "hexdump", is_flag=True, help="Add a hex dump of each frame's bytes.")
@click.option("--summary", is_flag=True, help="Per connection and stream summary instead of frames.")
@click.option(
    "--stats",
    "stats",
    multiple=True,
    metavar="io,SECONDS|conv|expert",
    callback=check_stats,
    help="After each capture's frames (instead of them with -q), a table (repeat): io,SECONDS: frames "
    "and bytes per interval (io,0: the whole capture); conv: one row per connection; expert: the "
    "findings (errors, warnings, notes) with their causes. Over the frames shown (the filters and -c "
    "apply); as JSON objects with --format jsonl.",
)
@click.option(
    "-c",
    "--count",
    type=click.IntRange(1),
    default=None,
    metavar="N",
    help="Stop after N frames shown, over all FILES (with --summary: summarise the first N frames read).",
)
@click.option(
    "-Y",
    "--display-filter",
    "display_filter",
    metavar="EXPR",
    help="Only frames the expression matches, over the --format jsonl field names: == != < <= > >= "
    "contains matches in {..} and or not ( ), e.g. 'type == MESSAGE and stream_id in {1 2}'.",
)
@click.option(
    "--stream",
    "streams",
    multiple=True,
    help="Only frames of this stream (repeat): its id, or its name (Wallaroo's NOTIFY names it).",
)
@click.option(
    "--type",
    "types",
    multiple=True,
    type=click.Choice(_TYPE_CHOICES, case_sensitive=False),
    metavar="TYPE",
    help="Only frames of this type or 2PC message (repeat), as the type column names it: message, ack, "
    "phase1, ...; a name not known lists them all.",
)
@click.option(
    "--connection", "connections", multiple=True, help="Connection number or part of its id (repeat)."
)
@click.option("--since", help="Frames at or after: epoch seconds, seconds from the first frame, or ISO time.")
@click.option("--until", help="Frames at or before (same forms as --since).")
@click.option("--strict", is_flag=True, help="Exit 1 if any protocol violation is found.")
@click.option(
    "--max-frame-size",
    type=click.IntRange(1),
    default=DEFAULT_MAX_FRAME_SIZE,
    show_default=True,
    help="A longer frame length prefix is a violation (and the connection is read no further).",
)
@verbosity(
    quiet="No notes on stderr (a capture without protocol connections): errors only. "
    "With --stats: the tables alone, no frames (as tshark's -q).",
    verbose="Also a line per capture on stderr: its connections and violations.",
)
@quiet_broken_pipe
def command(
    files,
    ports,
    protocol,
    fmt,
    fields,
    field_options,
    time_format,
    write,
    hexdump,
    summary,
    stats,
    count,
    display_filter,
    streams,
    types,
    connections,
    since,
    until,
    strict,
    max_frame_size,
    verbosity,
):
    """Show, filter and validate the protocol frames in pcap/pcapng FILES ("-" is stdin).

    A pipe or FIFO is read as it is written: frames are shown as their packets arrive.

    Exit 0 when read; 1 with violations under --strict or a capture cut short; 2 when a
    capture cannot be read (what came before the damage is still shown).
    """
    console = Console(highlight=False, soft_wrap=False)
    if summary:
        summary_console(console)
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    clock = TimeFormat(time_format)
    try:
        field_rows = FieldRows.for_options(fmt, fields, field_options, summary, write, clock)
    except UsageError as err:
        raise CommandError(str(err), EXIT_UNUSABLE) from None
    if stats and write == "-":
        raise usage_error("--stats with -w -: the tables would go into the pcap on stdout")
    write_to = None
    if write is not None and write != "-":
        try:  # opened now: a path that cannot be written is a usage error before any reading
            write_to = open(write, "wb")  # noqa: SIM115 - closed at the end
        except OSError as err:
            raise usage_error(open_failure(err, "-w", write)) from err
    export = PacketExport(write_to or write) if write is not None else None
    as_json = fmt == "json"
    if as_json:
        fmt = "jsonl"  # the same lines, written as one array
    json_array = JsonArray(sys.stdout) if as_json else None
    # Lines for scripts (jsonl, fields, text on a pipe), or None: rich tables.
    line_of = {"jsonl": to_json, "fields": field_rows and field_rows.record}.get(fmt)
    if fmt == "text" and not console.is_terminal:
        line_of = lambda r: text_line(r, clock, hexdump, names)  # noqa: E731
    if stats and summary:
        raise click.UsageError("--stats and --summary exclude each other")
    try:
        bounds = FrameFilter.parse_time(since), FrameFilter.parse_time(until)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    keep = FrameFilter(streams, types, connections, *bounds)
    # Stream names, learnt from the frames that give them: for the text's fields and --stream NAME.
    names = StreamNames() if fmt == "text" or keep.stream_names else None
    keep.names = names
    filtering = keep.active
    asked = keep.describe(streams, types, connections, since, until)
    if display_filter is not None:
        from wallaroo_proto.display_filter import FilterError  # only when asked: start-up

        try:
            accept = keep.with_expression(display_filter)
        except FilterError as err:
            raise usage_error(f"-Y: {err}") from None
        filtering = True
        asked = f"{asked} -Y {shlex.quote(display_filter)}".lstrip()
    else:
        accept = keep
    if field_rows is not None and field_rows.header:
        sys.stdout.write(field_rows.header_line() + "\n")
    reading = Reading(
        files=files,
        keep=keep,
        accept=accept,
        clock=clock,
        ports=ports,
        protocol=protocol,
        max_frame_size=max_frame_size,
        fmt=fmt,
        hexdump=hexdump,
        count=count,
        summary=summary,
        stats=stats,
        stats_only=bool(stats) and verbosity < 0,  # as tshark's -q with -z: the tables, no frames
        filtering=filtering,
        asked=asked,
        connections=connections,
        field_rows=field_rows,
        line_of=line_of,
        names=names,
        export=export,
        strict=strict,
        verbosity=verbosity,
    )
    text = fmt == "text" and not summary and not export
    closing = [json_array, export, write_to]
    view = TerminalView(console, errors, json_array, len(files), text, hexdump, clock, names, closing)
    try:
        code = run(reading, view)
    except Stopped as err:
        raise CommandError(str(err), err.code) from None
    if code:
        raise SystemExit(code)
