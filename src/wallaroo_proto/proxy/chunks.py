"""The relay's bytes on their way to the checker: raw chunks with a small header, not a pcap.

The relay writes each event (a connection opened, bytes forwarded, a FIN, a reset)
as one 17-byte header and the bytes themselves, in one ``writev``: no packet is
synthesised and no checksum computed on the relay's path. The checker rebuilds
the TCP segments with the very ``pcap_writer.TcpSession`` a recording uses, so
its packets, numbers and timestamps are the recording's, and hands them to the
capture ``Dissector`` as ``read_segments`` would: the live checks and ``dissect``
of the recording cannot disagree.
"""

from __future__ import annotations

import fcntl
import struct
from collections.abc import Callable, Iterator

from wallaroo_proto.capture.pcap import WAIT_SEGMENT, CaptureError, Segment, keep_comment
from wallaroo_proto.pcap_writer import DEFAULT_SEGMENT_SIZE, TcpSession
from wallaroo_proto.proxy.outlet import Spool

#: kind, connection number, timestamp (seconds), length of what follows.
_HEADER = struct.Struct("<BIdI")
OPENED, DATA, FIN, RESET, NOTE = 0, 2, 4, 6, 8  # | 1 when the client sent it
#: What the pipe to the checker may hold: the relay runs this far ahead of a busy checker.
PIPE_SIZE = 1 << 20
_READ_SIZE = 1 << 20


def widen_pipe(fd: int, size: int = PIPE_SIZE) -> None:
    """Let a pipe hold ``size`` bytes (Linux; 64 KiB otherwise), so relay and checker do not
    take turns at every chunk; bounded all the same."""
    setter = getattr(fcntl, "F_SETPIPE_SZ", None)
    while setter is not None and size > 1 << 16:
        try:
            fcntl.fcntl(fd, setter, size)
            return
        except OSError:  # above /proc/sys/fs/pipe-max-size for this user: ask for less
            size >>= 1


class ChunkPipe:
    """The relay's side: every event queued whole on a ``Spool`` that writes the checker's pipe
    (the relay never waits on a busy checker; ``Watch`` slows the peers instead)."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool

    def opened(self, conn: int, client: tuple[str, int], server: tuple[str, int], when: float) -> None:
        self._send(OPENED, conn, when, f"{client[0]} {client[1]} {server[0]} {server[1]}".encode())

    def data(self, conn: int, from_client: bool, data: bytes, when: float) -> None:
        self._send(DATA | from_client, conn, when, data)

    def ended(self, conn: int, from_client: bool, reset: bool, when: float) -> None:
        self._send((RESET if reset else FIN) | from_client, conn, when, b"")

    def note(self, conn: int, from_client: bool, text: str, when: float) -> None:
        """A comment on the packet completing the next bytes this side sends (a fault applied there)."""
        self._send(NOTE | from_client, conn, when, text.encode())

    def _send(self, kind: int, conn: int, when: float, data: bytes) -> None:
        self.spool.write(_HEADER.pack(kind, conn, when, len(data)), data)


class SegmentFeed:
    """What a ``TcpSession`` writes, as ``read_segments`` tuples instead of pcap packets.

    Numbered and timed as ``PcapWriter`` numbers and times them (microseconds), so a
    recording written beside it holds the same packets under the same numbers.
    """

    def __init__(self, comments: dict[int, list[str]]) -> None:
        self.packets = 0
        self.segments: list[Segment] = []
        #: A packet's comment, by its number: as ``read_segments`` gives a pcapng's (``stats["comments"]``).
        self.comments = comments

    def tcp_segment(
        self,
        src: tuple[bytes, int],
        dst: tuple[bytes, int],
        seq: int,
        _ack: int,
        flags: int,
        payload: bytes,
        _ip_id: int,
        timestamp: float | None,
        comment: str | None = None,
    ) -> None:
        ts = timestamp or 0.0
        sec = int(ts)
        usec = min(int(round((ts - sec) * 1_000_000)), 999_999)
        self.packets += 1
        key = (src[0], src[1], dst[0], dst[1])
        self.segments.append((self.packets, sec * 1_000_000_000 + usec * 1000, key, seq, flags, payload))
        if comment:
            keep_comment(self.comments, self.packets, [comment])


def segments(read: Callable[[int], bytes], stats: dict | None = None) -> Iterator[Segment]:
    """The TCP segments of the relay's events, ``read(n)`` (what is there, up to ``n`` bytes;
    empty at the end) until their end; ``WAIT_SEGMENT`` before each read (the dissector then
    hands out what it made). Notes go into ``stats["comments"]`` under their packets'
    numbers, as a pcapng's comments do."""
    feed = SegmentFeed((stats if stats is not None else {}).setdefault("comments", {}))
    made = feed.segments
    sessions: dict[int, TcpSession] = {}
    notes: dict[tuple[int, bool], str] = {}
    unpack = _HEADER.unpack_from
    head = _HEADER.size
    buf = b""
    pos = 0
    offset = 0  # of buf[0] in the stream
    while True:
        yield WAIT_SEGMENT
        more = read(_READ_SIZE)
        if not more:
            break
        buf = buf[pos:] + more if pos < len(buf) else more
        offset += pos
        pos = 0
        end = len(buf)
        while end - pos >= head:
            kind, conn, when, length = unpack(buf, pos)
            stop = pos + head + length
            if stop > end:
                break
            from_client = bool(kind & 1)
            kind &= ~1
            if kind == DATA:
                session = sessions.get(conn)
                if session is not None:
                    comment = notes.pop((conn, from_client), None) if notes else None
                    session.send(from_client, buf[pos + head : stop], when, comment)
            elif kind == NOTE:
                notes[(conn, from_client)] = buf[pos + head : stop].decode()
            elif kind == OPENED:
                chost, cport, shost, sport = buf[pos + head : stop].decode().split(" ")
                sessions[conn] = TcpSession(
                    feed,
                    (chost, int(cport)),
                    (shost, int(sport)),
                    timestamp=when,
                    segment_size=DEFAULT_SEGMENT_SIZE,
                )
            elif kind in (FIN, RESET):
                session = sessions.get(conn)
                if session is not None:
                    (session.reset if kind == RESET else session.fin)(from_client, when)
                    if session.closed:
                        del sessions[conn]
                        notes.pop((conn, True), None)
                        notes.pop((conn, False), None)
            else:
                known = f"{OPENED}, {DATA}, {FIN}, {RESET}, {NOTE}, each | 1 from the client"
                raise CaptureError(f"unknown relay event {kind} (known: {known})", offset=offset + pos)
            pos = stop
            if made:
                yield from made
                made.clear()
    if pos < len(buf):
        raise CaptureError(
            f"the relay's stream ends mid-event ({len(buf) - pos} bytes of it)", offset=offset + pos, cut=True
        )
