"""fuzz's protocol-agnostic parts, without a peer: mutants and their steps, the oracle on
hand-written conversations, shrinking, the budget and the state graph."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.fuzz import mutate, oracle
from wallaroo_proto.fuzz.hooks import Field, Hooks, Owed, with_value
from wallaroo_proto.fuzz.mutate import Edit, Mutant
from wallaroo_proto.fuzz.shrink import shrink
from wallaroo_proto.fuzz.states import StateGraph
from wallaroo_proto.replay.recording import Frame


def frame(index: int, sender: str, kind: str, raw: bytes = b"") -> Frame:
    return Frame(
        index, {"sender": sender, "type": kind, "conn_index": 1, "packet": index + 1}, raw or kind.encode()
    )


#: client HELLO, server OK, client DATA, client DATA, server ACK, client BYE
SEED = [
    frame(0, "client", "HELLO"),
    frame(1, "server", "OK"),
    frame(2, "client", "DATA", b"\x00\x00\x00\x05data1"),
    frame(3, "client", "DATA", b"\x00\x00\x00\x05data2"),
    frame(4, "server", "ACK"),
    frame(5, "client", "BYE"),
]


class FakeHooks:
    """Hooks of a made-up protocol: a HELLO is owed OK; ERROR is the refusal; the server must
    reply before it closes; DATA has a 4-byte length at 0."""

    REPLY_BEFORE_CLOSE = frozenset({"server"})
    REFUSE_BY_EXIT: frozenset[str] = frozenset()

    def fields(self, record: dict, raw: bytes) -> list[Field]:
        if record.get("type") != "DATA":
            return []
        return [Field("length", "length", int.from_bytes(raw[:4], "big"), 32, 0)]

    with_value = staticmethod(with_value)

    def owed(self, record: dict) -> Owed | None:
        return Owed(frozenset({"OK", "ERROR"})) if record.get("type") == "HELLO" else None

    def refusal(self, record: dict) -> bool:
        return record.get("type") == "ERROR"

    closed = refusal

    def tolerated(self, record: dict) -> bool:
        return False

    def fit(self, template: bytes, frame: Frame) -> bytes:
        return template

    def signature(self, kind: str) -> str:
        return kind


HOOKS = FakeHooks()


def ours(kind: str, verdict: str = "accepted", **extra) -> tuple:
    return ("ours", {"type": kind, "verdict": verdict, **extra})


def peer(kind: str, verdict: str = "accepted", **extra) -> tuple:
    return ("peer", {"type": kind, "verdict": verdict, **extra})


def kinds(verdicts: oracle.Verdicts) -> list[str]:
    return [f.kind for f in verdicts.findings]


# --- steps -----------------------------------------------------------------------------------


def played(mutant: Mutant) -> list[tuple[str, bytes | None]]:
    """(type, bytes, what follows) per step: the bytes edited as the engine edits the adapter's."""
    out = []
    for step in mutate.steps(mutant, SEED, "client", HOOKS):  # type: ignore[arg-type]
        data = step.raw
        if step.edit is not None:
            data = step.edit(data)
        out.append((step.type, data, step.then))
    return out


def test_the_seed_unchanged_is_played_as_recorded() -> None:
    steps = mutate.steps(Mutant(0), SEED, "client", HOOKS)  # type: ignore[arg-type]
    assert steps == SEED


def test_each_sequence_edit_gives_the_steps_it_names() -> None:
    drop = played(Mutant(0, (Edit("drop", 2, text="d"),)))
    assert [t for t, _, _ in drop] == ["HELLO", "OK", "DATA", "ACK", "BYE"]
    assert drop[2][1] == b"\x00\x00\x00\x05data2"
    twice = played(Mutant(0, (Edit("duplicate", 5, text="t"),)))
    assert twice[-1][1] == b"BYEBYE"
    swap = played(Mutant(0, (Edit("swap", 2, value=3, text="s"),)))
    assert [d for _, d, _ in swap][2:4] == [b"\x00\x00\x00\x05data2", b"\x00\x00\x00\x05data1"]
    cut = played(Mutant(0, (Edit("cut", 2, value=3, text="c"),)))
    assert cut[-1] == ("DATA", b"\x00\x00\x00", "half-close")  # nothing of ours after a cut
    assert len(cut) == 3
    reset = played(Mutant(0, (Edit("reset", 0, text="r"),)))
    assert reset == [("HELLO", b"HELLO", "reset")]
    flipped = played(Mutant(0, (Edit("bytes", 3, value=1, data=b"\xff", text="b"),)))
    assert flipped[3][1] == b"\x00\xff\x00\x05data2"


