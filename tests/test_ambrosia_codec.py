"""AMBROSIA wire format: golden bytes hand-written from the protocol notes; splitter and varint properties."""

from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.protocols.ambrosia.codec import (
    BECOMING_PRIMARY,
    CHECKPOINT,
    CHECKPOINT_SEQ,
    COUNT_REPLAYABLE_RPC_BATCH,
    FORK,
    INITIAL_MESSAGE,
    RPC,
    RPC_BATCH,
    TAKE_BECOMING_PRIMARY_CHECKPOINT,
    TAKE_CHECKPOINT,
    UPGRADE_SERVICE,
    UPGRADE_TAKE_CHECKPOINT,
    Blob,
    Garbage,
    Incomplete,
    MalformedError,
    Message,
    MessageFrame,
    MessageSplitter,
    RecordFrame,
    RecordSplitter,
    batch_messages,
    checkpoint_record,
    control_record,
    decode_rpc,
    encode_attach,
    encode_batch,
    encode_checkpoint,
    encode_incoming_rpc,
    encode_message,
    encode_outgoing_rpc,
    encode_record,
    read_header,
    read_zz,
    record_messages,
    zz32,
    zz64,
)

H = bytes.fromhex
COMMITTER = 0x12345678

# ----------------------------------------------------------------------------- golden: the notes' bytes

LENGTHS = [(0, "00"), (1, "02"), (2, "04"), (63, "7e"), (64, "8001"), (150, "ac02"), (-1, "01")]


@pytest.mark.parametrize(("value", "wire"), LENGTHS)
def test_zigzag_int_bytes(value, wire):
    assert zz32(value) == H(wire)
    assert read_zz(H(wire), 0, len(H(wire))) == (value, len(H(wire)))


def test_zigzag_extremes():
    assert zz32(-(1 << 31)) == H("ffffffff0f")
    assert zz32((1 << 31) - 1) == H("feffffff0f")
    assert zz64(-(1 << 63)) == H("ffffffffffffffffff01")
    with pytest.raises(ValueError):
        zz32(1 << 31)


def test_varint_limits_are_malformed():
    with pytest.raises(MalformedError, match="longer than 5"):
        read_zz(H("8080808080"), 0, 5)
    with pytest.raises(MalformedError, match="does not fit 32"):
        read_zz(H("808080807f"), 0, 5)
    with pytest.raises(Incomplete):
        read_zz(H("80"), 0, 1)


CONTROL_RECORDS = [
    (TAKE_CHECKPOINT, "78563412 1a000000 fb747b895a9033f8 ffffffffffffffff 0202"),
    (TAKE_BECOMING_PRIMARY_CHECKPOINT, "78563412 1a000000 c7f179c2cb842dda ffffffffffffffff 020b"),
    (UPGRADE_TAKE_CHECKPOINT, "78563412 1a000000 ac435ba151a0ded6 ffffffffffffffff 020a"),
    (UPGRADE_SERVICE, "78563412 1a000000 7ecb93646e0f48bf ffffffffffffffff 020c"),
    (BECOMING_PRIMARY, "78563412 1a000000 0a5bf7e39ce32212 ffffffffffffffff 020f"),
]


@pytest.mark.parametrize(("kind", "wire"), CONTROL_RECORDS)
def test_control_records(kind, wire):
    assert control_record(COMMITTER, kind) == H(wire)
    header = read_header(H(wire))
    assert (header.committer, header.size, header.seq) == (COMMITTER, 26, -1)


def test_recovery_checkpoint_record_size_leaves_the_blob_out():
    blob = b"12345"
    wire = H("78563412 1b000000 0000000000000000 feffffffffffffff 04080a") + blob
    assert checkpoint_record(COMMITTER, blob) == wire
    frames = RecordSplitter().feed(wire)
    assert frames == [
        RecordFrame(0, read_header(wire), H("04080a")),
        Blob(27, blob, 0),
    ]


def test_record_with_two_self_rpcs():
    rpc = H("0c000006017b7d")
    assert encode_incoming_rpc(3, FORK, b"{}") == rpc
    wire = H("78563412 26000000 fe60ab7cdfe89249 0000000000000000") + rpc + rpc
    assert encode_record(COMMITTER, 0, rpc + rpc) == wire
    assert record_messages(wire[24:]) == [Message(RPC, H("000601") + b"{}")] * 2
    assert decode_rpc(H("000601") + b"{}", outgoing=False).method_id == 3


def test_lb_messages():
    assert encode_outgoing_rpc("", 3, FORK, b"{}") == H("0e 00 00 00 06 01 7b7d")
    out = H("1a 00 0c 736572766572 00 06 01 7b7d")
    assert encode_outgoing_rpc("server", 3, FORK, b"{}") == out
    rpc = decode_rpc(out[2:], outgoing=True)
    assert (rpc.destination, rpc.method_id, rpc.rpc_type, rpc.args) == ("server", 3, FORK, b"{}")
    assert encode_attach("server") == H("0e 01 736572766572")
    self_rpc = encode_outgoing_rpc("", 3, FORK, b"{}")
    batch = H("24 05 04 0e00000006017b7d 0e00000006017b7d")
    assert encode_batch([self_rpc, self_rpc]) == batch
    assert batch_messages(Message(RPC_BATCH, batch[2:])) == (2, None, [Message(RPC, H("0000 0601 7b7d"))] * 2)
    assert encode_message(INITIAL_MESSAGE, b"2.0.1") == H("0c 09 322e302e31")
    assert encode_checkpoint(3) == H("04 08 06")


