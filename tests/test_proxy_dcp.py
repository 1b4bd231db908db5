"""DCP under the proxy's fault rules: the adapter's frames, fields and rewrites, and the named faults.

Packets are written out byte by byte from the memcached binary protocol's layout
(24-byte header: magic, opcode, key length, extras length, datatype, vbucket or
status, body length, opaque, CAS; then extras, key, value), not by the codec.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.judge import Kind
from wallaroo_proto.protocols.dcp import codec, plugin
from wallaroo_proto.protocols.dcp.core import CONSUMER, PRODUCER, Connection, needs_rollback
from wallaroo_proto.protocols.dcp.proxy_faults import NAMED_FAULTS, PROXY_OPAQUE, adapter
from wallaroo_proto.protocols.schema import field_types
from wallaroo_proto.proxy.faultkit import FaultError, Frame, Send
from wallaroo_proto.proxy.faults import ConnectionFaults, parse_rules

CAS0 = "0000000000000000"
FOREVER = "ffffffffffffffff"


def hexes(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts).replace(" ", ""))


# The client asks vbucket 2 for a stream from 0 to the end of time, opaque 9, knowing no uuid.
STREAM_REQ = hexes(
    "80 53 0000 30 00 0002 00000030 00000009", CAS0,
    "00000000 00000000", "0000000000000000", FOREVER,
    "0000000000000000", "0000000000000000", "0000000000000000",
)  # fmt: skip
# The same from seqno 50 (a snapshot 50..50) of vbucket uuid 0x1122334455667788, as a client resumes.
RESUME_REQ = hexes(
    "80 53 0000 30 00 0002 00000030 00000009", CAS0,
    "00000000 00000000", "0000000000000032", FOREVER,
    "1122334455667788", "0000000000000032", "0000000000000032",
)  # fmt: skip
# The producer accepts: failover log of one entry (uuid 0x1122334455667788, seqno 0).
STREAM_OK = hexes("81 53 0000 00 00 0000 00000010 00000009", CAS0, "1122334455667788 0000000000000000")
# A mutation on that stream: seqno 5, rev 1, key "k", value "v" (31 + 1 + 1 = 0x21 body bytes).
MUTATION = hexes(
    "80 57 0001 1f 00 0002 00000021 00000009", CAS0,
    "0000000000000005 0000000000000001 00000000 00000000 00000000 0000 00", "6b", "76",
)  # fmt: skip
# A snapshot marker 1..10, memory (V1: 20 bytes of extras).
MARKER = hexes("80 56 0000 14 00 0002 00000014 00000009", CAS0, "0000000000000001 000000000000000a 00000001")
# The client acknowledges 2000 bytes.
BUFFER_ACK = hexes("80 5d 0000 04 00 0000 00000004 00000000", CAS0, "000007d0")
# DCP_CONTROL connection_buffer_size=2000 (opaque 3) and its success.
CONTROL = hexes(
    "80 5e 0016 00 00 0000 0000001a 00000003", CAS0, b"connection_buffer_size".hex(), b"2000".hex()
)
CONTROL_OK = hexes("81 5e 0000 00 00 0000 00000000 00000003", CAS0)


def frame(data: bytes, from_client: bool, a=None) -> Frame:
    a = a or adapter()
    return Frame(data, from_client, a.fields(data, from_client))


# ------------------------------------------------------------------------------------------ framing


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([STREAM_REQ, MUTATION, MARKER, BUFFER_ACK, CONTROL]), max_size=8),
    st.binary(max_size=40),
    st.lists(st.integers(min_value=1, max_value=64), max_size=30),
)
def test_frames_are_the_packets_whatever_the_reads_and_every_byte_comes_out(packets, tail, cuts):
    """Each whole packet is one frame, however the bytes arrive; after packets, bytes that are no
    header still come out (as one frame) once they are known not to be one."""
    stream = b"".join(packets) + tail
    a = adapter()
    out: list[bytes] = []
    pos = 0
    for cut in [*cuts, len(stream)]:
        out += a.frames(True, stream[pos : pos + cut])
        pos += cut
    out += a.frames(True, stream[pos:])
    assert out[: len(packets)] == packets
    joined = b"".join(out)
    assert stream.startswith(joined)
    leftover = stream[len(joined) :]
    assert a.tail(True) == leftover  # what the engine forwards when the side ends
    # What is held back is less than a header, or a good header whose body has not all come.
    if len(leftover) >= 24:
        assert leftover[0] in codec.MAGICS
        assert len(leftover) < 24 + int.from_bytes(leftover[8:12], "big")


def sent_through_engine(from_client: bool, *reads: bytes) -> bytes:
    """What the engine sends of this side's reads once the side ends (no rules)."""
    engine = ConnectionFaults([], "dcp", adapter=adapter())
    steps = [step for data in reads for step in engine.feed(from_client, data)]
    steps += engine.end(from_client)
    return b"".join(s.data for s in steps if isinstance(s, Send) and s.to_upstream == from_client)


