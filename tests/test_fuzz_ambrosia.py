"""``fuzz`` for AMBROSIA: the hooks against bytes written by hand, and a planted rule break found.

The golden bytes are the protocol notes' examples (committer id 0x12345678), written by hand:
the TakeCheckpoint control record ``78563412 1a000000 fb747b895a9033f8 ffffffffffffffff 0202``,
a record of two self calls (method 3, Fork, ``{}``), an LB's RPC to "server", an RPCBatch and
a Checkpoint of 3 bytes.

The planted break is mock-lb's, behind ``WALLAROO_PROTO_PLANT=lb-checkpoint-twice`` (a test-only
switch, read in ``lb.MockLB``): it answers a plain TakeCheckpoint with two Checkpoints, the
second unsolicited.
"""

from __future__ import annotations

import json
import os
import re
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import COMMAND, Server, run_cli
from xxhash import xxh64_intdigest

from wallaroo_proto.fuzz.hooks import Hooks
from wallaroo_proto.fuzz.oracle import judge
from wallaroo_proto.protocols.ambrosia import codec
from wallaroo_proto.protocols.ambrosia.core import IC, LB, Session
from wallaroo_proto.replay.recording import Frame

TAKE_CHECKPOINT = bytes.fromhex("78563412 1a000000 fb747b895a9033f8 ffffffffffffffff 0202")
SELF_CALLS = bytes.fromhex(
    "78563412 26000000 fe60ab7cdfe89249 0000000000000000 0c000006017b7d 0c000006017b7d"
)
RPC_TO_SERVER = bytes.fromhex("1a 00 0c 736572766572 00 06 01 7b7d")
BATCH = bytes.fromhex("24 05 04 0e00000006017b7d 0e00000006017b7d")
CHECKPOINT = bytes.fromhex("04 08 06")

HOOKS = Hooks("ambrosia")
IC_RECORD = {"sender": IC, "type": "Record", "seq_id": 0}
IC_CONTROL = {"sender": IC, "type": "TakeCheckpoint", "seq_id": -1}


def by_name(record: dict, raw: bytes) -> dict[str, tuple[int, int | None]]:
    return {f.name: (f.value, f.offset) for f in HOOKS.fields(record, raw)}


def test_a_control_records_fields_where_the_notes_put_them():
    assert by_name(IC_CONTROL, TAKE_CHECKPOINT) == {
        "committer_id": (0x12345678, 0),
        "record_size": (26, 4),
        "check_bytes": (0xF833905A897B74FB, 8),
        "seq_id": ((1 << 64) - 1, 16),
        "message_size": (1, 24),
        "message_type": (2, 25),
    }


def test_a_records_first_rpc_fields():
    found = by_name(IC_RECORD, SELF_CALLS)
    assert found["record_size"] == (0x26, 4)
    assert found["seq_id"] == (0, 16)
    assert found["message_size"] == (6, 24)
    assert found["message_type"] == (0, 25)
    assert found["method_id"] == (3, 27)  # after the reserved byte at 26
    assert found["rpc_type"] == (1, 28)


def test_an_lb_messages_fields():
    rpc = by_name({"sender": LB, "type": "RPC"}, RPC_TO_SERVER)
    assert rpc == {
        "message_size": (13, 0),
        "message_type": (0, 1),
        "destination_length": (6, 2),
        "method_id": (3, 10),
        "rpc_type": (1, 11),
    }
    assert by_name({"sender": LB, "type": "RPCBatch"}, BATCH)["batch_count"] == (2, 2)
    assert by_name({"sender": LB, "type": "Checkpoint"}, CHECKPOINT)["checkpoint_length"] == (3, 2)
    assert HOOKS.fields({"sender": LB, "type": "CheckpointBytes"}, b"abc") == []


def field(record: dict, raw: bytes, name: str):
    return next(f for f in HOOKS.fields(record, raw) if f.name == name)


