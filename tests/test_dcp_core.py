"""DCP connection rules and the server's rollback rule, on hand-made packets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto import judge
from wallaroo_proto.judge import End, Expected, Kind
from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.codec import FOREVER, StreamReq, decode_packet
from wallaroo_proto.protocols.dcp.core import (
    CONSUMER,
    PRODUCER,
    RULES,
    Connection,
    Verdict,
    add_failover_entry,
    needs_rollback,
)

# A failover table, newest first: uuid 0xC took over at 20, 0xB at 10, 0xA from the start.
TABLE = [(0xC, 20), (0xB, 10), (0xA, 0)]


@pytest.mark.parametrize(
    ("start", "uuid", "snap_start", "snap_end", "high", "want"),
    [
        (0, 0, 0, 0, 30, None),  # nothing yet: never a rollback
        (0, 0x99, 0, 0, 30, None),  # start 0, not strict
        (5, 0x99, 5, 5, 30, 0),  # uuid unknown: back to 0
        (15, 0xB, 15, 15, 30, None),  # inside B's era (upper 20), whole snapshot
        (25, 0xB, 25, 25, 30, 20),  # past B's era: back to where C took over
        (25, 0xC, 25, 25, 30, None),  # newest uuid: upper is the high seqno
        (25, 0xC, 25, 25, 22, 22),  # the server has less than the consumer: back to its high seqno
        (18, 0xB, 16, 24, 30, 16),  # mid-snapshot crossing upper 20: back to the snapshot start
        (16, 0xB, 16, 24, 30, None),  # start == snap_start: the consumer has none of that snapshot
        (24, 0xB, 16, 24, 30, 20),  # start == snap_end: whole snapshot, upper 20 < 24
        (8, 0xA, 5, 12, 30, 5),  # A's era ends at 10: snapshot 5..12 is torn
    ],
)
def test_rollback_rule(start, uuid, snap_start, snap_end, high, want):
    assert needs_rollback(start, uuid, snap_start, snap_end, TABLE, high) == want


def test_rollback_rule_purge_and_strict():
    assert needs_rollback(3, 0xC, 3, 3, TABLE, 30, purge_seqno=5) == 0
    assert needs_rollback(0, 0x99, 0, 0, TABLE, 30, strict=True) == 0


def test_failover_entry_drops_later_entries_and_caps_the_table():
    assert add_failover_entry(TABLE, 0xD, 15) == [(0xD, 15), (0xB, 10), (0xA, 0)]
    table = []
    for n in range(30):
        table = add_failover_entry(table, n + 1, n)
    assert len(table) == 25 and table[0] == (30, 29)


# ------------------------------------------------------------------------------------------ the judge


def _open(conn: Connection, *controls: tuple[str, str]) -> None:
    assert conn.feed(CONSUMER, decode_packet(codec.open_request("c", opaque=1))).ok
    assert conn.feed(PRODUCER, decode_packet(codec.response(codec.OPEN, opaque=1))).ok
    for n, (key, value) in enumerate(controls, start=2):
        assert conn.feed(CONSUMER, decode_packet(codec.control_request(key, value, opaque=n))).ok
        assert conn.feed(PRODUCER, decode_packet(codec.response(codec.CONTROL, opaque=n))).ok


def _stream(conn: Connection, vb: int = 3, opaque: int = 7, start: int = 0) -> None:
    req = StreamReq(0, start, FOREVER, 0xA if start else 0, start, start)
    assert conn.feed(CONSUMER, decode_packet(codec.stream_req_request(vb, opaque, req))).ok
    answer = codec.response(codec.STREAM_REQ, opaque=opaque, value=codec.failover_log_value([(0xA, 0)]))
    v = conn.feed(PRODUCER, decode_packet(answer))
    assert v.ok and v.event == f"stream open from {start}"


def P(wire: bytes):  # noqa: N802
    return decode_packet(wire)


def test_a_clean_stream_is_accepted_and_snapshots_complete():
    conn = Connection()
    _open(conn, ("enable_noop", "true"))
    _stream(conn)
    assert conn.feed(PRODUCER, P(codec.snapshot_marker(3, 7, 0, 2, 1))).event == "snapshot 0..2"
    assert conn.feed(PRODUCER, P(codec.mutation(3, 7, 1, 1, b"a", b"x"))).ok
    v = conn.feed(PRODUCER, P(codec.deletion(3, 7, 2, 1, b"b")))
    assert v.ok and v.event == "snapshot complete"
    assert conn.feed(PRODUCER, P(codec.noop(99))).ok
    assert conn.feed(CONSUMER, P(codec.response(codec.NOOP, opaque=99))).ok
    assert conn.feed(PRODUCER, P(codec.stream_end(3, 7, 0))).event == "stream end ok"
    assert conn.violations == 0 and conn.ended[0].items == 2


@pytest.mark.parametrize(
    ("wires", "reason"),
    [
        ([codec.mutation(3, 7, 1, 1, b"a", b"")], "before any snapshot marker"),
        (
            [codec.snapshot_marker(3, 7, 0, 5, 1), codec.mutation(3, 7, 6, 1, b"a", b"")],
            "outside the snapshot",
        ),
        (
            [
                codec.snapshot_marker(3, 7, 0, 5, 1),
                codec.mutation(3, 7, 2, 1, b"a", b""),
                codec.deletion(3, 7, 2, 1, b"b"),
            ],
            "not after the last seqno",
        ),
        (
            [
                codec.snapshot_marker(3, 7, 0, 5, 1),
                codec.mutation(3, 7, 2, 1, b"a", b""),
                codec.snapshot_marker(3, 7, 3, 6, 1),
            ],
            "before the snapshot 0..5 completed",
        ),
        (
            [codec.snapshot_marker(3, 7, 0, 5, 1), codec.stream_end(3, 7, 0)],
            "STREAM_END ok inside the snapshot",
        ),
        (
            [codec.snapshot_marker(3, 7, 0, 5, 1), codec.mutation(4, 7, 1, 1, b"a", b"")],
            "vbucket 4 on the stream",
        ),
        ([codec.mutation(3, 8, 1, 1, b"a", b"")], "no open stream"),
        (
            [
                codec.snapshot_marker(3, 7, 0, 5, 1),
                codec.mutation(3, 7, 1, 1, b"a", b""),
                codec.mutation(3, 7, 2, 1, b"a", b""),
            ],
            "twice in the snapshot",
        ),
        ([codec.snapshot_marker(3, 7, 0, 5, 1, sid=4)], "stream id 4"),
        ([codec.noop(5)], "NOOP before enable_noop"),
        ([codec.response(codec.CONTROL, opaque=77)], "answers no request"),
    ],
)
def test_producer_violations(wires, reason):
    conn = Connection()
    _open(conn)
    _stream(conn)
    verdicts = [conn.feed(PRODUCER, P(w)) for w in wires]
    assert [v.kind for v in verdicts[:-1]] == [Kind.ACCEPTED] * (len(wires) - 1)
    assert verdicts[-1].kind is Kind.VIOLATION and reason in verdicts[-1].reason


def test_flow_control_allows_one_message_over_the_buffer_and_no_more():
    conn = Connection()
    _open(conn, ("connection_buffer_size", "100"))
    _stream(conn)
    assert conn.feed(PRODUCER, P(codec.snapshot_marker(3, 7, 0, 3, 1))).ok  # 44 bytes
    v = conn.feed(PRODUCER, P(codec.mutation(3, 7, 1, 1, b"k1", b"x" * 40)))  # 97: 141 > 100, allowed
    assert v.ok and v.event == "buffer full" and conn.stalls == 1
    v = conn.feed(PRODUCER, P(codec.mutation(3, 7, 2, 1, b"k2", b"")))
    assert v.kind is Kind.VIOLATION and "141 bytes unacknowledged of a 100-byte buffer" in v.reason
    assert conn.feed(CONSUMER, P(codec.buffer_ack(141))).ok
    v = conn.feed(CONSUMER, P(codec.buffer_ack(500)))
    assert v.kind is Kind.VIOLATION and "only 57 are unacknowledged" in v.reason


def test_rollback_answers_are_checked():
    conn = Connection()
    _open(conn)
    req = StreamReq(0, 10, FOREVER, 0xB, 10, 10)
    conn.feed(CONSUMER, P(codec.stream_req_request(3, 9, req)))
    v = conn.feed(PRODUCER, P(codec.rollback_response(9, 12)))
    assert v.kind is Kind.VIOLATION and "after the requested start 10" in v.reason
    conn.feed(CONSUMER, P(codec.stream_req_request(3, 10, StreamReq(0, 0, FOREVER, 0, 0, 0))))
    v = conn.feed(PRODUCER, P(codec.rollback_response(10, 0)))
    assert v.kind is Kind.VIOLATION and "never rolls back" in v.reason
    conn.feed(CONSUMER, P(codec.stream_req_request(3, 11, StreamReq(0, 10, FOREVER, 0xB, 10, 10))))
    v = conn.feed(PRODUCER, P(codec.rollback_response(11, 4)))
    assert v.ok and v.event == "rollback to 4" and conn.rollbacks[-1] == (3, 4)


def test_a_rollback_finding_gives_the_servers_reason():
    """The cause follows needs_rollback (docs: dcp.md 5.3): an incomplete snapshot rolls back to its
    start; otherwise to where the producer's history with the uuid ends, named as the failover
    log's branch when the connection has seen that log; 0 when it holds no such history."""
    conn = Connection()
    _open(conn)
    conn.feed(CONSUMER, P(codec.stream_req_request(3, 9, StreamReq(0, 30, FOREVER, 0xB, 25, 35))))
    severity, text = conn.feed(PRODUCER, P(codec.rollback_response(9, 25))).finding
    assert severity == "warning" and text.startswith(
        "vb 3 rolls back to 25: the consumer asked to resume at 30"
    )
    assert "inside a snapshot it had not completed" in text and "resumes from there" in text
    # GET_FAILOVER_LOG shows the producer's log: uuid 0xC from 20, 0xB before it.
    conn.feed(CONSUMER, P(codec.request(codec.GET_FAILOVER_LOG, vbucket=3, opaque=10)))
    log = codec.failover_log_value([(0xC, 20), (0xB, 0)])
    assert conn.feed(PRODUCER, P(codec.response(codec.GET_FAILOVER_LOG, opaque=10, value=log))).ok
    conn.feed(CONSUMER, P(codec.stream_req_request(3, 11, StreamReq(0, 30, FOREVER, 0xB, 30, 30))))
    _, text = conn.feed(PRODUCER, P(codec.rollback_response(11, 20))).finding
    assert "the producer's failover log branches at 20" in text
    assert text.endswith("newest first: 0x000000000000000c from 20, 0x000000000000000b from 0")
    conn.feed(CONSUMER, P(codec.stream_req_request(4, 12, StreamReq(0, 30, FOREVER, 0xD, 30, 30))))
    _, text = conn.feed(PRODUCER, P(codec.rollback_response(12, 0))).finding
    assert text.endswith("the producer holds no history with that uuid (none in its failover log, or purged)")
    conn.feed(CONSUMER, P(codec.stream_req_request(5, 13, StreamReq(0, 0, FOREVER, 0, 0, 0))))
    refused = conn.feed(PRODUCER, P(codec.response(codec.STREAM_REQ, codec.NOT_MY_VBUCKET, opaque=13)))
    assert refused.vbucket == 5 and refused.finding == (
        "warning",
        "stream request for vb 5 refused NOT_MY_VBUCKET: this node does not serve vb 5 (not here, or not "
        "active or replica)",
    )


