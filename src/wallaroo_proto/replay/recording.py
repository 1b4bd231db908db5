"""The conversation a capture holds, frame by frame, with each frame's record and its bytes.

One conversation is the connections its protocol's adapter puts together (one TCP
connection, or AMBROSIA's two sockets of one LB). Its frames come in the order the
packets completing them were captured, each with the bytes it was sent as, so a player can
send them again. Read in two passes, each streaming: the first finds the conversations and
picks one; the second yields its frames, keeping only the bytes of frames not yet given.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.frame_block import FrameBlock
from wallaroo_proto.capture.pcap import TCP_FIN, TCP_RST, CaptureError, Segment, format_address, read_segments
from wallaroo_proto.capture.reassembly import HalfStream
from wallaroo_proto.protocols import get_plugin

from . import adapter


class RecordingError(ValueError):
    """The capture holds no conversation to play, or several and no choice among them."""


@dataclass(frozen=True)
class ConnectionInfo:
    """One recorded TCP connection of a conversation."""

    conn_index: int
    label: str
    client: tuple[str, int]
    server: tuple[str, int]
    #: The side of the protocol that opened it (``sender`` of the initiator's frames).
    initiator_side: str | None


@dataclass
class Conversation:
    """What a player needs before the first frame: the protocol, its connections, its sides."""

    capture: str
    protocol: str
    #: In the order they were opened (``adapter.opening``).
    connections: list[ConnectionInfo]
    #: The judge's two sides (``plugin.judge().SIDES``).
    sides: tuple[str, str]
    #: Frames in the conversation, all connections.
    frames: int = 0
    ports: tuple[int, ...] | None = None
    max_frame_size: int | None = None
    #: The chosen conversation's ``adapter.conversation_key``.
    key: tuple = field(default=(), repr=False)
    #: Filled by ``frames``: per connection, whether its initiator (else its responder) ended
    #: its side first (FIN or RST): a player closes in the recording's order.
    first_end: dict[int, bool] = field(default_factory=dict, repr=False)
    #: Set by ``frames`` when the capture is cut short or damaged: what, and where (the frames
    #: before it were all given).
    cut: str | None = None

    def side_named(self, word: str) -> str:
        """``--play``'s word as one of the protocol's sides: ``client`` is the side that opened the
        first connection, ``server`` the other; a side's own name is itself. ValueError otherwise."""
        word = word.lower()
        if word in self.sides:
            return word
        opener = self.connections[0].initiator_side
        if word in ("client", "server") and opener in self.sides:
            other = self.sides[1] if opener == self.sides[0] else self.sides[0]
            return opener if word == "client" else other
        raise ValueError(
            f"cannot play {word!r} in this {self.protocol} conversation "
            f"(known: client, server, {', '.join(self.sides)})"
        )

    def connection(self, conn_index: int) -> ConnectionInfo:
        for conn in self.connections:
            if conn.conn_index == conn_index:
                return conn
        raise KeyError(conn_index)


@dataclass(slots=True)
class Frame:
    """One recorded frame: its record (``dissect --format jsonl``'s fields) and its bytes."""

    index: int
    record: dict
    raw: bytes
    #: Fuzzing's changes to a frame of the played side (replay leaves them unset): ``edit`` turns
    #: the bytes the adapter made into the bytes sent; ``as_is`` sends ``raw`` without asking the
    #: adapter (a frame the recording never held there); ``then`` is done once it went
    #: (``"half-close"`` or ``"reset"``: nothing of ours follows); ``note`` is written on its
    #: packet in ``--record``'s capture.
    edit: Callable[[bytes], bytes] | None = None
    as_is: bool = False
    then: str | None = None
    note: str | None = None

    @property
    def sender(self) -> str:
        return self.record.get("sender") or ""

    @property
    def type(self) -> str:
        return self.record.get("type") or ""

    @property
    def conn_index(self) -> int:
        return self.record["conn_index"]

    @property
    def packet(self) -> int:
        return self.record.get("packet") or 0


def _matches_connection(choice: str, conn_index: int, label: str) -> bool:
    return choice == str(conn_index) if choice.isdigit() else choice in label


def find(
    capture: str | os.PathLike,
    *,
    connections: tuple[str, ...] = (),
    display_filter: Callable[[dict], bool] | None = None,
    protocol: str | None = None,
    ports: tuple[int, ...] | None = None,
    max_frame_size: int | None = None,
) -> Conversation:
    """The one conversation the selectors pick (first pass); ``RecordingError`` names the choices."""
    name = os.fspath(capture)
    dissector = Dissector(name, ports=ports, protocol=protocol, max_frame_size=max_frame_size)
    frames: dict[tuple, int] = {}
    picked: set[tuple] = set()
    sides: dict[int, str] = {}
    ranks: dict[int, int] = {}
    keys: dict[int, tuple] = {}
    hooks: dict[str, tuple[Callable, Callable]] = {}
    try:
        for record in _records(dissector, name, keys, frames, skip_known=display_filter is None):
            index = record["conn_index"]
            protocol_name = record["protocol"]
            conversation_key, opening = hooks.get(protocol_name) or hooks.setdefault(
                protocol_name, (adapter.conversation_of(protocol_name), adapter.opening_of(protocol_name))
            )
            key = (protocol_name, *conversation_key(record))
            keys[index] = key
            frames[key] = frames.get(key, 0) + 1
            side, rank = opening(record)
            ranks.setdefault(index, rank)
            if side:
                sides.setdefault(index, side)
            if display_filter is not None and display_filter(record):
                picked.add(key)
    except CaptureError as err:
        if not frames:
            raise RecordingError(f"{name}: {err}") from None
    idents = {t.ident["conn_index"]: t.ident for t in dissector.trackers}
    groups: dict[tuple, list[int]] = {}
    for index, key in sorted(keys.items()):
        groups.setdefault(key, []).append(index)
    chosen = [
        key
        for key, indexes in groups.items()
        if (
            not connections
            or any(_matches_connection(c, i, idents[i]["connection"]) for c in connections for i in indexes)
        )
        and (display_filter is None or key in picked)
    ]
    if not groups:
        raise RecordingError(f"{name}: no frame of a known protocol (dissect it to see why)")
    if not chosen:
        raise RecordingError(
            f"{name}: no conversation matches the selection; it holds {_listing(groups, idents)}"
        )
    if len(chosen) > 1:
        held = _listing({k: groups[k] for k in chosen}, idents)
        raise RecordingError(
            f"{name}: {len(chosen)} conversations match; pick one with --connection N or -Y: {held}"
        )
    key = chosen[0]
    conns = [
        ConnectionInfo(
            i,
            idents[i]["connection"],
            (idents[i]["initiator_addr"], idents[i]["initiator_port"]),
            (idents[i]["responder_addr"], idents[i]["responder_port"]),
            sides.get(i),
        )
        for i in sorted(groups[key], key=lambda i: (ranks[i], i))
    ]
    protocol_name = key[0]
    return Conversation(
        name,
        protocol_name,
        conns,
        tuple(get_plugin(protocol_name).judge().SIDES),
        frames[key],
        ports,
        max_frame_size,
        key,
    )


