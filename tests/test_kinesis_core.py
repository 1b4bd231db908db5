"""The MLD conversation rules: hand-written lines of both sides through core.Conversation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto import judge
from wallaroo_proto.protocols.kinesis.codec import V1, Checkpoint, Initialize, ProcessRecords, Status
from wallaroo_proto.protocols.kinesis.core import (
    DAEMON,
    FINAL,
    PROCESSOR,
    REFUSED,
    REQUEST,
    RULES,
    TRANSITIONS,
    Conversation,
    Kind,
    State,
    checkpoint_error,
    seq_key,
)

INIT = (
    b'{"action":"initialize","shardId":"shardId-000000000000","sequenceNumber":"TRIM_HORIZON",'
    b'"subSequenceNumber":0}'
)
RECORDS = (
    b'{"action":"processRecords","records":[{"data":"eA==","partitionKey":"k","sequenceNumber":"100",'
    b'"approximateArrivalTimestamp":1700000000000,"subSequenceNumber":0,"action":"record"},'
    b'{"data":"eQ==","partitionKey":"k","sequenceNumber":"200","approximateArrivalTimestamp":1700000000001,'
    b'"subSequenceNumber":0,"action":"record"}],"millisBehindLatest":0}'
)


def status(action: str) -> bytes:
    return b'{"action": "status", "responseFor": "%s"}' % action.encode()


def checkpoint(seq: str | None = None) -> bytes:
    value = b"null" if seq is None else b'"%s"' % seq.encode()
    return b'{"action": "checkpoint", "sequenceNumber": %s, "subSequenceNumber": null}' % value


def reply(seq: str | None = None, error: str | None = None) -> bytes:
    value = b"null" if seq is None else b'"%s"' % seq.encode()
    err = b"null" if error is None else b'"%s"' % error.encode()
    return b'{"action":"checkpoint","sequenceNumber":%s,"subSequenceNumber":null,"error":%s}' % (value, err)


def play(conv: Conversation, *steps: tuple[str, bytes]):
    verdicts = []
    for sender, line in steps:
        verdicts.append(conv.feed(sender, line))
    return verdicts


D, P = DAEMON, PROCESSOR


def test_a_whole_lease_with_kclpy_lines_is_accepted():
    conv = Conversation()
    verdicts = play(
        conv,
        (D, INIT),
        (P, b""),
        (P, status("initialize")),
        (P, b""),
        (D, RECORDS),
        (P, b""),
        (P, checkpoint("200")),
        (D, reply("200")),
        (P, b""),
        (P, status("processRecords")),
        (D, b'{"action":"shardEnded"}'),
        (P, checkpoint()),
        (D, reply()),
        (P, status("shardEnded")),
    )
    assert [v.kind for v in verdicts if v.kind is not Kind.SKIPPED] == [Kind.ACCEPTED] * 10
    assert conv.done and conv.violations == 0
    assert conv.records == 2 and conv.checkpoints == 2 and conv.last_checkpoint == ("SHARD_END", 0)


def test_a_status_for_the_wrong_request_names_the_line_and_the_expected_one():
    conv = Conversation()
    *_, bad = play(
        conv, (D, INIT), (P, status("initialize")), (D, RECORDS), (P, b""), (P, status("initialize"))
    )
    assert bad.kind is Kind.VIOLATION and bad.line == 3
    assert bad.reason == "status with responseFor 'initialize', expected 'processRecords'"


def test_a_status_with_no_responsefor_or_no_request():
    conv = Conversation()
    assert play(conv, (P, status("initialize")))[0].reason == "a status with no request pending"
    conv = Conversation()
    *_, bad = play(conv, (D, INIT), (P, b'{"action":"status"}'))
    assert bad.reason == "status with no responseFor, expected 'initialize'"


def test_checkpoints_only_while_a_request_is_pending_and_one_at_a_time():
    conv = Conversation()
    assert play(conv, (P, checkpoint()))[0].reason == "a checkpoint with no request pending"
    conv = Conversation()
    *_, bad = play(
        conv, (D, INIT), (P, status("initialize")), (D, RECORDS), (P, checkpoint()), (P, checkpoint())
    )
    assert bad.reason == "a second checkpoint before the reply to the first"
    conv = Conversation()
    *_, bad = play(
        conv, (D, INIT), (P, status("initialize")), (D, RECORDS), (P, checkpoint()), (P, status("x"))
    )
    assert bad.reason == "a status while its checkpoint awaits the reply"


@pytest.mark.parametrize("during", ["initialize", "leaseLost"])
def test_no_checkpointer_during_initialize_and_leaselost(during):
    def conv_at_request() -> Conversation:
        conv = Conversation()
        if during == "leaseLost":
            play(conv, (D, INIT), (P, status("initialize")), (D, b'{"action":"leaseLost"}'))
        else:
            play(conv, (D, INIT))
        return conv

    conv = conv_at_request()
    ok = play(conv, (P, checkpoint()), (D, reply(None, "InvalidStateException")), (P, status(during)))
    assert [v.kind for v in ok] == [Kind.ACCEPTED] * 3
    conv = conv_at_request()
    *_, bad = play(conv, (P, checkpoint()), (D, reply()))
    assert bad.kind is Kind.VIOLATION and bad.side == DAEMON
    assert f"a checkpoint during {during} must fail with InvalidStateException" in bad.reason


def _at_shard_end() -> Conversation:
    conv = Conversation()
    play(conv, (D, INIT), (P, status("initialize")), (D, RECORDS), (P, status("processRecords")))
    play(conv, (D, b'{"action":"shardEnded"}'))
    return conv


@pytest.mark.parametrize(
    "steps",
    [
        [],  # no checkpoint at all
        [(P, checkpoint()), (D, reply(None, "ThrottlingException"))],  # a failed one
        [(P, checkpoint("200")), (D, reply("200"))],  # at a record, not at the end of the shard
    ],
)
def test_shard_ended_needs_a_successful_checkpoint_at_the_end(steps):
    conv = _at_shard_end()
    *_, bad = play(conv, *steps, (P, status("shardEnded")))
    assert (
        bad.kind is Kind.VIOLATION
        and "without a successful checkpoint at the end of the shard" in bad.reason
        and "child shards never start" in bad.reason
    )
    assert not conv.done


def test_the_daemon_keeps_strict_alternation():
    conv = Conversation()
    assert play(conv, (D, RECORDS))[0].reason == "processRecords before initialize"
    conv = Conversation()
    *_, bad = play(conv, (D, INIT), (D, RECORDS))
    assert bad.reason == "processRecords while initialize still awaits its status"
    conv = Conversation()
    *_, bad = play(conv, (D, INIT), (P, status("initialize")), (D, RECORDS), (P, checkpoint()), (D, RECORDS))
    assert "while the processor waits for the reply to its checkpoint" in bad.reason
    conv = Conversation()
    *_, bad = play(conv, (D, INIT), (P, status("initialize")), (D, reply()))
    assert bad.reason == "a checkpoint reply with no checkpoint asked"
    conv = Conversation()
    *_, bad = play(conv, (D, INIT), (P, status("initialize")), (D, b'{"action":"leaseLost"}'))
    play(conv, (P, status("leaseLost")))
    assert play(conv, (D, RECORDS))[0].reason == "processRecords after the conversation ended"


def test_a_daemon_line_kclpy_cannot_read_is_a_violation():
    conv = Conversation()
    (bad,) = play(conv, (D, b""))
    assert bad.kind is Kind.VIOLATION and "blank line" in bad.reason and bad.line == 1


def test_skipped_and_ignored_processor_lines_change_nothing():
    conv = Conversation()
    verdicts = play(
        conv,
        (D, INIT),
        (P, b"print() output"),
        (P, b'{"action":"status","responseFor":"initialize","extra":1}'),
        (P, b'{"action":"processRecords","records":[]}'),
        (P, status("initialize")),
    )
    assert [v.kind for v in verdicts] == [
        Kind.ACCEPTED,
        Kind.SKIPPED,
        Kind.SKIPPED,
        Kind.IGNORED,
        Kind.ACCEPTED,
    ]
    assert "unknown field 'extra'" in verdicts[2].note


def test_the_processor_closing_early_is_reported_with_what_was_owed():
    conv = Conversation()
    play(conv, (D, INIT), (P, status("initialize")), (D, RECORDS), (P, b""))
    verdict = conv.end(PROCESSOR)
    assert verdict.kind is Kind.VIOLATION
    assert verdict.reason == "closed its output before its status for processRecords (after line 2)"
    conv = Conversation()
    play(conv, (D, INIT), (P, status("initialize")))
    assert "before leaseLost or shardEnded" in conv.end(PROCESSOR).reason


def test_a_checkpoint_cut_short_by_the_daemon_closing_is_no_fault_of_the_processor():
    """A stop without a shutdown grace closes the processor's input at any moment, a pending
    checkpoint's reply included; the processor then ends, and owed nothing it could give."""
    conv = Conversation()
    play(conv, (D, INIT), (P, status("initialize")), (D, RECORDS), (P, checkpoint("200")))
    assert conv.end(DAEMON).kind is Kind.IGNORED
    assert conv.end(PROCESSOR).kind is Kind.IGNORED
    conv = Conversation()  # the processor closing first, its checkpoint unanswered: its fault
    play(conv, (D, INIT), (P, status("initialize")), (D, RECORDS), (P, checkpoint("200")))
    assert conv.end(PROCESSOR).kind is Kind.VIOLATION