def test_consumer_rules():
    conn = Connection()
    v = conn.feed(CONSUMER, P(codec.control_request("enable_noop", "true", opaque=1)))
    assert v.kind is Kind.VIOLATION and "before DCP_OPEN" in v.reason
    conn = Connection()
    _open(conn, ("enable_noop", "true"))
    v = conn.feed(CONSUMER, P(codec.stream_req_request(3, 9, StreamReq(0, 10, 5, 0, 10, 10))))
    assert v.kind is Kind.VIOLATION and "ERANGE" in v.reason
    v = conn.feed(
        PRODUCER, P(codec.response(codec.STREAM_REQ, opaque=9, value=codec.failover_log_value([(1, 0)])))
    )
    assert v.kind is Kind.VIOLATION and "must be ERANGE" in v.reason
    conn.feed(PRODUCER, P(codec.noop(5)))
    v = conn.feed(CONSUMER, P(codec.response(codec.NOOP, opaque=6)))
    assert v.kind is Kind.VIOLATION and "the NOOP's was 0x00000005" in v.reason
    v = conn.feed(CONSUMER, P(codec.buffer_ack(5)))
    assert v.kind is Kind.VIOLATION and "without connection_buffer_size" in v.reason


def test_malformed_packets_are_named():
    conn = Connection()
    bad = codec.encode(codec.Packet(0x80, codec.MUTATION, 3, 7, 0, 0, b"\0" * 10, b"k", b""))
    v = conn.feed(PRODUCER, P(bad), offset=500)
    assert v.kind is Kind.MALFORMED and "extras of 10 bytes, must be 31" in v.reason and "504" in v.reason


