"""reassembly.py and the dissector's resync: segments in any order, gaps, wrap-around.

Frame bytes in the end-to-end cases are written by hand from the spec tables
(u32 big-endian length, u8 type, fields), not produced by the encoder.
"""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_capture import A4, B4, T, ether, ipv4, pcap_file, tcp_header

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.pcap import TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN
from wallaroo_proto.capture.reassembly import HalfStream
from wallaroo_proto.protocols.wallaroo import resync
from wallaroo_proto.protocols.wallaroo.resync import BoundaryScan, DirectionFramer, find_boundary


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def data(self, offset, payload, packet, ts):
        self.events.append(("data", offset, bytes(payload), packet))

    def gap(self, offset, missing, packet, ts):
        self.events.append(("gap", offset, missing, packet))

    def stream(self) -> bytes:
        return b"".join(e[2] for e in self.events if e[0] == "data")


def half(max_ooo: int = 1 << 20) -> tuple[HalfStream, Recorder]:
    rec = Recorder()
    return HalfStream(rec, max_ooo), rec


DATA = TCP_PSH | TCP_ACK


def test_in_order_after_syn_offsets_start_at_zero():
    h, rec = half()
    h.segment(999, TCP_SYN, b"", 1, 0)
    h.segment(1000, DATA, b"abc", 2, 0)
    h.segment(1003, DATA, b"def", 3, 0)
    assert rec.events == [("data", 0, b"abc", 2), ("data", 3, b"def", 3)]


def test_out_of_order_is_delivered_in_order():
    h, rec = half()
    h.segment(0, TCP_SYN, b"", 1, 0)
    h.segment(4, DATA, b"def", 2, 0)
    h.segment(7, DATA, b"ghi", 3, 0)
    assert rec.events == []
    h.segment(1, DATA, b"abc", 4, 0)
    assert rec.stream() == b"abcdefghi"
    # The late segment completes what waited behind it: all of it is delivered at packet 4.
    assert [e[3] for e in rec.events] == [4, 4, 4]
    assert h.out_of_order == 2


def test_retransmission_dropped():
    h, rec = half()
    h.segment(0, TCP_SYN, b"", 1, 0)
    h.segment(1, DATA, b"abc", 2, 0)
    h.segment(1, DATA, b"abc", 3, 0)
    h.segment(4, DATA, b"d", 4, 0)
    assert rec.stream() == b"abcd" and h.retransmitted == 1


def test_overlapping_segment_contributes_only_new_bytes():
    h, rec = half()
    h.segment(0, TCP_SYN, b"", 1, 0)
    h.segment(1, DATA, b"abcd", 2, 0)
    h.segment(3, DATA, b"cdefg", 3, 0)  # overlaps two bytes
    assert rec.stream() == b"abcdefg" and h.overlapped == 1


def test_overlapping_out_of_order_segments():
    h, rec = half()
    h.segment(0, TCP_SYN, b"", 1, 0)
    h.segment(5, DATA, b"efgh", 2, 0)
    h.segment(3, DATA, b"cdef", 3, 0)
    h.segment(1, DATA, b"ab", 4, 0)
    assert rec.stream() == b"abcdefgh"


def test_sequence_wrap_around():
    h, rec = half()
    isn = 0xFFFF_FFFA
    h.segment(isn, TCP_SYN, b"", 1, 0)
    h.segment(isn + 1, DATA, b"01234", 2, 0)  # ends exactly at 2**32
    h.segment(2, DATA, b"789", 3, 0)  # out of order, after the wrap
    h.segment(0, DATA, b"5", 4, 0)  # wrapped to 0
    h.segment(1, DATA, b"6", 5, 0)
    assert rec.stream() == b"0123456789"
    assert rec.events[-1][1] == 7  # offsets keep growing past 2**32 sequence numbers


def test_gap_declared_when_out_of_order_buffer_is_full():
    h, rec = half(max_ooo=10)
    h.segment(0, TCP_SYN, b"", 1, 0)
    h.segment(1, DATA, b"ab", 2, 0)
    h.segment(8, DATA, b"hijkl", 3, 0)  # 5 bytes missing before it
    h.segment(13, DATA, b"mnopqr", 4, 0)  # buffer now 11 bytes > 10: give up on the hole
    assert ("gap", 2, 5, 3) in rec.events
    assert rec.stream() == b"abhijklmnopqr"
    assert h.pending_bytes == 0 and h.lost_bytes == 5


