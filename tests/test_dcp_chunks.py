"""The producer sends its stored packets: the bytes equal codec's builders, message by message."""

from __future__ import annotations

import random
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.codec import StreamReq
from wallaroo_proto.protocols.dcp.producer import MockProducer, ProducerConfig, _Session
from wallaroo_proto.protocols.dcp.store import DELETION, EXPIRATION, MUTATION, Bucket

OPS = st.sampled_from([MUTATION, MUTATION, DELETION, EXPIRATION])


def _with_cas(wire: bytes, cas: int) -> bytes:
    """The packet with its header's CAS (bytes 16 to 24) set."""
    return wire[:16] + cas.to_bytes(8, "big") + wire[24:]


def _built(vb, opaque: int, start: int, end: int, size: int, sid: int | None) -> list[bytes]:
    """The stream's messages from codec's one-message builders, each item with its version's CAS.

    An expiration goes as a DELETION to a connection that did not ask for expiry opcodes.
    """
    wires = []
    for snap in vb.snapshots(start, end, size):
        wires.append(codec.snapshot_marker(vb.vb, opaque, snap.start, snap.end, snap.flags, sid))
        for v in snap.versions:
            key = v.key.encode()
            if v.op == MUTATION:
                wire = codec.mutation(vb.vb, opaque, v.seqno, v.rev, key, v.value.encode(), sid=sid)
            else:
                wire = codec.deletion(vb.vb, opaque, v.seqno, v.rev, key, sid)
            assert v.cas > 0
            wires.append(_with_cas(wire, v.cas))
    wires.append(codec.stream_end(vb.vb, opaque, codec.END_OK, sid))
    return wires


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "é", "key-1"]), OPS, st.text(max_size=20)), max_size=40),
    st.integers(0, 2**32 - 1),
    st.sampled_from([None, 3]),
    st.integers(1, 7),
    st.integers(0, 10),
    st.integers(0, 40),
)
def test_chunks_hold_the_packets_codec_builds_and_their_ends(versions, opaque, sid, size, start, on_disk):
    """Memory snapshots and a deduplicated disk backfill, with and without a stream id."""
    bucket = Bucket.new(2, random.Random(1))
    vb = bucket.vbuckets[1]
    for key, op, value in versions:
        vb.add(key, op, value)
    start = min(start, vb.high_seqno)
    vb.persisted = min(on_disk, vb.high_seqno)
    producer = MockProducer(ProducerConfig(snapshot_size=size), bucket, lambda line: None)
    session = SimpleNamespace(producer=producer, delete_times=False, expiry_opcode=False)
    session.item_packet = lambda *args: _Session.item_packet(session, *args)
    req = StreamReq(0, start, vb.high_seqno, vb.uuid, start, start)
    chunks = list(_Session.chunks(session, vb, opaque, req, sid))
    expected = _built(vb, opaque, start, vb.high_seqno, size, sid)
    got = []
    for chunk in chunks:
        bounds = [0, *chunk.ends]
        got += [chunk.data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        assert chunk.ends[-1] == len(chunk.data)
    assert got == expected