def test_requests_may_share_an_opaque_and_are_answered_in_order():
    """java-dcp-client sends its setup commands all with opaque 0, pipelined."""
    conn = Connection()
    for wire in (
        codec.open_request("c", codec.OPEN_PRODUCER, 0),
        codec.request(codec.GET_CLUSTER_CONFIG, opaque=0),
        codec.control_request("connection_buffer_size", "100", 0),
    ):
        assert conn.feed(CONSUMER, decode_packet(wire)).ok
    for opcode in (codec.OPEN, codec.GET_CLUSTER_CONFIG, codec.CONTROL):
        verdict = conn.feed(PRODUCER, decode_packet(codec.response(opcode, opaque=0)))
        assert verdict.ok and verdict.request_opcode == opcode, verdict.reason
    assert conn.buffer_size == 100 and not conn.pending


def test_a_stream_request_may_not_reuse_an_opaque_in_use():
    conn = Connection()
    conn.feed(CONSUMER, decode_packet(codec.open_request("c", codec.OPEN_PRODUCER, 1)))
    conn.feed(PRODUCER, decode_packet(codec.response(codec.OPEN, opaque=1)))
    req = StreamReq(0, 0, FOREVER, 0, 0, 0)
    assert conn.feed(CONSUMER, decode_packet(codec.stream_req_request(0, 5, req))).ok
    log = codec.failover_log_value([(7, 0)])
    assert conn.feed(PRODUCER, decode_packet(codec.response(codec.STREAM_REQ, opaque=5, value=log))).ok
    verdict = conn.feed(CONSUMER, decode_packet(codec.stream_req_request(1, 5, req)))
    assert verdict.kind is Kind.VIOLATION and "opaque 0x00000005, already in use" in verdict.reason


