"""TCP reassembly: segments in capture order in, each direction's byte stream out.

One ``HalfStream`` per connection and direction turns segments into in-order
bytes with a 64-bit stream offset, whatever the capture did to them:

* retransmissions are dropped, overlapping segments contribute only their new
  bytes (the first copy wins, as in most stacks);
* out-of-order segments wait in a buffer bounded in bytes; when it is full, or
  the direction ends (RST, end of capture), the hole before the earliest
  waiting segment is declared lost: the consumer hears ``gap(offset, missing)``
  and delivery carries on after it, each waiting segment's bytes with its own
  packet (nothing later completed them);
* a FIN takes its place in the sequence space: one that comes behind a hole
  waits, as a segment does, so the late bytes before it are still delivered;
  ``fin_seen`` is set once every byte before the FIN is delivered or declared
  lost (the direction's end, a retransmission that comes after the FIN in the
  capture, no longer dropped);
* a late segment that fills a hole completes what waited behind it: those
  bytes are delivered with the late segment's packet and time, as Wireshark
  shows a reassembled frame at the packet completing it;
* ``holds``, if given, is told (``holds[half] = None``) when a direction starts
  holding segments, so a driver can keep its output in packet order while
  some bytes may still be delivered under earlier packets;
* sequence numbers wrap at 2**32 (all comparisons are modulo 2**32), stream
  offsets do not;
* SYN fixes the initial sequence number; a direction whose first segment is
  not a SYN started before the capture did: the consumer hears
  ``gap(0, None)`` ("unknown bytes before this") and must resync.

Consumers implement ``data(offset, payload, packet, ts)`` and
``gap(offset, missing, packet, ts)``. Nothing here knows the protocol.
"""

from __future__ import annotations

from typing import Protocol

from .pcap import TCP_FIN, TCP_RST, TCP_SYN

_MASK = 0xFFFF_FFFF
#: Default bound on bytes held out of order per direction.
DEFAULT_MAX_OUT_OF_ORDER = 4 * 1024 * 1024


class Consumer(Protocol):
    def data(self, offset: int, payload: bytes, packet: int, ts: int) -> None: ...

    def gap(self, offset: int, missing: int | None, packet: int, ts: int) -> None: ...


