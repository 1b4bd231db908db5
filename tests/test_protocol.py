"""The sans-IO protocol core: every transition the spec lists, and the illegal ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wallaroo_proto.protocols.wallaroo import (
    Ack,
    Connection,
    ConnState,
    EosMessage,
    Error,
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
    Side,
    StreamState,
    Use,
    Verdict,
    WorkersLeft,
    check_hello,
    twopc_frame,
)

C, W = Side.CONNECTOR, Side.WORKER
HELLO = Hello("0.0.1", b"", "prog", "inst")


def accept(conn: Connection, frame, sender: Side) -> None:
    outcome = conn.process(frame, sender)
    assert outcome.verdict is Verdict.ACCEPTED, outcome.reason


def streaming(credits: int = 100, use: Use = Use.SOURCE, **kw) -> Connection:
    conn = Connection(use, **kw)
    data, control = (C, W) if use is Use.SOURCE else (W, C)
    accept(conn, HELLO, data)
    accept(conn, Ok(credits), control)
    return conn


def open_stream(conn: Connection, stream_id: int = 1, sender: Side = C) -> None:
    accept(conn, Notify(stream_id, f"s{stream_id}", 0), sender)
    accept(conn, NotifyAck(True, stream_id, 0), sender.other)


# --- connection state machine ----------------------------------------------


def test_connected_handshake_streaming():
    conn = Connection()
    assert conn.state is ConnState.CONNECTED
    accept(conn, HELLO, C)
    assert conn.state is ConnState.HANDSHAKE
    accept(conn, Ok(7), W)
    assert conn.state is ConnState.STREAMING
    assert conn.credits == 7


@pytest.mark.parametrize("state_setup", ["connected", "handshake", "streaming"])
@pytest.mark.parametrize("sender", [C, W])
def test_error_from_either_side_in_any_state_goes_to_error(state_setup, sender):
    conn = Connection()
    if state_setup != "connected":
        accept(conn, HELLO, C)
    if state_setup == "streaming":
        accept(conn, Ok(1), W)
    accept(conn, Error("bye"), sender)
    assert conn.state is ConnState.ERROR


def test_after_error_the_sender_may_send_nothing_and_the_other_side_is_discarded():
    conn = streaming()
    accept(conn, Error("bye"), W)
    assert conn.process(Ack(1), W).is_violation
    assert conn.process(Notify(1, "s"), C).verdict is Verdict.IGNORED


def test_restart_goes_to_disconnected_and_terminates_streams():
    conn = streaming()
    open_stream(conn, 1)
    accept(conn, Notify(2, "s2", 0), C)
    accept(conn, Restart("elsewhere:1"), W)
    assert conn.state is ConnState.DISCONNECTED
    assert {s.state for s in conn.streams.values()} == {StreamState.TERMINATED}
    assert conn.process(Message(1, 1, 0, b"", b""), C).verdict is Verdict.IGNORED


def test_connection_lost_goes_to_disconnected():
    conn = streaming()
    conn.connection_lost()
    assert conn.state is ConnState.DISCONNECTED


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([(Notify(1, "s"), C)], "NOTIFY before HELLO"),
        ([(Ok(1), W)], "OK in state Connected"),
        ([(HELLO, C), (Notify(1, "s"), C)], "NOTIFY before the handshake completed with OK"),
        ([(HELLO, C), (Ok(1), W), (HELLO, C)], "HELLO in state Streaming: the handshake happens once"),
        ([(HELLO, C), (Ok(1), W), (Ok(1), W)], "OK in state Streaming"),
        ([(HELLO, W)], "Invalid message: HELLO may only be sent by the connector"),
        ([(HELLO, C), (Ok(1), C)], "Invalid message: OK may only be sent by the worker"),
        ([(HELLO, C), (Ok(1), W), (Ack(1), C)], "Invalid message: ACK may only be sent by the worker"),
        ([(HELLO, C), (Ok(1), W), (NotifyAck(True, 1, 0), C)], "NOTIFY_ACK may only be sent by the worker"),
        ([(HELLO, C), (Ok(1), W), (Restart(), C)], "RESTART may only be sent by the worker"),
        (
            [(HELLO, C), (Ok(1), W), (Message(1, 1, 0, b"", b""), W)],
            "MESSAGE may only be sent by the connector",
        ),
        ([(HELLO, C), (Ok(1), W), (WorkersLeft(1, ()), C)], "WORKERS_LEFT may only be sent by the worker"),
    ],
)
def test_illegal_connection_frames(frames, reason):
    conn = Connection()
    *setup, (frame, sender) = frames
    for f, s in setup:
        accept(conn, f, s)
    before = conn.state
    outcome = conn.process(frame, sender)
    assert outcome.is_violation
    assert reason in outcome.reason
    assert outcome.frame_index == len(setup)
    assert conn.state is before  # a rejected frame changes nothing


# --- stream state machine ---------------------------------------------------


def test_start_notify_sent_open_closed_and_reopen():
    conn = streaming()
    accept(conn, Notify(1, "s1", 0), C)
    assert conn.streams[1].state is StreamState.NOTIFY_SENT
    accept(conn, NotifyAck(True, 1, 40), W)
    assert conn.streams[1].state is StreamState.OPEN
    assert conn.streams[1].resume_from == 40
    accept(conn, Message(1, 40, 0, b"", b"x"), C)
    accept(conn, Ack(5, ((1, 41),)), W)
    assert conn.streams[1].last_acked == 41
    accept(conn, EosMessage(1, 40), C)
    assert conn.streams[1].state is StreamState.CLOSED
    accept(conn, Ack(0, ((1, 41),)), W)  # ACKs may arrive for a closed stream
    accept(conn, Notify(1, "s1", 41), C)  # a closed stream may be reintroduced
    assert conn.streams[1].state is StreamState.NOTIFY_SENT
    accept(conn, NotifyAck(True, 1, 41), W)
    accept(conn, Message(1, 41, 0, b"", b"y"), C)


def test_refused_notify_closes_the_stream_and_forbids_messages():
    conn = streaming()
    accept(conn, Notify(1, "s1", 0), C)
    accept(conn, NotifyAck(False, 1, 0), W)
    assert conn.streams[1].state is StreamState.CLOSED
    outcome = conn.process(Message(1, 1, 0, b"", b""), C)
    assert outcome.is_violation
    assert "Bad/unregistered stream_id 1 with message_id 1" in outcome.reason


def test_restart_while_notify_pending_terminates():
    conn = streaming()
    accept(conn, Notify(1, "s1", 0), C)
    accept(conn, Restart(), W)
    assert conn.streams[1].state is StreamState.TERMINATED


@pytest.mark.parametrize(
    ("setup", "frame", "sender", "reason"),
    [
        (
            [],
            Message(9, 1, 0, b"", b""),
            C,
            "Bad/unregistered stream_id 9 with message_id 1 (stream is never notified",
        ),
        ([(Notify(1, "s"), C)], Message(1, 1, 0, b"", b""), C, "stream is Notify-Sent"),
        ([], NotifyAck(True, 1, 0), W, "NOTIFY_ACK for stream 1, which has no NOTIFY pending"),
        ([], EosMessage(1, 0), C, "EOS_MESSAGE for stream 1, which is not open (never notified)"),
        ([], Ack(1, ((5, 1),)), W, "ACK for stream 5, which was never notified"),
    ],
)
def test_illegal_stream_frames(setup, frame, sender, reason):
    conn = streaming()
    for f, s in setup:
        accept(conn, f, s)
    outcome = conn.process(frame, sender)
    assert outcome.is_violation
    assert reason in outcome.reason


def test_message_ids_must_increase_and_replays_are_flagged_not_fatal():
    conn = streaming()
    open_stream(conn)
    accept(conn, Message(1, 10, 0, b"", b""), C)  # the first id may be anything
    assert conn.process(Message(1, 10, 0, b"", b""), C).verdict is Verdict.REPLAYED
    assert conn.process(Message(1, 3, 0, b"", b""), C).verdict is Verdict.REPLAYED
    accept(conn, Message(1, 11, 0, b"", b""), C)
    assert conn.streams[1].messages == 2
    assert conn.streams[1].replays == 2


# --- credits -----------------------------------------------------------------


def test_every_connector_frame_spends_a_credit_and_ack_adds():
    conn = streaming(credits=3)
    accept(conn, Notify(1, "s", 0), C)  # 2 left
    accept(conn, NotifyAck(True, 1, 0), W)
    accept(conn, Message(1, 1, 0, b"", b""), C)  # 1 left
    accept(conn, Message(1, 2, 0, b"", b""), C)  # 0 left
    outcome = conn.process(Message(1, 3, 0, b"", b""), C)
    assert outcome.is_violation
    assert outcome.reason == "MESSAGE sent with no credits left"
    accept(conn, Ack(2), W)
    assert conn.credits == 2
    accept(conn, Message(1, 3, 0, b"", b""), C)
    assert conn.credits == 1


def test_a_rejected_frame_spends_no_credit():
    conn = streaming(credits=5)
    assert conn.process(Message(1, 1, 0, b"", b""), C).is_violation
    assert conn.credits == 5


def test_lenient_credits_counts_the_overdraft():
    conn = streaming(credits=0, lenient_credits=True)
    accept(conn, Notify(1, "s", 0), C)
    assert conn.overdraft == 1


# --- sink use: roles reversed, 2PC on stream 0 ------------------------------


def sink_streaming() -> Connection:
    conn = Connection(Use.SINK)
    sink_hello = Hello("v0.0.1", b"", "w", "w1")
    accept(conn, sink_hello, W)
    # The shipped worker pipelines NOTIFY and LIST_UNCOMMITTED behind its HELLO.
    accept(conn, Notify(1, "sink", 0), W)
    assert conn.process(twopc_frame(ListUncommitted(1)), W).twopc == ListUncommitted(1)
    accept(conn, Ok(500), C)
    accept(conn, NotifyAck(True, 1, 0), C)
    accept(conn, twopc_frame(ReplyUncommitted(1, ())), C)
    return conn


def test_sink_roles_are_reversed():
    conn = Connection(Use.SINK)
    assert conn.process(Hello("v0.0.1", b"", "w", "w1"), C).is_violation
    conn = sink_streaming()
    assert conn.process(Message(1, 0, 0, b"", b"x"), C).is_violation  # the sink sends no data
    assert "may only be sent by the connector" in conn.process(Ok(1), W).reason


def test_no_application_message_between_phase1_and_phase2():
    conn = sink_streaming()
    accept(conn, Message(1, 0, 0, b"", b"abcd"), W)
    accept(conn, twopc_frame(Phase1("t1", ((1, 0, 4),))), W)
    outcome = conn.process(Message(1, 4, 0, b"", b"efgh"), W)
    assert outcome.is_violation
    assert "between PHASE1 of txn 't1' and its PHASE2" in outcome.reason
    accept(conn, twopc_frame(Reply("t1", True)), C)
    accept(conn, twopc_frame(Phase2("t1", True)), W)
    accept(conn, Message(1, 4, 0, b"", b"efgh"), W)


def test_twopc_messages_come_from_the_right_side():
    conn = sink_streaming()
    assert "2PC PHASE1 may only be sent by the worker" in conn.process(twopc_frame(Phase1("t", ())), C).reason
    assert (
        "2PC REPLY may only be sent by the connector" in conn.process(twopc_frame(Reply("t", True)), W).reason
    )


def test_second_phase1_before_phase2_and_unknown_reply_are_violations():
    conn = sink_streaming()
    accept(conn, twopc_frame(Phase1("t1", ())), W)
    assert "awaits its PHASE2" in conn.process(twopc_frame(Phase1("t2", ())), W).reason
    assert "which no PHASE1 or PHASE2 named" in conn.process(twopc_frame(Reply("zz", True)), C).reason


def test_listed_uncommitted_txn_is_settled_by_phase2_without_phase1():
    conn = Connection(Use.SINK)
    accept(conn, Hello("v0.0.1", b"", "w", "w1"), W)
    accept(conn, Ok(500), C)
    accept(conn, twopc_frame(ReplyUncommitted(1, ("old",))), C)
    accept(conn, twopc_frame(Phase2("old", True)), W)
    accept(conn, twopc_frame(Reply("old", True)), C)


def test_bad_twopc_payload_is_a_violation():
    conn = sink_streaming()
    outcome = conn.process(Message(0, 0, 0, b"", b"\xff"), W)
    assert outcome.is_violation
    assert "bad 2PC payload on stream 0: " in outcome.reason


def test_sink_sends_without_credits_is_not_a_violation():
    conn = Connection(Use.SINK)
    accept(conn, Hello("v0.0.1", b"", "w", "w1"), W)
    accept(conn, Ok(0), C)
    accept(conn, Notify(1, "s", 0), W)
    assert conn.overdraft == 1


# --- handshake check ---------------------------------------------------------


def test_check_hello_like_the_shipped_worker():
    assert check_hello(HELLO, version="0.0.1", cookie=b"") is None
    assert check_hello(HELLO, version="0.0.2", cookie=b"") == "Unknown protocol version: 0.0.1"
    assert check_hello(HELLO, version="0.0.1", cookie=b"secret") == "Bad cookie"


# --- property: the core never raises --------------------------------------

any_frame = st.one_of(
    st.just(HELLO),
    st.builds(Ok, st.integers(0, 3)),
    st.just(Error("x")),
    st.builds(Notify, st.integers(0, 2), st.just("s"), st.integers(0, 5)),
    st.builds(NotifyAck, st.booleans(), st.integers(0, 2), st.integers(0, 5)),
    st.builds(Message, st.integers(0, 2), st.integers(0, 5), st.just(0), st.just(b""), st.binary(max_size=8)),
    st.builds(
        Ack,
        st.integers(0, 3),
        st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5)), max_size=2).map(tuple),
    ),
    st.builds(Restart),
    st.builds(EosMessage, st.integers(0, 2), st.integers(0, 5)),
    st.sampled_from([twopc_frame(m) for m in (Phase1("t", ()), Phase2("t", True), Reply("t", False))]),
)


@given(
    st.sampled_from(list(Use)),
    st.booleans(),
    st.lists(st.tuples(any_frame, st.sampled_from(list(Side))), max_size=40),
)
def test_any_frame_sequence_gives_outcomes_and_violations_change_nothing(use, from_streaming, sequence):
    conn = streaming(credits=3, use=use) if from_streaming else Connection(use)
    for frame, sender in sequence:
        before = (conn.state, {k: v.state for k, v in conn.streams.items()}, conn.credits, conn.phase1_txn)
        outcome = conn.process(frame, sender)
        assert isinstance(outcome.verdict, Verdict)
        if outcome.is_violation:
            assert outcome.reason
            after = (
                conn.state,
                {k: v.state for k, v in conn.streams.items() if k in before[1]},
                conn.credits,
            )
            assert after == before[:3]


def test_reply_to_a_phase2_is_allowed_but_not_to_long_decided_txns():
    conn = sink_streaming()
    for txn in ("t1", "t2"):
        accept(conn, twopc_frame(Phase1(txn, ())), W)
        accept(conn, twopc_frame(Reply(txn, True)), C)
        accept(conn, twopc_frame(Phase2(txn, True)), W)
        accept(conn, twopc_frame(Reply(txn, True)), C)  # a sink may answer the PHASE2 too
    assert conn.undecided_txns == set()
    assert conn.process(twopc_frame(Reply("t1", True)), C).is_violation


def test_stream0_in_sink_use_is_always_read_as_2pc_even_if_notified():
    conn = sink_streaming()
    accept(conn, Notify(0, "odd", 0), W)
    accept(conn, NotifyAck(True, 0, 0), C)
    outcome = conn.process(twopc_frame(Phase1("t", ())), W)
    assert outcome.twopc == Phase1("t", ())
    assert conn.phase1_txn == "t"


def test_after_a_phase2_abort_the_worker_resends_from_the_committed_offset():
    conn = sink_streaming()
    accept(conn, Message(1, 0, 0, b"", b"abcd"), W)
    accept(conn, twopc_frame(Phase1("t1", ((1, 0, 4),))), W)
    accept(conn, twopc_frame(Reply("t1", False)), C)
    accept(conn, twopc_frame(Phase2("t1", False)), W)
    accept(conn, Message(1, 0, 0, b"", b"abcd"), W)  # the same offset again: a re-send
    assert conn.process(Message(1, 0, 0, b"", b"abcd"), W).verdict is Verdict.REPLAYED


def test_a_repeated_notify_is_refused_as_the_shipped_worker_does():
    conn = streaming()
    accept(conn, Notify(1, "s1", 0), C)
    repeat = conn.process(Notify(1, "s1", 0), C)  # while pending: the worker will refuse it
    assert repeat.verdict is Verdict.ACCEPTED
    assert "already Notify-Sent on this connection: to be refused" in repeat.reason
    accept(conn, NotifyAck(True, 1, 0), W)  # answers the first NOTIFY
    accept(conn, NotifyAck(False, 1, 0), W)  # refuses the repeat: the stream stays open
    assert conn.streams[1].state is StreamState.OPEN
    accept(conn, Message(1, 1, 0, b"", b""), C)
    accept(conn, Notify(1, "s1", 0), C)  # while open, likewise
    assert "success=1 for stream 1, which is already open" in conn.process(NotifyAck(True, 1, 0), W).reason
    accept(conn, NotifyAck(False, 1, 0), W)
    assert conn.process(NotifyAck(False, 1, 0), W).is_violation  # no refusal was due any more


def test_listed_uncommitted_txns_must_be_settled_before_data_or_a_new_round():
    conn = Connection(Use.SINK)
    accept(conn, Hello("v0.0.1", b"", "w", "w1"), W)
    accept(conn, Notify(1, "sink", 0), W)
    accept(conn, Ok(500), C)
    accept(conn, NotifyAck(True, 1, 0), C)
    accept(conn, twopc_frame(ReplyUncommitted(1, ("old-1", "old-2"))), C)
    early = conn.process(Message(1, 0, 0, b"", b"x"), W)
    assert "before the listed uncommitted txn(s) 'old-1', 'old-2' were settled by PHASE2" in early.reason
    assert conn.process(twopc_frame(Phase1("new", ())), W).is_violation
    accept(conn, twopc_frame(Phase2("old-1", True)), W)
    accept(conn, twopc_frame(Phase2("old-2", False)), W)
    accept(conn, Message(1, 0, 0, b"", b"x"), W)
    accept(conn, twopc_frame(Phase1("new", ((1, 0, 1),))), W)


def _state(conn: Connection) -> tuple:
    streams = {sid: (r.state, r.last_message_id, r.messages, r.replays) for sid, r in conn.streams.items()}
    return conn.state, conn.credits, conn.frame_index, streams


@given(
    st.lists(
        st.tuples(st.sampled_from([1, 2, 5]), st.integers(0, 40), st.sampled_from(["msg", "eos", "ack"])),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 40),
    st.sampled_from([C, W]),
    st.booleans(),
)
def test_a_run_is_accepted_whole_exactly_when_each_frame_would_be(items, credits, sender, use_sink):
    """process_run takes a run in one step only where process, frame by frame, accepts every
    frame with nothing else to say; otherwise it changes nothing."""
    make = {"msg": lambda s, m: Message(s, m, 0, b"", b"p"), "eos": EosMessage, "ack": lambda s, m: Ack(1)}
    frames = [make[kind](sid, mid) for sid, mid, kind in items]
    use = Use.SINK if use_sink else Use.SOURCE
    data_side = W if use_sink else C

    def fresh() -> Connection:
        conn = streaming(credits=100, use=use)
        for sid in (1, 2):
            open_stream(conn, sid, sender=data_side)
        accept(conn, Message(1, 3, 0, b"", b"p"), data_side)  # stream 1 has seen id 3
        conn.credits = credits
        return conn

    by_run, by_frame = fresh(), fresh()
    before = _state(by_run)
    outcomes = [by_frame.process(f, sender) for f in frames]
    plain = all(o.verdict is Verdict.ACCEPTED and not o.reason and o.twopc is None for o in outcomes)
    one_stream_of_messages = all(type(f) is Message for f in frames) and len({f[0] for f in frames}) == 1
    taken = by_run.process_run(frames, sender)
    if taken:
        assert plain and one_stream_of_messages
        assert _state(by_run) == _state(by_frame)
    else:
        assert _state(by_run) == before
        assert not (plain and one_stream_of_messages and by_frame.overdraft == 0)


def test_a_run_of_consecutive_ids_spends_one_credit_each():
    conn = streaming(credits=10)
    open_stream(conn, 1)
    run = [Message(1, i, 0, b"", b"x") for i in range(1, 8)]
    assert conn.process_run(run, C)
    assert (conn.credits, conn.streams[1].last_message_id, conn.streams[1].messages) == (2, 7, 7)
    assert not conn.process_run([Message(1, 9, 0, b"", b"x"), Message(1, 8, 0, b"", b"x")], C)  # falls
    assert not conn.process_run([Message(1, i, 0, b"", b"x") for i in range(10, 13)], C)  # 3 > 2 credits
