"""The capture driver: captures in, any plug-in protocol's records and summaries out.

Pipeline per capture: ``capture.read_segments`` (fast header parsing) -> a
flow table finds each TCP connection's protocol -> ``reassembly.HalfStream``
per direction -> the plug-in's per-connection tracker (``protocols``), whose
per-direction framer splits and resyncs, whose decoder and sans-IO judge make
each frame's record.

A connection's protocol: ``protocol`` forces one plug-in for every
connection. Otherwise a connection on a plug-in's default port is that
plug-in's; one on a port given in ``ports`` that no plug-in owns, or on any
other port, is probed: the first plug-in whose detector accepts the
connection's first bytes takes it (on a given port, Wallaroo when none does,
so a capture starting mid-connection is still read; elsewhere it is skipped).

Records come out in capture order: sorted by ``packet``, the packet that
completes each frame (a frame a late segment completes is shown at that
segment, as Wireshark does), both directions and all connections interleaved.
Every record is produced as soon as the packet completing it is read; only
while a direction holds segments behind a hole (or a tracker holds frames, as
Wallaroo's until a connection's use is known) are the records made meanwhile
held back, since bytes after a hole declared lost keep their own, earlier
packets. That hold lasts at most ``max_out_of_order`` bytes of capture (then
the holes are declared lost), so memory stays bounded by the reassembly and
frame-size limits, never by the capture size. A capture read from a pipe
(``tcpdump -U -w - | ...``) also hands out what it holds whenever the reader is
about to wait for more bytes, so records come out as their packets arrive. A
connection's summary is kept for ``summaries()`` (one small object per
connection); ``keep_summaries=False``, as ``iter_records`` uses, drops
each connection entirely once it closes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, BinaryIO

from wallaroo_proto.protocols import ProtocolPlugin, get_plugin, plugins
from wallaroo_proto.records import ConnectionKey, to_json

from .frame_block import SHARED, FrameBlock
from .pcap import (
    PAUSE,
    TCP_ACK,
    TCP_FIN,
    TCP_RST,
    TCP_SYN,
    WAIT,
    CaptureError,
    PacketTap,
    Segment,
    format_address,
    read_segments,
)
from .reassembly import DEFAULT_MAX_OUT_OF_ORDER, HalfStream

_CLOSING = TCP_FIN | TCP_RST
_CONTROL = TCP_SYN | TCP_FIN | TCP_RST
#: Items (records, lines or blocks of at most ``frame_block.MAX_ROWS`` frames) handed out together:
#: fewer generator switches, and still bounded (a few thousand frames at most).
_BATCH = 64


# --- flows -------------------------------------------------------------------------


class _Skipped:
    """A connection not dissected here: not ours, or over.

    It remembers just enough to notice a new connection on the same 4-tuple.
    """

    __slots__ = ("isn", "closed")

    def __init__(self, isn: int | None = None) -> None:
        self.isn = isn
        self.closed = False

    def segment(self, seq: int, flags: int, payload: bytes, packet: int, ts: int) -> None:
        if flags & TCP_SYN:
            if not flags & TCP_ACK and self.isn is None:
                self.isn = seq
        elif flags & (TCP_FIN | TCP_RST):
            self.closed = True


class _Unread:
    """One direction of a connection another task of a split capture dissects (``connection_filter``).

    It keeps what the flow table asks of a dissected direction, taken as
    ``HalfStream`` takes it, so that a new connection on its 4-tuple is found
    exactly where the whole capture's dissector finds one and connections are
    numbered alike in every task.
    """

    __slots__ = ("started", "isn", "fin_seen", "rst_seen", "other")

    def __init__(self) -> None:
        self.started = self.fin_seen = self.rst_seen = False
        self.isn: int | None = None
        self.other: _Unread = self

    def segment(self, seq: int, flags: int, payload: bytes, packet: int, ts: int) -> None:
        if flags & TCP_SYN:
            if not self.started:
                self.started = True
                self.isn = seq
            return
        if flags & TCP_RST:
            self.rst_seen = True
        if flags & TCP_FIN:
            self.fin_seen = True
        if payload:
            self.started = True

    @property
    def over(self) -> bool:
        """As a dissected connection ends: a RST, or FINs both ways."""
        other = self.other
        return self.rst_seen or other.rst_seen or (self.fin_seen and other.fin_seen)


class _Probe:
    """A connection whose protocol its first bytes decide; ``fallback`` takes it when none does.

    The first sender's segments are held until the detectors can tell (however
    few bytes each segment carries), so the answer does not depend on how the
    stream was cut; while held, the driver holds back later records for order.
    """

    __slots__ = ("dissector", "key", "syns", "fallback", "side", "held", "data", "next_seq")

    def __init__(self, dissector: Dissector, key: tuple, fallback: ProtocolPlugin | None) -> None:
        self.dissector = dissector
        self.key = key
        self.syns: dict[tuple, tuple[int, int]] = {}  # directional key -> (seq, flags)
        self.fallback = fallback
        self.side: tuple | None = None  # the first sender's directional key
        self.held: list[tuple[int, int, bytes, int, int]] = []  # (seq, flags, payload, packet, ts)
        self.data = bytearray()
        self.next_seq = 0

    def for_key(self, key: tuple) -> _ProbeSide:
        return _ProbeSide(self, key)

    @property
    def pending(self) -> bool:
        return bool(self.held)

    def hold(self, key: tuple, seq: int, flags: int, payload: bytes, packet: int, ts: int) -> None:
        if not self.held:
            self.side = key
            self.dissector._holding[self] = None
        self.held.append((seq, flags, payload, packet, ts))
        self.data += payload
        self.next_seq = (seq + len(payload)) & 0xFFFF_FFFF

    def flush(self, packet: int = 0, ts: int = 0) -> None:
        """No more bytes to wait for: decide on what is held."""
        if self.held:
            self.dissector._decide(self, final=True)


class _ProbeSide:
    __slots__ = ("probe", "key")

    def __init__(self, probe: _Probe, key: tuple) -> None:
        self.probe = probe
        self.key = key

    def segment(self, seq: int, flags: int, payload: bytes, packet: int, ts: int) -> None:
        probe = self.probe
        if flags & TCP_SYN:
            probe.syns[self.key] = (seq, flags)
            return
        d = probe.dissector
        if probe.held:
            if payload and self.key == probe.side and seq == probe.next_seq and not flags & _CLOSING:
                probe.hold(self.key, seq, flags, payload, packet, ts)
                d._decide(probe, final=False)
                return
            # Anything else (the other side speaking, a close, a segment out of order) ends the wait.
            probe.flush()
            d._flows[self.key].segment(seq, flags, payload, packet, ts)
            return
        if not payload:
            return
        syn = probe.syns.get(self.key)
        at_start = syn is None or ((syn[0] + 1) & 0xFFFF_FFFF) == seq
        probe.hold(self.key, seq, flags, payload, packet, ts)
        # Mid-connection bytes open nothing: only a fallback reads them.
        d._decide(probe, final=not at_start or bool(flags & _CLOSING), detect=at_start)


class Dissector:
    """Dissect one capture: ``run(source)`` yields records; ``summaries()`` afterwards."""

    def __init__(
        self,
        capture_name: str = "<capture>",
        *,
        ports: Iterable[int] | None = None,
        protocol: str | None = None,
        protocols: Collection[str] | None = None,
        conn_indexes: Collection[int] | None = None,
        connection_filter: Callable[[tuple], bool] | None = None,
        max_frame_size: int | None = None,
        max_out_of_order: int = DEFAULT_MAX_OUT_OF_ORDER,
        with_raw: bool = False,
        keep_summaries: bool = True,
        max_frames: int | None = None,
    ) -> None:
        self.capture_name = capture_name
        #: False (iter_records): forget a connection once it closed, so memory stays flat.
        self.keep_summaries = keep_summaries
        #: The plug-ins that may claim a connection; ``protocol`` forces one (KeyError: unknown name).
        self.plugins: tuple[ProtocolPlugin, ...] = (get_plugin(protocol),) if protocol else plugins()
        given = frozenset(ports) if ports is not None else None
        #: Ports whose connections are tracked at once, and by which plug-in.
        self.port_plugins: dict[int, ProtocolPlugin] = {}
        #: Given ports no plug-in owns: probed, with Wallaroo (the first plug-in) as the fallback.
        self.probe_ports: frozenset[int] = frozenset()
        if protocol:
            self.port_plugins = dict.fromkeys(given or self.plugins[0].default_ports, self.plugins[0])
        else:
            for plugin in reversed(self.plugins):
                self.port_plugins.update(dict.fromkeys(plugin.default_ports, plugin))
            if given is not None:  # given ports replace the defaults; a plug-in keeps its own among them
                self.probe_ports = given - self.port_plugins.keys()
                self.port_plugins = {p: pl for p, pl in self.port_plugins.items() if p in given}
        self.ports = frozenset(self.port_plugins) | self.probe_ports
        self.connection_filter = connection_filter
        #: Only these protocols' connections are dissected; the others are numbered and not read.
        self.only = frozenset(protocols) if protocols is not None else None
        #: Only the connections with these numbers are dissected (numbered as ever).
        self.conn_indexes = frozenset(conn_indexes) if conn_indexes is not None else None
        #: Every protocol's frame-length limit, as the user gave it; None: each plug-in's own.
        self.max_frame_size = max_frame_size
        self.max_out_of_order = max_out_of_order
        self.with_raw = with_raw
        #: Stop reading after the packet that completes this many frames (its other frames included).
        self.max_frames = max_frames
        self.trackers: list[Any] = []
        self.stats: dict[str, Any] = {}
        self.error: CaptureError | None = None
        self._flows: dict[tuple, Any] = {}
        self._live: dict[tuple, Any] = {}
        self._out: list = []
        #: What holds back bytes or frames whose packets come before records made since: directions
        #: with segments behind a hole (``reassembly.HalfStream.holds``), trackers holding frames.
        #: Each has ``pending`` (still holding) and ``flush(packet, ts)`` (stop holding).
        self._holding: dict[Any, None] = {}
        #: Payload bytes read since a direction started holding (records held back meanwhile).
        self._held_bytes = 0
        self._count = 0
        #: Set by jsonl_batches: records go out as JSON text.
        self.jsonl = False
        #: Cleared by drain: plug-ins count frames without making their records.
        self.want_records = True
        #: Given every packet as read (``pcap.PacketTap``): ``dissect -w`` keeps the ones it writes.
        self.tap: PacketTap | None = None

    # what a tracker may use of its driver (besides jsonl, want_records, capture_name) ---------

    @property
    def out(self) -> list:
        """The list a tracker appends its records to (dicts, JSONL lines or ``FrameBlock``s) as it
        makes them: the driver hands them out, in packet order, after each batch of packets."""
        return self._out

    def hold_back(self, holder: Any) -> None:
        """``holder`` (a tracker) holds frames whose packets come before records made since: those
        records wait until it is no longer ``pending`` or the driver calls its ``flush(packet, ts)``."""
        self._holding[holder] = None

    def frame_limit(self, protocol: str) -> int:
        """A protocol's frame-length limit here: the user's, else its plug-in's ``max_frame_size``."""
        if self.max_frame_size is not None:
            return self.max_frame_size
        return get_plugin(protocol).max_frame_size

    def run(self, source: str | os.PathLike | BinaryIO) -> Iterator[dict]:
        """Every frame record, in the order the packets completing them appear."""
        self.jsonl = False
        for batch in self._batches(source):
            for item in batch:
                if type(item) is FrameBlock:
                    yield from item.records()
                else:
                    yield item

    def record_batches(self, source: str | os.PathLike | BinaryIO) -> Iterator[list[dict]]:
        """``run``'s records a list at a time; from a pipe, a list ends where the input pauses.

        Each list is reused: consume it before asking for the next.
        """
        self.jsonl = False
        return self._flattened(source, FrameBlock.records)

    def frames(self, source: str | os.PathLike | BinaryIO) -> Iterator[dict | FrameBlock]:
        """``run``'s records, with each plug-in's blocks of frames left as blocks."""
        self.jsonl = False
        for batch in self._batches(source):
            yield from batch

    def segment_frames(self, segments: Iterable[Segment]) -> Iterator[dict | FrameBlock]:
        """``frames`` of segments made elsewhere, as ``read_segments`` makes them (``WAIT_SEGMENT``
        where their source is about to wait): the proxy's checker rebuilds them from relayed bytes."""
        self.jsonl = False
        for batch in self._batches(None, segments):
            yield from batch

    def segment_batches(self, segments: Iterable[Segment]) -> Iterator[list]:
        """``segment_frames`` a batch at a time; a ``PAUSE_SEGMENT`` from ``segments`` makes a batch
        (maybe empty) at once, so a source fed as bytes come (``replay``) gets control back."""
        self.jsonl = False
        return self._batches(None, segments)

    def drain(self, source: str | os.PathLike | BinaryIO) -> None:
        """Read the capture for its summaries only: no record is made where a plug-in can avoid it."""
        self.want_records = False
        for _ in self._batches(source):
            pass

    def run_jsonl(self, source: str | os.PathLike | BinaryIO) -> Iterator[str]:
        """``run`` as JSONL lines (``records.to_json`` of each record)."""
        for batch in self.jsonl_batches(source):
            yield from batch

    def jsonl_batches(self, source: str | os.PathLike | BinaryIO) -> Iterator[list[str]]:
        """The JSONL lines in lists of at most a few thousand, in order: the fastest form.

        An accepted plain MESSAGE is written as text directly, never built as a
        dict. Each list is reused: consume it before asking for the next.
        """
        self.jsonl = True
        return self._flattened(source, FrameBlock.jsonl)

    def _flattened(self, source: str | os.PathLike | BinaryIO, view: Callable) -> Iterator[list]:
        """Each batch as one reused list, a block's frames given by ``view`` (records or lines)."""
        flat: list = []
        for batch in self._batches(source):
            for item in batch:
                if type(item) is FrameBlock:
                    flat += view(item)
                else:
                    flat.append(item)
            yield flat
            flat.clear()

    def _batches(
        self, source: str | os.PathLike | BinaryIO | None, segments: Iterable[Segment] | None = None
    ) -> Iterator[list]:
        """Each batch of records and blocks; a packet's comments become notes of its frames."""
        for batch in self._raw_batches(source, segments):
            comments = self.stats.get("comments")
            if comments:
                _comment(batch, comments, self.jsonl)
            yield batch

    def _raw_batches(
        self, source: str | os.PathLike | BinaryIO | None, segments: Iterable[Segment] | None
    ) -> Iterator[list]:
        flows = self._flows
        out = self._out
        new_flow = self._new_flow
        holding = self._holding
        limit = self.max_frames
        made = 0
        try:
            if segments is None:
                segments = read_segments(source, self.stats, waits=True, tap=self.tap)
            for packet, ts, key, seq, flags, payload in segments:
                if not payload and not flags & _CONTROL:
                    # A pipe with nothing more yet: out with what is made (unless held back for order).
                    if flags & WAIT:
                        if out and not holding:
                            yield out
                            out.clear()
                        elif flags & PAUSE:
                            yield []  # the source gives control back to the reader (``segment_batches``)
                    continue  # a bare ACK: nothing for any flow state here
                half = flows.get(key)
                if half is None or (flags & TCP_SYN and not flags & TCP_ACK and self._reused(half, seq)):
                    half = new_flow(key, flags)
                half.segment(seq, flags, payload, packet, ts)
                if flags & _CLOSING:
                    if type(half) is HalfStream:
                        self._closing(half)
                    elif type(half) is _Unread and half.over:
                        self._skip(key).closed = True
                elif type(half) is HalfStream and half.fin_seen:  # a FIN that waited behind a hole
                    self._closing(half)
                if limit is not None and made + _frames_in(out) >= limit:
                    break
                if holding and self._holding_back(len(payload), packet, ts):
                    continue
                if len(out) >= _BATCH:
                    if limit is not None:
                        made += _frames_in(out)
                    yield out
                    out.clear()
        except CaptureError as err:
            self.error = err
        for probe in [holder for holder in holding if type(holder) is _Probe]:
            probe.flush()
        for tracker in list(self._live.values()):
            tracker.finish()
        self._live.clear()
        if holding:
            holding.clear()
            self._held_bytes = 0
            in_packet_order(out)
        if out:
            yield out
            out.clear()
        if self.error is not None:
            raise self.error

    def _holding_back(self, size: int, packet: int, ts: int) -> bool:
        """Whether records wait for held bytes or frames; when nothing is held, sort what waited."""
        holding = self._holding
        for done in [holder for holder in holding if not holder.pending]:
            del holding[done]
        if holding:
            self._held_bytes += size
            if self._held_bytes <= self.max_out_of_order:
                return True
            holders = list(holding)
            for holder in holders:  # waited a whole window: holes are lost, frames go out
                holder.flush(packet, ts)
            holding.clear()
            for holder in holders:
                if type(holder) is HalfStream and holder.fin_seen:  # a FIN that waited: maybe the end
                    self._closing(holder)
        self._held_bytes = 0
        in_packet_order(self._out)
        return False

    def violations(self) -> int:
        """Frames with a violation so far, over all connections."""
        return sum(t.summary.violations for t in self.trackers)

    def summaries(self) -> list[dict]:
        """Each connection's summary, with the findings its plug-in marked (``findings.mark``)."""
        return [{**t.summary.as_dict(), "findings": list(t.findings)} for t in self.trackers]

    # what a live connection holds (the proxy's checker bounds it) ---------------------

    def tracker_of(self, key: tuple) -> Any | None:
        """The tracker of the live connection a segment's 4-tuple belongs to, if one dissects it."""
        half = self._flows.get(key)
        return half.consumer.tracker if type(half) is HalfStream else None

    def held_by(self, tracker: Any) -> int:
        """Bytes ``tracker``'s connection keeps for what is not yet whole: its plug-in's unfinished
        frames (``held_bytes()``) and the segments its directions hold behind a hole."""
        held = tracker.held_bytes() if hasattr(tracker, "held_bytes") else 0
        for direction in tracker.dirs.values():
            half = direction.half
            if half is not None:
                held += half.pending_bytes
        return held

    def give_up(self, tracker: Any, reason: str) -> None:
        """Stop dissecting a live connection: its buffers are freed, its later segments passed by,
        and its summary says ``reason`` where it says how the connection ended."""
        if self._live.get(tracker.canon) is not tracker:
            return
        del self._live[tracker.canon]
        self._holding.pop(tracker, None)
        for direction in tracker.dirs.values():
            self._holding.pop(direction.half, None)
        client = tracker.dirs[True].half
        self._skip(tracker.canon, client.isn if client is not None else None)
        tracker.release()
        tracker.summary.closed = reason

    # flow table ----------------------------------------------------------------------

    def _closing(self, half: HalfStream) -> None:
        """After a RST, or FINs both ways, a connection is over: settle it and free its buffers."""
        tracker = half.consumer.tracker
        halves = [d.half for d in tracker.dirs.values()]
        if not (any(h.rst_seen for h in halves) or all(h.fin_seen for h in halves)):
            return
        tracker.finish()
        self._live.pop(tracker.canon, None)
        client = tracker.dirs[True].half
        self._skip(tracker.canon, client.isn).closed = True
        tracker.release()
        if not self.keep_summaries:
            self.trackers.remove(tracker)

    def _reused(self, half: Any, seq: int) -> bool:
        """A SYN on a known 4-tuple starts a new connection unless it repeats the known one's."""
        if isinstance(half, (HalfStream, _Unread)):
            if not half.started:
                return False
            return half.fin_seen or half.rst_seen or half.isn is None or seq != half.isn
        if isinstance(half, _Skipped):
            return half.closed or half.isn is None or seq != half.isn
        return False

    def _canonical(self, key: tuple) -> tuple:
        src, sport, dst, dport = key
        return key if (src, sport) <= (dst, dport) else (dst, dport, src, sport)

    def _wanted(self, canon: tuple, plugin: ProtocolPlugin) -> bool:
        """Whether the connection just numbered is read here: its protocol is among ``only``, its
        number among ``conn_indexes``, and ``connection_filter`` (given its part key) keeps it."""
        if self.only is not None and plugin.name not in self.only:
            return False
        if self.conn_indexes is not None and self._count not in self.conn_indexes:
            return False
        if self.connection_filter is None:
            return True
        a, pa, b, pb = canon
        key = ConnectionKey(format_address(a), pa, format_address(b), pb)
        return bool(self.connection_filter(plugin.part_key(key)))

    def _skip(self, key: tuple, isn: int | None = None) -> _Skipped:
        src, sport, dst, dport = key
        skipped = _Skipped(isn)
        self._flows[key] = self._flows[(dst, dport, src, sport)] = skipped
        return skipped

    def _unread(self, key: tuple, reverse: tuple) -> _Unread:
        """Another task's connection: both directions followed only for the flow table."""
        half, back = _Unread(), _Unread()
        half.other, back.other = back, half
        self._flows[key], self._flows[reverse] = half, back
        return half

    def _new_flow(self, key: tuple, flags: int) -> Any:
        canon = self._canonical(key)
        old = self._live.pop(canon, None)
        if old is not None:
            old.finish()
        src, sport, dst, dport = key
        reverse = (dst, dport, src, sport)
        port_plugins = self.port_plugins
        plugin = port_plugins.get(sport) or port_plugins.get(dport)
        if plugin is not None:
            # Numbered before filtering, so every task of a split capture numbers alike.
            self._count += 1
            if not self._wanted(canon, plugin):
                return self._unread(key, reverse)
            client_known = bool(flags & TCP_SYN)
            client_is_src = not (flags & TCP_ACK) if client_known else True
            return self._track(key, reverse, canon, client_is_src, client_known, plugin)
        fallback = None
        if sport in self.probe_ports or dport in self.probe_ports:
            fallback = self.plugins[0]
        probe = _Probe(self, canon, fallback)
        self._flows[key] = probe.for_key(key)
        self._flows[reverse] = probe.for_key(reverse)
        return self._flows[key]

    def _decide(self, probe: _Probe, final: bool, detect: bool = True) -> None:
        """Give a probed connection its plug-in once the first sender's bytes tell (``final``: they must)."""
        plugin = None
        for candidate in self.plugins if detect else ():
            answer = candidate.detect(bytes(probe.data), self.frame_limit(candidate.name), final)
            if answer is None:  # an earlier plug-in may yet claim these bytes
                return
            if answer:
                plugin = candidate
                break
        held, probe.held, probe.data = probe.held, [], bytearray()
        self._holding.pop(probe, None)
        if plugin is not None:
            self._promote(probe, probe.side, held, plugin)
        elif probe.fallback is not None:
            self._promote(probe, probe.side, held, probe.fallback, fixed=False)
        else:
            self._ignore(probe)

    def _track(
        self,
        key: tuple,
        reverse: tuple,
        canon: tuple,
        client_is_src: bool,
        client_known: bool,
        plugin: ProtocolPlugin,
    ):
        src, sport, dst, dport = key
        client, server = ((src, sport), (dst, dport)) if client_is_src else ((dst, dport), (src, sport))
        tracker = plugin.tracker(self, self._count, client, server, client_known)
        tracker.canon = canon
        self.trackers.append(tracker)
        self._live[canon] = tracker
        halves = {}
        for k, is_client in ((key, client_is_src), (reverse, not client_is_src)):
            direction = tracker.dirs[is_client]
            half = direction.half = HalfStream(direction, self.max_out_of_order, self._holding)
            self._flows[k] = halves[k] = half
        return halves[key]

    def _ignore(self, probe: _Probe) -> None:
        """Not ours: no plug-in knows its first bytes."""
        syn = next((seq for (seq, flags) in probe.syns.values() if not flags & TCP_ACK), None)
        self._skip(probe.key, syn)

    def _promote(
        self,
        probe: _Probe,
        key: tuple,
        held: list[tuple[int, int, bytes, int, int]],
        plugin: ProtocolPlugin,
        fixed: bool = True,
    ):
        """A probed connection a plug-in knows: track it, its first sender being the initiator.

        ``fixed`` False: a fallback, whose initiator the SYN tells if seen. The
        held segments of the first sender then go to the tracker in order.
        """
        self._count += 1
        src, sport, dst, dport = key
        reverse = (dst, dport, src, sport)
        if not self._wanted(probe.key, plugin):
            self._unread(key, reverse)
        else:
            client_is_src, known = True, fixed
            if not fixed:  # a fallback: the SYN, if seen, tells the initiator
                syn = next((k for k, (_, f) in probe.syns.items() if not f & TCP_ACK), None)
                client_is_src, known = (syn is None or syn == key), syn is not None
            self._track(key, reverse, probe.key, client_is_src, known, plugin)
            self._live[probe.key].initiator_fixed = fixed
        _, _, _, packet, ts = held[0]
        for k, (syn_seq, syn_flags) in probe.syns.items():
            self._flows[k].segment(syn_seq, syn_flags, b"", packet, ts)
        half = self._flows[key]
        for seq, flags, payload, packet, ts in held:
            half.segment(seq, flags, payload, packet, ts)