def test_an_inserted_frame_goes_as_it_is_before_its_frame_with_a_note() -> None:
    steps = mutate.steps(
        Mutant(0, (Edit("insert", 3, name="RESTART", data=b"R!", text="R before"),)), SEED, "client", HOOKS
    )  # type: ignore[arg-type]
    inserted = steps[3]
    assert (inserted.type, inserted.raw, inserted.as_is, inserted.note) == (
        "RESTART",
        b"R!",
        True,
        "fuzz: R before",
    )
    assert steps[4] is SEED[3]


def test_a_dropped_frame_is_noted_on_the_next_of_ours() -> None:
    steps = mutate.steps(Mutant(0, (Edit("drop", 0, text="HELLO #0 dropped"),)), SEED, "client", HOOKS)  # type: ignore[arg-type]
    assert steps[1].type == "DATA" and steps[1].note == "fuzz: HELLO #0 dropped"


def test_a_field_edit_changes_the_adapted_bytes_at_the_field() -> None:
    value = played(Mutant(0, (Edit("value", 2, name="length", value=0xFFFFFFFF, text="v"),)))
    assert value[2][1] == b"\xff\xff\xff\xffdata1"


def test_removed_units_take_a_frame_of_ours_and_the_answers_after_it() -> None:
    assert mutate.units(SEED, "client") == [[0, 1], [2], [3, 4], [5]]  # type: ignore[arg-type]
    steps = mutate.steps(Mutant(0, removed=frozenset({2})), SEED, "client", HOOKS)  # type: ignore[arg-type]
    assert [s.index for s in steps] == [0, 1, 2, 5]


def test_boundaries_hold_the_edges_and_the_kind_s_values() -> None:
    length = Field("length", "length", 5, 16)
    assert {0, 4, 6, 7, 11, 0x8000, 0xFFFF} <= set(mutate.boundaries(length, None))
    ident = Field("id", "id", 9, 64)
    assert {6, 7, 8} <= set(mutate.boundaries(ident, 7))
    assert 5 not in mutate.boundaries(length, None)  # the value itself is no mutation


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1_000_000))
def test_any_mutation_of_the_seed_gives_steps(seed: int) -> None:
    rng = random.Random(seed)
    mutant = Mutant(0)
    templates = {"RESTART": b"R", "HELLO": b"H"}
    for _ in range(3):
        mutant = mutate.mutate(mutant, SEED, "client", HOOKS, rng, templates)  # type: ignore[arg-type]
    assert len(mutant.edits) == 3
    steps = mutate.steps(mutant, SEED, "client", HOOKS)  # type: ignore[arg-type]
    assert all(s.sender in ("client", "server") for s in steps)


def test_the_sweep_inserts_each_type_once_in_each_state() -> None:
    sweep = mutate.sweep(0, SEED, "client", {"X": b"x", "Y": b"y"})  # type: ignore[arg-type]
    places = [(m.edits[0].name, m.edits[0].at) for m in sweep]
    # states: (start, HELLO), (OK, DATA), (ACK, BYE); DATA #3 comes after OK too: no new state
    assert places == [("X", 0), ("Y", 0), ("X", 2), ("Y", 2), ("X", 5), ("Y", 5)]


# --- the oracle ------------------------------------------------------------------------------


def test_a_conversation_as_the_protocol_wants_is_no_finding() -> None:
    events = [
        ours("HELLO"),
        peer("OK"),
        ours("DATA"),
        peer("ACK"),
        ("we-end", 1, "closed"),
        ("end", 1, "closed"),
    ]
    verdicts = oracle.judge(events, HOOKS, "server")  # type: ignore[arg-type]
    assert verdicts.findings == []
    assert verdicts.signature == ("OK", "ACK", "closed")
    assert ("start", "HELLO", "OK") in verdicts.coverage and ("OK", "DATA", "ACK") in verdicts.coverage


def test_a_peer_frame_that_breaks_a_rule_is_a_violation() -> None:
    events = [ours("HELLO"), peer("OK", "violation", violations=["OK with 7 credits twice"])]
    found = oracle.judge(events, HOOKS, "server", "insert X").findings  # type: ignore[arg-type]
    assert [(f.kind, f.reaction, f.sent) for f in found] == [
        ("violation", "OK with # credits twice", "insert X")
    ]


def test_an_illegal_frame_refused_with_the_error_reply_is_no_finding() -> None:
    events = [ours("HELLO"), peer("OK"), ours("HELLO", "violation"), peer("ERROR"), ("end", 1, "closed")]
    assert oracle.judge(events, HOOKS, "server").findings == []  # type: ignore[arg-type]


