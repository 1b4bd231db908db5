"""One dissect run over captures: which frames are kept, which of four read paths makes them.

The fastest path that can give what was asked is taken: ``--summary`` drains the dissector
(or counts its frames), ``--stats`` alone feeds the ``FrameBlock``s to the counters,
unfiltered ``-T fields``/``-T jsonl`` takes its lines from the blocks, and anything else
(filters, the rich table, ``-w``) goes record by record. Every path shows the same frames;
the command line only turns options into a ``Reading`` and renders through a ``View``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from wallaroo_proto.records import to_json

from .dissector import Dissector
from .frame_block import FrameBlock
from .pcap import CaptureError, is_stream
from .stats import StatsError, feed
from .stats import make as make_stats
from .views import FieldRows, PacketExport, StreamNames, TimeFormat, UsageError

EXIT_VIOLATIONS = 1
EXIT_UNUSABLE = 2


class Stopped(Exception):
    """The run stops with this message and exit code (a bad name in a capture, an interrupt)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class FrameFilter:
    """``--stream``, ``--type``, ``--connection``, ``--since`` and ``--until`` as one test of a record."""

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
    def parse_time(value: str | None) -> float | None:
        """``--since``/``--until``: seconds since the epoch, seconds from the capture's first frame (a
        small number), or an ISO 8601 time (UTC unless it says otherwise); ValueError otherwise."""
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r}: give seconds or an ISO 8601 time") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()

    def with_expression(self, expression: str) -> Callable[[dict], bool]:
        """A test of a record by this filter and a ``-Y`` expression both (FilterError when the
        expression cannot be read)."""
        from wallaroo_proto.display_filter import compile_filter  # only when asked: start-up

        matches = compile_filter(expression)
        return matches if not self.active else (lambda r: self(r) and matches(r))

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


class Frames(Protocol):
    """Where a record-by-record run's frames go when they are not lines (the rich table)."""

    def add(self, r: dict) -> None: ...
    def flush(self) -> None: ...


class View(Protocol):
    """How a run is shown: the command's rendering, called as the run goes."""

    def emit(self, lines: list[str]) -> None: ...
    def flush(self) -> None: ...
    def capture_start(self, path: str, frames: Frames | None) -> None: ...
    def frames(self) -> Frames: ...
    def capture_failed(self, path: str, err: CaptureError) -> None: ...
    def problem(self, path: str, message: str) -> None: ...
    def stats(self, result: dict, path: str) -> None: ...
    def summary(self, kept: list[dict], path: str) -> None: ...
    def note(self, line: str, markup: bool = False) -> None: ...
    def close(self) -> None: ...
    def strict_failure(self, violations: int) -> None: ...


@dataclass
class Reading:
    """A dissect run: what is read, what is kept and shown, in which form."""

    files: Sequence[str]
    keep: FrameFilter
    accept: Callable[[dict], bool]
    clock: TimeFormat
    ports: Sequence[int] = ()
    protocol: str | None = None
    max_frame_size: int | None = None  # None: each plug-in's own
    fmt: str = "text"
    hexdump: bool = False
    count: int | None = None
    summary: bool = False
    stats: Sequence[str] = ()
    stats_only: bool = False
    filtering: bool = False
    asked: str = ""
    connections: Sequence[str] = ()
    field_rows: FieldRows | None = None
    line_of: Callable[[dict], str] | None = None
    names: StreamNames | None = None
    export: PacketExport | None = None
    strict: bool = False
    verbosity: int = 0


def run(reading: Reading, view: View) -> int:  # noqa: C901 - the four paths side by side
    """Read every capture as ``reading`` asks, shown through ``view``: the exit code (0, 1, 2)."""
    o = reading
    fmt, keep, accept, clock, names, export = o.fmt, o.keep, o.accept, o.clock, o.names, o.export
    field_rows, line_of, filtering, summary, stats_only = (
        o.field_rows,
        o.line_of,
        o.filtering,
        o.summary,
        o.stats_only,
    )
    jsonl = fmt == "jsonl"
    left = o.count  # frames still to show (None: no limit)
    read = shown = 0
    emit = view.emit
    violations = 0
    unusable = False
    cut_short = False
    summed = matched = 0  # with --summary: connections summarised, and those --connection kept
    for path in o.files:
        if left == 0:
            break
        source = sys.stdin.buffer if path == "-" else path
        live = is_stream(source)  # a pipe: each batch is written out at once
        dissector = Dissector(
            path,
            ports=o.ports or None,
            protocol=o.protocol,
            max_frame_size=o.max_frame_size,
            with_raw=o.hexdump and fmt == "text",
            # Unfiltered, the N frames shown are the first N made: no need to read further.
            max_frames=left if summary or not filtering else None,
        )
        accs = [make_stats(value) for value in o.stats]
        rich_out = None if line_of or summary or export or stats_only else view.frames()
        view.capture_start(path, rich_out)
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
                            view.flush()
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
                        view.flush()
                    if export is not None and export.gone:
                        raise BrokenPipeError  # `-w - | head`: ended quietly, as any closed pipe
                    if left == 0:
                        break
        except CaptureError as err:
            if err.cut:
                cut_short = True
            else:
                unusable = True
            view.capture_failed(path, err)
        except UsageError as err:
            raise Stopped(str(err), EXIT_UNUSABLE) from None
        except KeyboardInterrupt:
            view.flush()
            raise Stopped("interrupted", 130) from None
        finally:
            if lines:
                emit(lines)
            if rich_out is not None:
                rich_out.flush()
            view.flush()
        violations += dissector.violations()
        for acc in accs:
            try:
                result = acc.result()
            except StatsError as err:
                unusable = True
                view.problem(path, str(err))
                continue
            if jsonl:  # (-T json: in the array)
                emit([to_json({"stats": result.pop("stats"), "capture": path, **result})])
            else:
                view.stats(result, path)
        if summary:
            kept = []
            for s in dissector.summaries():
                summed += 1
                if keep.match_connection(s["conn_index"], s["connection"]):
                    kept.append(s)
            matched += len(kept)
            if jsonl:
                for s in kept:
                    emit([to_json({"capture": path, "summary": s})])
            else:
                view.summary(kept, path)
        elif fmt == "text" and dissector.trackers == [] and not unusable and o.verbosity >= 0:
            ports_read = ", ".join(map(str, sorted(dissector.ports)))
            view.note(f"{path}: no protocol connections found (ports {ports_read})")
        if o.verbosity > 0:
            view.note(
                f"{path}: {len(dissector.trackers)} connection(s), "
                f"{dissector.violations()} frame(s) with violations",
                markup=True,
            )
        view.flush()
    view.close()
    if filtering and not summary and not shown and o.verbosity >= 0:
        view.note(f"no frame matched {o.asked} ({read} frame(s) read)")
    if summary and o.connections and not matched and o.verbosity >= 0:
        chosen = " ".join(f"--connection {shlex.quote(c)}" for c in o.connections)
        view.note(f"no connection matched {chosen} ({summed} connection(s) read)")
    if unusable:
        return EXIT_UNUSABLE
    if o.strict and violations:
        view.strict_failure(violations)
        return EXIT_VIOLATIONS
    if cut_short:
        return EXIT_VIOLATIONS
    return 0