def test_a_processor_ending_after_the_daemon_closed_its_input_between_requests_is_no_fault():
    """The KCL's default stop (no shutdown grace) closes every processor's input with no leaseLost;
    kclpy then ends, as it should."""
    conv = Conversation()
    play(conv, (D, INIT), (P, status("initialize")), (D, RECORDS), (P, status("processRecords")))
    assert conv.end(DAEMON) is None
    assert conv.end(PROCESSOR) is None


def test_lines_after_the_final_status_are_drained():
    conv = Conversation()
    play(conv, (D, INIT), (P, status("initialize")), (D, b'{"action":"leaseLost"}'), (P, status("leaseLost")))
    assert play(conv, (P, status("leaseLost")))[0].kind is Kind.IGNORED
    assert conv.end(PROCESSOR) is None


def test_v2_shutdown_reasons():
    conv = Conversation()
    play(conv, (D, INIT), (P, status("initialize")), (D, b'{"action":"shutdown","reason":"TERMINATE"}'))
    assert play(conv, (P, status("shutdown")))[0].kind is Kind.VIOLATION
    play(conv, (P, checkpoint()), (D, reply()))
    assert play(conv, (P, status("shutdown")))[0].kind is Kind.ACCEPTED and conv.done
    conv = Conversation()
    play(conv, (D, INIT), (P, status("initialize")), (D, b'{"action":"shutdown","reason":"ZOMBIE"}'))
    *_, bad = play(conv, (P, checkpoint()), (D, reply()))
    assert "during shutdown must fail with InvalidStateException" in bad.reason