def _comment(batch: list, comments: dict[int, list[str]], jsonl: bool = False) -> None:
    """Notes from the packets' comments on the records of the frames those packets complete
    (a block holding one is turned into its records, as JSON lines for ``jsonl``: comments are
    rare)."""
    for i in range(len(batch) - 1, -1, -1):
        item = batch[i]
        if type(item) is str:  # a JSON line: only those of a commented packet are read back
            number = next((n for n in comments if f'"packet":{n},' in item), None)  # to_json's form
            if number is None:
                continue
            record = json.loads(item)
            if record.get("packet") != number:
                continue
            record["notes"] = [*(record.get("notes") or []), *comments.pop(number)]
            batch[i] = to_json(record)
            continue
        if type(item) is FrameBlock:
            items = item.records()
            if not any(r.get("packet") in comments for r in items):
                continue
        else:
            items = [item]
        for record in items:
            texts = comments.pop(record.get("packet"), None)
            if texts:
                record["notes"] = [*(record.get("notes") or []), *texts]
        if type(item) is FrameBlock:
            batch[i : i + 1] = [to_json(r) for r in items] if jsonl else items


def _frames_in(items: list) -> int:
    return sum(len(item) if type(item) is FrameBlock else 1 for item in items)


def in_packet_order(items: list) -> None:
    """Sort records (dicts, JSON lines, blocks) by packet, in place and stably.

    A block whose rows span packets is cut into one block per run of rows of a
    packet, so another record can go between them. Where frames of a connection
    moved, their ``frame_index`` values are given out again in the new order, so a
    connection's frames are numbered as they are shown.
    """
    keyed: list[tuple[int, Any]] = []
    for item in items:
        if type(item) is FrameBlock:
            keyed += _block_runs(item)
        elif type(item) is str:
            keyed.append((json.loads(item)["packet"], item))
        else:
            keyed.append((item["packet"], item))
    if all(keyed[i][0] <= keyed[i + 1][0] for i in range(len(keyed) - 1)) and len(keyed) == len(items):
        return
    keyed.sort(key=lambda pair: pair[0])
    items[:] = [item for _, item in keyed]
    _renumber(items)


