"""A capture's records do not depend on how its TCP byte streams were cut into segments.

Each sample capture is written again with every segment's payload re-cut into
pieces of drawn sizes (1 byte and up), each piece its own packet with its own
sequence number, the packets in the original order (so both directions
interleave as before, and holes stay holes). The records must be the same but
for what belongs to packets.

The projection drops ``packet``, ``ts``, ``ts_ns`` (the packets differ) and
``capture`` (the file's name), and writes "packet N" for packet numbers in
notes and violations; everything the bytes decide stays compared: the
protocol, connection and its socket or role, type, sender, direction, stream
offset and length, frame index, sequence and stream ids, verdicts and their
reasons. The ``moved`` case also puts every connection on ports no plug-in
owns, so the detectors decide each connection's protocol from its first
bytes; it drops the port fields and the connection label, which name ports.
"""

from __future__ import annotations

import io
import re
from functools import cache
from itertools import cycle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wallaroo_proto.capture.dissector import iter_records
from wallaroo_proto.capture.pcap import read_segments
from wallaroo_proto.pcap_writer import PcapWriter, tcp_frame
from wallaroo_proto.protocols import plugins

CAPTURES = sorted((Path(__file__).resolve().parent.parent / "captures").glob("*.pcap"))
_PACKET_FIELDS = {"packet", "ts", "ts_ns", "capture"}
_PORT_FIELDS = {"initiator_port", "responder_port", "connection", "lb"}
_PACKET_NUMBER = re.compile(r"packets? \d+")
#: Ports no plug-in owns: a connection there is claimed by its first bytes or not at all.
_MOVED_BASE = 40000


def _moved(port: int) -> int:
    owned = {p for plugin in plugins() for p in plugin.default_ports}
    return _MOVED_BASE + port % 20000 if port in owned else port


def recut(path: Path, sizes: list[int], move_ports: bool = False) -> io.BytesIO:
    """The capture with each payload cut into pieces of ``sizes`` (cycled), as a pcap in memory."""
    out = io.BytesIO()
    writer = PcapWriter(out)
    size = cycle(sizes)
    for _, ts, (src, sport, dst, dport), seq, flags, payload in read_segments(path):
        if move_ports:
            sport, dport = _moved(sport), _moved(dport)
        pieces = [b""]
        if payload:
            pieces, start = [], 0
            while start < len(payload):
                end = start + next(size)
                pieces.append(payload[start:end])
                start = end
        offset = 0
        for piece in pieces:
            frame = tcp_frame((src, sport), (dst, dport), (seq + offset) & 0xFFFF_FFFF, 0, flags, piece)
            writer.write_packet(frame, ts / 1e9)
            offset += len(piece)
    out.seek(0)
    return out


def _projection(records, drop: set[str]) -> list[dict]:
    rows = []
    for record in records:
        row = {k: v for k, v in record.items() if k not in drop}
        for key in ("notes", "violations"):
            if key in row:
                row[key] = [_PACKET_NUMBER.sub("packet N", text) for text in row[key]]
        rows.append(row)
    return rows


@cache
def _original(name: str, moved: bool) -> tuple:
    path = next(p for p in CAPTURES if p.name == name)
    drop = _PACKET_FIELDS | (_PORT_FIELDS if moved else set())
    return tuple(map(repr, _projection(iter_records(path), drop)))


def _recut_records(name: str, sizes: list[int], moved: bool) -> tuple:
    path = next(p for p in CAPTURES if p.name == name)
    drop = _PACKET_FIELDS | (_PORT_FIELDS if moved else set())
    return tuple(map(repr, _projection(iter_records(recut(path, sizes, moved)), drop)))


def test_every_sample_capture_is_found_and_has_records():
    assert len(CAPTURES) >= 10
    for path in CAPTURES:
        assert _original(path.name, False), path.name


@pytest.mark.e2e
@pytest.mark.parametrize("moved", [False, True], ids=["own-ports", "moved-ports"])
@pytest.mark.parametrize("name", [p.name for p in CAPTURES])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=8))
def test_records_do_not_depend_on_how_segments_are_cut(name, moved, sizes):
    assert _recut_records(name, sizes, moved) == _original(name, moved)


@pytest.mark.parametrize("size", [1, 5, 25])
def test_ambrosia_send_socket_in_tiny_first_segments_keeps_its_records(size):
    """The IC's records on the send socket come through whatever the first segments hold."""
    got = _recut_records("ambrosia-first-start.pcap", [size], False)
    assert got == _original("ambrosia-first-start.pcap", False)
    assert not any("UNKNOWN" in row for row in got)