def test_v1_is_detected_and_its_checkpoint_form_read():
    conv = Conversation()
    v1_records = (
        b'{"action":"processRecords","records":[{"data":"eA==","partitionKey":"k","sequenceNumber":"7"}]}'
    )
    verdicts = play(
        conv,
        (D, b'{"action":"initialize","shardId":"shardId-1"}'),
        (P, status("initialize")),
        (D, v1_records),
        (P, b'{"action":"checkpoint","checkpoint":"7"}'),
        (D, b'{"action":"checkpoint","checkpoint":"7","error":null}'),
        (P, status("processRecords")),
    )
    assert conv.dialect == V1
    assert [v.kind for v in verdicts] == [Kind.ACCEPTED] * 6
    assert conv.last_checkpoint == ("7", None)


def test_the_checkpointer_validates_like_the_kcl():
    def err(seq, sub=None, action="processRecords", last="100", largest="200", reason=None):
        last = None if last is None else seq_key(last, 0)
        largest = None if largest is None else seq_key(largest, 0)
        return checkpoint_error(
            Checkpoint(seq, sub), action=action, last=last, largest=largest, reason=reason
        )

    assert err(None) is None and err("200") is None and err("100") is None and err("150", 3) is None
    assert err("99") == "IllegalArgumentException"  # before the last checkpoint
    assert err("201") == "IllegalArgumentException"  # beyond the records delivered
    assert err("150", -1) == "IllegalArgumentException"
    assert err("12ab") == "IllegalArgumentException"
    assert err("SHARD_END") == "IllegalArgumentException"
    assert err("SHARD_END", action="shardEnded") is None
    assert err(None, action="initialize") == "InvalidStateException"
    assert err(None, action="leaseLost") == "InvalidStateException"
    assert err(None, action="shutdown", reason="ZOMBIE") == "InvalidStateException"
    assert err(None, action="shutdown", reason="TERMINATE") is None
    assert err("150", largest=None) == "IllegalArgumentException"
    assert err("0150") is None  # leading zeros: the same integer
    assert err("9" * 5000) == "IllegalArgumentException"  # beyond the range, however long
    assert err("1" * 5000, last=None, largest="2" * 5000) is None
    assert err("١٥٠") == "IllegalArgumentException"  # digits of another script are not a sequence number


def test_a_refused_checkpoint_says_its_sequence_number_and_the_range_allowed():
    from wallaroo_proto.protocols.kinesis.core import checkpoint_refusal

    def why(seq, sub=None, last="100", largest="200"):
        last = None if last is None else seq_key(last, 0)
        largest = None if largest is None else seq_key(largest, 2)
        return checkpoint_refusal(Checkpoint(seq, sub), action="processRecords", last=last, largest=largest)

    refused = "IllegalArgumentException"
    assert why("99") == (refused, "99/0 is before the last checkpoint: allowed 100/0 to 200/2")
    assert why("200", 3) == (refused, "200/3 is beyond the last record: allowed 100/0 to 200/2")
    assert why("300", last=None) == (
        refused,
        "300/0 is beyond the last record: allowed the shard's start to 200/2",
    )
    assert why("150", largest=None) == (refused, "150/0: no record delivered yet")
    assert why("150", -1) == (refused, "subsequence number -1 is below 0")
    assert why("150", 1) is None