def _renumber(items: list) -> None:
    """Each connection's ``frame_index`` values, in the order of ``items``, made increasing: the
    same values given out again (records before and after these keep theirs)."""
    # (item, row or None, connection, index) for every frame with an index, in order
    frames: list[tuple[int, int | None, Any, int]] = []
    parsed: dict[int, dict] = {}
    for position, item in enumerate(items):
        if type(item) is FrameBlock:
            names = [name for name, kind in item.layout if kind != SHARED]
            if "frame_index" not in names:
                continue
            column = names.index("frame_index")
            conn = item.shared.get("conn_index")
            frames += [(position, row, conn, values[column]) for row, values in enumerate(item.rows)]
            continue
        record = item
        if type(item) is str:
            record = parsed[position] = json.loads(item)
        index = record.get("frame_index")
        if index is not None:
            frames.append((position, None, record.get("conn_index"), index))
    by_conn: dict[Any, list[int]] = {}
    for _, _, conn, index in frames:
        by_conn.setdefault(conn, []).append(index)
    given = {conn: iter(sorted(indices)) for conn, indices in by_conn.items() if indices != sorted(indices)}
    if not given:
        return
    for position, row, conn, index in frames:
        if conn not in given:
            continue
        new = next(given[conn])
        if new == index:
            continue
        item = items[position]
        if row is not None:
            names = [name for name, kind in item.layout if kind != SHARED]
            column = names.index("frame_index")
            values = list(item.rows[row])
            values[column] = new
            if item.rows is not None and not isinstance(item.rows, list):
                item.rows = list(item.rows)
            item.rows[row] = tuple(values)
        elif type(item) is str:
            parsed[position]["frame_index"] = new
            items[position] = to_json(parsed[position])
        else:
            item["frame_index"] = new


