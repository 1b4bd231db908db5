"""Property tests for the codec and the incremental reader."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wallaroo_proto.protocols.wallaroo import (
    Ack,
    EncodeError,
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
    ProtocolError,
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

u8 = st.integers(0, 0xFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, 0xFFFF_FFFF_FFFF_FFFF)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
short = st.binary(max_size=40)
# Decoded text is str when UTF-8 and bytes otherwise, so generate it that way.
text = st.one_of(st.text(max_size=20), short.filter(lambda b: not _is_utf8(b)))


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


frames = st.one_of(
    st.builds(Hello, text, short, text, text),
    st.builds(Ok, u32),
    st.builds(Error, text),
    st.builds(Notify, u64, text, u64),
    st.builds(NotifyAck, st.booleans(), u64, u64),
    st.builds(Message, u64, u64, i64, short, st.binary(max_size=200)),
    st.builds(Ack, u32, st.lists(st.tuples(u64, u64), max_size=4).map(tuple)),
    st.builds(Restart, st.one_of(st.none(), text)),
    st.builds(EosMessage, u64, st.one_of(st.none(), u64)),
    st.builds(WorkersLeft, u64, st.lists(text, max_size=4).map(tuple)),
)

twopc = st.one_of(
    st.builds(ListUncommitted, u64),
    st.builds(ReplyUncommitted, u64, st.lists(text, max_size=4).map(tuple)),
    st.builds(Phase1, text, st.lists(st.tuples(u64, u64, u64), max_size=4).map(tuple)),
    st.builds(Reply, text, st.booleans()),
    st.builds(Phase2, text, st.booleans()),
    st.builds(TwoPCWorkersLeft, u64, st.lists(text, max_size=4).map(tuple)),
)


@given(frames)
def test_frame_round_trip(frame):
    wire = encode(frame)
    assert int.from_bytes(wire[:4], "big") == len(wire) - 4
    assert decode(wire[4:]) == frame


@given(twopc)
def test_twopc_round_trip(msg):
    assert decode_twopc(encode_twopc(msg)) == msg


def _chunk(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def _read_all(data: bytes, cuts: list[int], max_frame_size: int = 1024) -> tuple[list, list[str]]:
    """Feed ``data`` cut at ``cuts``; frames and errors, going past recoverable errors."""
    reader = FrameReader(max_frame_size)
    got: list = []
    errors: list[str] = []
    for chunk in [*_chunk(data, cuts), b""]:
        pending = chunk
        while True:
            try:
                got += reader.feed(pending)
                break
            except ProtocolError as err:
                got += err.decoded
                errors.append(str(err))
                if not err.recoverable:
                    return got, errors
                pending = b""  # drain what followed the bad frame
    return got, errors


@given(st.lists(frames, max_size=12), st.lists(st.integers(0, 10_000), max_size=20))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_reader_gives_same_frames_for_any_chunking(frame_list, cuts):
    data = b"".join(encode(f) for f in frame_list)
    got, errors = _read_all(data, cuts, max_frame_size=1 << 20)
    assert errors == []
    assert got == frame_list


@given(st.binary(max_size=600), st.lists(st.integers(0, 1000), max_size=30), st.lists(st.integers(0, 1000)))
def test_arbitrary_bytes_give_frames_or_protocol_errors_the_same_way(data, cuts_a, cuts_b):
    # Only ProtocolError may escape (anything else fails the test), and the
    # result does not depend on how the bytes were cut.
    assert _read_all(data, cuts_a) == _read_all(data, cuts_b) == _read_all(data, [])


@given(st.binary(max_size=300))
def test_decode_of_arbitrary_bodies_gives_frame_or_protocol_error(body):
    with contextlib.suppress(ProtocolError):
        decode(body)


@given(st.binary(max_size=300))
def test_decode_twopc_of_arbitrary_payloads_gives_message_or_protocol_error(payload):
    with contextlib.suppress(ProtocolError):
        decode_twopc(payload)


def test_one_byte_at_a_time_keeps_only_the_tail():
    frame = Message(1, 2, 3, b"k", b"x" * 5000)
    wire = encode(frame)
    reader = FrameReader()
    out = []
    for i in range(len(wire)):
        out += reader.feed(wire[i : i + 1])
        assert reader.buffered == (i + 1) % len(wire)
    assert out == [frame]
    assert reader.offset == len(wire)


def test_oversize_length_is_refused_before_buffering():
    reader = FrameReader(max_frame_size=1000)
    with pytest.raises(ProtocolError) as info:
        reader.feed(b"\x00\x00\x03\xe9")  # 1001
    assert "exceeds the maximum frame size 1000" in str(info.value)
    assert info.value.offset == 0
    assert not info.value.recoverable
    assert reader.buffered == 0
    with pytest.raises(ProtocolError):
        reader.feed(b"more")


def test_error_names_offset_frame_index_and_type_and_keeps_earlier_frames():
    good = encode(Ok(1)) + encode(Ok(2))
    bad = bytes.fromhex("00000003 06 0000")  # ACK body too short
    reader = FrameReader()
    with pytest.raises(ProtocolError) as info:
        reader.feed(good + bad + encode(Ok(3)))
    err = info.value
    assert err.decoded == [Ok(1), Ok(2)]
    assert (err.offset, err.frame_index, err.frame_type) == (18, 2, "ACK")
    assert str(err).startswith("frame #2 (ACK) at byte offset 18")
    assert err.recoverable
    assert reader.feed(b"") == [Ok(3)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\x0a", "unknown frame type 10"),
        (b"\x01\x00\x00\x00\x01\xff", "1 unexpected trailing bytes"),
        (b"\x04\x02" + bytes(16), "success must be 0 or 1, not 2"),
        (b"\x05" + bytes(24) + b"\x00\x05ab", "key is 5 bytes long but the body has 2 left"),
        (b"\x06" + bytes(4) + b"\xff\xff\xff\xff", "count=4294967295 items"),
        (b"\x08" + bytes(12), "EOS_MESSAGE body of 12 bytes: the spec's form has 16"),
        (b"\x07\x00\x00\x00\x09ab", "address is 9 bytes long"),
    ],
)
def test_malformed_bodies_say_what_is_wrong(body, message):
    with pytest.raises(ProtocolError, match=message):
        decode(body)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (Ok(-1), "OK.initial_credits=-1 is out of range for u32"),
        (Ok(1 << 32), "out of range for u32"),
        (Notify(-1, "s", 0), "NOTIFY.stream_id=-1 is out of range for u64"),
        (Message(1, 1 << 64, 0, b"", b""), "MESSAGE.message_id=18446744073709551616 is out of range"),
        (Message(1, 1, 1 << 63, b"", b""), "out of range for i64"),
        (Error("x" * 65536), "ERROR.reason is 65536 bytes; a u16-prefixed string holds at most 65535"),
        (Message(1, 1, 0, "key", b""), None),  # str keys are accepted and written as UTF-8
        (Hello(1, b"", "p", "i"), "HELLO.version must be str or bytes, not int"),
    ],
)
def test_encoder_refuses_out_of_range_values(frame, message):
    if message is None:
        assert decode(encode(frame)[4:]).key == b"key"
        return
    with pytest.raises(EncodeError, match=message):
        encode(frame)


def test_frames_compare_by_type_as_well_as_value():
    assert Ok(5) != Error(5)
    assert Ok(5) == Ok(5)
    assert hash(Ok(5)) == hash(Ok(5))
    assert len({Ok(5), Error(5)}) == 2


# Runs of MESSAGEs of one size, as load generators send them: the reader splits these in
# blocks (byte columns and struct.iter_unpack) and must give exactly what frame-by-frame gives.
same_size_runs = st.builds(
    lambda sid, first, key_len, size, count, event_time: [
        Message(sid, first + i, event_time, b"k" * key_len, bytes([i % 256]) * size) for i in range(count)
    ],
    st.integers(0, 3),
    u64.map(lambda v: v // 2),
    st.integers(0, 3),
    st.integers(0, 70),
    st.integers(1, 40),
    i64,
)


@given(
    st.lists(st.one_of(same_size_runs, st.lists(frames, max_size=3)), max_size=6),
    st.lists(st.integers(0, 20_000), max_size=8),
    st.lists(st.tuples(st.integers(0, 5_000), u8), max_size=2),
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_reader_blocks_of_same_size_messages_match_frame_by_frame(runs, cuts, corruptions):
    frame_list = [f for run in runs for f in run]
    data = bytearray(b"".join(encode(f) for f in frame_list))
    for pos, value in corruptions:  # a bad length, type or key length inside a block is seen
        if data:
            data[pos % len(data)] = value
    data = bytes(data)
    expected = _read_all(data, [], max_frame_size=1 << 20)
    one_by_one = _read_all(data, list(range(1, len(data), 7)), max_frame_size=1 << 20)
    assert _read_all(data, cuts, max_frame_size=1 << 20) == expected == one_by_one
    if not corruptions:
        assert expected == (frame_list, [])
