"""DCP's fuzz hooks: fields where the memcached binary header and DCP's extras put them (golden
bytes hand-written from shared/protocols/dcp.md), what a peer owes and how it refuses, and that
any value in any field still gives bytes the splitter, decoder and judge take without crashing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.fuzz.hooks import Hooks, with_value
from wallaroo_proto.fuzz.oracle import judge
from wallaroo_proto.protocols.dcp import codec, fuzz
from wallaroo_proto.protocols.dcp.codec import PacketSplitter, ProtocolError, decode_packet, parse
from wallaroo_proto.protocols.dcp.core import CONSUMER, PRODUCER, Connection

H = bytes.fromhex

# DCP_MUTATION vb 3, opaque 0x0b, key "key1", value "{}": seqno 10, rev 1, flags, expiry, lock
# time 0, nmeta 0, nru 0 (31 bytes of extras).
MUTATION = H(
    "80 57 0004 1f 00 0003 00000025 0000000b 0000000000000000"
    "000000000000000a 0000000000000001 00000000 00000000 00000000 0000 00"
    "6b657931 7b7d"
)
# DCP_SNAPSHOT_MARKER with a stream-id frame info (magic 0x08: framing extras length 3, key
# length 0), opaque 0x0b, vb 0: frame info 0x22 sid 1, then start 0, end 8, flags 1 (memory).
MARKER_SID = H(
    "08 56 03 00 14 00 0000 00000017 0000000b 0000000000000000"
    "22 0001 0000000000000000 0000000000000008 00000001"
)
# DCP_BUFFER_ACKNOWLEDGEMENT of 1000 bytes.
BUFFER_ACK = H("80 5d 0000 04 00 0000 00000004 00000000 0000000000000000 000003e8")
# DCP_STREAM_REQ's answer ROLLBACK (0x23) to seqno 5, opaque 0x0b.
ROLLBACK = H("81 53 0000 00 00 0023 00000008 0000000b 0000000000000000 0000000000000005")


def by_name(raw: bytes) -> dict[str, tuple[str, int, int, int]]:
    return {f.name: (f.kind, f.value, f.offset, f.bits) for f in fuzz.fields({}, raw)}


def test_a_mutations_header_and_extras_fields():
    got = by_name(MUTATION)
    assert got["magic"] == ("enum", 0x80, 0, 8)
    assert got["opcode"] == ("enum", 0x57, 1, 8)
    assert got["key_length"] == ("length", 4, 2, 16)
    assert got["extras_length"] == ("length", 31, 4, 8)
    assert got["vbucket"] == ("id", 3, 6, 16)
    assert got["body_length"] == ("length", 37, 8, 32)
    assert got["opaque"] == ("id", 0x0B, 12, 32)
    assert got["seqno"] == ("id", 10, 24, 64)
    assert got["rev_seqno"] == ("uint", 1, 32, 64)
    assert "status" not in got


def test_flexible_framing_moves_the_key_length_and_the_extras():
    got = by_name(MARKER_SID)
    assert got["framing_length"] == ("length", 3, 2, 8)
    assert got["key_length"] == ("length", 0, 3, 8)
    assert got["snap_start"] == ("id", 0, 27, 64)
    assert got["snap_end"] == ("id", 8, 35, 64)
    assert got["snap_flags"] == ("enum", 1, 43, 32)


def test_an_ack_is_a_credit_and_a_response_has_a_status_not_a_vbucket():
    assert by_name(BUFFER_ACK)["ack_bytes"] == ("credit", 1000, 24, 32)
    got = by_name(ROLLBACK)
    assert got["status"] == ("enum", 0x23, 6, 16)
    assert "vbucket" not in got and "start_seqno" not in got


def test_extras_of_another_length_than_the_layout_are_not_read_as_it():
    short = bytearray(MUTATION)
    short[4] = 30  # extras length 30: not a mutation's layout
    assert "seqno" not in by_name(bytes(short))
    assert fuzz.fields({}, MUTATION[:10]) == []


def test_with_value_writes_the_field_and_the_codec_reads_it_back():
    seqno = next(f for f in fuzz.fields({}, MUTATION) if f.name == "seqno")
    out = with_value({}, MUTATION, seqno, 9)
    assert out == MUTATION[:24] + H("0000000000000009") + MUTATION[32:]
    assert parse(decode_packet(out)).seqno == 9
    end = next(f for f in fuzz.fields({}, MARKER_SID) if f.name == "snap_end")
    assert parse(decode_packet(with_value({}, MARKER_SID, end, 4))).end == 4


def test_what_a_peer_owes():
    owed = fuzz.owed
    assert owed({"type": "DCP_NOOP"}).types == {"DCP_NOOP_RESPONSE"}
    assert owed({"type": "DCP_STREAM_REQ"}).types == {"DCP_STREAM_REQ_RESPONSE"}
    assert owed({"type": "DCP_CLOSE_STREAM"}).types == {"DCP_CLOSE_STREAM_RESPONSE"}
    assert owed({"type": "HELLO"}).types == {"HELLO_RESPONSE"}
    assert owed({"type": "DCP_SNAPSHOT_MARKER", "snap_flags": 0x0C}).types == {"DCP_SNAPSHOT_MARKER_RESPONSE"}
    for nothing in (
        {"type": "DCP_SNAPSHOT_MARKER", "snap_flags": 0x05},
        {"type": "DCP_BUFFER_ACKNOWLEDGEMENT"},  # never answered
        {"type": "DCP_MUTATION"},
        {"type": "DCP_STREAM_END"},
        {"type": "DCP_NOOP_RESPONSE"},
        {"type": "DCP_STREAM_REQ_RESPONSE", "status": "SUCCESS"},
    ):
        assert owed(nothing) is None, nothing


def test_a_refusal_is_a_response_with_an_error_status():
    refusal = fuzz.refusal
    assert refusal({"type": "DCP_STREAM_REQ_RESPONSE", "status": "ERANGE"})
    assert refusal({"type": "DCP_MUTATION_RESPONSE", "status": "KEY_ENOENT"})
    assert refusal({"type": "DCP_CONTROL_RESPONSE", "status": "0x00ff"})
    assert not refusal({"type": "DCP_STREAM_REQ_RESPONSE", "status": "ROLLBACK"})
    assert not refusal({"type": "SASL_AUTH_RESPONSE", "status": "AUTH_CONTINUE"})
    assert not refusal({"type": "DCP_CONTROL_RESPONSE", "status": "SUCCESS"})
    assert not refusal({"type": "DCP_STREAM_END"})
    assert not fuzz.REPLY_BEFORE_CLOSE


def test_only_an_ack_of_too_many_bytes_is_tolerated():
    over = {
        "type": "DCP_BUFFER_ACKNOWLEDGEMENT",
        "verdict": "violation",
        "violations": ["acknowledges 425 bytes, only 0 are unacknowledged"],
    }
    assert fuzz.tolerated(over)
    assert not fuzz.tolerated(over | {"violations": ["DCP_BUFFER_ACKNOWLEDGEMENT before DCP_OPEN"]})
    assert not fuzz.tolerated(over | {"verdict": "malformed"})
    assert not fuzz.tolerated(over | {"type": "DCP_MUTATION"})


def test_the_plugin_gives_these_hooks():
    hooks = Hooks("dcp")
    assert hooks.fields is fuzz.fields and hooks.owed is fuzz.owed and hooks.tolerated is fuzz.tolerated


@pytest.mark.parametrize("side", [PRODUCER, CONSUMER])
def test_templates_decode_as_the_type_they_are_named(side):
    templates = fuzz.templates(side)
    assert templates
    for name, raw in templates.items():
        p = decode_packet(raw)
        assert p.size == len(raw)
        assert p.name + ("" if p.is_request else "_RESPONSE") == name
        parse(p)  # well-formed: no ProtocolError


GOLDEN = [MUTATION, MARKER_SID, BUFFER_ACK, ROLLBACK]
FRAMES = GOLDEN + list(fuzz.templates(PRODUCER).values()) + list(fuzz.templates(CONSUMER).values())


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FRAMES), st.data())
def test_any_value_in_any_field_gives_bytes_the_decoder_and_judge_survive(raw, data):
    fields = fuzz.fields({}, raw)
    field = data.draw(st.sampled_from(fields))
    value = data.draw(st.integers(0, (1 << field.bits) - 1) | st.sampled_from([0, field.value + 1]))
    out = with_value({}, raw, field, value)
    assert len(out) == len(raw)
    conn = Connection()
    try:
        packets = PacketSplitter().feed(out)
    except ProtocolError:
        return
    for offset, wire in packets:
        try:
            p = decode_packet(wire, 0, offset)
        except ProtocolError:
            continue
        conn.feed(PRODUCER if p.opcode in codec.STREAM_MESSAGES else CONSUMER, p, offset=offset)


def test_a_producer_going_on_after_a_too_large_ack_is_no_finding_but_after_another_illegal_frame_it_is():
    over = {
        "type": "DCP_BUFFER_ACKNOWLEDGEMENT",
        "verdict": "violation",
        "violations": ["acknowledges 425 bytes, only 0 are unacknowledged"],
    }
    item = {"type": "DCP_MUTATION", "verdict": "accepted"}
    hooks = Hooks("dcp")
    assert judge([("ours", over), ("peer", item)], hooks, PRODUCER).findings == []
    early = over | {"violations": ["DCP_BUFFER_ACKNOWLEDGEMENT before DCP_OPEN"]}
    assert [f.kind for f in judge([("ours", early), ("peer", item)], hooks, PRODUCER).findings] == [
        "accepted"
    ]