# --- the judge contract ------------------------------------------------------------------------------

_OPAQUES = st.integers(0, 2)
_SEQNOS = st.integers(0, 12)


@st.composite
def _packets(draw) -> list[tuple[str, bytes]]:
    """A command and, mostly, its answer, or one stream message: each usually from the side that
    sends it, sometimes from the other; random opaques, seqnos, ranges, keys and failover logs."""
    opaque, vb, seqno = draw(_OPAQUES), draw(st.sampled_from([0, 0, 0, 1])), draw(_SEQNOS)
    kind = draw(
        st.sampled_from(
            ["open", "control", "stream_req", "stream_req", "stream_req", "ack", "noop", "close", "log"]
            + ["marker", "marker", "marker", "item", "item", "item", "item", "item", "adv", "end"]
        )
    )
    answer: bytes | None = codec.response(codec.OPEN, opaque=opaque)
    consumers = True
    if kind == "open":
        wire = codec.open_request("c", opaque=opaque)
    elif kind == "control":
        key, value = draw(
            st.sampled_from(
                [("enable_noop", "true"), ("connection_buffer_size", "300"), ("enable_stream_id", "true")]
                + [("send_stream_end_on_client_close_stream", "true"), ("connection_buffer_size", "0")]
            )
        )
        wire = codec.control_request(key, value, opaque=opaque)
        answer = codec.response(codec.CONTROL, opaque=opaque)
    elif kind == "stream_req":
        start, end, snap_start, snap_end = (draw(_SEQNOS) for _ in range(4))
        end = draw(st.sampled_from([end, FOREVER]))
        wire = codec.stream_req_request(
            vb, opaque, StreamReq(0, start, end, draw(_OPAQUES), snap_start, snap_end)
        )
        log = draw(st.lists(st.tuples(_OPAQUES, _SEQNOS), max_size=3))
        answer = draw(
            st.sampled_from(
                [
                    codec.response(codec.STREAM_REQ, opaque=opaque, value=codec.failover_log_value(log)),
                    codec.rollback_response(opaque, seqno),
                    codec.response(codec.STREAM_REQ, codec.NOT_MY_VBUCKET, opaque=opaque),
                ]
            )
        )
    elif kind == "ack":
        wire, answer = codec.buffer_ack(draw(st.integers(0, 400))), None
    elif kind == "noop":
        consumers, wire, answer = False, codec.noop(opaque), codec.response(codec.NOOP, opaque=opaque)
    elif kind == "close":
        wire = codec.request(codec.CLOSE_STREAM, vbucket=vb, opaque=opaque)
        answer = codec.response(codec.CLOSE_STREAM, draw(st.sampled_from([0, 0x21])), opaque=opaque)
    elif kind == "log":
        wire = codec.request(codec.GET_FAILOVER_LOG, vbucket=vb, opaque=opaque)
        log = draw(st.lists(st.tuples(_OPAQUES, _SEQNOS), max_size=3))
        answer = codec.response(codec.GET_FAILOVER_LOG, opaque=opaque, value=codec.failover_log_value(log))
    else:
        consumers, answer = False, None
        if kind == "marker":
            wire = codec.snapshot_marker(vb, opaque, seqno, draw(_SEQNOS), draw(st.sampled_from([1, 0x21])))
        elif kind == "item":
            key = draw(st.sampled_from([b"a", b"b", b"c"]))
            wire = codec.mutation(
                vb, opaque, seqno, 1, key, b"v" * 40, sid=draw(st.sampled_from([None] * 5 + [1]))
            )
        elif kind == "adv":
            wire = codec.seqno_advanced(vb, opaque, seqno)
        else:
            wire = codec.stream_end(vb, opaque, draw(st.sampled_from([0, 1, 2, 4])))
    first, other = (CONSUMER, PRODUCER) if consumers else (PRODUCER, CONSUMER)
    if draw(st.integers(0, 9)) == 0:
        first, other = other, first
    out = [(first, wire)] if draw(st.integers(0, 9)) else []  # now and then an answer to nothing
    if answer is not None and draw(st.integers(0, 5)):
        out.append((other, answer))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(_packets(), max_size=40).map(lambda runs: [p for run in runs for p in run]))
