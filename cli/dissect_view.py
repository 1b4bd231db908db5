"""How ``dissect`` shows frames: the rich table on a terminal, a tab line a frame on a pipe,
and the notes on stderr; the reading itself is ``wallaroo_proto.capture.reading``."""

from __future__ import annotations

import base64
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from wallaroo_proto_cli.dissect_stats import print_stats, print_summary_findings

from wallaroo_proto.capture.pcap import CUT_NOTE, CaptureError
from wallaroo_proto.capture.views import JsonArray, StreamNames, TimeFormat, field_text
from wallaroo_proto.protocols import get_plugin

NAME = "wallaroo-proto dissect"
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


def _preview(data: bytes, width: int = 32) -> str:
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in data[:width])
    return text + ("…" if len(data) > width else "")


def _fields(r: dict) -> str:
    """The frame's own fields, as its protocol's plug-in shows them."""
    return get_plugin(r.get("protocol") or "wallaroo").describe(r)


def text_line(r: dict, clock: TimeFormat, hexdump: bool, names: StreamNames) -> str:
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


class TerminalView:
    """The ``reading.View`` of the command line: stdout for frames, stderr for notes."""

    def __init__(
        self,
        console: Console,
        errors: Console,
        json_array: JsonArray | None,
        files: int,
        text: bool,
        hexdump: bool,
        clock: TimeFormat,
        names: StreamNames | None,
        closing: list,
    ) -> None:
        self.console, self.errors, self.json_array = console, errors, json_array
        self.many, self.text = files > 1, text
        self.hexdump, self.clock, self.names = hexdump, clock, names
        self.closing = closing
        self.out = sys.stdout

    def emit(self, lines: list[str]) -> None:
        if self.json_array is not None:
            self.json_array.write(lines)
        else:
            lines.append("")
            self.out.write("\n".join(lines))
        lines.clear()

    def flush(self) -> None:
        self.out.flush()

    def frames(self) -> _RichFrames:
        return _RichFrames(self.console, self.hexdump, self.clock, self.names)

    def capture_start(self, path: str, frames: object | None) -> None:
        if frames is not None and self.many:
            self.console.rule(path)
        elif self.text and self.many:
            self.out.write(f"# {path}\n")

    def capture_failed(self, path: str, err: CaptureError) -> None:
        if err.cut:
            self.errors.print(
                f"[yellow]{NAME}:[/] {escape(path)}: {escape(str(err))} {CUT_NOTE}", markup=True
            )
        else:
            self.problem(path, str(err))

    def problem(self, path: str, message: str) -> None:
        self.errors.print(f"[bold red]{NAME}:[/] {escape(path)}: {escape(message)}", markup=True)

    def stats(self, result: dict, path: str) -> None:
        print_stats(self.console, result, path)

    def summary(self, kept: list[dict], path: str) -> None:
        if kept:
            print_summary_findings(self.console, kept, path)
        for s in kept:
            get_plugin(s.get("protocol", "wallaroo")).print_summary(self.console, s)

    def note(self, line: str, markup: bool = False) -> None:
        self.errors.print(f"{NAME}: {line if markup else escape(line)}")

    def strict_failure(self, violations: int) -> None:
        self.errors.print(f"[bold red]{NAME}:[/] {violations} frame(s) with protocol violations", markup=True)

    def close(self) -> None:
        for thing in self.closing:
            if thing is not None:
                thing.close()