class HalfStream:
    """One direction of one TCP connection."""

    __slots__ = (
        "consumer",
        "max_out_of_order",
        "isn",
        "next_seq",
        "offset",
        "started",
        "syn_seen",
        "fin_seen",
        "rst_seen",
        "pending",
        "pending_bytes",
        "retransmitted",
        "overlapped",
        "out_of_order",
        "lost_bytes",
        "gaps",
        "holds",
    )

    def __init__(
        self,
        consumer: Consumer,
        max_out_of_order: int = DEFAULT_MAX_OUT_OF_ORDER,
        holds: dict[HalfStream, None] | None = None,
    ) -> None:
        self.consumer = consumer
        self.holds = holds
        self.max_out_of_order = max_out_of_order
        self.next_seq = 0
        self.isn: int | None = None
        self.offset = 0  # stream offset of next_seq
        self.started = False
        self.syn_seen = False
        self.fin_seen = False
        self.rst_seen = False
        # stream offset -> (payload, packet, ts)
        self.pending: dict[int, tuple[bytes, int, int]] = {}
        self.pending_bytes = 0
        self.retransmitted = 0
        self.overlapped = 0
        self.out_of_order = 0
        self.lost_bytes = 0
        self.gaps = 0

    def segment(self, seq: int, flags: int, payload: bytes, packet: int, ts: int) -> None:
        """Take one segment sent in this direction."""
        if flags & TCP_SYN:
            if not self.started:
                self.started = self.syn_seen = True
                self.isn = seq
                self.next_seq = (seq + 1) & _MASK
            return
        if flags & TCP_RST:
            self.rst_seen = True
        if not payload:
            if flags & TCP_RST:
                self.flush(packet, ts)
            elif flags & TCP_FIN:
                self._fin(seq, 0, packet, ts)
            return
        if not self.started:
            self.started = True
            self.next_seq = seq
            self.consumer.gap(0, None, packet, ts)
        rel = (seq - self.next_seq) & _MASK
        if rel & 0x8000_0000:
            rel -= 0x1_0000_0000
        size = len(payload)
        if rel == 0:
            # _deliver, inlined: this is the path almost every segment takes.
            self.consumer.data(self.offset, payload, packet, ts)
            self.offset += size
            self.next_seq = (self.next_seq + size) & _MASK
            if self.pending:
                self._drain(packet, ts)
        elif rel < 0:
            if rel + size <= 0:
                self.retransmitted += 1
            else:
                self.overlapped += 1
                self._deliver(payload[-rel:], packet, ts)
                if self.pending:
                    self._drain(packet, ts)
        else:
            self.out_of_order += 1
            if not self.pending and self.holds is not None:
                self.holds[self] = None
            key = self.offset + rel
            held = self.pending.get(key)
            if held is None or len(held[0]) < size:  # (a FIN waiting there is an empty one)
                self.pending_bytes += size - (len(held[0]) if held else 0)
                self.pending[key] = (payload, packet, ts)
            while self.pending_bytes > self.max_out_of_order:
                self._skip_hole(packet, ts)
        if flags & TCP_RST:
            self.flush(packet, ts)
        elif flags & TCP_FIN:
            self._fin(seq, size, packet, ts)

    def _fin(self, seq: int, size: int, packet: int, ts: int) -> None:
        """A FIN after ``size`` bytes from ``seq``: the end of the stream once what comes before it
        is in; behind a hole it waits in ``pending`` as an empty segment (the hole's bound and the
        driver's hold cover it as any waiting segment)."""
        if not self.started:  # a FIN is all that was seen of this direction
            self.fin_seen = True
            return
        rel = (seq + size - self.next_seq) & _MASK
        if rel & 0x8000_0000 or rel == 0:  # at or before what was delivered: the end is here
            self.fin_seen = True
            self.flush(packet, ts)  # bytes after a FIN are no part of the stream
            return
        if not self.pending and self.holds is not None:
            self.holds[self] = None
        self.pending.setdefault(self.offset + rel, (b"", packet, ts))

    def flush(self, packet: int, ts: int) -> None:
        """No more segments will fill the holes: declare them lost and deliver what waits."""
        while self.pending:
            self._skip_hole(packet, ts)

    def _deliver(self, payload: bytes, packet: int, ts: int) -> None:
        self.consumer.data(self.offset, payload, packet, ts)
        size = len(payload)
        self.offset += size
        self.next_seq = (self.next_seq + size) & _MASK

    def _drain(self, late_packet: int = -1, late_ts: int = 0) -> None:
        """Deliver what waited and is now in order; ``late_packet``: the segment that filled the hole."""
        pending = self.pending
        while pending:
            first = min(pending)
            if first > self.offset:
                return
            payload, packet, ts = pending.pop(first)
            if not payload:  # the FIN, its bytes before it all in: the stream ends here
                self.fin_seen = True
                continue
            self.pending_bytes -= len(payload)
            if late_packet >= 0:
                packet, ts = late_packet, late_ts
            skip = self.offset - first
            if skip < len(payload):
                if skip:
                    self.overlapped += 1
                self._deliver(payload[skip:], packet, ts)
            else:
                self.retransmitted += 1

    def _skip_hole(self, packet: int, ts: int) -> None:
        first = min(self.pending)
        missing = first - self.offset
        if missing > 0:
            _, first_packet, first_ts = self.pending[first]
            self.gaps += 1
            self.lost_bytes += missing
            self.consumer.gap(self.offset, missing, first_packet, first_ts)
            self.offset = first
            self.next_seq = (self.next_seq + missing) & _MASK
        self._drain()
