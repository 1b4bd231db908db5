"""dissect's column path for DCP gives the records the frame-by-frame path gives, byte for byte.

The producer's stream messages go through the core's run path
(``Connection.feed_run``) and come out as a ``FrameBlock`` of columns; every
other packet is judged and recorded one at a time. Random producer traffic, valid
and broken (``test_dcp_run.traffic``), cut into TCP segments at random places with
the consumer's buffer acknowledgements between them, is dissected twice: as it is,
and with the run path turned off. Records (as dicts and as JSONL) and summaries
must be equal.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dcp_run import STREAMS, traffic

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.frame_block import MAX_ROWS, FrameBlock
from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.codec import StreamReq
from wallaroo_proto.protocols.dcp.dissect import DcpTracker
from wallaroo_proto.records import to_json


def _capture(
    events: list[tuple[str, bytes]], buffer_size: int, cuts: list[int], lost: frozenset[int] = frozenset()
) -> bytes:
    """A pcap of one DCP connection: the consumer's setup, then the producer's traffic in segments
    cut at ``cuts`` (positions in its bytes), each acknowledgement its own segment between them;
    the producer's segments numbered in ``lost`` (from 1) are left out of the capture."""
    out = io.BytesIO()
    with PcapWriter(out) as w:
        s = w.tcp_session(("10.0.0.1", 40000), ("10.0.0.2", 11210), timestamp=1_700_000_000.0)
        t = 1_700_000_000.0
        segment = s._segment
        numbered = iter(range(1, 1 << 30))

        def captured(from_client: bool, flags: int, payload: bytes, timestamp: float | None, *rest) -> None:
            if from_client or not payload or next(numbered) not in lost:
                segment(from_client, flags, payload, timestamp, *rest)

        s._segment = captured

        def exchange(request: bytes, answer: bytes) -> None:
            s.send(True, request, t)
            s.send(False, answer, t)

        exchange(codec.open_request("c", opaque=1), codec.response(codec.OPEN, opaque=1))
        controls = [("enable_noop", "true"), ("enable_stream_id", "true")]
        if buffer_size:
            controls.append(("connection_buffer_size", str(buffer_size)))
        for n, (key, value) in enumerate(controls, start=2):
            exchange(codec.control_request(key, value, opaque=n), codec.response(codec.CONTROL, opaque=n))
        for opaque, (vb, sid, end) in STREAMS.items():
            req = StreamReq(0, 0, end, 0, 0, 0, b'{"sid": %d}' % sid if sid else b"")
            answer = codec.response(
                codec.STREAM_REQ, opaque=opaque, value=codec.failover_log_value([(0xA, 0)])
            )
            exchange(codec.stream_req_request(vb, opaque, req), answer)
        pending = b""
        sent = 0
        cut_at = iter(sorted(set(cuts)))
        next_cut = next(cut_at, None)
        for kind, wire in events:
            if kind == "ack":
                if pending:
                    s.send(False, pending, t)
                    sent += len(pending)
                    pending = b""
                s.send(True, wire, t)
                continue
            pending += wire
            while next_cut is not None and next_cut < sent + len(pending):
                if next_cut > sent:
                    s.send(False, pending[: next_cut - sent], t)
                    pending = pending[next_cut - sent :]
                    sent = next_cut
                next_cut = next(cut_at, None)
            t += 0.001
        if pending:
            s.send(False, pending, t)
    return out.getvalue()


def _dissect(pcap: bytes) -> tuple[list[dict], list[str], list[dict], list[dict], list[dict]]:
    """Records, JSONL lines, and the summaries of the record, JSONL and drain readings."""
    dissector = Dissector("c.pcap")
    records = list(dissector.run(io.BytesIO(pcap)))
    jsonl_dissector = Dissector("c.pcap")
    lines = [line for batch in jsonl_dissector.jsonl_batches(io.BytesIO(pcap)) for line in batch]
    drained = Dissector("c.pcap")
    drained.drain(io.BytesIO(pcap))
    return records, lines, dissector.summaries(), jsonl_dissector.summaries(), drained.summaries()


