"""dissect's outputs for scripts: time formats, ``-T fields`` rows, a JSON array, filtered packet export.

Each view takes records (dicts) or, where it can, the plug-ins' ``FrameBlock``s
directly (``FieldRows.block``): a ``-T fields`` row of a block's frame is made
from its columns, never from a record dict.
"""

from __future__ import annotations

import difflib
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from functools import partial
from typing import Any, BinaryIO

from wallaroo_proto.protocols import as_hex, hex_fields, schema

from .frame_block import SHARED, FrameBlock

#: ``-t`` formats, as tshark names them.
TIME_FORMATS = ("a", "ad", "d", "e", "r", "u", "ud")
#: A field ``-e`` takes besides the record's: the frame's time as ``-t`` formats it.
TIME_FIELD = "time"


class UsageError(ValueError):
    """Options that do not fit together, or a name that is not known: exit 2."""


def _utc_clock(ns: int) -> str:
    """UTC time of day by arithmetic: a damaged capture's timestamp may lie outside datetime's years."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    minutes, second = divmod(seconds % 86400, 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}:{second:02d}.{fraction // 1000:06d}"


def _seconds(ns: int) -> str:
    sign = "-" if ns < 0 else ""
    whole, fraction = divmod(abs(ns), 1_000_000_000)
    return f"{sign}{whole}.{fraction // 1000:06d}"


def _dated(ns: int, local: bool, with_date: bool) -> str:
    seconds, fraction = divmod(ns, 1_000_000_000)
    try:
        moment = datetime.fromtimestamp(seconds, None if local else UTC)
    except (OverflowError, OSError, ValueError):  # out of datetime's range: the epoch seconds
        return _seconds(ns)
    text = moment.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")
    return f"{text}.{fraction // 1000:06d}"


class TimeFormat:
    """A frame's time as text, as tshark's ``-t``: a/ad local, u/ud UTC (d: with date), e epoch,
    r seconds since the capture's first frame, d since the previous frame shown."""

    def __init__(self, kind: str = "u") -> None:
        if kind not in TIME_FORMATS:
            raise UsageError(f"-t {kind}: not a time format (one of {', '.join(TIME_FORMATS)})")
        self.kind = kind
        self.first: int | None = None
        self.previous: int | None = None

    def start_capture(self) -> None:
        """Times relative to a frame (``r``, ``d``) count within each capture."""
        self.first = None
        self.previous = None

    def seen(self, ns: int) -> None:
        """A frame read, shown or not: the first one is ``r``'s zero."""
        if self.first is None:
            self.first = ns

    def __call__(self, ns: int) -> str:
        """The time of a frame shown (for ``d``, the next one counts from it)."""
        kind = self.kind
        if kind == "u":
            return _utc_clock(ns)
        if kind == "e":
            return _seconds(ns)
        if kind == "r":
            self.seen(ns)
            return _seconds(ns - self.first)
        if kind == "d":
            before, self.previous = self.previous, ns
            return _seconds(0 if before is None else ns - before)
        return _dated(ns, local=kind in ("a", "ad"), with_date=kind.endswith("d"))


# --- -T fields ------------------------------------------------------------------------

_SEPARATORS = {"/t": "\t", "/s": " "}
_QUOTES = {"d": '"', "s": "'", "n": ""}
_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def check_fields(names: Iterable[str]) -> list[str]:
    """``-e`` names, each a record field (``protocols.schema.field_names()``) or ``time``; else a
    did-you-mean."""
    known = (*schema.field_names(), TIME_FIELD)
    out = []
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {' or '.join(close)}?" if close else " (the names of --format jsonl)"
            raise UsageError(f"-e {name}: no such field{hint}")
        out.append(name)
    return out


def parse_options(pairs: Iterable[str]) -> dict[str, str]:
    """``-E`` options: separator=C|/t|/s, header=y|n, quote=d|s|n (as tshark's)."""
    options = {"separator": "\t", "header": "n", "quote": ""}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name == "separator" and value:
            options[name] = _SEPARATORS.get(value, value)
        elif name == "header" and value in ("y", "n"):
            options[name] = value
        elif name == "quote" and value in _QUOTES:
            options[name] = _QUOTES[value]
        else:
            raise UsageError(f"-E {pair}: expected separator=C|/t|/s, header=y|n or quote=d|s|n")
    return options