def test_every_verdict_is_the_contracts_and_every_violation_names_a_rule(packets):
    conn = Connection()
    for side, wire in packets:
        verdict = conn.feed(side, decode_packet(wire))
        assert isinstance(verdict, Verdict) and isinstance(verdict, judge.Verdict)
        assert verdict.side == side and verdict.kind in (Kind.ACCEPTED, Kind.VIOLATION, Kind.MALFORMED)
        if verdict.kind is Kind.VIOLATION:
            assert verdict.rule in RULES, verdict
        else:
            assert verdict.rule is None, verdict
        legal = conn.expects().legal
        assert set(legal) == set(Connection.SIDES)
    assert type(conn.violations) is int


def test_a_violation_names_the_rule_of_its_first_reason():
    conn = Connection()
    _open(conn)
    _stream(conn)
    v = conn.feed(PRODUCER, P(codec.mutation(3, 7, 0, 1, b"a", b"x")))  # no marker, not after 0
    assert v.rule == "item-before-marker"
    assert v.reason == "seqno 0 before any snapshot marker; seqno 0 not after the last seqno 0"
    assert conn.feed(CONSUMER, P(codec.buffer_ack(1))).rule == "buffer-ack"
    assert conn.feed(PRODUCER, P(codec.open_request("x", opaque=3))).rule == "wrong-side"


def test_expects_follows_the_connection():
    conn = Connection()
    fresh = conn.expects()
    assert "DCP_OPEN" in fresh.legal[CONSUMER] and "DCP_CONTROL" not in fresh.legal[CONSUMER]
    assert fresh.legal[PRODUCER] == frozenset() and fresh.text == "DCP_OPEN from the consumer"
    conn = Connection()
    _open(conn, ("enable_noop", "true"), ("connection_buffer_size", "100"))
    _stream(conn)
    opened = conn.expects()
    assert {"DCP_CONTROL", "DCP_BUFFER_ACKNOWLEDGEMENT"} <= opened.legal[CONSUMER]
    assert {"DCP_MUTATION", "DCP_SNAPSHOT_MARKER", "DCP_NOOP"} <= opened.legal[PRODUCER]
    conn.feed(PRODUCER, P(codec.snapshot_marker(3, 7, 0, 3, 1)))
    conn.feed(PRODUCER, P(codec.mutation(3, 7, 1, 1, b"k1", b"x" * 80)))  # the buffer is full
    full = conn.expects()
    assert "DCP_MUTATION" not in full.legal[PRODUCER] and "a BUFFER_ACK before" in full.text
    conn.feed(PRODUCER, P(codec.noop(5)))
    assert "DCP_NOOP_RESPONSE" in conn.expects().legal[CONSUMER]
    assert conn.end(PRODUCER, End.RESET) is None
    assert conn.expects().legal[PRODUCER] == frozenset()
    assert conn.end(CONSUMER, End.CUT, partial=7) is None
    assert conn.expects() == Expected(
        {CONSUMER: frozenset(), PRODUCER: frozenset()}, "nothing: both sides have ended"
    )


def test_feed_refuses_a_side_it_does_not_know():
    with pytest.raises(ValueError, match="side 'client' is none of"):
        Connection().feed("client", P(codec.noop(1)))