def test_count_replayable_batch():
    inner = encode_incoming_rpc(1, FORK, b"a")
    wire = encode_batch([inner, inner], replayable=2)
    assert wire[1] == COUNT_REPLAYABLE_RPC_BATCH
    assert batch_messages(Message(wire[1], wire[2:]))[:2] == (2, 2)


def test_check_bytes_are_xxhash64_of_the_body():
    body = encode_incoming_rpc(7, FORK, b"x" * 100)
    record = encode_record(-5, 12, body)
    assert struct.unpack_from("<iiQq", record) == (-5, 24 + len(body), xxhash.xxh64_intdigest(body), 12)


def test_lb_stream_checkpoint_blob_is_not_a_message():
    stream = encode_checkpoint(3) + b"\x02\x02\x02" + encode_message(TAKE_CHECKPOINT)
    frames = MessageSplitter().feed(stream)
    assert frames == [
        MessageFrame(0, 3, Message(CHECKPOINT, b"\x06")),
        Blob(3, b"\x02\x02\x02", 0),
        MessageFrame(6, 2, Message(TAKE_CHECKPOINT, b"")),
    ]


def test_bad_sizes_are_garbage_with_offsets():
    assert MessageSplitter().feed(b"\x00") == [Garbage(0, "message size 0 is below 1")]
    bad = struct.pack("<iiQq", 1, 10, 0, 0)
    [garbage] = RecordSplitter().feed(bad)
    assert garbage.offset == 0 and "below the 24-byte header" in garbage.reason


# ----------------------------------------------------------------------------- properties


@given(st.integers(-(1 << 31), (1 << 31) - 1))
def test_zz32_round_trip(value):
    wire = zz32(value)
    assert 1 <= len(wire) <= 5
    assert read_zz(wire, 0, len(wire)) == (value, len(wire))


@given(st.integers(-(1 << 63), (1 << 63) - 1))
def test_zz64_round_trip(value):
    wire = zz64(value)
    assert read_zz(wire, 0, len(wire), 64) == (value, len(wire))


@given(st.binary(max_size=12))
def test_read_zz_never_crashes(data):
    try:
        value, pos = read_zz(data, 0, len(data))
    except (Incomplete, MalformedError):
        return
    assert 0 < pos <= 5
    assert zz32(value) == data[:pos] or data[pos - 1] == 0  # non-minimal forms end in a zero byte


_rpcs = st.builds(
    encode_incoming_rpc, st.integers(-1000, 1 << 20), st.integers(0, 2), st.binary(max_size=300)
)
_records = st.lists(st.lists(_rpcs, max_size=5), min_size=1, max_size=8)


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({p % (len(data) + 1) for p in points})
    out, last = [], 0
    for edge in [*edges, len(data)]:
        out.append(data[last:edge])
        last = edge
    return out


@settings(max_examples=150, deadline=None)
@given(_records, st.binary(max_size=200), st.lists(st.integers(0, 10_000), max_size=12))
def test_record_stream_splits_alike_however_cut(records, blob, cuts):
    """Records (and a checkpoint record's blob) come out the same whatever the TCP segmentation."""
    stream = checkpoint_record(7, blob)
    bodies = [b"".join(r) for r in records]
    for seq, body in enumerate(bodies):
        stream += encode_record(7, seq, body)
    splitter = RecordSplitter()
    frames = [f for piece in _cuts(stream, cuts) for f in splitter.feed(piece)]
    got_blob = b"".join(f.data for f in frames if isinstance(f, Blob))
    recs = [f for f in frames if isinstance(f, RecordFrame)]
    assert got_blob == blob
    assert recs[0].header.seq == CHECKPOINT_SEQ
    assert [r.body for r in recs[1:]] == bodies
    assert [len(record_messages(r.body)) for r in recs[1:]] == [len(r) for r in records]
    assert splitter.pending == 0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(
                encode_outgoing_rpc,
                st.text(max_size=8),
                st.integers(0, 99),
                st.integers(0, 2),
                st.binary(max_size=50),
            ),
            st.binary(max_size=40).map(lambda b: encode_checkpoint(len(b)) + b),
        ),
        max_size=10,
    ),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_message_stream_splits_alike_however_cut(messages, cuts):
    stream = b"".join(messages)
    splitter = MessageSplitter()
    frames = [f for piece in _cuts(stream, cuts) for f in splitter.feed(piece)]
    rebuilt = b"".join(
        encode_message(f.message.type, f.message.data) if isinstance(f, MessageFrame) else f.data
        for f in frames
    )
    assert rebuilt == stream
    assert sum(isinstance(f, MessageFrame) for f in frames) == len(messages)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_splitters_take_any_bytes(data):
    """Garbage in: frames or a Garbage marker with an offset, never an exception."""
    for splitter in (RecordSplitter(max_size=1 << 16), MessageSplitter(max_size=1 << 16)):
        for frame in splitter.feed(data):
            assert 0 <= frame.offset <= len(data)
