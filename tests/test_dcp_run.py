"""The consumer's run path (``Connection.feed_run``) judges exactly as ``feed`` does.

Random producer traffic, valid and broken (seqnos out of order or outside the
snapshot, repeated keys, wrong vbuckets and opaques, markers too early, bad extras,
stream ids, noops, stream ends, flow-control overruns and acknowledgements), is fed
to two connections: one packet by packet through ``feed``, the other
through ``feed_run`` with the packets it leaves to ``feed``. Every
packet must get the same verdict and both connections must end in the same state.
"""

from __future__ import annotations

from dataclasses import astuple

from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.judge import Kind
from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.codec import FOREVER, StreamReq, decode_packet
from wallaroo_proto.protocols.dcp.core import (
    CONSUMER,
    PRODUCER,
    RULES,
    Connection,
    Stream,
    StreamRun,
    item_reasons,
    item_window,
    marker_fits,
    marker_reasons,
)

# Streams: opaque -> (vbucket, stream id, end seqno).
STREAMS = {7: (3, None, FOREVER), 8: (5, None, 3), 9: (6, 2, FOREVER)}


def _fresh(buffer_size: int) -> Connection:
    conn = Connection()
    assert conn.feed(CONSUMER, decode_packet(codec.open_request("c", opaque=1))).ok
    assert conn.feed(PRODUCER, decode_packet(codec.response(codec.OPEN, opaque=1))).ok
    controls = [("enable_noop", "true"), ("enable_stream_id", "true")]
    if buffer_size:
        controls.append(("connection_buffer_size", str(buffer_size)))
    for n, (key, value) in enumerate(controls, start=2):
        assert conn.feed(CONSUMER, decode_packet(codec.control_request(key, value, opaque=n))).ok
        assert conn.feed(PRODUCER, decode_packet(codec.response(codec.CONTROL, opaque=n))).ok
    for opaque, (vb, sid, end) in STREAMS.items():
        req = StreamReq(0, 0, end, 0, 0, 0, b'{"sid": %d}' % sid if sid else b"")
        conn.feed(CONSUMER, decode_packet(codec.stream_req_request(vb, opaque, req)))
        answer = codec.response(codec.STREAM_REQ, opaque=opaque, value=codec.failover_log_value([(0xA, 0)]))
        conn.feed(PRODUCER, decode_packet(answer))
    return conn


STREAM_OPAQUES = st.sampled_from([7, 7, 7, 8, 9, 12])


@st.composite
def traffic(draw) -> list[tuple[str, bytes]]:
    """Events: ("p", a producer packet) or ("ack", a consumer BUFFER_ACK).

    Mostly a well-behaved producer (markers then rising seqnos with fresh keys per
    stream), with every kind of fault mixed in at random.
    """
    next_seqno = {o: 1 for o in (7, 8, 9, 12)}
    events = []
    for _ in range(draw(st.integers(0, 60))):
        kind = draw(st.sampled_from(["item"] * 6 + ["marker"] * 2 + ["end", "adv", "noop", "ack", "bad"]))
        opaque = draw(STREAM_OPAQUES)
        vb = STREAMS.get(opaque, (3,))[0]
        sid = STREAMS.get(opaque, (0, None))[1]
        seqno = next_seqno[opaque]
        fault = draw(st.integers(0, 9)) == 0
        if fault:
            what = draw(st.sampled_from(["vbucket", "sid", "seqno"]))
            if what == "vbucket":
                vb = draw(st.sampled_from([3, 4, 5, 6]))
            elif what == "sid":
                sid = draw(st.sampled_from([None, 2, 3]))
            else:
                seqno = draw(st.integers(0, 12))
        if kind == "item":
            next_seqno[opaque] = seqno + draw(st.sampled_from([1, 1, 1, 2]))
            key = b"k%d" % seqno if draw(st.integers(0, 7)) else draw(st.sampled_from([b"k1", b"k2", b""]))
            op = draw(st.sampled_from(["mut", "mut", "mut", "del", "del2", "exp"]))
            if op == "mut":
                wire = codec.mutation(vb, opaque, seqno, 1, key, draw(st.binary(max_size=30)), sid=sid)
            elif op == "del":
                wire = codec.deletion(vb, opaque, seqno, 1, key, sid)
            elif op == "del2":
                extras = codec._DELETION_V2.pack(seqno, 1, 0, 0)
                wire = codec.request(codec.DELETION, vbucket=vb, opaque=opaque, extras=extras, key=key)
            else:
                wire = codec.expiration(vb, opaque, seqno, 1, key, 0, sid)
        elif kind == "marker":
            end = seqno + draw(st.integers(-1, 6))
            flags = draw(st.sampled_from([1, 2, 4, 0x21]))
            wire = codec.snapshot_marker(vb, opaque, seqno, max(end, 0), flags, sid)
        elif kind == "end":
            wire = codec.stream_end(vb, opaque, draw(st.sampled_from([0, 2])), sid)
        elif kind == "adv":
            wire = codec.seqno_advanced(vb, opaque, seqno, sid)
            next_seqno[opaque] = seqno + 1
        elif kind == "noop":
            wire = codec.noop(draw(st.integers(100, 103)))
        elif kind == "ack":
            events.append(("ack", codec.buffer_ack(draw(st.integers(0, 400)))))
            continue
        else:  # malformed: wrong extras length, a key on a marker, a value on a V1 marker
            bad = draw(st.sampled_from(["extras", "marker key", "marker value"]))
            if bad == "extras":
                wire = codec.request(codec.MUTATION, vbucket=vb, opaque=opaque, extras=b"\0" * 30, key=b"k")
            else:
                extras = codec._MARKER_V1.pack(seqno, seqno + 2, 1)
                body = {"key": b"k"} if bad == "marker key" else {"value": b"v"}
                wire = codec.request(codec.SNAPSHOT_MARKER, vbucket=vb, opaque=opaque, extras=extras, **body)
        events.append(("p", wire))
    return events