@pytest.mark.parametrize("from_client", [True, False])
def test_a_packet_cut_short_at_the_end_still_goes_on(from_client):
    """A whole packet, then 5 bytes of the next header, then the side ends: all 29 bytes go on."""
    stream = CONTROL_OK + MARKER[:5]
    assert sent_through_engine(from_client, stream[:20], stream[20:]) == stream
    # A header whole and its body not: held across reads, then given back whole.
    assert sent_through_engine(from_client, MUTATION, MARKER[:30], MARKER[30:40]) == MUTATION + MARKER[:40]


def test_bytes_after_a_bad_header_pass_as_they_come():
    a = adapter()
    torn = b"\x00 is no magic, and this no packet" + MUTATION[:10]
    assert a.frames(False, MUTATION + torn) == [MUTATION, torn]
    assert a.frames(False, b"more") == [b"more"]
    assert a.fields(b"more", False)["type"] == "INVALID"


def test_a_bad_header_across_reads_passes_with_every_byte_held_before_it():
    """The bad header's first bytes were held by an earlier read, or a packet's were."""
    a = adapter()
    assert a.frames(False, MUTATION + b"\x00\x01") == [MUTATION]
    assert a.frames(False, b"x" * 30) == [b"\x00\x01" + b"x" * 30]
    a = adapter()
    assert a.frames(False, MUTATION[:30]) == []
    bad = b"\x00 is no magic, nor is this a header"
    assert a.frames(False, MUTATION[30:] + bad) == [MUTATION, bad]


# ------------------------------------------------------------------------------------------ fields


def test_fields_are_those_dissect_names():
    a = adapter()
    assert a.fields(STREAM_REQ, True) == {
        "sender": "consumer",
        "type": "DCP_STREAM_REQ",
        "dcp_magic": 0x80,
        "dcp_opcode": 0x53,
        "opaque": 9,
        "vbucket": 2,
        "start_seqno": 0,
        "end_seqno": 2**64 - 1,
        "snap_start": 0,
        "snap_end": 0,
        "vb_uuid": 0,
    }
    # The answer carries no vbucket: the adapter knows it by the request's opaque.
    assert a.fields(STREAM_OK, False) == {
        "sender": "producer",
        "type": "DCP_STREAM_REQ_RESPONSE",
        "dcp_magic": 0x81,
        "dcp_opcode": 0x53,
        "opaque": 9,
        "status": "SUCCESS",
        "value_len": 16,
        "vb_uuid": 0x1122334455667788,
        "vbucket": 2,
    }
    assert a.fields(MUTATION, False) == {
        "sender": "producer",
        "type": "DCP_MUTATION",
        "dcp_magic": 0x80,
        "dcp_opcode": 0x57,
        "opaque": 9,
        "vbucket": 2,
        "dcp_key": "k",
        "value_len": 1,
        "seqno": 5,
        "rev_seqno": 1,
    }
    assert a.fields(BUFFER_ACK, True)["ack_bytes"] == 2000
    marker = a.fields(MARKER, False)
    assert (marker["snap_start"], marker["snap_end"], marker["snap_flags"]) == (1, 10, 1)
    control = a.fields(CONTROL, True)
    assert (control["control_key"], control["control_value"]) == ("connection_buffer_size", "2000")
    every = {name for name, *_ in plugin.RECORD_FIELDS} | {"type", "sender"}
    for packet, from_client in ((STREAM_REQ, True), (STREAM_OK, False), (MUTATION, False), (MARKER, False)):
        assert set(a.fields(packet, from_client)) <= every
        assert set(a.fields(packet, from_client)) <= set(field_types())


def test_a_malformed_packet_is_invalid_not_an_error():
    short_extras = hexes("80 57 0000 04 00 0000 00000004 00000000", CAS0, "00000000")  # a mutation needs 31
    assert adapter().fields(short_extras, False) == {"sender": "producer", "type": "INVALID"}


# ------------------------------------------------------------------------------------------ rewrite


def test_rewrite_a_mutations_seqno():
    a = adapter()
    want = hexes(
        "80 57 0001 1f 00 0002 00000021 00000009", CAS0,
        "0000000000000063 0000000000000001 00000000 00000000 00000000 0000 00", "6b", "76",
    )  # fmt: skip
    assert a.rewrite(frame(MUTATION, False, a), "seqno", 99) == want


