"""Records come out in capture order, whatever reassembly had to wait for.

A frame is shown at the packet that completes it; the output is sorted by that
packet, both directions (and all connections) interleaved, even when bytes
after a hole declared lost come out later than records of packets after them.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from test_reassembly import DATA, capture, message, opening

from wallaroo_proto.capture.dissector import Dissector, in_packet_order
from wallaroo_proto.capture.frame_block import COLUMN, SHARED, FrameBlock
from wallaroo_proto.capture.pcap import TCP_ACK, TCP_FIN
from wallaroo_proto.report.collect import build_report

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
LOST = CAPTURES / "lost-segment.pcap"
#: A worker's ACK granting 1 credit and acknowledging nothing (u32 length, type 6, credits, count).
ACK_1 = b"\x00\x00\x00\x09\x06" + struct.pack(">II", 1, 0)


def packets(records: list[dict]) -> list[int]:
    return [r["packet"] for r in records]


def test_lost_segment_frames_come_out_in_packet_order():
    records = list(Dissector(str(LOST)).run(LOST))
    assert packets(records) == sorted(packets(records))
    # Messages 7 to 12 (packets 9-11, after the hole) come before the worker's ACK of packet 12.
    assert [(r["packet"], r["type"]) for r in records[-7:]] == [
        (9, "MESSAGE"),
        (9, "MESSAGE"),
        (10, "MESSAGE"),
        (10, "MESSAGE"),
        (10, "MESSAGE"),
        (11, "MESSAGE"),
        (12, "ACK"),
    ]
    lines = [json.loads(line) for line in Dissector(str(LOST)).run_jsonl(LOST)]
    assert lines == records
    # numbered as shown: the ACK, judged before the messages after the hole came in, is frame 12
    assert [r["frame_index"] for r in records] == list(range(13))


def numbered_as_shown(records: list[dict]) -> bool:
    """Each connection's frames numbered 0, 1, 2, ... in the order they come out."""
    by_conn: dict[int, list[int]] = {}
    for r in records:
        by_conn.setdefault(r["conn_index"], []).append(r["frame_index"])
    return all(indices == list(range(len(indices))) for indices in by_conn.values())


def test_lost_segment_ladder_never_runs_backwards():
    [capture_report] = build_report([LOST]).captures
    [conn] = capture_report.connections
    frames = conn.head + conn.tail
    assert len(frames) == 13
    times = [frame[1] for frame in frames]
    assert times == sorted(times)
    assert [frame[5] for frame in frames] == sorted(frame[5] for frame in frames)


def test_a_block_spanning_packets_is_cut_around_a_record_between_them():
    layout = (("conn_index", SHARED), ("packet", COLUMN), ("offset", COLUMN))
    block = FrameBlock(layout, {"conn_index": 1}, [(3, 0), (3, 10), (5, 20), (7, 30)])
    ack = {"conn_index": 1, "packet": 4, "offset": 0}
    late = '{"conn_index":1,"packet":6,"offset":9}'
    items: list = [block, ack, late]
    in_packet_order(items)
    flat = [
        (r["packet"], r["offset"])
        for item in items
        for r in (
            item.records() if type(item) is FrameBlock else [item if type(item) is dict else json.loads(item)]
        )
    ]
    assert flat == [(3, 0), (3, 10), (4, 0), (5, 20), (6, 9), (7, 30)]
    unsplit: list = [FrameBlock(layout, {"conn_index": 1}, [(3, 0), (3, 1)]), ack]
    before = list(unsplit)
    in_packet_order(unsplit)
    assert unsplit == before and unsplit[0] is before[0]  # in order already: nothing rebuilt


def client_segments(stream: bytes, base: int, cuts: list[int]) -> list[tuple[bool, int, int, bytes]]:
    points = sorted({c for c in cuts if 0 < c < len(stream)} | {0, len(stream)})
    return [(True, base + points[i], DATA, stream[points[i] : points[i + 1]]) for i in range(len(points) - 1)]


def comparable(records: list[dict]) -> list[tuple]:
    """A direction's frames as decoded, without where and when the capture had them."""
    drop = {"packet", "ts", "ts_ns", "frame_index"}
    kept = [{k: v for k, v in r.items() if k not in drop} for r in records]
    return sorted((r["direction"], r["offset"], json.dumps(r, sort_keys=True)) for r in kept)