def _records(
    dissector: Dissector, name: str, keys: dict[int, tuple], frames: dict[tuple, int], skip_known: bool
) -> Iterator[dict]:
    """The capture's records; with ``skip_known``, a run of frames (a ``FrameBlock``) of a
    connection already placed is only counted: the first pass need not build a record a frame."""
    for item in dissector.frames(name):
        if type(item) is FrameBlock:
            index = item.shared.get("conn_index")
            if skip_known and index in keys:
                frames[keys[index]] += len(item)
                continue
            yield from item.records()
        else:
            yield item


def _listing(groups: dict[tuple, list[int]], idents: dict[int, dict]) -> str:
    shown = [
        f"#{'+#'.join(map(str, indexes))} {key[0]} {idents[indexes[0]]['connection']}"
        for key, indexes in list(groups.items())[:10]
    ]
    more = f" and {len(groups) - 10} more" if len(groups) > 10 else ""
    return "; ".join(shown) + more


class StreamBytes:
    """One direction's stream bytes from ``base`` on, kept until the frames holding them are
    taken: a ``reassembly.Consumer`` here, and the live peer's bytes in the engine."""

    __slots__ = ("base", "buf")

    def __init__(self) -> None:
        self.base = 0
        self.buf = bytearray()

    def data(self, offset: int, payload: bytes, packet: int, ts: int) -> None:
        end = self.base + len(self.buf)
        if offset > end:  # after a gap: offsets kept aligned with zeros (a frame there is cut short)
            self.buf += bytes(offset - end)
        self.buf += payload

    def gap(self, offset: int, missing: int | None, packet: int, ts: int) -> None:
        """Nothing to keep: the zeros ``data`` puts in the hole make its frames short of bytes."""

    def take(self, offset: int, length: int) -> bytes:
        start = offset - self.base
        if start < 0:
            return b""
        raw = bytes(self.buf[start : start + length])
        del self.buf[: start + length]
        self.base = offset + length
        return raw


def frames(conversation: Conversation) -> Iterator[Frame]:
    """The chosen conversation's frames in capture order (second pass), each with its bytes."""
    indexes = {c.conn_index for c in conversation.connections}
    wanted: dict[tuple, StreamBytes] = {}
    which: dict[tuple, tuple[int, bool]] = {}
    halves: dict[tuple, HalfStream] = {}
    streams: dict[tuple[int, bool], StreamBytes] = {}
    for conn in conversation.connections:
        for from_initiator in (True, False):
            src, dst = (conn.client, conn.server) if from_initiator else (conn.server, conn.client)
            stream = StreamBytes()
            wanted[(src, dst)] = stream
            which[(src, dst)] = (conn.conn_index, from_initiator)
            streams[(conn.conn_index, from_initiator)] = stream

    def tee(segments: Iterator[Segment]) -> Iterator[Segment]:
        for segment in segments:
            _, _, key, seq, flags, payload = segment
            if key[1]:
                ends = ((format_address(key[0]), key[1]), (format_address(key[2]), key[3]))
                stream = wanted.get(ends)
                if stream is not None:
                    half = halves.get(ends)
                    if half is None:
                        half = halves[ends] = HalfStream(stream)
                    half.segment(seq, flags, payload, segment[0], segment[1])
                    if flags & (TCP_FIN | TCP_RST):
                        conn_index, from_initiator = which[ends]
                        conversation.first_end.setdefault(conn_index, from_initiator)
            yield segment

    dissector = Dissector(
        conversation.capture,
        ports=conversation.ports,
        protocol=conversation.protocol if conversation.ports else None,
        conn_indexes=indexes,
        max_frame_size=conversation.max_frame_size,
    )
    stats: dict = {}
    index = 0
    items = dissector.segment_frames(tee(read_segments(conversation.capture, stats)))
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except CaptureError as err:  # as dissect: every frame before the damage, then the reason
            conversation.cut = f"{conversation.capture}: {err}"
            return
        records = item.records() if not isinstance(item, dict) else (item,)
        for record in records:
            record.pop("_raw", None)
            from_initiator = record.get("direction") == "initiator>responder"
            stream = streams.get((record["conn_index"], from_initiator))
            raw = b""
            if stream is not None and record.get("offset") is not None and record.get("length"):
                raw = stream.take(record["offset"], record["length"])
            yield Frame(index, record, raw)
            index += 1
