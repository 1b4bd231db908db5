"""``wallaroo-proto dissect``: show, filter and validate the frames in captures.

Thin: ``wallaroo_proto.capture.dissector.Dissector`` and the protocol plug-ins do the
work; this module parses options, filters records and renders them (rich
table, hex dump, JSONL, each plug-in's summary). Exit codes: 0 ok, 1 violations under --strict, 2 a capture
that could not be read (everything before the damage is still shown).
"""

from __future__ import annotations

import base64
import shlex
import sys
from datetime import UTC, datetime

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from wallaroo_proto_cli.dissect_stats import check_stats, print_stats, print_summary_findings, summary_console
from wallaroo_proto_cli.options import (
    EXIT_INTERRUPTED,
    AliasChoice,
    Command,
    CommandError,
    examples,
    open_failure,
    quiet_broken_pipe,
    usage_error,
    verbosity,
)

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.frame_block import FrameBlock
from wallaroo_proto.capture.pcap import CUT_NOTE, CaptureError, is_stream
from wallaroo_proto.capture.stats import StatsError, feed
from wallaroo_proto.capture.stats import make as make_stats
from wallaroo_proto.capture.views import (
    TIME_FORMATS,
    FieldRows,
    JsonArray,
    PacketExport,
    StreamNames,
    TimeFormat,
    UsageError,
    check_fields,
    field_text,
    parse_options,
)
from wallaroo_proto.protocols import get_plugin, names, plugins
from wallaroo_proto.protocols.wallaroo.frames import DEFAULT_MAX_FRAME_SIZE
from wallaroo_proto.records import to_json

NAME = "wallaroo-proto dissect"
EXIT_VIOLATIONS = 1
EXIT_UNUSABLE = 2
_BATCH = 200

STYLES = {
    "HELLO": "bold cyan",
    "OK": "green",
    "ERROR": "bold red",
    "NOTIFY": "blue",
    "NOTIFY_ACK": "bright_blue",
    "MESSAGE": "white",
    "ACK": "yellow",
    "RESTART": "bold magenta",
    "EOS_MESSAGE": "cyan",
    "WORKERS_LEFT": "magenta",
    "INVALID": "bold red reverse",
}
_ARROWS = {"connector": "C→W", "worker": "W→C", "daemon": "D→P", "processor": "P→D"}
_ARROWS |= {"consumer": "C→P", "producer": "P→C", "lb": "L→I", "ic": "I→L", "client": "C→N", "server": "N→C"}
_TIME_WIDTHS = {"u": 15, "a": 15, "ud": 26, "ad": 26}
_TYPE_CHOICES = sorted({name.lower() for plugin in plugins() for name in plugin.type_names})


def _parse_time(value: str | None) -> float | None:
    """Seconds since the epoch, seconds from the capture start (a small number), or ISO 8601."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give seconds or an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


class _Filter:
    def __init__(self, streams, types, connections, since, until) -> None:
        streams = [str(s) for s in streams]  # ids given as numbers by a caller are ids too
        numeric = {s for s in streams if s.isascii() and s.isdigit()}
        self.stream_names = set(streams) - numeric
        #: Where names asked for are learnt (set by the command when they are).
        self.names: StreamNames | None = None
        self.streams = {int(s) for s in numeric} if streams else None
        self.types = {t.upper() for t in types} or None
        self.connections = list(connections) or None
        self.since = since
        self.until = until
        self.start: float | None = None
        self.active = any(v is not None for v in (self.streams, self.types, self.connections, since, until))

    @staticmethod
    def describe(streams, types, connections, since, until) -> str:
        """The filter's options as the command line gave them, for the note when nothing matches."""
        words = [f"--stream {s}" for s in streams] + [f"--type {t}" for t in types]
        words += [f"--connection {c}" for c in connections]
        words += [
            f"--{name} {value}" for name, value in (("since", since), ("until", until)) if value is not None
        ]
        return " ".join(words)

    def _bound(self, value: float | None) -> float | None:
        # Small numbers are relative to the first frame of the capture.
        if value is None or value >= 1e8 or self.start is None:
            return value
        return self.start + value

    def match_connection(self, conn_index: int, label: str) -> bool:
        if self.connections is None:
            return True
        return any(c == str(conn_index) if c.isdigit() else c in label for c in self.connections)

    def __call__(self, r: dict) -> bool:
        if self.start is None:
            self.start = r["ts"]
        if (
            self.types is not None
            and r["type"].upper() not in self.types
            and r.get("twopc") not in self.types
        ):
            return False
        if (
            self.streams is not None
            and r.get("stream_id") not in self.streams
            and not (self.stream_names and self.names.name(r) in self.stream_names)
        ):
            return False
        if self.connections is not None and not self.match_connection(r["conn_index"], r["connection"]):
            return False
        since = self._bound(self.since)
        if since is not None and r["ts"] < since:
            return False
        until = self._bound(self.until)
        return not (until is not None and r["ts"] > until)


