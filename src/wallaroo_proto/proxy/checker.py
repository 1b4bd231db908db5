"""The proxy's live checker, a process of its own: the relayed bytes in, violations and summaries out.

Run as ``python -m wallaroo_proto.proxy.checker NAME PROTOCOL PORTS LIMIT [state]`` (PROTOCOL
``-``: detected; PORTS comma-separated; LIMIT the bytes all connections may keep of frames
not yet whole, ``HeldBound``, or ``-``) with the relay's events (``proxy.chunks``) on stdin.
The first line, ``{"ready": true}``, says it has started (its imports take a few hundred ms).
Each frame with a violation is written to stdout as its JSONL record the moment it is read;
with ``state``, while frames flow, at most every ``STATE_EVERY`` seconds (and once when they
pause), a line ``{"state": [...]}`` with each connection that changed (``connection_state``);
a line ``{"given_up": {...}}`` (the connection's ident, ``held``, ``limit``) for each
connection no longer checked past LIMIT; at the end, one line ``{"summaries": [...]}``. A
process, not a thread: dissecting costs about as much as relaying, and a second core is worth
more than a shared one.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, TextIO

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.pcap import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, WAIT, CaptureError, Segment
from wallaroo_proto.proxy.chunks import segments
from wallaroo_proto.records import to_json

#: Seconds between state lines while bytes come.
STATE_EVERY = 0.5
#: Violations of one connection, direction and frame type sent to the proxy; the rest are counted.
SHOWN_REPEATS = 10
KEYS_KEPT = 10_000


def connection_state(tracker: Any) -> dict:
    """One connection as the live view shows it: who, how much each way, and its protocol's state."""
    ident = tracker.ident
    initiator = getattr(tracker, "initiator_is_client", True)
    dirs = tracker.dirs
    halves = (dirs[initiator].half, dirs[not initiator].half)
    live = getattr(tracker, "live_state", None)
    return {
        "conn_index": ident["conn_index"],
        "protocol": ident["protocol"],
        "client": [ident["initiator_addr"], ident["initiator_port"]],
        "server": [ident["responder_addr"], ident["responder_port"]],
        # Tremor's summary keeps frames by opcode; every tracker numbers its frames.
        "frames": tracker.frame_index if hasattr(tracker, "frame_index") else tracker.summary.frames,
        "bytes": None if None in halves else [h.offset for h in halves],  # None: the connection is over
        "violations": tracker.summary.violations,
        "state": live() if live is not None else {},
    }


class Pacer:
    """Calls ``tick()`` before a read of ``fd`` at most every ``every`` seconds while bytes come,
    and once when they pause (nothing to read until the next tick is due): no cost per frame,
    and the trackers are between packets whenever it runs. ``before_read()`` goes before
    each read of the input, ``got_data()`` after one that got bytes."""

    __slots__ = ("_fd", "_every", "_due", "_fresh", "_tick")

    def __init__(self, fd: int, every: float, tick: Callable[[], None]) -> None:
        self._fd = fd
        self._every = every
        self._due = time.monotonic() + every
        self._fresh = False
        self._tick = tick

    def before_read(self) -> None:
        if self._fresh:
            wait = self._due - time.monotonic()
            if wait <= 0 or not select.select([self._fd], [], [], wait)[0]:
                self._tick()
                self._fresh = False
                self._due = time.monotonic() + self._every

    def got_data(self) -> None:
        self._fresh = True


class _PacedFile:
    """The checker's input file, read as the dissector asks, paced by a ``Pacer``."""

    __slots__ = ("_fd", "_read", "_pacer")

    def __init__(self, f: BinaryIO, pacer: Pacer) -> None:
        self._fd = f.fileno()
        self._read = f.raw.read if hasattr(f, "raw") else f.read
        self._pacer = pacer

    def fileno(self) -> int:
        return self._fd

    def read1(self, n: int) -> bytes:
        self._pacer.before_read()
        data = self._read(n)
        if data:
            self._pacer.got_data()
        return data

    read = read1  # a pipe's reader (pcap._Stream) asks for read1; read only for the file header


class _StateLines:
    """Writes the state of each connection that changed since the last line. A connection
    over is said once so and then passed by: a long run's closed connections cost nothing."""

    def __init__(self, trackers: list, out: TextIO) -> None:
        self.trackers = trackers  # the dissector's, in order, none ever removed here
        self.out = out
        self.shown: dict[int, tuple] = {}  # by position in trackers: what was last said
        self.over = 0  # the trackers before this position are all over and said so
        self.ended: set[int] = set()  # positions after it of others over

    def __call__(self) -> None:
        changed = []
        for i in range(self.over, len(self.trackers)):
            if i in self.ended:
                continue
            line = connection_state(self.trackers[i])
            seen = (line["frames"], line["bytes"], line["violations"])
            if self.shown.get(i) != seen:
                self.shown[i] = seen
                changed.append(line)
            if line["bytes"] is None:
                self.ended.add(i)
                del self.shown[i]
        while self.over in self.ended:
            self.ended.remove(self.over)
            self.over += 1
        if changed:
            self.out.write(to_json({"state": changed}) + "\n")
            self.out.flush()