def test_an_illegal_frame_the_peer_goes_on_after_is_accepted() -> None:
    events = [
        ours("HELLO"),
        peer("OK"),
        ours("HELLO", "violation"),
        ours("DATA"),
        peer("ACK"),
        ("we-end", 1, "closed"),
        ("end", 1, "closed"),
    ]
    assert kinds(oracle.judge(events, HOOKS, "server")) == ["accepted"]  # type: ignore[arg-type]


def test_a_close_without_the_required_error_reply_is_a_finding_only_where_one_is_required() -> None:
    events = [ours("HELLO"), peer("OK"), ours("HELLO", "violation"), ("end", 1, "closed")]
    assert kinds(oracle.judge(events, HOOKS, "server")) == ["no-error-reply"]  # type: ignore[arg-type]
    assert kinds(oracle.judge(events, HOOKS, "client")) == []  # type: ignore[arg-type]


def test_an_owed_answer_that_never_came_is_silent_unless_we_reset() -> None:
    events = [ours("HELLO"), ("we-end", 1, "closed")]
    assert kinds(oracle.judge(events, HOOKS, "server")) == ["silent"]  # type: ignore[arg-type]
    assert kinds(oracle.judge([ours("HELLO"), ("we-end", 1, "reset")], HOOKS, "server")) == []  # type: ignore[arg-type]


def test_a_reset_after_legal_frames_is_a_finding_but_not_after_our_own_error() -> None:
    assert kinds(oracle.judge([ours("HELLO"), peer("OK"), ("end", 1, "reset")], HOOKS, "server")) == ["reset"]  # type: ignore[arg-type]
    after_ours = [ours("HELLO"), peer("OK"), ours("ERROR"), ours("DATA", "violation"), ("end", 1, "reset")]
    assert kinds(oracle.judge(after_ours, HOOKS, "server")) == []  # type: ignore[arg-type]
    assert kinds(oracle.judge([("end", 1, "reset")], HOOKS, "server")) == []  # type: ignore[arg-type]


def test_a_process_exit_and_a_missing_reconnect_are_findings() -> None:
    events = [ours("HELLO"), peer("OK")]
    assert kinds(oracle.judge(events, HOOKS, "server", exited="killed by SIGSEGV")) == ["crash"]  # type: ignore[arg-type]

    class Restarting(FakeHooks):
        def owed(self, record: dict) -> Owed | None:
            return Owed(reconnect=True) if record["type"] == "RESTART" else None

    restart = [ours("RESTART"), ("end", 1, "closed")]
    assert kinds(oracle.judge(restart, Restarting(), "server", reconnected=False)) == ["no-reconnect"]  # type: ignore[arg-type]
    assert kinds(oracle.judge(restart, Restarting(), "server", reconnected=True)) == []  # type: ignore[arg-type]


def test_outstanding_waits_for_an_owed_answer_and_for_a_refusal() -> None:
    assert oracle.outstanding([ours("HELLO")], HOOKS)  # type: ignore[arg-type]
    assert not oracle.outstanding([ours("HELLO"), peer("OK")], HOOKS)  # type: ignore[arg-type]
    assert oracle.outstanding([ours("DATA", "violation")], HOOKS)  # type: ignore[arg-type]
    assert not oracle.outstanding([ours("DATA", "violation"), peer("ERROR")], HOOKS)  # type: ignore[arg-type]
    assert not oracle.outstanding([ours("HELLO"), ("end", 1, "closed")], HOOKS)  # type: ignore[arg-type]


# --- shrinking, budget, graph -----------------------------------------------------------------


def test_shrinking_keeps_what_the_finding_needs_and_moves_an_insert_early() -> None:
    noise = Edit("duplicate", 5, text="BYE twice")
    restart = Edit("insert", 3, name="RESTART", data=b"R", text="RESTART inserted before DATA #3")
    tries: list[Mutant] = []

    def gives(m: Mutant) -> bool:
        tries.append(m)
        return any(e.kind == "insert" for e in m.edits)

    small = shrink(Mutant(0, (noise, restart)), SEED, "client", gives, seconds=30)  # type: ignore[arg-type]
    assert [e.kind for e in small.edits if e.kind != "drop"] == ["insert"]
    assert small.edits[0].at == 0 and small.edits[0].text.endswith("before HELLO #0")
    assert small.removed  # the units not needed left out
    assert len(tries) < 40