def test_a_fin_behind_a_hole_waits_for_it_and_rst_and_the_end_flush_the_holes():
    h, rec = half()
    h.segment(0, TCP_SYN, b"", 1, 0)
    h.segment(5, DATA, b"xyz", 2, 0)
    h.segment(8, TCP_FIN | TCP_ACK, b"", 3, 0)
    assert rec.events == [] and not h.fin_seen  # the FIN comes after bytes 1-4, not yet here
    h.flush(4, 0)  # the direction's end (the capture's, or the window's): the hole is lost
    assert rec.events == [("gap", 0, 4, 2), ("data", 4, b"xyz", 2)] and h.fin_seen
    h2, rec2 = half()
    h2.segment(0, TCP_SYN, b"", 1, 0)
    h2.segment(3, TCP_RST | DATA, b"late", 2, 0)
    assert rec2.events[0][0] == "gap" and h2.rst_seen


@pytest.mark.parametrize("fin_payload", [b"", b"jkl"])
def test_a_fin_that_comes_before_the_bytes_it_follows_ends_the_stream_after_them(fin_payload):
    """Captured out of order: the FIN (with or without bytes of its own) before a segment it
    follows. The late segment's bytes are delivered, not dropped as a retransmission."""
    h, rec = half()
    h.segment(0, TCP_SYN, b"", 1, 0)
    h.segment(1, DATA, b"abc", 2, 0)
    h.segment(7, TCP_FIN | DATA, fin_payload, 3, 0)  # bytes 4-6 not yet here
    assert not h.fin_seen
    h.segment(4, DATA, b"def", 4, 0)
    assert rec.stream() == b"abcdef" + fin_payload and h.fin_seen
    assert not [e for e in rec.events if e[0] == "gap"] and h.retransmitted == 0
    h.segment(7 + len(fin_payload), TCP_FIN | TCP_ACK, b"", 5, 0)  # the FIN again: nothing new
    assert rec.stream() == b"abcdef" + fin_payload and h.fin_seen


def test_a_fin_in_order_ends_the_stream_at_once():
    h, rec = half()
    h.segment(0, TCP_SYN, b"", 1, 0)
    h.segment(1, TCP_FIN | DATA, b"abc", 2, 0)
    assert h.fin_seen and rec.stream() == b"abc"
    h2, _ = half()
    h2.segment(0, TCP_SYN, b"", 1, 0)
    h2.segment(1, TCP_FIN | TCP_ACK, b"", 2, 0)
    assert h2.fin_seen


def test_both_fins_before_a_late_segment_still_give_its_frame_to_the_connection():
    """The client's last MESSAGE is captured after both FINs (a retransmission): the connection
    ends after it, and the frame is dissected there, not lost with the closed connection."""
    msgs = [message(1, i, b"payload-%d" % i) for i in range(1, 4)]
    segs, base = opening()
    first, last = b"".join(msgs[:2]), msgs[2]
    end = base + len(first) + len(last)
    segs += [
        (True, base, DATA, first),
        (True, end, TCP_FIN | TCP_ACK, b""),
        (False, 500 + len(OK_20) + len(NOTIFY_ACK_1), TCP_FIN | TCP_ACK, b""),
        (True, base + len(first), DATA, last),  # the late segment the client's FIN follows
    ]
    records, d = run(capture(segs))
    assert [r["message_id"] for r in records if r["type"] == "MESSAGE"] == [1, 2, 3]
    [summary] = d.summaries()
    assert summary["tcp"]["initiator>responder"]["lost_bytes"] == 0
    assert len(d.summaries()) == 1


def test_mid_connection_start_is_announced():
    h, rec = half()
    h.segment(123456, DATA, b"abc", 1, 0)
    assert rec.events == [("gap", 0, None, 1), ("data", 0, b"abc", 1)]


# --- the dissector end to end: resync after a lost segment or a mid-connection start ----