def test_rewrite_a_buffer_acks_count_and_a_status():
    a = adapter()
    assert a.rewrite(frame(BUFFER_ACK, True, a), "ack_bytes", 1) == hexes(
        "80 5d 0000 04 00 0000 00000004 00000000", CAS0, "00000001"
    )
    want = hexes("81 53 0000 00 00 0023 00000010 00000009", CAS0, "1122334455667788 0000000000000000")
    assert a.rewrite(frame(STREAM_OK, False, a), "status", "ROLLBACK") == want
    assert a.rewrite(frame(STREAM_OK, False, a), "status", 0x23) == want


def test_rewrite_names_what_can_be_rewritten():
    a = adapter()
    with pytest.raises(FaultError, match="DCP_BUFFER_ACKNOWLEDGEMENT has no seqno.*ack_bytes"):
        a.rewrite(frame(BUFFER_ACK, True, a), "seqno", 1)
    with pytest.raises(FaultError, match="ack_bytes must be an integer from 0 to 4294967295"):
        a.rewrite(frame(BUFFER_ACK, True, a), "ack_bytes", -1)
    with pytest.raises(FaultError, match="status 'NOPE' is none of"):
        a.rewrite(frame(STREAM_OK, False, a), "status", "NOPE")


def test_dcp_has_no_error_frame():
    assert adapter().error_frame("anything", True) is None


# ------------------------------------------------------------------------------------------ named faults


def test_rollback_to_0_asks_the_producer_with_a_uuid_no_failover_log_holds():
    a = adapter()
    sends = NAMED_FAULTS["rollback"].act(frame(RESUME_REQ, True, a), {"seqno": 0}, a)
    # The same request from 1, in a snapshot 0..forever, of vbucket uuid 0.
    want = hexes(
        "80 53 0000 30 00 0002 00000030 00000009", CAS0,
        "00000000 00000000", "0000000000000001", FOREVER, "0000000000000000", "0000000000000000", FOREVER,
    )  # fmt: skip
    assert sends == [Send(True, want)]
    # A producer's own rule answers it ROLLBACK to 0, whatever its failover log.
    assert needs_rollback(1, 0, 0, codec.FOREVER, [(0x1122334455667788, 0)], 100) == 0


def test_rollback_to_a_seqno_uses_the_uuid_the_producer_gave():
    a = adapter()
    failover_req = hexes("80 54 0000 00 00 0002 00000000 00000004", CAS0)
    failover_log = hexes("81 54 0000 00 00 0000 00000010 00000004", CAS0, "1122334455667788 0000000000000000")
    a.fields(failover_req, True)
    a.fields(failover_log, False)
    sends = NAMED_FAULTS["rollback"].act(frame(RESUME_REQ, True, a), {"seqno": 40}, a)
    # From 41, in a snapshot 40..forever, of the uuid the failover log gave.
    want = hexes(
        "80 53 0000 30 00 0002 00000030 00000009", CAS0,
        "00000000 00000000", "0000000000000029", FOREVER, "1122334455667788", "0000000000000028", FOREVER,
    )  # fmt: skip
    assert sends == [Send(True, want)]
    assert needs_rollback(41, 0x1122334455667788, 40, codec.FOREVER, [(0x1122334455667788, 0)], 100) == 40
    with pytest.raises(FaultError, match="needs vbucket 2's uuid"):
        NAMED_FAULTS["rollback"].act(frame(RESUME_REQ, True), {"seqno": 40}, adapter())


def test_rollback_refuses_what_no_producer_would_answer():
    act = NAMED_FAULTS["rollback"].act
    with pytest.raises(FaultError, match="seqno 51 is past the request's start 50"):
        act(frame(RESUME_REQ, True), {"seqno": 51}, adapter())
    with pytest.raises(FaultError, match="a request from seqno 0 with no vbucket uuid is never rolled back"):
        act(frame(STREAM_REQ, True), {"seqno": 0}, adapter())
    with pytest.raises(FaultError, match="acts at stream requests, not at DCP_MUTATION"):
        act(frame(MUTATION, False), {"seqno": 0}, adapter())


def test_not_my_vbucket_asks_the_producer_for_a_vbucket_no_bucket_has():
    a = adapter()
    sends = NAMED_FAULTS["not-my-vbucket"].act(frame(STREAM_REQ, True, a), {}, a)
    assert sends == [Send(True, STREAM_REQ[:6] + b"\xff\xff" + STREAM_REQ[8:])]
    # Its answer (the producer's NOT_MY_VBUCKET with its cluster map) is the client's vbucket 2's.
    answer = hexes("81 53 0000 00 01 0007 00000002 00000009", CAS0, b"{}".hex())
    assert a.fields(answer, False)["vbucket"] == 2