def _block_runs(block: FrameBlock) -> list[tuple[int, FrameBlock]]:
    """A block as (packet, block) runs of rows of one packet; the block itself when it has one."""
    if "packet" in block.shared:
        return [(block.shared["packet"], block)]
    column = [name for name, kind in block.layout if kind != SHARED].index("packet")
    rows = block.rows
    runs: list[tuple[int, FrameBlock]] = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][column] != rows[start][column]:
            runs.append((rows[start][column], FrameBlock(block.layout, block.shared, rows[start:i])))
            start = i
    if len(runs) == 1:
        return [(runs[0][0], block)]
    return runs


def dissect(
    source: str | os.PathLike | BinaryIO, *, ports: Iterable[int] | None = None, **kwargs: Any
) -> tuple[list[dict], Dissector]:
    """Convenience for small captures and tests: all records and the dissector."""
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<stream>"
    dissector = Dissector(name, ports=ports, **kwargs)
    records: list[dict] = []
    try:
        for record in dissector.run(source):
            records.append(record)
    except CaptureError:
        pass
    return records, dissector


def iter_records(
    path_or_fileobj: str | os.PathLike | BinaryIO,
    *,
    ports: Iterable[int] | None = None,
    protocol: str | None = None,
    protocols: Iterable[str] | None = None,
    conn_indexes: Iterable[int] | None = None,
    connection_filter: Callable[[tuple], bool] | None = None,
    capture_name: str | None = None,
    max_frame_size: int | None = None,
    blocks: bool = False,
) -> Iterator[dict | FrameBlock]:
    """Stream the frame records of one capture, in packet order, with bounded memory.

    ``connection_filter`` lets N Spark tasks each reassemble 1/N of one capture's
    connections: ``connection_filter=lambda key: flow_hash(key) % n == i``. The filter is
    given each connection's part key (``ProtocolPlugin.part_key``: its ``ConnectionKey``,
    unless its plug-in groups connections whose dissection shares state), so a group is
    kept or left whole. Use ``records.flow_hash``, not ``hash()``: Python's string hash
    differs per process.

    Raises ``CaptureError`` after yielding every record before the damage.
    ``connection_filter`` picks the connections to reassemble (all by default) by their
    part keys; connections are numbered alike whatever it keeps. ``protocols``: only these
    protocols' connections are dissected (the others are recognised and numbered, not read);
    ``conn_indexes``: only the connections of these numbers.
    ``blocks``: runs of frames come as ``frame_block.FrameBlock`` (rows, not
    dicts) where a plug-in makes them, for readers that take columns.
    """
    if capture_name is None:
        capture_name = (
            os.fspath(path_or_fileobj)
            if isinstance(path_or_fileobj, (str, os.PathLike))
            else getattr(path_or_fileobj, "name", "<stream>")
        )
    dissector = Dissector(
        capture_name,
        ports=ports,
        protocol=protocol,
        protocols=protocols,
        conn_indexes=conn_indexes,
        connection_filter=connection_filter,
        max_frame_size=max_frame_size,
        keep_summaries=False,
    )
    yield from dissector.frames(path_or_fileobj) if blocks else dissector.run(path_or_fileobj)


__all__ = [
    "CaptureError",
    "Dissector",
    "dissect",
    "in_packet_order",
    "iter_records",
]