def hello(version: bytes = b"0.0.1") -> bytes:
    body = b"\x00" + struct.pack(">H", len(version)) + version + b"\x00\x00" + b"\x00\x01p" + b"\x00\x01i"
    return struct.pack(">I", len(body)) + body


def message(stream_id: int, message_id: int, payload: bytes, key: bytes = b"") -> bytes:
    body = b"\x05" + struct.pack(">QQqH", stream_id, message_id, 0, len(key)) + key + payload
    return struct.pack(">I", len(body)) + body


OK_20 = b"\x00\x00\x00\x05\x01\x00\x00\x00\x14"  # OK, 20 credits
NOTIFY_1 = b"\x00\x00\x00\x14\x03" + struct.pack(">Q", 1) + b"\x00\x01s" + struct.pack(">Q", 0)
NOTIFY_ACK_1 = b"\x00\x00\x00\x12\x04\x01" + struct.pack(">QQ", 1, 0)


def capture(segs: list[tuple[bool, int, int, bytes]]) -> bytes:
    """segs: (from client, seq, flags, payload) between 10.0.0.1:40000 and 10.0.0.2:7100."""
    packets = []
    for i, (from_client, seq, flags, payload) in enumerate(segs):
        if from_client:
            tcp = tcp_header(40000, 7100, seq, flags, payload)
            packets.append((T + i * 1000, ether(ipv4(A4, B4, tcp))))
        else:
            tcp = tcp_header(7100, 40000, seq, flags, payload)
            packets.append((T + i * 1000, ether(ipv4(B4, A4, tcp))))
    return pcap_file(packets)


def run(blob: bytes, **kwargs) -> tuple[list[dict], Dissector]:
    d = Dissector("test", **kwargs)
    return list(d.run(io.BytesIO(blob))), d


def handshake() -> list[tuple[bool, int, int, bytes]]:
    return [(True, 99, TCP_SYN, b""), (False, 499, TCP_SYN | TCP_ACK, b""), (True, 100, TCP_ACK, b"")]


def opening() -> tuple[list[tuple[bool, int, int, bytes]], int]:
    """TCP handshake, HELLO, OK, NOTIFY, NOTIFY_ACK: (segments, the client's next sequence number)."""
    h = hello()
    segs = handshake() + [
        (True, 100, DATA, h),
        (False, 500, DATA, OK_20),
        (True, 100 + len(h), DATA, NOTIFY_1),
        (False, 500 + len(OK_20), DATA, NOTIFY_ACK_1),
    ]
    return segs, 100 + len(h) + len(NOTIFY_1)


def test_lost_segment_reported_and_decoding_resyncs():
    msgs = [message(1, i, b"payload-%d" % i) for i in range(1, 7)]
    client = hello() + NOTIFY_1
    stream = b"".join(msgs)
    segs, base = opening()
    cut = len(msgs[0]) + 5  # the lost segment starts inside message 2 ...
    cut2 = len(b"".join(msgs[:3])) + 3  # ... and ends inside message 4
    segs += [
        (True, base, DATA, stream[:cut]),
        # (True, base + cut, DATA, stream[cut:cut2]) never captured
        (True, base + cut2, DATA, stream[cut2:]),
        (True, base + len(stream), TCP_FIN | TCP_ACK, b""),
    ]
    records, d = run(capture(segs))
    ids = [r["message_id"] for r in records if r["type"] == "MESSAGE"]
    assert ids == [1, 5, 6]
    first_after = next(r for r in records if r.get("message_id") == 5)
    notes = " ".join(first_after["notes"])
    assert f"{cut2 - cut} bytes missing at stream offset {len(client) + cut}" in notes
    assert "resynced at stream offset" in notes
    assert first_after["offset"] == len(client) + len(b"".join(msgs[:4]))
    [summary] = d.summaries()
    assert summary["tcp"]["initiator>responder"]["lost_bytes"] == cut2 - cut
    assert summary["violations"] == 0