def test_an_explicit_shard_end_checkpoint_ends_the_shard_like_a_bare_one():
    """The KCL takes SHARD_END as the largest permitted value at the end of a shard."""
    conv = Conversation()
    verdicts = play(
        conv,
        (D, INIT),
        (P, status("initialize")),
        (D, b'{"action":"shardEnded"}'),
        (P, checkpoint("SHARD_END")),
        (D, reply("SHARD_END")),
        (P, status("shardEnded")),
    )
    assert all(v.kind is Kind.ACCEPTED for v in verdicts), [v.describe() for v in verdicts]
    assert conv.done and conv.violations == 0 and conv.last_checkpoint == ("SHARD_END", 0)


def test_a_kinesis_conversation_counts_its_violations_and_keeps_none() -> None:
    """The checker grew linearly with garbage (110 MB for 331k bad lines): each verdict was kept."""
    conv = Conversation()
    verdicts = [conv.feed(DAEMON, b"not json") for _ in range(5000)]
    assert all(v.kind is Kind.VIOLATION and v.rule == "daemon-line" for v in verdicts)
    assert conv.violations == 5000


def test_every_state_takes_or_refuses_each_frame_and_names_the_rule() -> None:
    """The transition table is whole: a frame a state does not take breaks a named rule there."""
    frames = [(DAEMON, "initialize"), (DAEMON, REQUEST), (DAEMON, "checkpoint")]
    frames += [(PROCESSOR, "status"), (PROCESSOR, "checkpoint")]
    assert set(REFUSED) == set(frames)
    for state in State:
        for frame in frames:
            taken, refused = frame in TRANSITIONS[state], state in REFUSED[frame]
            assert taken != refused or (state is State.ENDED and frame[0] == PROCESSOR), (state, frame)
            if refused:
                assert REFUSED[frame][state][0] in RULES, (state, frame)


_DAEMON_FRAMES = [
    INIT,
    RECORDS,
    b'{"action":"leaseLost"}',
    b'{"action":"shardEnded"}',
    b'{"action":"shutdownRequested"}',
    b'{"action":"shutdown","reason":"TERMINATE"}',
    b'{"action":"shutdown","reason":"ZOMBIE"}',
    reply(),
    reply("100"),
    reply("SHARD_END"),
    reply(None, "InvalidStateException"),
    b"not json",
    b"",
    Initialize("shardId-1", "TRIM_HORIZON", 0),
    ProcessRecords([]),
    Checkpoint(None, None, None),
]
_PROCESSOR_FRAMES = [
    *(status(action) for action in ("initialize", "processRecords", "leaseLost", "shardEnded", "shutdown")),
    b'{"action":"status"}',
    checkpoint(),
    checkpoint("100"),
    checkpoint("SHARD_END"),
    b'{"action":"processRecords","records":[]}',
    b"not json",
    b"",
    Status("processRecords"),
    Checkpoint(),
]
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just(DAEMON), st.sampled_from(_DAEMON_FRAMES)),
        st.tuples(st.just(PROCESSOR), st.sampled_from(_PROCESSOR_FRAMES)),
        st.tuples(st.sampled_from([DAEMON, PROCESSOR]), st.sampled_from(list(judge.End))),
    ),
    max_size=30,
)


@settings(deadline=None, max_examples=300)  # a loaded machine is no failure
@given(_STEPS)
def test_any_frames_get_judge_verdicts_whose_violations_name_a_rule(steps) -> None:
    """On random frames of both sides: every verdict is the contract's, every violation names one of
    RULES, and an accepted frame was legal where ``expects`` said, and moved as TRANSITIONS says."""
    conv = Conversation()
    for side, frame in steps:
        if isinstance(frame, judge.End):
            verdict = conv.end(side, frame)
            assert verdict is None or isinstance(verdict, judge.Verdict)
            if verdict is not None and verdict.kind is Kind.VIOLATION:
                assert verdict.rule in RULES, verdict
            continue
        before, legal, pending = conv.state, conv.expects().legal, conv.pending
        verdict = conv.feed(side, frame)
        assert isinstance(verdict, judge.Verdict) and verdict.side == side
        if verdict.kind is Kind.VIOLATION:
            assert verdict.rule in RULES, verdict
        else:
            assert verdict.rule is None
        if verdict.kind is Kind.ACCEPTED and verdict.message is not None:
            action = verdict.message.action
            assert action in legal[side], (before, side, action)
            kind = action if action in ("initialize", "status", "checkpoint") else REQUEST
            after = TRANSITIONS[before][side, kind]
            if action == "status" and pending in FINAL:
                after = State.ENDED
            assert conv.state is after, (before, side, action)