def _preview(data: bytes, width: int = 32) -> str:
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in data[:width])
    return text + ("…" if len(data) > width else "")


def _fields(r: dict) -> str:
    """The frame's own fields, as its protocol's plug-in shows them."""
    return get_plugin(r.get("protocol") or "wallaroo").describe(r)


def _line(r: dict, clock: TimeFormat, hexdump: bool, names: StreamNames) -> str:
    """A frame on one line, for scripts: columns between tabs, never wrapped or cut.

    Notes and violations follow as columns of their own (``note: ...``, ``VIOLATION: ...``),
    so each line is one frame: ``grep -c`` counts frames, ``grep VIOLATION`` shows them whole.
    """
    t = r["type"]
    payload = ""
    if t == "MESSAGE" and not r.get("twopc") and r.get("payload_b64") is not None:
        payload = _preview(base64.b64decode(r["payload_b64"]))
    columns = [
        str(r["packet"]),
        clock(r["ts_ns"]),
        f"#{r['conn_index']}",
        _ARROWS.get(r.get("sender"), "?"),
        r.get("twopc") or t,
        field_text(_fields(names.labelled(r))),
        payload,
    ]
    columns += [f"note: {field_text(note)}" for note in r.get("notes") or ()]
    columns += [f"VIOLATION: {field_text(v)}" for v in r.get("violations") or ()]
    line = "\t".join(columns)
    if hexdump and "_raw" in r:
        line += "\n" + _hexdump(r["_raw"])
    return line


def _hexdump(data: bytes) -> str:
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i : i + 16]
        lines.append(f"{i:06x}  {chunk.hex(' '):<47}  {_preview(chunk, 16)}")
    return "\n".join(lines)