def test_capture_starting_mid_connection_resyncs_and_says_so():
    msgs = b"".join(message(1, i, b"m%d" % i) for i in range(10, 14))
    # The capture begins 7 bytes into a frame of a connection already streaming.
    segs = [
        (True, 5000, DATA, msgs[7:]),
        (False, 9000, DATA, b"\x00\x00\x00\x09\x06" + b"\x00\x00\x00\x05" + b"\x00" * 4),
    ]
    records, d = run(capture(segs))
    assert [r["message_id"] for r in records if r["type"] == "MESSAGE"] == [11, 12, 13]
    assert "mid-connection" in " ".join(records[0]["notes"])
    [summary] = d.summaries()
    assert summary["midstream"] is True
    # Streams never seen opened are assumed open: no spurious violations.
    assert summary["violations"] == 0
    assert records[-1]["type"] == "ACK" and records[-1]["credits"] == 5


def test_wrap_around_inside_a_protocol_stream():
    isn = 0xFFFF_FFFF - 60
    segs = [(True, isn, TCP_SYN, b""), (False, 499, TCP_SYN | TCP_ACK, b"")]
    h = hello()
    segs += [(True, isn + 1, DATA, h), (False, 500, DATA, OK_20)]
    segs += [(True, isn + 1 + len(h), DATA, NOTIFY_1), (False, 500 + len(OK_20), DATA, NOTIFY_ACK_1)]
    data = message(1, 1, b"x" * 50) + message(1, 2, b"y" * 50)
    start = isn + 1 + len(h) + len(NOTIFY_1)
    segs += [
        (True, (start + 70) & 0xFFFFFFFF, DATA, data[70:]),  # out of order, across the wrap
        (True, start, DATA, data[:70]),
    ]
    records, d = run(capture(segs))
    types = [r["type"] for r in records if r["sender"] == "connector"]
    assert types == ["HELLO", "NOTIFY", "MESSAGE", "MESSAGE"]
    assert [r["payload_len"] for r in records if r["type"] == "MESSAGE"] == [50, 50]
    assert d.summaries()[0]["violations"] == 0


def test_find_boundary_prefers_a_decodable_chain():
    frames = message(1, 7, b"abc") + message(1, 8, b"def")
    junk = b"\x00\x00\x00\x02\x63" + b"\xff" * 3  # plausible length, impossible type byte
    pos, _ = find_boundary(junk + frames, 4 * 1024 * 1024)
    assert pos == len(junk)


def test_a_resync_judges_each_candidate_once_however_the_bytes_come(monkeypatch):
    """Tiny undecodable frames packet after packet: the scan once cost 12k decodes a packet."""
    calls = []
    real = resync.decode
    monkeypatch.setattr(resync, "decode", lambda body: calls.append(1) or real(body))
    framer = DirectionFramer(None, True, 4 * 1024 * 1024)
    framer.reader = None  # resyncing
    packet = b"\x00\x00\x00\x01\x09" * 200  # 1000 bytes, each 5 a frame no decoder takes
    for n in range(100):
        framer.data(n * len(packet), packet, n + 1, 0)
    assert framer.reader is None
    assert len(calls) <= 2 * 100 * 200  # at most the two candidates of each 5 bytes, once


@pytest.mark.parametrize("cut", range(0, 40, 3))
def test_a_boundary_found_bit_by_bit_is_the_one_found_at_once(cut):
    frames = message(1, 7, b"abc") + message(1, 8, b"def")
    data = b"\x00\x00\x00\x02\x63" + b"\xff" * 3 + b"\x00\x00\x01\x09\x00" + frames
    scan = BoundaryScan(4 * 1024 * 1024)
    got = scan.find(data[:cut])
    if got[0] < 0:
        got = scan.find(data)
    assert got == find_boundary(data, 4 * 1024 * 1024)


def test_oversize_frame_is_reported_then_resynced():
    too_big = struct.pack(">I", 5_000_000) + b"\x05" + b"\x00" * 10
    later = message(1, 2, b"ok")
    segs, base = opening()
    segs.append((True, base, DATA, message(1, 1, b"a") + too_big + later))
    records, d = run(capture(segs))
    invalid = [r for r in records if r["type"] == "INVALID"]
    assert len(invalid) == 1
    assert "exceeds the maximum frame size" in invalid[0]["violations"][0]
    assert invalid[0]["packet"] == 8
    assert [r["message_id"] for r in records if r["type"] == "MESSAGE"] == [1, 2]
    assert d.summaries()[0]["violations"] == 1