def test_shrinking_stops_at_its_deadline() -> None:
    calls = []
    small = shrink(
        Mutant(0, (Edit("drop", 2, text="d"),)), SEED, "client", lambda m: calls.append(m) or True, seconds=0
    )  # type: ignore[arg-type]
    assert small == Mutant(0, (Edit("drop", 2, text="d"),)) and calls == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90s", (90.0, None)), ("5m", (300.0, None)), ("1h", (3600.0, None)), ("500", (None, 500))],
)
def test_the_budget_is_a_time_or_a_number_of_executions(text, expected) -> None:
    from wallaroo_proto_cli.fuzz import parse_budget

    assert parse_budget(text) == expected


def test_the_state_graph_counts_edges_and_says_when_one_is_new() -> None:
    graph = StateGraph()
    assert graph.add({("start", "HELLO", "OK")})
    assert not graph.add({("start", "HELLO", "OK")})
    assert graph.dot() == 'digraph states {\n  rankdir=LR;\n  "start" -> "OK" [label="HELLO (2)"];\n}\n'


def test_the_default_hooks_know_nothing_and_patch_integers_in_place() -> None:
    from wallaroo_proto.fuzz import hooks as defaults

    assert defaults.fields({}, b"") == [] and defaults.templates("x") == {} and defaults.owed({}) is None
    assert with_value({}, b"\x00\x01\x02", Field("f", "uint", 1, 8, 1), 0x1FF) == b"\x00\xff\x02"
    assert Hooks("wallaroo").owed({"type": "HELLO"}) == Owed(frozenset({"OK", "ERROR"}))


def test_an_illegal_frame_we_reset_right_after_is_no_finding() -> None:
    """The peer had no time to refuse it: our reset came first."""
    events = [ours("HELLO"), peer("OK"), ours("HELLO", "violation"), ("we-end", 1, "reset")]
    assert kinds(oracle.judge(events, HOOKS, "server")) == []  # type: ignore[arg-type]


def test_after_the_peer_s_own_error_reply_its_reset_and_unanswered_frames_are_no_finding() -> None:
    """It refused what the core finds legal (it knows what the core does not: a vote it cast)."""
    events = [ours("HELLO"), peer("ERROR"), ("end", 1, "reset")]
    assert kinds(oracle.judge(events, HOOKS, "server")) == []  # type: ignore[arg-type]


def test_a_frame_inserted_before_a_dropped_one_still_goes() -> None:
    """Shrinking drops the frame an insert went before: the insert must stay."""
    both = (Edit("insert", 2, name="X", data=b"X!", text="X"), Edit("drop", 2, text="d"))
    steps = mutate.steps(Mutant(0, both), SEED, "client", HOOKS)  # type: ignore[arg-type]
    assert [s.type for s in steps] == ["HELLO", "OK", "X", "DATA", "ACK", "BYE"]


# --- the peer's process ----------------------------------------------------------------------


@pytest.mark.e2e
def test_a_spawned_peer_s_memory_beyond_max_rss_and_its_exit_are_findings() -> None:
    import sys

    from wallaroo_proto.fuzz.peer import PeerProcess, rss_mib

    sleeper = f"{sys.executable} -c 'import time; time.sleep(60)'"
    peer = PeerProcess(sleeper, "client", max_rss=0.5)  # any Python is past half a MiB
    peer.before()
    try:
        deadline = time.monotonic() + 60
        while rss_mib(peer.process.pid) <= 0.5:  # the interpreter is still starting
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert "beyond --max-rss 0.5" in (peer.after() or "")
    finally:
        peer.stop()
    exits = PeerProcess(f"{sys.executable} -c 'raise SystemExit(3)'", "client")
    exits.before()
    exits.process.wait(timeout=60)
    assert exits.after() == "the peer's process exited with status 3"


@pytest.mark.e2e
def test_a_pipe_peer_written_to_after_our_half_close_takes_nothing_and_raises_nothing() -> None:
    """Fuzz half-closes a stdin peer, then the adapter may still owe it an answer."""
    import sys

    from wallaroo_proto.replay.links import SpawnLink

    link = SpawnLink(
        f"{sys.executable} -c 'import sys; sys.stdin.read()'", ("127.0.0.1", 1), ("127.0.0.1", 2)
    )
    link.shutdown_write()
    assert link.send(memoryview(b"late")) == 4
    link.close()


def test_an_illegal_frame_completed_only_after_the_peer_ended_is_no_finding() -> None:
    """A message whose size asked for bytes that came after the peer had closed (an AMBROSIA IC
    reading a checkpoint's tail as a message): the peer never took it, so it accepted nothing."""
    events = [
        ours("HELLO"),
        peer("OK"),
        ("end", 1, "closed"),
        ours("DATA", "violation"),
        ("we-end", 1, "closed"),
    ]
    assert kinds(oracle.judge(events, HOOKS, "server")) == []  # type: ignore[arg-type]