@settings(max_examples=200, deadline=None)
@given(
    traffic(),
    st.sampled_from([0, 0, 150, 600, 4000]),
    st.lists(st.integers(0, 3000), max_size=12),
    st.frozensets(st.integers(2, 12), max_size=2),
)
def test_the_column_path_records_what_the_frame_path_records(events, buffer_size, cuts, lost):
    """Also with producer segments lost (the splitter resyncs, a note waits for the next record)."""
    pcap = _capture(events, buffer_size, cuts, lost)
    fast = _dissect(pcap)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(DcpTracker, "runs_from", lambda self, direction: False)
        slow = _dissect(pcap)
    records, lines, *summaries = fast
    assert records == slow[0]
    assert lines == slow[1] == [to_json(r) for r in slow[0]]
    assert summaries == list(slow[2:])


def test_a_long_producer_stream_comes_out_in_blocks():
    """The path is taken: a clean stream of many items gives blocks, not one record per packet, and
    no block holds more than MAX_ROWS (the driver's batches are bounded in rows)."""
    items = [("p", codec.snapshot_marker(3, 7, 1, 200, 1, None))]
    items += [("p", codec.mutation(3, 7, n, 1, b"k%d" % n, b"v" * 20)) for n in range(1, 201)]
    pcap = _capture(items, 0, [])
    dissector = Dissector("c.pcap")
    kinds = [type(item) for batch in dissector._batches(io.BytesIO(pcap)) for item in batch]
    assert kinds.count(FrameBlock) == 4 and kinds.count(dict) < 20
    items = [item for batch in Dissector("c.pcap")._batches(io.BytesIO(pcap)) for item in batch]
    sizes = [len(item) for item in items if type(item) is FrameBlock]
    assert sizes == [MAX_ROWS, MAX_ROWS, MAX_ROWS, 201 - 3 * MAX_ROWS]  # one segment, blocks of at most 64


def test_the_packet_that_fills_the_window_says_so_and_the_next_ones_break_the_rule():
    marker = [("p", codec.snapshot_marker(3, 7, 1, 10, 1, None))]
    events = marker + [("p", codec.mutation(3, 7, n, 1, b"k%d" % n, b"v" * 20)) for n in range(1, 6)]
    pcap = _capture(events, 150, [])
    fast = _dissect(pcap)
    records = fast[0][-6:]
    assert [r.get("dcp_event") for r in records[1:3]] == [None, "buffer full"]  # 44 + 77 + 77 >= 150
    assert [r["verdict"] for r in records] == ["accepted"] * 3 + ["violation"] * 3
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(DcpTracker, "runs_from", lambda self, direction: False)
        assert fast == _dissect(pcap)


def test_a_large_value_in_small_segments_is_one_record_between_runs(monkeypatch):
    """A 3 MB value arriving 1,000 bytes at a time, between runs of small items."""
    events = [("p", codec.snapshot_marker(3, 7, 1, 30, 1, None))]
    events += [("p", codec.mutation(3, 7, n, 1, b"k%d" % n, b"v" * 20)) for n in range(1, 4)]
    events += [("p", codec.mutation(3, 7, 4, 1, b"big", b"x" * 3_000_000))]
    events += [("p", codec.mutation(3, 7, n, 1, b"k%d" % n, b"v" * 20)) for n in range(5, 9)]
    pcap = _capture(events, 0, list(range(200, 3_000_600, 1000)))
    fast = _dissect(pcap)
    big = [r for r in fast[0] if r.get("dcp_key") == "big"]
    assert len(big) == 1 and big[0]["value_len"] == 3_000_000 and big[0]["verdict"] == "accepted"
    monkeypatch.setattr(DcpTracker, "runs_from", lambda self, direction: False)
    assert fast == _dissect(pcap)


@pytest.mark.parametrize("value", ["k\u00e9y", 'q"uote\\', "tab\tnew\nline", "\x00\x1f"])
def test_keys_that_json_escapes_come_out_as_the_frame_path_writes_them(monkeypatch, value):
    key = value.encode()
    events = [("p", codec.snapshot_marker(3, 7, 1, 1, 1, None)), ("p", codec.mutation(3, 7, 1, 1, key, b"v"))]
    pcap = _capture(events, 0, [])
    fast = _dissect(pcap)
    monkeypatch.setattr(DcpTracker, "runs_from", lambda self, direction: False)
    assert fast == _dissect(pcap)