def test_a_body_field_is_re_encoded_with_the_records_size_and_check_bytes():
    changed = HOOKS.with_value(IC_RECORD, SELF_CALLS, field(IC_RECORD, SELF_CALLS, "method_id"), 100)
    # method 100 is the two-byte ZigZag c8 01: the first RPC grows by one byte, so does the record
    body = bytes.fromhex("0e0000c801017b7d 0c000006017b7d")
    assert (
        changed
        == bytes.fromhex("78563412 27000000") + xxh64_intdigest(body).to_bytes(8, "little") + bytes(8) + body
    )
    assert by_name(IC_RECORD, changed)["method_id"] == (100, 27)
    judged = Session().feed(IC, (codec.read_header(changed), changed[24:]))
    assert [v for v in judged.violations if not v.startswith("start-sequence")] == []  # alone, a record 0


def test_a_header_field_is_patched_in_place():
    changed = HOOKS.with_value(IC_RECORD, SELF_CALLS, field(IC_RECORD, SELF_CALLS, "seq_id"), 5)
    assert changed == SELF_CALLS[:16] + bytes.fromhex("0500000000000000") + SELF_CALLS[24:]


def test_an_lb_messages_size_is_written_as_given():
    record = {"sender": LB, "type": "Checkpoint"}
    assert HOOKS.with_value(record, CHECKPOINT, field(record, CHECKPOINT, "message_size"), 64) == (
        bytes.fromhex("80 01 08 06")
    )
    changed = HOOKS.with_value(record, CHECKPOINT, field(record, CHECKPOINT, "checkpoint_length"), 64)
    assert changed == bytes.fromhex("06 08 80 01")


def test_what_is_owed_and_how_a_peer_refuses():
    asks = ("TakeCheckpoint", "TakeBecomingPrimaryCheckpoint", "UpgradeTakeCheckpoint")
    for kind in asks:
        assert HOOKS.owed({"sender": IC, "type": kind, "seq_id": -1}).types == {"Checkpoint"}
    assert HOOKS.owed({"sender": IC, "type": "Record", "seq_id": 3}) is None
    assert HOOKS.owed({"sender": IC, "type": "BecomingPrimary", "seq_id": -1}) is None
    assert HOOKS.owed({"sender": LB, "type": "TakeCheckpoint"}).types == {"TakeCheckpoint"}
    assert HOOKS.owed({"sender": LB, "type": "TakeCheckpoint", "ic_asked": "TakeCheckpoint"}) is None
    assert HOOKS.owed({"sender": LB, "type": "RPC"}) is None
    assert not HOOKS.refusal({"sender": LB, "type": "Checkpoint"})
    assert not HOOKS.REPLY_BEFORE_CLOSE
    assert {IC} == HOOKS.REFUSE_BY_EXIT


def test_templates_decode_as_the_type_they_are_named():
    for name, raw in HOOKS.templates(IC).items():
        header = codec.read_header(raw)
        messages = codec.record_messages(raw[24 : header.size])
        if header.seq == -1:
            assert [m.name for m in messages] == [name]
        elif header.seq == -2:
            assert name == "CheckpointRecord" and [m.name for m in messages] == ["Checkpoint"]
        else:
            assert name == "Record" and header.check == xxh64_intdigest(raw[24:])
    for name, raw in HOOKS.templates(LB).items():
        message, end = codec.read_message(raw, 0, len(raw))
        assert (message.name, end) == (name, len(raw))


def test_an_inserted_record_carries_the_committer_and_next_id_of_the_frame_it_goes_before():
    """Fitted, an inserted record is out of state and nothing else: the seed's committer id (a
    committer-changed break otherwise), a normal record the id the frame it precedes has."""
    before = Frame(0, IC_RECORD, SELF_CALLS[:16] + bytes.fromhex("0500000000000000") + SELF_CALLS[24:])
    record = HOOKS.fit(HOOKS.templates(IC)["Record"], before)
    body = codec.encode_incoming_rpc(1, codec.FORK, b'{"value":1}')
    assert (
        record
        == bytes.fromhex("78563412")
        + (24 + len(body)).to_bytes(4, "little")
        + xxh64_intdigest(body).to_bytes(8, "little")
        + bytes.fromhex("0500000000000000")
        + body
    )
    ask = HOOKS.fit(HOOKS.templates(IC)["TakeCheckpoint"], before)
    assert ask == TAKE_CHECKPOINT
    control = HOOKS.fit(HOOKS.templates(IC)["Record"], Frame(0, IC_CONTROL, TAKE_CHECKPOINT))
    assert control[:4] == bytes.fromhex("78563412") and control[16:24] == bytes(8)  # no id to follow
    assert HOOKS.fit(RPC_TO_SERVER, Frame(0, {"sender": LB, "type": "RPC"}, CHECKPOINT)) == RPC_TO_SERVER
    session = Session()
    session.feed(IC, (codec.read_header(TAKE_CHECKPOINT), TAKE_CHECKPOINT[24:]))
    assert "committer-changed" not in str(session.feed(IC, (codec.read_header(ask), ask[24:])).violations)


