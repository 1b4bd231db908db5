"""The IC/LB pair's rules: each named violation provoked once, and the sequences that are right."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.judge import End, Kind, Verdict
from wallaroo_proto.protocols.ambrosia.codec import (
    ATTACH_TO,
    BECOMING_PRIMARY,
    CHECKPOINT,
    CONTROL,
    FORK,
    IMPULSE,
    INITIAL_MESSAGE,
    TAKE_BECOMING_PRIMARY_CHECKPOINT,
    TAKE_CHECKPOINT,
    UPGRADE_SERVICE,
    UPGRADE_TAKE_CHECKPOINT,
    Message,
    checkpoint_record,
    control_record,
    encode_batch,
    encode_checkpoint,
    encode_incoming_rpc,
    encode_message,
    encode_outgoing_rpc,
    encode_record,
    read_header,
)
from wallaroo_proto.protocols.ambrosia.core import _LB_ANY_TIME, IC, LB, RULES, Phase, Session

C = 42


def ic(session: Session, wire: bytes):
    return session.feed(IC, (read_header(wire), wire[24 : read_header(wire).size]))


def lb(session: Session, wire: bytes):
    return session.feed(LB, Message(wire[1], wire[2:]))  # one-byte sizes only


def rpc(n: int = 1) -> bytes:
    return b"".join(encode_incoming_rpc(1, FORK, b"%d" % i) for i in range(n))


def first_started() -> Session:
    s = Session()
    assert ic(s, control_record(C, TAKE_BECOMING_PRIMARY_CHECKPOINT)).kind is Kind.ACCEPTED
    assert lb(s, encode_message(INITIAL_MESSAGE, b"hi")).ok
    assert lb(s, encode_checkpoint(4)).ok
    return s


def rules_of(verdict) -> set[str]:
    return {v.split(":")[0] for v in verdict.violations}


def test_first_start_then_normal_records():
    s = first_started()
    assert s.phase is Phase.NORMAL
    for seq in range(3):
        v = ic(s, encode_record(C, seq, rpc(2)))
        assert v.kind is Kind.ACCEPTED and len(v.messages) == 2
    assert s.rpcs_in == 6 and s.violations == 0


def test_recovery_replay_then_becoming_primary_checkpoint():
    s = Session()
    assert ic(s, checkpoint_record(C, b"state")).kind is Kind.ACCEPTED
    assert ic(s, encode_record(C, 7, rpc())).kind is Kind.REPLAYED
    assert ic(s, encode_record(C, 8, rpc())).kind is Kind.REPLAYED
    assert ic(s, control_record(C, TAKE_BECOMING_PRIMARY_CHECKPOINT)).ok
    assert lb(s, encode_checkpoint(5)).ok
    assert ic(s, encode_record(C, 9, rpc())).kind is Kind.ACCEPTED
    assert s.replayed == 2 and s.violations == 0


@pytest.mark.parametrize("seed_dialect", [True, False])
def test_upgrade_with_and_without_the_follow_up_checkpoint(seed_dialect):
    """The seed ends the upgrade at its checkpoint; the current IC asks once more (TakeCheckpoint)."""
    s = Session()
    ic(s, checkpoint_record(C, b""))
    ic(s, encode_record(C, 0, rpc()))
    assert ic(s, control_record(C, UPGRADE_TAKE_CHECKPOINT)).ok
    assert lb(s, encode_checkpoint(0)).ok
    if not seed_dialect:
        assert ic(s, control_record(C, TAKE_CHECKPOINT)).ok
        assert lb(s, encode_checkpoint(0)).ok
    assert ic(s, encode_record(C, 1, rpc())).kind is Kind.ACCEPTED
    assert s.violations == 0


def test_active_active_becoming_primary_needs_no_checkpoint():
    s = Session()
    ic(s, checkpoint_record(C, b"x"))
    ic(s, control_record(C, BECOMING_PRIMARY))
    assert ic(s, encode_record(C, 0, rpc())).kind is Kind.ACCEPTED
    assert s.violations == 0


def test_upgrade_test_replay_goes_on():
    s = Session()
    ic(s, checkpoint_record(C, b"x"))
    v = ic(s, control_record(C, UPGRADE_SERVICE))
    assert v.ok and "upgrade test" in v.note
    assert ic(s, encode_record(C, 0, rpc())).kind is Kind.REPLAYED


# ----------------------------------------------------------------------------- one test per rule

VIOLATIONS = {
    "check-bytes": lambda s: ic(s, encode_record(C, 0, rpc(), check=1)),
    "sequence-gap": lambda s: (ic(s, encode_record(C, 0, rpc())), ic(s, encode_record(C, 2, rpc())))[1],
    "sequence-id": lambda s: ic(s, encode_record(C, -3, rpc())),
    "committer-changed": lambda s: ic(s, encode_record(C + 1, 0, rpc())),
    "record-body": lambda s: ic(s, encode_record(C, 0, b"\x10\x00ab")),
    "control-record": lambda s: ic(s, encode_record(C, -1, encode_message(TAKE_CHECKPOINT, b"x"))),
    "checkpoint-record": lambda s: ic(s, checkpoint_record(C, b"late")),
    "type-in-record": lambda s: ic(s, encode_record(C, 0, encode_message(ATTACH_TO, b"x"))),
    "record-while-checkpointing": lambda s: (
        ic(s, control_record(C, TAKE_CHECKPOINT)),
        ic(s, encode_record(C, 0, rpc())),
    )[1],
    "batch": lambda s: ic(s, encode_record(C, 0, encode_batch([rpc(), rpc()], replayable=1))),
    "rpc": lambda s: ic(s, encode_record(C, 0, encode_incoming_rpc(1, 9, b""))),
    "lb-message-type": lambda s: lb(s, encode_message(13, b"")),
    "attach-before-send": lambda s: lb(s, encode_outgoing_rpc("other", 1, FORK, b"")),
    "initial-message": lambda s: lb(s, encode_message(INITIAL_MESSAGE, b"again")),
    "unsolicited-checkpoint": lambda s: lb(s, encode_checkpoint(1)),
    "checkpoint-message": lambda s: (ic(s, control_record(C, TAKE_CHECKPOINT)), lb(s, b"\x02\x08"))[1],
}


@pytest.mark.parametrize("rule", sorted(VIOLATIONS))
def test_each_rule_is_named(rule):
    verdict = VIOLATIONS[rule](first_started())
    assert verdict.kind is Kind.VIOLATION
    assert rule in rules_of(verdict), verdict.violations


def test_start_sequence_and_initial_before_checkpoint():
    s = Session()
    assert rules_of(ic(s, encode_record(C, 0, rpc()))) == {"start-sequence"}
    s = Session()
    ic(s, control_record(C, TAKE_BECOMING_PRIMARY_CHECKPOINT))
    assert rules_of(lb(s, encode_checkpoint(0))) == {"initial-before-checkpoint"}


def test_impulse_during_recovery():
    s = Session()
    ic(s, checkpoint_record(C, b""))
    ic(s, encode_record(C, 0, rpc()))
    assert rules_of(lb(s, encode_outgoing_rpc("", 1, IMPULSE, b""))) == {"impulse-during-recovery"}
    assert lb(s, encode_outgoing_rpc("", 1, FORK, b"")).ok  # a Fork while replaying is fine


def test_attach_then_send_is_fine():
    s = first_started()
    assert lb(s, encode_message(ATTACH_TO, b"server")).ok
    assert lb(s, encode_outgoing_rpc("server", 1, FORK, b"")).ok
    assert lb(s, encode_outgoing_rpc("", 1, FORK, b"")).ok  # self calls need no AttachTo


def test_checkpoint_truncated_on_close():
    s = Session()
    v = s.end(LB, End.RESET, blob_left=10)
    assert rules_of(v) == {"checkpoint-truncated"}
    assert s.end(IC) is None


def test_every_rule_has_a_test():
    tested = set(VIOLATIONS) | {
        "start-sequence",
        "initial-before-checkpoint",
        "impulse-during-recovery",
        "checkpoint-truncated",
        "framing",  # the splitters' Garbage: tests/test_ambrosia_codec.py and the dissector tests
    }
    assert tested == set(RULES)


def test_checkpoint_message_type_constant():
    assert encode_checkpoint(0)[1] == CHECKPOINT


# ----------------------------------------------------------------------------- the judge contract

_ic_frames = st.one_of(
    st.builds(control_record, st.just(C), st.sampled_from(sorted(CONTROL))),
    st.builds(checkpoint_record, st.just(C), st.binary(max_size=8)),
    st.builds(
        encode_record,
        st.sampled_from([C, C + 1]),
        st.integers(-3, 4),
        st.one_of(st.builds(rpc, st.integers(0, 3)), st.binary(max_size=12)),
        st.one_of(st.none(), st.just(1)),
    ),
)
_lb_frames = st.builds(Message, st.integers(0, 20), st.binary(max_size=12))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.tuples(st.just(IC), _ic_frames), st.tuples(st.just(LB), _lb_frames)), max_size=20)
)
def test_every_verdict_is_the_judges_and_every_violation_names_a_rule(frames) -> None:
    s = Session()
    for side, frame in frames:
        verdict = ic(s, frame) if side == IC else s.feed(LB, frame)
        assert isinstance(verdict, Verdict) and verdict.side == side
        if verdict.kind is Kind.VIOLATION:
            assert verdict.rule in RULES and verdict.violations
            assert verdict.violations[0] == f"{verdict.rule}: {verdict.reason}"
            assert rules_of(verdict) <= set(RULES)
        assert s.expects().text
    for side in Session.SIDES:
        ended = s.end(side, End.CUT, 3)
        assert isinstance(ended, Verdict) and ended.rule == "framing"


def test_expects_follows_a_first_start():
    s = Session()
    assert s.expects().legal == {IC: {"TakeBecomingPrimaryCheckpoint", "CheckpointRecord"}, LB: _LB_ANY_TIME}
    ic(s, control_record(C, TAKE_BECOMING_PRIMARY_CHECKPOINT))
    assert s.expects().legal[LB] == _LB_ANY_TIME | {"InitialMessage"}
    assert "Record" not in s.expects().legal[IC]
    assert s.expects().text == "InitialMessage, then Checkpoint from the LB"
    lb(s, encode_message(INITIAL_MESSAGE, b"hi"))
    assert s.expects().legal[LB] == _LB_ANY_TIME | {"Checkpoint"}
    lb(s, encode_checkpoint(4))
    assert "Record" in s.expects().legal[IC] and s.expects().legal[LB] == _LB_ANY_TIME
    assert s.expects().text == "records and RPCs"


def test_a_second_request_while_one_is_outstanding_is_the_ics_break():
    """The IC quiesces its committer until a request's checkpoint is in (IC:1388-1400, 2550-2579): it
    never has two outstanding. A second one is its break; the LB's first answer is to the first."""
    s = first_started()
    assert ic(s, control_record(C, TAKE_CHECKPOINT)).ok
    assert rules_of(ic(s, control_record(C, TAKE_CHECKPOINT))) == {"record-while-checkpointing"}
    assert lb(s, encode_checkpoint(0)).ok
    assert rules_of(lb(s, encode_checkpoint(0))) == {"unsolicited-checkpoint"}
    assert ic(s, control_record(C, TAKE_CHECKPOINT)).ok  # asked again once answered: fine