def _state(conn: Connection) -> tuple:
    streams = {o: astuple(s) for o, s in conn.streams.items()}
    ended = [astuple(s) for s in conn.ended]
    fields = (conn.outstanding, conn.stalls, conn.acked, conn.violations, conn.noop_pending, conn.noops)
    return streams, ended, fields


def _what(p: codec.Packet, verdict) -> tuple:
    """What an accepted stream packet carries, as the run path reports it."""
    msg = verdict.message
    if p.opcode == codec.SNAPSHOT_MARKER:
        return ("marker", p.opaque, msg.start, msg.end, msg.flags)
    return ("item", p.opaque, p.opcode, msg.seqno, msg.key, p.value, verdict.event == "snapshot complete")


def _unrolled(run: StreamRun) -> list[tuple]:
    """A run's markers and items back in packet order, in ``_what``'s form."""
    out = []
    markers = iter(run.markers)
    marker = next(markers, None)
    for i, item in enumerate([*run.items, None]):
        while marker is not None and marker[0] == i:
            out.append(("marker", run.opaque, *marker[1:]))
            marker = next(markers, None)
        if item is not None:
            out.append(("item", run.opaque, *item, item[1] in run.completed))
    return out


@settings(max_examples=300, deadline=None)
@given(traffic(), st.sampled_from([0, 0, 150, 600, 4000]))
def test_the_run_path_gives_every_packet_the_same_verdict_and_state(events, buffer_size):
    one_by_one, by_run = _fresh(buffer_size), _fresh(buffer_size)
    expected: list[Kind] = []
    carried: list[tuple | None] = []  # per event: what an accepted stream packet carries
    for who, wire in events:
        p = decode_packet(wire)
        verdict = one_by_one.feed(PRODUCER if who == "p" else CONSUMER, p)
        assert verdict.rule in RULES if verdict.kind is Kind.VIOLATION else verdict.rule is None
        expected.append(verdict.kind)
        taken_kinds = (codec.SNAPSHOT_MARKER, codec.MUTATION, codec.DELETION, codec.EXPIRATION)
        carried.append(_what(p, verdict) if verdict.ok and who == "p" and p.opcode in taken_kinds else None)

    got: list[Kind] = []
    i = 0
    while i < len(events):
        if events[i][0] == "ack":
            got.append(by_run.feed(CONSUMER, decode_packet(events[i][1])).kind)
            i += 1
            continue
        j = i
        while j < len(events) and events[j][0] == "p":
            j += 1
        wires = [w for _, w in events[i:j]]
        buf = b"".join(wires)
        starts = [0]
        for w in wires:
            starts.append(starts[-1] + len(w))
        pos = 0
        while pos < len(buf):
            pos, taken = by_run.feed_run(buf, pos)
            for run in taken:
                for what in _unrolled(run):
                    assert what == carried[len(got)]  # the same fields, the same snapshot completions
                    got.append(Kind.ACCEPTED)
            if pos < len(buf):
                assert pos in starts  # it stops on a packet boundary
                p = decode_packet(buf, pos)
                got.append(by_run.feed(PRODUCER, p).kind)
                pos += p.size
        i = j
    assert got == expected
    assert _state(by_run) == _state(one_by_one)