@pytest.mark.parametrize("limit", [16, 1 << 20])
def test_out_of_order_memory_is_bounded(limit):
    h, rec = half(max_ooo=limit)
    h.segment(0, TCP_SYN, b"", 1, 0)
    for i in range(200):  # segment 1 never arrives: everything else waits for it
        h.segment(2 + i * 8, DATA, b"abcdefgh", i + 2, 0)
        assert h.pending_bytes <= max(limit, 8)


def test_resync_through_garbage():
    # Mid-connection start: a plausible 1 MiB MESSAGE header, then 300 KB that can start no frame.
    garbage = b"\x00\x10\x00\x00\x05" + b"\xff" * 300_000
    tail = message(1, 41, b"found") + message(1, 42, b"again")
    segs = [(True, 7000 + i, DATA, garbage[i : i + 1400]) for i in range(0, len(garbage), 1400)]
    segs.append((True, 7000 + len(garbage), DATA, tail))
    records = list(Dissector("garbage").run(io.BytesIO(capture(segs))))
    assert [r["message_id"] for r in records] == [41, 42]
    assert f"{len(garbage)} bytes skipped" in " ".join(records[0]["notes"])


def test_resync_buffer_is_bounded_while_scanning():
    from wallaroo_proto.protocols.wallaroo.resync import RESYNC_WAIT

    # Zero bytes everywhere: every offset is a candidate start, none ever decides.
    garbage = b"\x00\x10\x00\x00\x05" + b"\x00\x01\x02\x03" * 25_000
    segs = [(True, 7000 + i, DATA, garbage[i : i + 1400]) for i in range(0, len(garbage), 1400)]
    d = Dissector("garbage")
    assert list(d.run(io.BytesIO(capture(segs)))) == []
    [tracker] = d.trackers
    assert max(len(direction.resync_buf) for direction in tracker.dirs.values()) <= RESYNC_WAIT + 1400


@given(
    data=st.binary(min_size=1, max_size=3000),
    cuts=st.lists(st.integers(min_value=1, max_value=2999), max_size=30),
    isn=st.integers(min_value=0, max_value=0xFFFF_FFFF),
    order=st.randoms(use_true_random=False),
    duplicates=st.lists(st.integers(min_value=0, max_value=40), max_size=8),
)
@settings(max_examples=150, deadline=None)
def test_any_segmentation_order_and_duplication_gives_the_stream(data, cuts, isn, order, duplicates):
    """Segments cut anywhere, shuffled, some sent twice or overlapping the next: the same bytes."""
    points = sorted({c for c in cuts if c < len(data)} | {0, len(data)})
    segments = [(points[i], data[points[i] : points[i + 1]]) for i in range(len(points) - 1)]
    for d in duplicates:
        if segments:
            start, chunk = segments[d % len(segments)]
            segments.append((start, chunk + data[start + len(chunk) : start + len(chunk) + 5]))  # overlaps
    order.shuffle(segments)
    h, rec = half(max_ooo=1 << 20)
    h.segment(isn, TCP_SYN, b"", 1, 0)
    for n, (start, chunk) in enumerate(segments):
        h.segment((isn + 1 + start) & 0xFFFFFFFF, DATA, chunk, n + 2, 0)
    h.flush(99, 0)
    assert rec.stream() == data
    assert not [e for e in rec.events if e[0] == "gap"]
    offsets = [e[1] for e in rec.events]
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_ipv6_connection_end_to_end():
    from test_capture import A6, B6, ipv6

    h = hello()
    packets = [
        (T, ether(ipv6(A6, B6, tcp_header(40000, 7100, 9, TCP_SYN)), ethertype=0x86DD)),
        (T + 1, ether(ipv6(A6, B6, tcp_header(40000, 7100, 10, DATA, h)), ethertype=0x86DD)),
        (T + 2, ether(ipv6(B6, A6, tcp_header(7100, 40000, 5, DATA, OK_20)), ethertype=0x86DD)),
    ]
    records, _ = run(pcap_file(packets))
    assert [r["type"] for r in records] == ["HELLO", "OK"]
    assert records[0]["connection"] == "[2001:db8::1]:40000 > [2001:db8::2]:7100"