class _RichFrames:
    """Streams rows in small fixed-width tables, so a huge capture prints with flat memory."""

    def __init__(
        self,
        console: Console,
        hexdump: bool,
        clock: TimeFormat | None = None,
        names: StreamNames | None = None,
    ) -> None:
        self.console = console
        self.clock = clock or TimeFormat()
        self.names = names or StreamNames()
        self.hexdump = hexdump
        self.rows: list[dict] = []
        self.header = True

    def add(self, r: dict) -> None:
        self.rows.append(r)
        if len(self.rows) >= _BATCH or self.hexdump:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        table = Table(show_header=self.header, box=None, pad_edge=False, header_style="bold")
        self.header = False
        table.add_column("pkt", justify="right", width=7)
        table.add_column("time", width=_TIME_WIDTHS.get(self.clock.kind))
        table.add_column("conn", justify="right", width=4)
        table.add_column("dir", width=4)
        table.add_column("type", width=17)
        table.add_column("fields", ratio=3, overflow="fold")
        table.add_column("payload", ratio=1, overflow="ellipsis", no_wrap=True)
        for r in self.rows:
            t = r["type"]
            style = STYLES.get(t, "white")
            if r.get("twopc"):
                style = "bold green" if r["twopc"] != "PHASE2" or r.get("commit") else "bold red"
            when = self.clock(r["ts_ns"])
            arrow = _ARROWS.get(r.get("sender"), "?")
            payload = ""
            if t == "MESSAGE" and not r.get("twopc") and r.get("payload_b64") is not None:
                payload = _preview(base64.b64decode(r["payload_b64"]))
            label = r.get("twopc") or t
            table.add_row(
                str(r["packet"]),
                when,
                f"#{r['conn_index']}",
                arrow,
                Text(label, style=style),
                _fields(self.names.labelled(r)),
                payload,
            )
            for note in r.get("notes") or ():
                table.add_row("", "", "", "", Text("note", style="yellow"), Text(note, style="yellow"), "")
            for v in r.get("violations") or ():
                table.add_row("", "", "", "", Text("VIOLATION", style="bold red"), Text(v, style="red"), "")
        self.console.print(table)
        if self.hexdump:
            for r in self.rows:
                if "_raw" in r:
                    self.console.print(Text(_hexdump(r["_raw"]), style="dim"), soft_wrap=True)
        self.rows.clear()


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
    type=click.Choice(names()),
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
        field_rows = _field_rows(fmt, fields, field_options, summary, write, clock)
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
        line_of = lambda r: _line(r, clock, hexdump, names)  # noqa: E731
    if stats and summary:
        raise click.UsageError("--stats and --summary exclude each other")
    stats_only = bool(stats) and verbosity < 0  # as tshark's -q with -z: the tables, no frames
    keep = _Filter(streams, types, connections, _parse_time(since), _parse_time(until))
    # Stream names, learnt from the frames that give them: for the text's fields and --stream NAME.
    names = StreamNames() if fmt == "text" or keep.stream_names else None
    keep.names = names
    filtering = keep.active
    asked = keep.describe(streams, types, connections, since, until)
    if display_filter is not None:
        from wallaroo_proto.display_filter import FilterError, compile_filter  # only when asked: start-up

        try:
            matches = compile_filter(display_filter)
        except FilterError as err:
            raise usage_error(f"-Y: {err}") from None
        accept = matches if not filtering else (lambda r, options=keep: options(r) and matches(r))
        filtering = True
        asked = f"{asked} -Y {shlex.quote(display_filter)}".lstrip()
    else:
        accept = keep
    jsonl = fmt == "jsonl"
    left = count  # frames still to show (None: no limit)
    read = shown = 0
    out = sys.stdout

    def emit(lines: list[str]) -> None:
        if json_array is not None:
            json_array.write(lines)
        else:
            lines.append("")
            out.write("\n".join(lines))
        lines.clear()

    if field_rows is not None and field_rows.header:
        out.write(field_rows.header_line() + "\n")
    violations = 0
    unusable = False
    cut_short = False
    summed = matched = 0  # with --summary: connections summarised, and those --connection kept
    for path in files:
        if left == 0:
            break
        source = sys.stdin.buffer if path == "-" else path
        live = is_stream(source)  # a pipe: each batch is written out at once
        dissector = Dissector(
            path,
            ports=ports or None,
            protocol=protocol,
            max_frame_size=max_frame_size,
            with_raw=hexdump and fmt == "text",
            # Unfiltered, the N frames shown are the first N made: no need to read further.
            max_frames=left if summary or not filtering else None,
        )
        accs = [make_stats(value) for value in stats]
        rich_out = (
            None
            if line_of or summary or export or stats_only
            else _RichFrames(console, hexdump, clock, names)
        )
        if rich_out is not None and len(files) > 1:
            console.rule(path)
        elif fmt == "text" and len(files) > 1 and not summary and not export:
            out.write(f"# {path}\n")
        lines: list[str] = []
        keep.start = None
        clock.start_capture()
        if names is not None:
            names.new_capture()
        if export is not None:
            export.new_capture()
            dissector.tap = export
        try:
            if summary and left is None:
                dissector.drain(source)
            elif summary:  # the frames are made, to be counted
                for item in dissector.frames(source):
                    left -= len(item) if type(item) is FrameBlock else 1
                left = max(left, 0)
            elif stats_only and not filtering and export is None:  # FrameBlocks straight into the counts
                fed = feed(accs, dissector.frames(source), left)
                shown += fed
                left = None if left is None else left - fed
            elif (field_rows is not None or jsonl) and not filtering and export is None and not accs:
                if field_rows is not None:  # taken from the blocks' rows: no dict a frame
                    rows = field_rows
                    batches = (
                        rows.block(item) if type(item) is FrameBlock else [rows.record(item)]
                        for item in dissector.frames(source)
                    )
                else:
                    batches = dissector.jsonl_batches(source)
                for batch in batches:
                    if left is not None:
                        batch = batch[:left]
                        left -= len(batch)
                    lines += batch
                    if left == 0:
                        break
                    if len(lines) >= 2048 or live:
                        emit(lines)
                        if live:
                            out.flush()
            else:
                for records in dissector.record_batches(source):
                    if accs and records and accs[0].origin_ns is None:  # times from the capture's start
                        for acc in accs:
                            acc.origin_ns = records[0]["ts_ns"]
                    for r in records:
                        read += 1
                        if clock.first is None:
                            clock.first = r["ts_ns"]
                        if names is not None:
                            names.learn(r)
                        if filtering and not accept(r):
                            if export is not None:
                                export.record(r["packet"], False)
                            continue
                        shown += 1
                        for acc in accs:
                            acc.add(r)
                        if export is not None:
                            export.record(r["packet"], True)
                        elif stats_only:
                            pass
                        elif line_of is not None:
                            lines.append(line_of(r))
                            if len(lines) >= 1024:
                                emit(lines)
                        else:
                            rich_out.add(r)
                        if left is not None:
                            left -= 1
                            if left == 0:
                                break
                    if live:
                        if lines:
                            emit(lines)
                        if rich_out is not None:
                            rich_out.flush()
                        out.flush()
                    if export is not None and export.gone:
                        raise BrokenPipeError  # `-w - | head`: ended quietly, as any closed pipe
                    if left == 0:
                        break
        except CaptureError as err:
            if err.cut:
                cut_short = True
                errors.print(f"[yellow]{NAME}:[/] {escape(path)}: {escape(str(err))} {CUT_NOTE}", markup=True)
            else:
                unusable = True
                errors.print(f"[bold red]{NAME}:[/] {escape(path)}: {escape(str(err))}", markup=True)
        except UsageError as err:
            raise CommandError(str(err), EXIT_UNUSABLE) from None
        except KeyboardInterrupt:
            out.flush()
            raise CommandError("interrupted", EXIT_INTERRUPTED) from None
        finally:
            if lines:
                emit(lines)
            if rich_out is not None:
                rich_out.flush()
            out.flush()
        violations += dissector.violations()
        for acc in accs:
            try:
                result = acc.result()
            except StatsError as err:
                unusable = True
                errors.print(f"[bold red]{NAME}:[/] {escape(path)}: {escape(str(err))}", markup=True)
                continue
            if jsonl:  # (-T json: in the array)
                emit([to_json({"stats": result.pop("stats"), "capture": path, **result})])
            else:
                print_stats(console, result, path)
        if summary:
            kept = []
            for s in dissector.summaries():
                summed += 1
                if keep.match_connection(s["conn_index"], s["connection"]):
                    kept.append(s)
            matched += len(kept)
            if not jsonl and kept:
                print_summary_findings(console, kept, path)
            for s in kept:
                if jsonl:
                    emit([to_json({"capture": path, "summary": s})])
                else:
                    get_plugin(s.get("protocol", "wallaroo")).print_summary(console, s)
        elif fmt == "text" and dissector.trackers == [] and not unusable and verbosity >= 0:
            ports_read = ", ".join(map(str, sorted(dissector.ports)))
            errors.print(f"{NAME}: {escape(path)}: no protocol connections found (ports {ports_read})")
        if verbosity > 0:
            errors.print(
                f"{NAME}: {path}: {len(dissector.trackers)} connection(s), "
                f"{dissector.violations()} frame(s) with violations"
            )
        out.flush()
    if json_array is not None:
        json_array.close()
    if export is not None:
        export.close()
    if write_to is not None:
        write_to.close()
    if filtering and not summary and not shown and verbosity >= 0:
        errors.print(f"{NAME}: no frame matched {escape(asked)} ({read} frame(s) read)")
    if summary and connections and not matched and verbosity >= 0:
        chosen = " ".join(f"--connection {shlex.quote(c)}" for c in connections)
        errors.print(f"{NAME}: no connection matched {escape(chosen)} ({summed} connection(s) read)")
    if unusable:
        raise SystemExit(EXIT_UNUSABLE)
    if strict and violations:
        errors.print(f"[bold red]{NAME}:[/] {violations} frame(s) with protocol violations", markup=True)
        raise SystemExit(EXIT_VIOLATIONS)
    if cut_short:
        raise SystemExit(EXIT_VIOLATIONS)


def _field_rows(fmt, fields, field_options, summary, write, clock) -> FieldRows | None:
    """``-T fields``' writer, or None; the options that only go with it, checked (as tshark)."""
    if fmt != "fields":
        if fields:
            raise UsageError("-e needs -T fields")
        if field_options:
            raise UsageError("-E needs -T fields")
        if summary and write:
            raise UsageError("-w writes frames: not with --summary")
        if write and fmt != "text":
            raise UsageError(f"-w writes packets instead of showing frames: not with -T {fmt}")
        return None
    if summary or write:
        raise UsageError(f"-T fields writes frames: not with {'--summary' if summary else '-w'}")
    if not fields:
        raise UsageError("-T fields needs at least one -e FIELD")
    return FieldRows(check_fields(fields), parse_options(field_options), clock)
