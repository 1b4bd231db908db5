"""DCP packets: golden bytes hand-written from the protocol notes; the decoder's properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.codec import (
    Deletion,
    Mutation,
    Packet,
    PacketSplitter,
    ProtocolError,
    SnapshotMarker,
    StreamEnd,
    StreamReq,
    decode_packet,
    encode,
    parse,
)

H = bytes.fromhex

# DCP_OPEN "ab", producer flag, opaque bytes 00 00 00 01: header, extras (seqno 0, flags 1), key.
OPEN = H("80 50 0002 08 00 0000 0000000a 00000001 000000000000000000000000 000000016162")
# STREAM_REQ vb 3, opaque 7: flags 0, reserved 0, start 5, end forever, uuid 0xabc, snap 5..5.
STREAM_REQ = H(
    "80 53 0000 30 00 0003 00000030 00000007 0000000000000000"
    "00000000 00000000 0000000000000005 ffffffffffffffff 0000000000000abc"
    "0000000000000005 0000000000000005"
)
# Its success response: the failover log, newest first: (0xabc, 4), (0x123, 0).
STREAM_REQ_OK = H(
    "81 53 0000 00 00 0000 00000020 00000007 0000000000000000"
    "0000000000000abc 0000000000000004 0000000000000123 0000000000000000"
)
# ROLLBACK 0x23 with the 8-byte seqno 2.
ROLLBACK = H("81 53 0000 00 00 0023 00000008 00000007 0000000000000000 0000000000000002")
# SNAPSHOT_MARKER V1 vb 3: start 6, end 9, flags memory|checkpoint.
MARKER = H(
    "80 56 0000 14 00 0003 00000014 00000007 0000000000000000 0000000000000006 0000000000000009 00000005"
)
# MUTATION vb 3 seqno 6 rev 1, flags 0, exp 0, lock 0, nmeta 0, nru 0; key "k", value "v", datatype raw.
MUTATION = H(
    "80 57 0001 1f 00 0003 00000021 00000007 0000000000000000"
    "0000000000000006 0000000000000001 00000000 00000000 00000000 0000 00"
    "6b"
    "76"
)
# DELETION V1 vb 3 seqno 7 rev 2, key "k".
DELETION = H(
    "80 58 0001 12 00 0003 00000013 00000007 0000000000000000 0000000000000007 0000000000000002 0000 6b"
)
# STREAM_END vb 3 reason state_changed (2); BUFFER_ACK 4096; NOOP opaque 10000001 little-endian.
STREAM_END = H("80 55 0000 04 00 0003 00000004 00000007 0000000000000000 00000002")
BUFFER_ACK = H("80 5d 0000 04 00 0000 00000004 00000000 0000000000000000 00001000")
NOOP = H("80 5c 0000 00 00 0000 00000000 81969800 0000000000000000")
# A mutation on a stream opened with sid 5: magic 0x08, framing length 3, frame 0x22 00 05.
MUTATION_SID = H(
    "08 57 03 01 1f 00 0003 00000024 00000007 0000000000000000"
    "220005"
    "0000000000000006 0000000000000001 00000000 00000000 00000000 0000 00"
    "6b"
    "76"
)


def test_open_golden():
    assert codec.open_request("ab", opaque=1) == OPEN
    p = decode_packet(OPEN)
    assert (p.magic, p.opcode, p.opaque) == (0x80, codec.OPEN, 1)
    msg = parse(p)
    assert (msg.name, msg.flags, msg.producer) == ("ab", 1, True)


def test_stream_req_and_its_answers_golden():
    req = StreamReq(0, 5, codec.FOREVER, 0xABC, 5, 5)
    assert codec.stream_req_request(3, 7, req) == STREAM_REQ
    assert parse(decode_packet(STREAM_REQ)) == req
    assert codec.response(
        codec.STREAM_REQ, opaque=7, value=codec.failover_log_value([(0xABC, 4), (0x123, 0)])
    ) == (STREAM_REQ_OK)
    assert parse(decode_packet(STREAM_REQ_OK)).failover_log == [(0xABC, 4), (0x123, 0)]
    assert codec.rollback_response(7, 2) == ROLLBACK
    answer = parse(decode_packet(ROLLBACK))
    assert (answer.status_name, answer.rollback_seqno) == ("ROLLBACK", 2)


def test_stream_messages_golden():
    assert codec.snapshot_marker(3, 7, 6, 9, codec.SNAP_MEMORY | codec.SNAP_CHECKPOINT) == MARKER
    assert parse(decode_packet(MARKER)) == SnapshotMarker(6, 9, 5)
    assert codec.mutation(3, 7, 6, 1, b"k", b"v") == MUTATION
    assert parse(decode_packet(MUTATION)) == Mutation(6, 1, 0, 0, 0, b"k", b"v")
    assert codec.deletion(3, 7, 7, 2, b"k") == DELETION
    assert parse(decode_packet(DELETION)) == Deletion(7, 2, b"k")
    assert codec.stream_end(3, 7, codec.END_STATE_CHANGED) == STREAM_END
    assert parse(decode_packet(STREAM_END)).reason_name == "state_changed"
    assert codec.buffer_ack(4096) == BUFFER_ACK
    assert codec.noop(0x81969800) == NOOP
    # flow control counts the whole wire size: 24 + 31 + key + value, +3 with a stream id
    assert decode_packet(MUTATION).size == 24 + 31 + 2 and decode_packet(MUTATION_SID).size == 24 + 31 + 2 + 3


def test_stream_id_frame_golden():
    assert codec.mutation(3, 7, 6, 1, b"k", b"v", sid=5) == MUTATION_SID
    p = decode_packet(MUTATION_SID)
    assert (p.framing, codec.stream_id_of(p), p.key, p.value) == (H("220005"), 5, b"k", b"v")
    assert parse(p).seqno == 6


def test_frame_info_escapes():
    # id 15 + 1 = 16 with length 2; then length 15 + 1 = 16 bytes of id 1.
    framing = H("f2 01 abcd") + H("1f 01") + bytes(16)
    assert codec.parse_frame_infos(framing) == [(16, H("abcd")), (1, bytes(16))]
    with pytest.raises(ProtocolError, match="runs past"):
        codec.parse_frame_infos(H("23 0001"))


@pytest.mark.parametrize(
    ("wire", "reason", "offset"),
    [
        (H("79") + OPEN[1:], "bad magic 0x79", 0),
        (MUTATION[:30], "truncated body", 24),
        (OPEN[:10], "truncated header", 0),
        (H("80 57 0001 12") + MUTATION[5:8] + H("00000013") + MUTATION[12:24] + bytes(19), "extras of 18", 4),
        (H("80 5c 0000 00 00 0000 00000001 00000001 0000000000000000 00"), "must have no value", 8),
        (H("80 99 0000 00 00 0000 00000000 00000001 0000000000000000"), "opcode 0x99", 1),
        (H("81 53 0000 00 00 0023 00000004 00000007 0000000000000000 00000002"), "8-byte seqno", 8),
    ],
)
def test_bad_packets_name_what_and_where(wire, reason, offset):
    with pytest.raises(ProtocolError, match=reason) as err:
        parse(decode_packet(wire, 0, base=1000), 1000)
    assert err.value.offset == 1000 + offset
    assert "offset" in str(err.value)


def test_splitter_splits_anywhere_and_resyncs_after_a_gap():
    stream = OPEN + STREAM_REQ + MARKER + MUTATION + DELETION
    for cut in range(1, len(stream)):
        s = PacketSplitter()
        got = s.feed(stream[:cut]) + s.feed(stream[cut:])
        assert [o for o, _ in got] == [0, 34, 106, 150, 207]
    s = PacketSplitter()
    assert len(s.feed(OPEN + MARKER[:30])) == 1
    s.gap(5)
    got = s.feed(MARKER[35:] + MUTATION + DELETION)
    assert [(o, w) for o, w in got] == [
        (34 + len(MARKER), MUTATION),
        (34 + len(MARKER) + len(MUTATION), DELETION),
    ]


# ------------------------------------------------------------------------------------------ properties

u64 = st.integers(0, 2**64 - 1)
small = st.binary(max_size=40)


@st.composite
def packets(draw) -> Packet:
    magic = draw(st.sampled_from(sorted(codec.MAGICS)))
    framing = b""
    if magic in (codec.ALT_REQ, codec.ALT_RES):
        framing = draw(st.sampled_from([b"", codec.stream_id_frame(draw(st.integers(0, 65535)))]))
    return Packet(
        magic,
        draw(st.integers(0, 255)),
        draw(st.integers(0, 65535)),
        draw(st.integers(0, 2**32 - 1)),
        draw(u64),
        draw(st.integers(0, 7)),
        draw(small),
        draw(st.binary(max_size=40 if magic in (codec.ALT_REQ, codec.ALT_RES) else 300)),
        draw(small),
        framing,
    )


@settings(max_examples=300, deadline=None)
@given(packets())
def test_packets_round_trip(p):
    assert decode_packet(encode(p)) == p


@settings(max_examples=200, deadline=None)
@given(st.lists(packets(), min_size=1, max_size=6), st.data())
def test_splitter_gives_back_the_packets_in_any_chunking(ps, data):
    wire = b"".join(encode(p) for p in ps)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    s = PacketSplitter()
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got += s.feed(wire[a:b])
    assert [decode_packet(w) for _, w in got] == ps


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120))
def test_garbage_gives_a_protocol_error_or_a_value_never_a_crash(raw):
    try:
        parse(decode_packet(raw))
    except ProtocolError as err:
        assert 0 <= err.offset <= len(raw) + 24
    s = PacketSplitter(max_body=64)
    try:
        s.feed(raw)
    except ProtocolError as err:
        assert 0 <= err.offset < len(raw)


@settings(max_examples=200, deadline=None)
@given(u64, u64, st.integers(0, 2**32 - 1), st.binary(min_size=1, max_size=250), st.binary(max_size=100))
def test_mutations_round_trip(seqno, rev, flags, key, value):
    wire = codec.mutation(1023, 9, seqno, rev, key, value, flags=flags)
    assert parse(decode_packet(wire)) == Mutation(seqno, rev, flags, 0, 0, key, value)
    assert parse(decode_packet(codec.stream_end(1, 2, 7))) == StreamEnd(7)