def _text(value: str) -> str:
    """A string on one line: a newline, tab or backslash in it is written as its escape."""
    return value if value.isprintable() and "\\" not in value else value.translate(_ESCAPES)


def field_text(value: Any) -> str:
    """One value as ``-T fields`` writes it: lists joined by ',' (a struct's values by ':'),
    booleans as in JSON, absent as nothing."""
    kind = type(value)
    if kind is str:
        return _text(value)
    if kind is int:
        return str(value)
    if value is None:
        return ""
    if kind is bool:
        return "true" if value else "false"
    if kind is float:
        return repr(value)
    if kind is list or kind is tuple:
        return ",".join(
            ":".join(map(field_text, v.values())) if type(v) is dict else field_text(v) for v in value
        )
    return _text(str(value))


def _hex_text(value: Any, digits: int) -> str:
    return as_hex(int(value), digits)


class FieldRows:
    """``-T fields`` lines: the ``-e`` fields of each frame, joined by the separator."""

    def __init__(self, names: list[str], options: dict[str, str], clock: TimeFormat) -> None:
        self.names = names
        self.separator = options["separator"]
        self.quote = options["quote"]
        self.header = options["header"] == "y"
        self.clock = clock
        self._kinds = [schema.field_types().get(name, "string") for name in names]
        hexes = hex_fields()
        #: Digits of each field shown in hex (as the table shows it), else None.
        self._hex = [hexes.get(name) for name in names]

    @classmethod
    def for_options(
        cls, fmt: str, fields: Iterable[str], options: Iterable[str], summary: bool, write: str | None,
        clock: TimeFormat,
    ) -> FieldRows | None:  # fmt: skip
        """``-T fields``' writer, or None; the options that only go with it, checked (as tshark):
        a mismatch is a UsageError."""
        if fmt != "fields":
            if fields:
                raise UsageError("-e needs -T fields")
            if options:
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
        return cls(check_fields(fields), parse_options(options), clock)

    def header_line(self) -> str:
        return self.separator.join(self._quoted(name) for name in self.names)

    def _quoted(self, text: str) -> str:
        q = self.quote
        return f"{q}{text.replace(q, chr(92) + q)}{q}" if q else text

    def record(self, r: dict) -> str:
        get = r.get
        values = [
            self.clock(r["ts_ns"])
            if name == TIME_FIELD
            else field_text(get(name))
            if digits is None or get(name) is None
            else as_hex(int(get(name)), digits)
            for name, digits in zip(self.names, self._hex, strict=True)
        ]
        if self.quote:
            values = [self._quoted(v) for v in values]
        return self.separator.join(values)

    def block(self, block: FrameBlock) -> list[str]:
        """A block's lines from its columns (a shared field written once for all its rows)."""
        n = len(block.rows)
        if not n:
            return []
        columns: list[Iterable[str]] = []
        positions = {name: i for i, name in enumerate(name for name, kind in block.layout if kind != SHARED)}
        for name, kind, digits in zip(self.names, self._kinds, self._hex, strict=True):
            if name == TIME_FIELD:
                if "ts_ns" in block.shared:
                    stamps: Iterable[int] = (block.shared["ts_ns"],) * n
                else:
                    at = positions["ts_ns"]
                    stamps = [row[at] for row in block.rows]
                columns.append([self._cell(self.clock(ns)) for ns in stamps])
            elif name in block.shared:
                value = block.shared[name]
                text = field_text(value) if digits is None or value is None else as_hex(int(value), digits)
                columns.append((self._cell(text),) * n)
            elif name in positions:
                at = positions[name]
                if digits is not None:
                    convert: Callable[[Any], str] = partial(_hex_text, digits=digits)
                elif kind in ("int", "long", "u64"):
                    convert = str
                else:
                    convert = field_text
                column = [convert(row[at]) if row[at] is not None else "" for row in block.rows]
                columns.append([self._quoted(v) for v in column] if self.quote else column)
            else:
                columns.append((self._cell(""),) * n)
        if len(columns) == 1:
            return list(columns[0])
        return list(map(self.separator.join, zip(*columns, strict=True)))

    def _cell(self, text: str) -> str:
        return self._quoted(text) if self.quote else text