def test_a_run_returns_items_and_markers_with_their_fields():
    conn = _fresh(1000)
    wires = [
        codec.snapshot_marker(3, 7, 0, 3, 1),
        codec.mutation(3, 7, 1, 1, b"a", b"x1"),
        codec.deletion(3, 7, 2, 1, b"b"),
        codec.expiration(3, 7, 3, 1, b"c"),
        codec.mutation(3, 7, 3, 1, b"d", b""),  # seqno not rising: left to feed
    ]
    buf = b"".join(wires)
    assert conn.feed_run(buf, 0, max_body=20) == (len(wires[0]), [StreamRun(7, [], [(0, 0, 3, 1)], [])])
    conn = _fresh(1000)  # a body over max_body is left to the splitter, which names it
    pos, taken = conn.feed_run(buf)
    assert pos == len(buf) - len(wires[-1])
    assert taken == [
        StreamRun(
            7,
            [
                (codec.MUTATION, 1, b"a", b"x1"),
                (codec.DELETION, 2, b"b", b""),
                (codec.EXPIRATION, 3, b"c", b""),
            ],
            [(0, 0, 3, 1)],
            [3],
        )
    ]
    s = conn.streams[7]
    assert (s.last_seqno, s.items, s.snapshots_complete, s.snapshot_open) == (3, 3, 1, False)
    assert conn.outstanding == pos
    v = conn.feed(PRODUCER, decode_packet(buf, pos))
    assert v.kind is Kind.VIOLATION and "not after the last seqno 3" in v.reason


@given(
    st.lists(
        st.tuples(
            st.sampled_from([codec.MUTATION, codec.DELETION, codec.EXPIRATION]),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
            st.binary(min_size=1, max_size=20),
            st.binary(max_size=40),
        ),
        max_size=8,
    ),
    st.sampled_from([None, 5]),
)
def test_many_items_encode_as_each_one_alone(entries, sid):
    """The producer's batch encoder (``codec.items``) gives the bytes of the one-item builders."""
    alone = []
    for op, seqno, rev, key, value in entries:
        if op == codec.MUTATION:
            alone.append(codec.mutation(9, 7, seqno, rev, key, value, sid=sid))
        elif op == codec.DELETION:
            alone.append(codec.deletion(9, 7, seqno, rev, key, sid))
        else:
            alone.append(codec.expiration(9, 7, seqno, rev, key, 0, sid))
    assert codec.items(9, 7, entries, sid) == alone


_SEQ = st.integers(0, 12) | st.sampled_from([FOREVER - 1, FOREVER])


@settings(max_examples=1000)
@given(_SEQ, _SEQ, _SEQ, st.booleans(), st.booleans(), _SEQ, _SEQ, _SEQ)
def test_the_reasons_explain_exactly_what_the_shared_rules_refuse(
    last, snap_start, snap_end, marker_seen, snapshot_open, req_end, seqno, end
):
    """Both paths read ``item_window`` and ``marker_fits``; ``feed`` gives the reasons when they refuse.
    The reasons are found exactly where the rules refuse, so the two say one thing."""
    s = Stream(3, 7, StreamReq(0, 0, req_end, 0, 0, 0), None, [], last, snap_start, snap_end, 0, marker_seen)
    s.snapshot_open = snapshot_open
    lo, hi = item_window(last, snap_start, snap_end, marker_seen, req_end)
    reasons = item_reasons(s, seqno)
    assert bool(reasons) == (not lo < seqno <= hi), (lo, hi, reasons)
    assert all(rule in RULES for rule, _ in reasons)
    fits = marker_fits(seqno, end, last, marker_seen, snapshot_open)
    reasons = marker_reasons(s, seqno, end)
    assert bool(reasons) == (not fits), reasons
    assert all(rule in RULES for rule, _ in reasons)
