"""The sans-IO protocol core: every transition the spec lists, and the illegal ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wallaroo_proto import judge
from wallaroo_proto.judge import Kind
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
    outcome = conn.feed(sender, frame)
    assert outcome.kind is Kind.ACCEPTED, outcome.reason


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
    assert conn.feed(W, Ack(1)).kind is Kind.VIOLATION
    assert conn.feed(C, Notify(1, "s")).kind is Kind.IGNORED


def test_restart_goes_to_disconnected_and_terminates_streams():
    conn = streaming()
    open_stream(conn, 1)
    accept(conn, Notify(2, "s2", 0), C)
    accept(conn, Restart("elsewhere:1"), W)
    assert conn.state is ConnState.DISCONNECTED
    assert {s.state for s in conn.streams.values()} == {StreamState.TERMINATED}
    assert conn.feed(C, Message(1, 1, 0, b"", b"")).kind is Kind.IGNORED


def test_the_end_of_the_transport_goes_to_disconnected():
    conn = streaming()
    conn.end(W)
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
    outcome = conn.feed(sender, frame)
    assert outcome.kind is Kind.VIOLATION
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
    outcome = conn.feed(C, Message(1, 1, 0, b"", b""))
    assert outcome.kind is Kind.VIOLATION
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
    outcome = conn.feed(sender, frame)
    assert outcome.kind is Kind.VIOLATION
    assert reason in outcome.reason


def test_message_ids_must_increase_and_replays_are_flagged_not_fatal():
    conn = streaming()
    open_stream(conn)
    accept(conn, Message(1, 10, 0, b"", b""), C)  # the first id may be anything
    assert conn.feed(C, Message(1, 10, 0, b"", b"")).kind is Kind.REPLAYED
    assert conn.feed(C, Message(1, 3, 0, b"", b"")).kind is Kind.REPLAYED
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
    outcome = conn.feed(C, Message(1, 3, 0, b"", b""))
    assert outcome.kind is Kind.VIOLATION
    assert outcome.reason == "MESSAGE sent with no credits left"
    accept(conn, Ack(2), W)
    assert conn.credits == 2
    accept(conn, Message(1, 3, 0, b"", b""), C)
    assert conn.credits == 1


def test_a_rejected_frame_spends_no_credit():
    conn = streaming(credits=5)
    assert conn.feed(C, Message(1, 1, 0, b"", b"")).kind is Kind.VIOLATION
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
    assert conn.feed(W, twopc_frame(ListUncommitted(1))).twopc == ListUncommitted(1)
    accept(conn, Ok(500), C)
    accept(conn, NotifyAck(True, 1, 0), C)
    accept(conn, twopc_frame(ReplyUncommitted(1, ())), C)
    return conn


def test_sink_roles_are_reversed():
    conn = Connection(Use.SINK)
    assert conn.feed(C, Hello("v0.0.1", b"", "w", "w1")).kind is Kind.VIOLATION
    conn = sink_streaming()
    assert conn.feed(C, Message(1, 0, 0, b"", b"x")).kind is Kind.VIOLATION  # the sink sends no data
    assert "may only be sent by the connector" in conn.feed(W, Ok(1)).reason


def test_no_application_message_between_phase1_and_phase2():
    conn = sink_streaming()
    accept(conn, Message(1, 0, 0, b"", b"abcd"), W)
    accept(conn, twopc_frame(Phase1("t1", ((1, 0, 4),))), W)
    outcome = conn.feed(W, Message(1, 4, 0, b"", b"efgh"))
    assert outcome.kind is Kind.VIOLATION
    assert "between PHASE1 of txn 't1' and its PHASE2" in outcome.reason
    accept(conn, twopc_frame(Reply("t1", True)), C)
    accept(conn, twopc_frame(Phase2("t1", True)), W)
    accept(conn, Message(1, 4, 0, b"", b"efgh"), W)


def test_twopc_messages_come_from_the_right_side():
    conn = sink_streaming()
    assert "2PC PHASE1 may only be sent by the worker" in conn.feed(C, twopc_frame(Phase1("t", ()))).reason
    assert "2PC REPLY may only be sent by the connector" in conn.feed(W, twopc_frame(Reply("t", True))).reason


def test_second_phase1_before_phase2_and_unknown_reply_are_violations():
    conn = sink_streaming()
    accept(conn, twopc_frame(Phase1("t1", ())), W)
    assert "awaits its PHASE2" in conn.feed(W, twopc_frame(Phase1("t2", ()))).reason
    assert "which no PHASE1 or PHASE2 named" in conn.feed(C, twopc_frame(Reply("zz", True))).reason


def test_listed_uncommitted_txn_is_settled_by_phase2_without_phase1():
    conn = Connection(Use.SINK)
    accept(conn, Hello("v0.0.1", b"", "w", "w1"), W)
    accept(conn, Ok(500), C)
    accept(conn, twopc_frame(ReplyUncommitted(1, ("old",))), C)
    accept(conn, twopc_frame(Phase2("old", True)), W)
    accept(conn, twopc_frame(Reply("old", True)), C)


def test_bad_twopc_payload_is_a_violation():
    conn = sink_streaming()
    outcome = conn.feed(W, Message(0, 0, 0, b"", b"\xff"))
    assert outcome.kind is Kind.VIOLATION
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
    st.builds(WorkersLeft, st.integers(0, 3), st.just(("w2",))),
    st.sampled_from([twopc_frame(ListUncommitted(1)), twopc_frame(ReplyUncommitted(1, ("t",)))]),
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
        outcome = conn.feed(sender, frame)
        assert isinstance(outcome, Verdict)
        if outcome.kind is Kind.VIOLATION:
            assert outcome.reason
            after = (
                conn.state,
                {k: v.state for k, v in conn.streams.items() if k in before[1]},
                conn.credits,
            )
            assert after == before[:3]


@given(
    st.sampled_from(list(Use)),
    st.booleans(),
    st.lists(st.tuples(any_frame, st.sampled_from(list(Side))), max_size=40),
)
def test_every_verdict_is_the_judges_and_every_violation_names_a_rule(use, from_streaming, sequence):
    """The judge contract on random frames: one Verdict type, rules from the catalogue, and
    nothing accepted that ``expects`` did not list for its sender just before."""
    conn = streaming(credits=3, use=use) if from_streaming else Connection(use)
    for frame, sender in sequence:
        legal = conn.expects().legal[sender]
        verdict = conn.feed(sender, frame)
        assert isinstance(verdict, judge.Verdict)
        assert verdict.side == sender.value, (frame, verdict)
        if verdict.kind is Kind.VIOLATION:
            assert verdict.rule in Connection.RULES, verdict
        else:
            assert verdict.rule is None
        if verdict.kind in (Kind.ACCEPTED, Kind.REPLAYED):
            assert frame.TYPE.name in legal, (frame, sender, conn.state)


@given(
    st.sampled_from(list(Use)),
    st.booleans(),
    st.lists(st.tuples(any_frame, st.sampled_from(list(Side))), max_size=40),
)
def test_the_sides_as_plain_words_judge_as_the_enum_does(use, from_streaming, sequence):
    """``SIDES`` are plain str (the contract's); a caller may pass them for ``Side``'s members."""
    by_enum = streaming(credits=3, use=use) if from_streaming else Connection(use)
    by_word = streaming(credits=3, use=use) if from_streaming else Connection(use)
    assert Connection.SIDES == ("connector", "worker") and all(type(s) is str for s in Connection.SIDES)
    for frame, sender in sequence:
        assert by_word.feed(str(sender.value), frame) == by_enum.feed(sender, frame)
        assert _state(by_word) == _state(by_enum)


def test_a_run_from_the_data_side_by_its_word_takes_the_fast_path() -> None:
    """A generic driver (replay, fuzz) names sides by ``SIDES``: its runs are not turned away."""
    conn = streaming(credits=10)
    open_stream(conn)
    run = [Message(1, i, 0, b"", b"x") for i in range(1, 4)]
    assert conn.feed_run(run, "connector") is True
    assert conn.stream(1).last_message_id == 3


def test_an_unknown_side_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown side 'sink'"):
        Connection().feed("sink", HELLO)


def _breaks(rule: str) -> judge.Verdict:
    """A connection brought to where one frame breaks ``rule``, and that frame's verdict."""
    if rule in ("sender", "after-end", "credits", "notify-ack", "stream-not-open", "ack-stream"):
        conn = streaming(credits=0 if rule == "credits" else 10)
        if rule == "after-end":
            accept(conn, Error("bye"), C)
        frame, sender = {
            "sender": (Ack(1), C),
            "after-end": (Notify(1, "s", 0), C),
            "credits": (Notify(1, "s", 0), C),
            "notify-ack": (NotifyAck(True, 1, 0), W),
            "stream-not-open": (Message(1, 1, 0, b"", b""), C),
            "ack-stream": (Ack(1, ((5, 0),)), W),
        }[rule]
        return conn.feed(sender, frame)
    if rule == "handshake":
        return Connection().feed(C, Notify(1, "s"))
    conn = sink_streaming()
    if rule in ("data-in-round", "one-round"):
        accept(conn, twopc_frame(Phase1("t1", ())), W)
    if rule == "unsettled":
        accept(conn, twopc_frame(ReplyUncommitted(1, ("old",))), C)
    frame, sender = {
        "data-in-round": (Message(1, 0, 0, b"", b"x"), W),
        "unsettled": (twopc_frame(Phase1("t2", ())), W),
        "one-round": (twopc_frame(Phase1("t2", ())), W),
        "twopc-payload": (Message(0, 0, 0, b"", b"\xff"), W),
        "reply-txn": (twopc_frame(Reply("zz", True)), C),
    }[rule]
    return conn.feed(sender, frame)


@pytest.mark.parametrize("rule", list(Connection.RULES))
def test_every_rule_of_the_catalogue_is_one_a_frame_can_break(rule):
    verdict = _breaks(rule)
    assert (verdict.kind, verdict.rule) == (Kind.VIOLATION, rule), verdict
    assert verdict.side in Connection.SIDES and verdict.reason


def test_a_fresh_connection_expects_a_hello_from_its_data_side():
    assert Connection().expects() == judge.Expected(
        {"connector": frozenset({"HELLO", "ERROR"}), "worker": frozenset({"ERROR"})},
        "ERROR or HELLO from the connector; ERROR from the worker",
    )
    sink = Connection(Use.SINK)
    accept(sink, HELLO, W)
    assert sink.expects().legal == {
        "connector": frozenset({"OK", "ERROR"}),
        "worker": frozenset({"ERROR", "NOTIFY", "MESSAGE", "EOS_MESSAGE", "WORKERS_LEFT"}),
    }
    accept(sink, Error("bye"), C)
    assert sink.expects() == judge.Expected(
        {"connector": frozenset(), "worker": frozenset()}, "nothing: the connection is Error"
    )


def test_reply_to_a_phase2_is_allowed_but_not_to_long_decided_txns():
    conn = sink_streaming()
    for txn in ("t1", "t2"):
        accept(conn, twopc_frame(Phase1(txn, ())), W)
        accept(conn, twopc_frame(Reply(txn, True)), C)
        accept(conn, twopc_frame(Phase2(txn, True)), W)
        accept(conn, twopc_frame(Reply(txn, True)), C)  # a sink may answer the PHASE2 too
    assert conn.undecided_txns == set()
    assert conn.feed(C, twopc_frame(Reply("t1", True))).kind is Kind.VIOLATION


def test_a_reply_still_in_flight_after_the_worker_decided_on_is_legal():
    """A sink answers each PHASE1 in order, however late (it fsyncs first): a worker that decides
    without waiting may have started and decided the next round before the REPLY comes. Found by
    fuzz against mock-sink (a REPLY judged against the last PHASE2 only)."""
    conn = sink_streaming()
    for txn in ("t1", "t2"):
        accept(conn, twopc_frame(Phase1(txn, ())), W)
        accept(conn, twopc_frame(Phase2(txn, True)), W)
    accept(conn, twopc_frame(Reply("t1", True)), C)
    accept(conn, twopc_frame(Reply("t2", True)), C)
    assert conn.feed(C, twopc_frame(Reply("zz", True))).kind is Kind.VIOLATION


def test_stream0_in_sink_use_is_always_read_as_2pc_even_if_notified():
    conn = sink_streaming()
    accept(conn, Notify(0, "odd", 0), W)
    accept(conn, NotifyAck(True, 0, 0), C)
    outcome = conn.feed(W, twopc_frame(Phase1("t", ())))
    assert outcome.twopc == Phase1("t", ())
    assert conn.phase1_txn == "t"


def test_after_a_phase2_abort_the_worker_resends_from_the_committed_offset():
    conn = sink_streaming()
    accept(conn, Message(1, 0, 0, b"", b"abcd"), W)
    accept(conn, twopc_frame(Phase1("t1", ((1, 0, 4),))), W)
    accept(conn, twopc_frame(Reply("t1", False)), C)
    accept(conn, twopc_frame(Phase2("t1", False)), W)
    accept(conn, Message(1, 0, 0, b"", b"abcd"), W)  # the same offset again: a re-send
    assert conn.feed(W, Message(1, 0, 0, b"", b"abcd")).kind is Kind.REPLAYED


def test_a_repeated_notify_is_refused_as_the_shipped_worker_does():
    conn = streaming()
    accept(conn, Notify(1, "s1", 0), C)
    repeat = conn.feed(C, Notify(1, "s1", 0))  # while pending: the worker will refuse it
    assert repeat.kind is Kind.ACCEPTED
    assert "already Notify-Sent on this connection: to be refused" in repeat.reason
    accept(conn, NotifyAck(True, 1, 0), W)  # answers the first NOTIFY
    accept(conn, NotifyAck(False, 1, 0), W)  # refuses the repeat: the stream stays open
    assert conn.streams[1].state is StreamState.OPEN
    accept(conn, Message(1, 1, 0, b"", b""), C)
    accept(conn, Notify(1, "s1", 0), C)  # while open, likewise
    assert "success=1 for stream 1, which is already open" in conn.feed(W, NotifyAck(True, 1, 0)).reason
    accept(conn, NotifyAck(False, 1, 0), W)
    assert conn.feed(W, NotifyAck(False, 1, 0)).kind is Kind.VIOLATION  # no refusal was due any more


def test_a_repeat_notify_sent_while_the_first_was_pending_is_answered_afresh_if_that_one_was_refused():
    """Found by fuzz against mock-worker: two NOTIFYs in one write while another connection still
    held the stream; the worker refused the first, the stream came free, and it took the second."""
    conn = streaming()
    accept(conn, Notify(1, "s1", 0), C)
    accept(conn, Notify(1, "s1", 0), C)
    accept(conn, NotifyAck(False, 1, 0), W)  # the first refused: the repeat is pending now
    assert conn.streams[1].state is StreamState.NOTIFY_SENT
    accept(conn, NotifyAck(True, 1, 0), W)
    accept(conn, Message(1, 1, 0, b"", b""), C)
    assert conn.feed(W, NotifyAck(False, 1, 0)).kind is Kind.VIOLATION  # nothing is pending now
    conn = streaming()  # the other connection held it throughout: both refused
    accept(conn, Notify(1, "s1", 0), C)
    accept(conn, Notify(1, "s1", 0), C)
    accept(conn, NotifyAck(False, 1, 0), W)
    accept(conn, NotifyAck(False, 1, 0), W)
    assert conn.streams[1].state is StreamState.CLOSED


def test_the_refusal_of_a_repeat_notify_may_cross_the_stream_s_eos():
    conn = streaming()
    open_stream(conn)
    accept(conn, Notify(1, "s1", 0), C)  # open: to be refused
    accept(conn, EosMessage(1, 0), C)  # sent before the refusal came
    accept(conn, NotifyAck(False, 1, 0), W)
    assert conn.streams[1].state is StreamState.CLOSED


def test_listed_uncommitted_txns_must_be_settled_before_data_or_a_new_round():
    conn = Connection(Use.SINK)
    accept(conn, Hello("v0.0.1", b"", "w", "w1"), W)
    accept(conn, Notify(1, "sink", 0), W)
    accept(conn, Ok(500), C)
    accept(conn, NotifyAck(True, 1, 0), C)
    accept(conn, twopc_frame(ReplyUncommitted(1, ("old-1", "old-2"))), C)
    early = conn.feed(W, Message(1, 0, 0, b"", b"x"))
    assert "before the listed uncommitted txn(s) 'old-1', 'old-2' were settled by PHASE2" in early.reason
    assert conn.feed(W, twopc_frame(Phase1("new", ()))).kind is Kind.VIOLATION
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
    """feed_run takes a run in one step only where feed, frame by frame, accepts every
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
    outcomes = [by_frame.feed(sender, f) for f in frames]
    plain = all(o.kind is Kind.ACCEPTED and not o.reason and o.twopc is None for o in outcomes)
    one_stream_of_messages = all(type(f) is Message for f in frames) and len({f[0] for f in frames}) == 1
    taken = by_run.feed_run(frames, sender)
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
    assert conn.feed_run(run, C)
    assert (conn.credits, conn.streams[1].last_message_id, conn.streams[1].messages) == (2, 7, 7)
    assert not conn.feed_run([Message(1, 9, 0, b"", b"x"), Message(1, 8, 0, b"", b"x")], C)  # falls
    assert not conn.feed_run([Message(1, i, 0, b"", b"x") for i in range(10, 13)], C)  # 3 > 2 credits