class Repeats:
    """Whether a violation is sent on: the first ``SHOWN_REPEATS`` of a connection's direction
    and frame type are, the last of them marked ``repeats_hidden``, and the rest only counted
    in the summary. Garbage is a violation a line; a line each on stderr cost the proxy more
    CPU than the relaying. The keys of the last ``KEYS_KEPT`` kinds are remembered."""

    def __init__(self) -> None:
        self.seen: dict[tuple, int] = {}

    def __call__(self, item: dict) -> bool:
        key = (item.get("conn_index"), item.get("direction"), item.get("type"))
        n = self.seen.get(key, 0) + 1
        if n > SHOWN_REPEATS:
            return False
        self.seen[key] = n
        if len(self.seen) > KEYS_KEPT:
            del self.seen[next(iter(self.seen))]
        if n == SHOWN_REPEATS:
            item["repeats_hidden"] = True
        return True


def every_connection_is(dissector: Dissector, feed: Iterator[Segment]) -> Iterator[Segment]:
    """With ``--protocol`` forced, every relayed connection is of it, whatever its server port:
    with fault rules the client's side is recorded as a connection to the proxy's own port,
    which its first bytes (garbage, say) may not tell, and which went unchecked."""
    plugin = dissector.plugins[0]
    claim = dissector.port_plugins.setdefault
    for segment in feed:
        if segment[4] & (TCP_SYN | TCP_ACK | WAIT) == TCP_SYN:  # a connection's first packet
            claim(segment[2][3], plugin)
        yield segment


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n % (1 << 20) else f"{n >> 20} MiB"


class HeldBound:
    """What all connections keep of frames not yet whole (``Dissector.held_by``), bounded
    together by ``limit`` bytes: each connection may hold its protocol's largest frame, and
    nothing else bounds the sum. Each connection is measured after each of its segments is
    dissected; the one whose segment takes the sum past the limit while asking for more is
    given up (``Dissector.give_up``: its held bytes freed, the rest of it passed by) and told
    to ``say``, and the others go on being checked. A closed connection frees what it held
    (``release``): it is dropped from the sum the next time the sum is counted again."""

    def __init__(self, dissector: Dissector, limit: int, say: Callable[[dict], None]) -> None:
        self.dissector = dissector
        self.limit = limit
        self.say = say
        self.total = 0
        self._held: dict[Any, int] = {}  # by tracker: bytes at its last measure, if any

    def feed(self, feed: Iterator[Segment]) -> Iterator[Segment]:
        """``feed``'s segments, each connection measured once the dissector took its segment."""
        last = None
        for segment in feed:
            if last is not None:
                self.measure(last)
                last = None
            if segment[5] or segment[4] & (TCP_FIN | TCP_RST):
                last = segment[2]
            yield segment
        if last is not None:
            self.measure(last)

    def measure(self, key: tuple) -> None:
        tracker = self.dissector.tracker_of(key)
        if tracker is None:  # not dissected, or over: what it held was freed
            return
        held = self.dissector.held_by(tracker)
        before = self._held.pop(tracker, 0)
        if held:
            self._held[tracker] = held
        self.total += held - before
        if held <= before or self.total <= self.limit:
            return
        self.total = sum(self._recount())
        if self.total <= self.limit:
            return
        self._held.pop(tracker, None)
        self.total -= held
        reason = f"not checked to its end: live checks given up holding {mib(held)} of frames not yet whole"
        self.dissector.give_up(tracker, reason)
        self.say({"given_up": {**tracker.ident, "held": held, "limit": self.limit}})

    def _recount(self) -> Iterator[int]:
        """Each connection's bytes afresh: those over since are dropped."""
        for tracker in list(self._held):
            held = self.dissector.held_by(tracker)
            if held:
                self._held[tracker] = held
                yield held
            else:
                del self._held[tracker]


def main(argv: list[str]) -> int:
    name, protocol, ports, limit, *wanted = argv
    # Ctrl-C, and a SIGTERM to the group (timeout, a service manager, a container's stop), reach
    # this process too: the proxy ends the stream, and this reads to its end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Second to the relay and the peers for the CPU: its work waits in the pipe, theirs holds up the traffic.
    os.nice(10)
    dissector = Dissector(
        name,
        protocol=None if protocol == "-" else protocol,
        ports=[int(p) for p in ports.split(",") if p],
    )
    dissector.want_records = False  # as for --summary: no record where a plug-in can avoid one
    out = sys.stdout
    out.write('{"ready": true}\n')  # what the proxy waits for before it says it is listening
    out.flush()
    source: Any = sys.stdin.buffer
    if wanted == ["state"]:
        source = _PacedFile(source, Pacer(source.fileno(), STATE_EVERY, _StateLines(dissector.trackers, out)))
    error = None

    def say(item: dict) -> None:
        out.write(to_json(item) + "\n")
        out.flush()

    try:
        shown = Repeats()
        feed = segments(source.read1, dissector.stats)
        if protocol != "-":
            feed = every_connection_is(dissector, feed)
        if limit != "-":
            feed = HeldBound(dissector, int(limit), say).feed(feed)
        for item in dissector.segment_frames(feed):
            # Blocks hold accepted frames only: a violation is always a record of its own.
            if type(item) is dict and item.get("violations") and shown(item):
                out.write(to_json(item) + "\n")
                out.flush()
    except CaptureError as err:
        error = str(err)
    out.write(to_json({"summaries": dissector.summaries(), "error": error}) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
