"""What went over the live connections: dissected as it goes (the core judges every frame,
as ``dissect`` and the proxy judge) and, with ``--record``, written as a pcapng whose
packets carry the comparison's comments.

The bytes become TCP segments (``pcap_writer.TcpSession``), as the proxy's checker rebuilds
them, and a ``Dissector`` reads them: so the records of a live frame are exactly the records
``dissect`` gives for the recording of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.frame_block import FrameBlock
from wallaroo_proto.capture.pcap import PAUSE_SEGMENT, Segment
from wallaroo_proto.pcap_writer import DEFAULT_SEGMENT_SIZE, PcapWriter, TcpSession
from wallaroo_proto.proxy.chunks import SegmentFeed

#: Packets held for notes still to come, at most: beyond, they are written (and a late note goes on
#: the next packet written).
MAX_HELD = 10_000


class _Tee:
    """A ``TcpSession``'s segments to the dissector now, and to the recording once judged."""

    def __init__(self, feed: SegmentFeed, writer: PcapWriter | None) -> None:
        self.feed = feed
        self.writer = writer
        self.held: list[tuple] = []

    def tcp_segment(self, *segment) -> None:  # noqa: ANN002 - SegmentSink's arguments, passed on
        self.feed.tcp_segment(*segment)
        if self.writer is not None:
            self.held.append(segment)


class Transcript:
    """The live conversation's connections, judged as their bytes go by."""

    def __init__(self, protocol: str, ports: list[int], record_to: str | None = None) -> None:
        self.comments: dict[int, list[str]] = {}
        self.feed = SegmentFeed({})
        self.writer = PcapWriter(record_to, pcapng=True) if record_to else None
        self._tee = _Tee(self.feed, self.writer)
        self.dissector = Dissector("<live>", protocol=protocol, ports=ports)
        self._batches = self.dissector.segment_batches(self._source())
        self.sessions: dict[int, TcpSession] = {}
        #: Packets numbered so far (the feed's numbering, which the recording's follows).
        self._written = 0
        self._paused = False
        #: Notes for packets already written: they go on the next one.
        self._late: list[str] = []

    def _source(self) -> Iterator[Segment]:
        made = self.feed.segments
        while True:
            if made:
                batch = made[:]
                made.clear()
                yield from batch
            self._paused = True
            yield PAUSE_SEGMENT

    def open(self, link_id: int, client: tuple[str, int], server: tuple[str, int]) -> None:
        # tracked from its SYN: numbered in the order opened (the engine's link ids) and its
        # initiator the TCP client, though the server may speak first (AMBROSIA's send socket)
        self.dissector.port_plugins.setdefault(server[1], self.dissector.plugins[0])
        self.sessions[link_id] = TcpSession(
            self._tee, client, server, timestamp=time.time(), segment_size=DEFAULT_SEGMENT_SIZE
        )

    def sent(self, link_id: int, from_client: bool, data: bytes) -> None:
        self.sessions[link_id].send(from_client, data, time.time())

    def ended(self, link_id: int, from_client: bool, reset: bool = False) -> None:
        session = self.sessions.get(link_id)
        if session is not None:
            (session.reset if reset else session.fin)(from_client, time.time())

    def items(self) -> list:
        """Every frame the bytes so far complete: records, and ``FrameBlock``s where the dissector
        made runs of accepted frames (their records made only if wanted)."""
        out: list = []
        self._paused = False
        for batch in self._batches:
            out += batch
            if self._paused:
                break
        return out

    def records(self) -> list[dict]:
        """The records of every frame the bytes so far complete."""
        out: list[dict] = []
        for item in self.items():
            if type(item) is FrameBlock:
                out += item.records()
            else:
                out.append(item)
        return out

    def comment(self, packet: int, text: str) -> None:
        """A note on a live packet, in the recording (pcapng comment); on the next packet written,
        naming its own, when that packet went out already."""
        if self.writer is None or not packet:
            return
        if packet <= self._written:
            self._late.append(f"(live packet {packet}) {text}")
        else:
            self.comments.setdefault(packet, []).append(text)

    def flush(self, before: int | None = None) -> None:
        """Write the packets whose frames were judged to the recording: all made so far, or those
        numbered below ``before`` (a frame judged later may still get a comment)."""
        writer = self.writer
        if writer is None:
            return
        held = self._tee.held
        count = len(held) if before is None else max(0, min(len(held), before - 1 - self._written))
        count = max(count, len(held) - MAX_HELD)  # memory stays bounded: a late note goes further on
        for segment in held[:count]:
            self._written += 1
            notes = self.comments.pop(self._written, None)
            if self._late:
                notes = self._late + (notes or [])
                self._late = []
            *args, comment = segment
            if notes:
                comment = "; ".join(([comment] if comment else []) + notes)
            writer.tcp_segment(*args, comment)
        del held[:count]

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()
        self._batches.close()