@given(
    count=st.integers(min_value=1, max_value=12),
    cuts=st.lists(st.integers(min_value=1, max_value=600), max_size=12),
    order=st.randoms(use_true_random=False),
    duplicates=st.lists(st.integers(min_value=0, max_value=40), max_size=4),
    drops=st.lists(st.integers(min_value=0, max_value=40), max_size=2),
    acks=st.lists(st.integers(min_value=0, max_value=40), max_size=6),
)
@settings(max_examples=120, deadline=None)
def test_any_reordering_gives_records_in_packet_order(count, cuts, order, duplicates, drops, acks):
    """Client segments shuffled, duplicated or dropped, worker ACKs between them: packet order.

    With nothing dropped the frames are those of the in-order capture.
    """
    segs, base = opening()
    stream = b"".join(message(1, i, b"p%03d" % i) for i in range(1, count + 1))
    data = client_segments(stream, base, cuts)
    worker_seq = 500 + 9 + 22  # after OK and NOTIFY_ACK

    def with_acks(client: list) -> list:
        out = list(client)
        seq = worker_seq
        for n, at in enumerate(sorted(acks)):
            out.insert(min(at, len(out)) + n, (False, seq, DATA, ACK_1))
            seq += len(ACK_1)
        end = base + len(stream)
        return out + [(True, end, TCP_FIN | TCP_ACK, b""), (False, seq, TCP_FIN | TCP_ACK, b"")]

    in_order = with_acks(data)
    shaken = list(data)
    for d in duplicates:
        shaken.append(shaken[d % len(shaken)])
    order.shuffle(shaken)
    dropped = {d % len(shaken) for d in drops} if len(shaken) > 1 else set()
    shaken = [s for i, s in enumerate(shaken) if i not in dropped]

    def records(segments: list) -> list[dict]:
        blob = capture(segs + segments)
        got = list(Dissector("prop").run(io.BytesIO(blob)))
        lines = [json.loads(line) for line in Dissector("prop").run_jsonl(io.BytesIO(blob))]
        assert lines == got
        return got

    expected = records(in_order)
    got = records(with_acks(shaken))
    assert packets(got) == sorted(packets(got))
    assert numbered_as_shown(got) and numbered_as_shown(expected)
    if not dropped:
        assert comparable(got) == comparable(expected)
    else:  # some frames are lost, none is made up or shown twice (after a lost hole, stream
        # order and capture order may differ: a frame keeps the packet that carried it)
        messages = [r["message_id"] for r in got if r["type"] == "MESSAGE"]
        assert len(messages) == len(set(messages)) and set(messages) <= set(range(1, count + 1))


def test_records_wait_for_a_hole_only_a_window_of_bytes():
    """A hole no segment fills while the other direction streams: it is declared lost after
    ``max_out_of_order`` bytes of capture, and the records held back meanwhile go out."""
    segs, base = opening()
    first = message(1, 1, b"a" * 40)
    later = message(1, 2, b"b" * 40) + message(1, 3, b"c" * 40)
    segs.append((True, base + len(first), DATA, later))  # the segment carrying message 1 is lost
    seq = 500 + 9 + 22
    for _ in range(400):
        segs.append((False, seq, DATA, ACK_1))
        seq += len(ACK_1)
    d = Dissector("window", max_out_of_order=500)
    most = 0
    records = []
    for item in d.frames(io.BytesIO(capture(segs))):
        most = max(most, len(d._out))
        records += item.records() if type(item) is FrameBlock else [item]
    assert packets(records) == sorted(packets(records))
    assert [r["message_id"] for r in records if r["type"] == "MESSAGE"] == [2, 3]
    assert most <= 500 // len(ACK_1) + 64 + 2


def test_frames_waiting_for_a_connections_use_keep_capture_order():
    """A connection seen mid-stream holds its first frames until a MESSAGE tells its use; another
    connection's frames meanwhile wait too, so the output stays in packet order."""
    from test_capture import A4, B4, T, ether, ipv4, pcap_file, tcp_header

    def seg(port: int, from_worker: bool, seq: int, payload: bytes) -> bytes:
        if from_worker:
            return ether(ipv4(B4, A4, tcp_header(7100, port, seq, DATA, payload)))
        return ether(ipv4(A4, B4, tcp_header(port, 7100, seq, DATA, payload)))

    one, two = message(1, 5, b"first"), message(2, 9, b"second")
    frames = [
        seg(40001, True, 9000, ACK_1),  # connection 1: its use is not known yet
        seg(40002, False, 5000, two),  # connection 2: a MESSAGE, a source at once
        seg(40002, True, 7000, ACK_1),
        seg(40001, False, 3000, one),  # connection 1 is a source too
    ]
    blob = pcap_file([(T + i * 1000, frame) for i, frame in enumerate(frames)])
    records = list(Dissector("use").run(io.BytesIO(blob)))
    assert [(r["packet"], r["conn_index"], r["type"]) for r in records] == [
        (1, 1, "ACK"),
        (2, 2, "MESSAGE"),
        (3, 2, "ACK"),
        (4, 1, "MESSAGE"),
    ]


def test_messages_after_a_lost_segment_interleave_with_the_acks_between_them():
    """Message 1's segment is lost: messages 2 to 7 wait behind the hole until the FIN, and
    come out (in one block of plain MESSAGEs, cut up) between the ACKs of packets 9 and 11."""
    segs, base = opening()
    msgs = [message(1, i, b"x%d" % i) for i in range(1, 8)]
    size = len(msgs[0])
    worker = 500 + 9 + 22
    segs += [
        (True, base + size, DATA, b"".join(msgs[1:3])),
        (False, worker, DATA, ACK_1),
        (True, base + 3 * size, DATA, b"".join(msgs[3:5])),
        (False, worker + len(ACK_1), DATA, ACK_1),
        (True, base + 5 * size, DATA, b"".join(msgs[5:7])),
        (True, base + 7 * size, TCP_FIN | TCP_ACK, b""),
    ]
    blob = capture(segs)
    records = list(Dissector("lost").run(io.BytesIO(blob)))
    assert [(r["packet"], r["type"], r.get("message_id")) for r in records[4:]] == [
        (8, "MESSAGE", 2),
        (8, "MESSAGE", 3),
        (9, "ACK", None),
        (10, "MESSAGE", 4),
        (10, "MESSAGE", 5),
        (11, "ACK", None),
        (12, "MESSAGE", 6),
        (12, "MESSAGE", 7),
    ]
    assert [json.loads(line) for line in Dissector("lost").run_jsonl(io.BytesIO(blob))] == records