def test_two_plays_whose_lb_batched_its_self_calls_otherwise_are_alike():
    """mock-lb sends the self calls of one read in one RPCBatch, one call alone: how its reads fall
    decides, so a seed's plays differ in that and nothing else, and are steady."""
    ask = ("ours", {"sender": IC, "type": "TakeCheckpoint", "verdict": "accepted", "seq_id": -1})
    answer = [("peer", {"sender": LB, "type": t}) for t in ("Checkpoint", "CheckpointBytes")]
    ends = [("end", 0, "closed"), ("end", 1, "closed")]

    def played(*kinds: str):
        calls = [("peer", {"sender": LB, "type": t, "verdict": "accepted"}) for t in kinds]
        return judge([ask, *answer, *calls, ask, *answer, *ends], HOOKS, LB).signature

    assert played("RPCBatch") == played("RPC", "RPCBatch") == played("RPCBatch", "RPCBatch")
    assert played("RPCBatch") != played()


FRAMES = [
    (IC_CONTROL, TAKE_CHECKPOINT),
    (IC_RECORD, SELF_CALLS),
    (IC_RECORD, codec.encode_record(7, 1, codec.encode_batch([SELF_CALLS[24:31]] * 2, replayable=2))),
    ({"sender": IC, "type": "CheckpointRecord", "seq_id": -2}, codec.checkpoint_record(7, b"")),
    ({"sender": LB, "type": "RPC"}, RPC_TO_SERVER),
    ({"sender": LB, "type": "RPCBatch"}, BATCH),
    ({"sender": LB, "type": "Checkpoint"}, CHECKPOINT),
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FRAMES), st.data(), st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_any_value_in_any_field_still_splits_and_is_judged(frame, data, value):
    record, raw = frame
    chosen = data.draw(st.sampled_from(HOOKS.fields(record, raw)))
    changed = HOOKS.with_value(record, raw, chosen, value % (1 << chosen.bits))
    splitter = codec.RecordSplitter() if record["sender"] == IC else codec.MessageSplitter()
    session = Session()
    for piece in splitter.feed(changed):  # never raises: a bad frame is Garbage, judged by the rules
        if type(piece) is codec.RecordFrame:
            session.feed(IC, (piece.header, piece.body))
        elif type(piece) is codec.MessageFrame:
            session.feed(LB, piece.message)


# --- end to end: our mock-lb fuzzed, the plant found --------------------------------------------------

PORTS = re.compile(r"receive port (\d+), send port (\d+)")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    """A first start of mock-ic with mock-lb, recorded: TakeCheckpoint every 2 records."""
    path = tmp_path_factory.mktemp("fuzz-ambrosia") / "seed.pcap"
    ic = Server(
        "ambrosia", "mock-ic", "--exit-when-done", "--rpcs", "30", "--batch", "10",
        "--checkpoint-every", "2", "--record", str(path),
    )  # fmt: skip
    rport, sport = map(int, PORTS.search(ic.lines[-1]).groups())
    with ic:
        lb = run_cli("ambrosia", "mock-lb", "-q", "--connect", f"127.0.0.1:{rport}",
                     "--send-connect", f"127.0.0.1:{sport}")  # fmt: skip
        assert lb.returncode == 0, lb.stderr
        code, _, err = ic.stop(sig=None)
        assert code == 0, err
    return path