def test_stream_end_ends_the_stream_closes_it_upstream_and_withholds_the_rest():
    a = adapter()
    for packet, from_client in ((CONTROL, True), (CONTROL_OK, False), (STREAM_REQ, True), (STREAM_OK, False)):
        a.fields(packet, from_client)
    act = NAMED_FAULTS["stream-end"].act
    params = {"reason": "too_slow", "streams": 1}
    sends = act(frame(MUTATION, False, a), params, a)
    stream_end = hexes("80 55 0000 04 00 0002 00000004 00000009", CAS0, "00000004")
    close = hexes(f"80 52 0000 00 00 0002 00000000 {PROXY_OPAQUE:08x}", CAS0)
    # The mutation (57 bytes) never reaches the client: the proxy acknowledges it upstream, less
    # the end's 28 bytes, which the client acknowledges in its place.
    ack = hexes("80 5d 0000 04 00 0000 00000004 00000000", CAS0, "0000001d")
    assert sends == [Send(True, close), Send(False, stream_end), Send(True, ack)]
    # The stream's later messages are withheld (and acknowledged upstream), and the close's answer too.
    later = act(frame(MARKER, False, a), params, a)
    assert later == [Send(True, hexes("80 5d 0000 04 00 0000 00000004 00000000", CAS0, "0000002c"))]
    close_ok = hexes(f"81 52 0000 00 00 0000 00000000 {PROXY_OPAQUE:08x}", CAS0)
    assert a.fields(close_ok, False)["vbucket"] == 2
    assert act(frame(close_ok, False, a), params, a) == []
    # Another stream's message: the rule has ended its one stream, so it passes.
    other = MUTATION[:6] + b"\x00\x03" + MUTATION[8:12] + b"\x00\x00\x00\x0a" + MUTATION[16:]
    with pytest.raises(FaultError, match="passed on"):
        act(frame(other, False, a), params, a)


def test_stream_end_without_flow_control_acknowledges_nothing():
    a = adapter()
    a.fields(STREAM_REQ, True)
    a.fields(STREAM_OK, False)
    sends = NAMED_FAULTS["stream-end"].act(frame(MUTATION, False, a), {"reason": "ok", "streams": 1}, a)
    assert [s.to_upstream for s in sends] == [True, False]
    assert sends[1].data[-4:] == b"\x00\x00\x00\x00"  # reason ok


def test_stall_buffer_ack_withholds_every_acknowledgement_and_nothing_else():
    shaper = ConnectionFaults(parse_rules(["stall-buffer-ack"], [], "dcp"), "dcp")
    steps = shaper.feed(True, BUFFER_ACK + CONTROL + BUFFER_ACK)
    assert [s for s in steps if type(s) is Send] == [Send(True, CONTROL)]


def test_a_rewrite_rule_changes_the_field_as_the_frame_passes():
    rules = parse_rules(["rewrite type=DCP_MUTATION field=seqno value=99 count=1"], [], "dcp")
    shaper = ConnectionFaults(rules, "dcp")
    steps = shaper.feed(False, MUTATION + MUTATION)
    rewritten = MUTATION[:24] + bytes.fromhex("0000000000000063") + MUTATION[32:]
    assert [s for s in steps if type(s) is Send] == [Send(False, rewritten), Send(False, MUTATION)]


def test_named_faults_parse_as_rules_with_their_params():
    rules = parse_rules(
        ["rollback type=DCP_STREAM_REQ where=vbucket==2 count=1 seqno=5", "stream-end reason=too_slow"],
        [],
        "dcp",
    )
    assert rules[0].params == {"seqno": 5} and rules[1].params == {"reason": "too_slow", "streams": 1}


def test_the_judge_ends_a_stream_its_close_was_answered_for():
    """A CLOSE_STREAM answered SUCCESS ends the stream (no STREAM_END follows unless asked for):
    a new stream request for that vbucket may then be accepted."""
    conn = Connection()
    conn.feed(CONSUMER, codec.decode_packet(codec.open_request("c", opaque=1)))
    conn.feed(PRODUCER, codec.decode_packet(codec.response(codec.OPEN, opaque=1)))
    req2 = STREAM_REQ[:12] + b"\x00\x00\x00\x0b" + STREAM_REQ[16:]
    ok2 = STREAM_OK[:12] + b"\x00\x00\x00\x0b" + STREAM_OK[16:]
    close = hexes("80 52 0000 00 00 0002 00000000 0000000a", CAS0)
    close_ok = hexes("81 52 0000 00 00 0000 00000000 0000000a", CAS0)
    verdicts = []
    for packet, from_client in ((STREAM_REQ, True), (STREAM_OK, False), (close, True), (close_ok, False)):
        verdicts.append(conn.feed(CONSUMER if from_client else PRODUCER, codec.decode_packet(packet)))
    verdicts.append(conn.feed(CONSUMER, codec.decode_packet(req2)))
    verdicts.append(conn.feed(PRODUCER, codec.decode_packet(ok2)))
    assert [v.kind for v in verdicts] == [Kind.ACCEPTED] * 6, [v.reason for v in verdicts]
    assert [s.end_reason for s in conn.ended] == ["closed"]
