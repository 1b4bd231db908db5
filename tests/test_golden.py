"""Golden byte vectors for every frame type, written by hand from the spec tables.

Each vector is spelled out field by field (length prefix, type byte, fields in
big endian) so that it does not come from the encoder under test. Both ways are
checked: the encoder produces exactly these bytes and the decoder reads them back.
"""

from __future__ import annotations

import pytest

from wallaroo_proto.protocols.wallaroo import (
    Ack,
    EosMessage,
    Error,
    FrameReader,
    Hello,
    ListUncommitted,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Phase1,
    Phase2,
    Reply,
    ReplyUncommitted,
    Restart,
    TwoPCWorkersLeft,
    WorkersLeft,
    decode,
    decode_twopc,
    encode,
    encode_twopc,
)


def h(*parts: str) -> bytes:
    """Hex fields separated by spaces, for readability."""
    return bytes.fromhex("".join(parts).replace(" ", ""))


FRAME_VECTORS = [
    pytest.param(
        Hello("0.0.1", b"ck", "prog", "i1"),
        h(
            "00000016",  # length 22
            "00",  # HELLO
            "0005 302e302e31",  # version "0.0.1"
            "0002 636b",  # cookie "ck"
            "0004 70726f67",  # program_name "prog"
            "0002 6931",  # instance_name "i1"
        ),
        id="HELLO",
    ),
    pytest.param(
        Hello("v0.0.1", b"", "", ""), h("0000000f 00 0006 76302e302e31 0000 0000 0000"), id="HELLO-empty"
    ),
    pytest.param(Ok(500), h("00000005 01 000001f4"), id="OK"),
    pytest.param(Error("bad"), h("00000006 02 0003 626164"), id="ERROR"),
    pytest.param(
        Notify(0x0102030405060708, "ab", 0xFFFFFFFFFFFFFFFF),
        h("00000015 03 0102030405060708 0002 6162 ffffffffffffffff"),
        id="NOTIFY",
    ),
    pytest.param(
        NotifyAck(True, 7, 42), h("00000012 04 01 0000000000000007 000000000000002a"), id="NOTIFY_ACK-1"
    ),
    pytest.param(
        NotifyAck(False, 7, 0), h("00000012 04 00 0000000000000007 0000000000000000"), id="NOTIFY_ACK-0"
    ),
    pytest.param(
        Message(1, 2, -1, b"k", b"hello"),
        h(
            "00000021",  # length 33 = 1 + 8 + 8 + 8 + 2 + 1 + 5
            "05",
            "0000000000000001",  # stream_id
            "0000000000000002",  # message_id
            "ffffffffffffffff",  # event_time -1 (i64)
            "0001 6b",  # key "k"
            "68656c6c6f",  # payload, the rest of the frame
        ),
        id="MESSAGE",
    ),
    pytest.param(
        Message(3, 0, 0, b"", b""),
        h("0000001b 05 0000000000000003 0000000000000000 0000000000000000 0000"),
        id="MESSAGE-empty",
    ),
    pytest.param(
        Ack(10, ((1, 100), (2, 200))),
        h(
            "00000029 06 0000000a 00000002",  # length 41, ACK, credits 10, 2 pairs
            "0000000000000001 0000000000000064",  # (1, 100)
            "0000000000000002 00000000000000c8",  # (2, 200)
        ),
        id="ACK",
    ),
    pytest.param(Ack(0, ()), h("00000009 06 00000000 00000000"), id="ACK-empty"),
    pytest.param(Restart(), h("00000001 07"), id="RESTART-spec"),
    pytest.param(Restart("h:9"), h("00000008 07 00000003 683a39"), id="RESTART-shipped"),
    pytest.param(Restart(""), h("00000005 07 00000000"), id="RESTART-shipped-empty"),
    pytest.param(EosMessage(5, 9), h("00000011 08 0000000000000005 0000000000000009"), id="EOS-spec"),
    pytest.param(EosMessage(5, None), h("00000009 08 0000000000000005"), id="EOS-shipped"),
    pytest.param(
        WorkersLeft(3, ("w1", "w2")),
        h("00000015 09 0000000000000003 00000002 0002 7731 0002 7732"),
        id="WORKERS_LEFT",
    ),
]


@pytest.mark.parametrize(("frame", "wire"), FRAME_VECTORS)
def test_encode_matches_golden(frame, wire):
    assert encode(frame) == wire


@pytest.mark.parametrize(("frame", "wire"), FRAME_VECTORS)
def test_decode_matches_golden(frame, wire):
    assert decode(wire[4:]) == frame
    assert FrameReader().feed(wire) == [frame]


TWOPC_VECTORS = [
    pytest.param(ListUncommitted(1), h("c9 0000000000000001"), id="LIST_UNCOMMITTED"),
    pytest.param(
        ReplyUncommitted(1, ("t1", "t2")),
        h("ca 0000000000000001 00000002 0002 7431 0002 7432"),
        id="REPLY_UNCOMMITTED",
    ),
    pytest.param(
        Phase1("s:c_id=1", ((1, 0, 64),)),
        h("cb 0008 733a635f69643d31 00000001 0000000000000001 0000000000000000 0000000000000040"),
        id="PHASE1",
    ),
    pytest.param(Reply("t", True), h("cc 0001 74 01"), id="REPLY"),
    pytest.param(Phase2("t", False), h("cd 0001 74 00"), id="PHASE2"),
    pytest.param(
        TwoPCWorkersLeft(2, ("w",)), h("ce 0000000000000002 00000001 0001 77"), id="WORKERS_LEFT-2pc"
    ),
]


@pytest.mark.parametrize(("msg", "payload"), TWOPC_VECTORS)
def test_twopc_golden_both_ways(msg, payload):
    assert encode_twopc(msg) == payload
    assert decode_twopc(payload) == msg


def test_twopc_inside_a_stream0_message():
    # A PHASE2 as the shipped worker sends it: stream 0, message id 0, time 0, no key.
    wire = h("00000020 05 0000000000000000 0000000000000000 0000000000000000 0000 cd 0001 74 01")
    (frame,) = FrameReader().feed(wire)
    assert frame.stream_id == 0
    assert decode_twopc(frame.payload) == Phase2("t", True)


def test_non_utf8_text_is_kept_as_bytes():
    frame = decode(h("02 0002 fffe"))
    assert frame == Error(b"\xff\xfe")
    assert encode(frame) == h("00000005 02 0002 fffe")