def fuzz_mock_lb(seed, findings, *extra: str, plant: str | None = None):
    rport, sport = free_ports(2)
    lb = " ".join(
        [*COMMAND, "ambrosia", "mock-lb", "-q", "--connect", f"127.0.0.1:{rport}"]
        + ["--send-connect", f"127.0.0.1:{sport}"]
    )
    env = {k: v for k, v in os.environ.items() if k != "WALLAROO_PROTO_PLANT"}
    if plant:
        env["WALLAROO_PROTO_PLANT"] = plant
    args = ["--play", "ic", "--listen", f"127.0.0.1:{rport}", "--listen", f"127.0.0.1:{sport}"]
    args += ["--spawn", lb, "--findings", str(findings), "--answer-timeout", "1"]
    return run_cli("fuzz", *args, *extra, timeout=600, env=env), args


@pytest.mark.e2e
def test_the_planted_double_checkpoint_is_found_shrunk_and_rerun(seed, tmp_path):
    findings = tmp_path / "findings"
    done, args = fuzz_mock_lb(
        seed, findings, "--seeds", str(seed), "--budget", "8", "--seed", "7", "--format", "json",
        plant="lb-checkpoint-twice",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    found = [f for f in summary["findings"] if f["kind"] == "violation"]
    assert found and all("unsolicited-checkpoint" in f["reaction"] for f in found), summary
    reproducer = found[0]["reproducer"]
    assert found[0]["deterministic"] and found[0]["frames"] <= 20
    assert run_cli("dissect", reproducer).returncode in (0, 1)
    env = {**os.environ, "WALLAROO_PROTO_PLANT": "lb-checkpoint-twice"}
    rerun = run_cli("fuzz", "--rerun", reproducer, *args[: args.index("--findings")], env=env)
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert "unsolicited-checkpoint" in rerun.stdout


@pytest.mark.e2e
def test_without_the_plant_mock_lb_breaks_no_rule(seed, tmp_path):
    """30 executions reach the IC's second checkpoint request while one is outstanding (inserted), which
    mock-lb answers too: the IC's break, not a second answer unsolicited."""
    done, _ = fuzz_mock_lb(
        seed, tmp_path / "findings", "--seeds", str(seed), "--budget", "30", "--seed", "7", "--format", "json"
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["executions"] >= 30 and not summary["unsteady_seeds"], summary
    assert [f for f in summary["findings"] if f["kind"] == "violation"] == [], summary


@pytest.mark.e2e
def test_mock_ic_started_afresh_each_case_breaks_no_rule(seed, tmp_path):
    """fuzz plays the LB against mock-ic, stopped and started again before each case (--reset-cmd):
    else every LB after the first would get a recovery, and no two plays would be alike."""
    rport, sport = free_ports(2)
    ic = " ".join(
        [*COMMAND, "ambrosia", "mock-ic", "-q", "--listen", f"127.0.0.1:{rport}"]
        + ["--send-listen", f"127.0.0.1:{sport}", "--rpcs", "30", "--batch", "10", "--checkpoint-every", "2"]
    )
    done = run_cli(
        "fuzz", "--seeds", str(seed), "--play", "lb", "--connect", f"127.0.0.1:{rport}",
        "--connect", f"127.0.0.1:{sport}", "--spawn", ic, "--reset-cmd", "true", "--answer-timeout", "1",
        "--findings", str(tmp_path / "findings"), "--budget", "20", "--seed", "7", "--format", "json",
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["executions"] >= 20 and not summary["unsteady_seeds"] and not summary["findings"]


def test_an_lb_going_on_after_an_illegal_ic_record_is_tolerated_but_not_the_other_way() -> None:
    """Bindings trust their IC (nobody on the LB side verifies check bytes); an IC must refuse."""
    from wallaroo_proto.fuzz import oracle

    hooks = Hooks("ambrosia")
    ic_bad = [
        ("ours", {"type": "Record", "sender": "ic", "verdict": "violation", "violations": ["check-bytes"]})
    ]
    assert oracle.judge([*ic_bad, ("we-end", 1, "closed")], hooks, "lb").findings == []
    lb_bad = [("ours", {"type": "RPC", "sender": "lb", "verdict": "violation", "violations": ["x"]})]
    assert [f.kind for f in oracle.judge([*lb_bad, ("we-end", 1, "closed")], hooks, "ic").findings] == [
        "accepted"
    ]