class JsonArray:
    """``-T json``: the JSONL lines written as one JSON array, as they come (nothing held)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.started = False

    def write(self, lines: list[str]) -> None:
        if not lines:
            return
        text = ",\n".join(lines)
        self.out.write(("[\n" if not self.started else ",\n") + text)
        self.started = True

    def close(self) -> None:
        self.out.write("\n]\n" if self.started else "[]\n")


# --- -w FILE --------------------------------------------------------------------------


class PacketExport:
    """The packets of the frames kept, written as a pcap: each kept frame's completing packet.

    Fed every packet as it is read (``packet``) and every record in output order
    (``record``): records come out in packet order, so a packet older than the
    last record seen is never needed again and is dropped. Memory is bounded by
    how far records lag the reading (the reassembly's out-of-order window), with
    ``max_bytes`` as a hard cap on what is held.
    """

    def __init__(self, target: str | BinaryIO, *, max_bytes: int = 64 << 20) -> None:
        self.target = target
        self.max_bytes = max_bytes
        self.writer = None
        self.written = 0
        self._held: deque[tuple[int, int, bytes]] = deque()
        self._bytes = 0
        self._last = 0  # the last packet written (a packet with several kept frames goes once)
        self.linktype: int | None = None
        self.nanoseconds = False

    def new_capture(self) -> None:
        """Packet numbers start again."""
        self._held.clear()
        self._bytes = 0
        self._last = 0

    def begin(self, linktype: int, nanoseconds: bool) -> None:
        """A capture's link type: the output's header comes from the first one."""
        from wallaroo_proto.pcap_writer import PcapWriter

        if self.writer is None:
            self.linktype, self.nanoseconds = linktype, nanoseconds
            self.writer = PcapWriter(self.target, linktype=linktype, nanoseconds=nanoseconds)
            self.writer.gone_warning = None  # the command ends quietly, as on any closed pipe
        elif linktype != self.linktype:
            raise UsageError(
                f"-w: captures of different link types ({self.linktype}, {linktype}) in one pcap"
            )

    def packet(self, number: int, ts_ns: int, data: bytes) -> None:
        held = self._held
        held.append((number, ts_ns, data))
        self._bytes += len(data)
        while self._bytes > self.max_bytes and len(held) > 1:
            self._bytes -= len(held.popleft()[2])

    def record(self, packet: int, kept: bool) -> None:
        """A record in output order; ``kept``: its frame passed the filters."""
        held = self._held
        while held and held[0][0] < packet:
            self._bytes -= len(held.popleft()[2])
        if kept and held and held[0][0] == packet and packet != self._last:
            number, ts_ns, data = held[0]
            self.writer.write_raw(data, ts_ns)
            self._last = number
            self.written += 1

    @property
    def gone(self) -> bool:
        """The pipe written to lost its reader: nothing more can be written."""
        return self.writer is not None and not self.writer.recording

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# --- stream names -----------------------------------------------------------------------


class StreamNames:
    """Stream names a connection's frames gave (Wallaroo's NOTIFY), to show beside the ids of
    its later frames, whose records hold only the id (a 20-digit hash, for a named stream)."""

    #: Names remembered at most (per capture): a stream is named once per connection.
    MAX = 100_000

    def __init__(self) -> None:
        self._names: dict[tuple[int, int], str] = {}

    def new_capture(self) -> None:
        self._names.clear()

    def learn(self, r: dict) -> None:
        name = r.get("stream_name")
        if name is not None and r.get("stream_id") is not None and len(self._names) < self.MAX:
            self._names[(r["conn_index"], r["stream_id"])] = name

    def name(self, r: dict) -> str | None:
        """The name of the record's stream, if its connection gave one."""
        sid = r.get("stream_id")
        if sid is None:
            return None
        return r.get("stream_name") or self._names.get((r["conn_index"], sid))

    def labelled(self, r: dict) -> dict:
        """The record with its stream id shown as ``name (id)`` where only the id is in it."""
        if "stream_name" in r:
            return r
        name = self.name(r)
        return r if name is None else {**r, "stream_id": f"{name} ({r['stream_id']})"}
