"""The AMBROSIA replay adapter, sans-IO: golden bytes from the protocol notes (§7 of
shared/protocols/ambrosia.md), and the sample captures' conversations."""

from __future__ import annotations

import struct
from pathlib import Path

import xxhash

from wallaroo_proto.replay import adapter as adapters
from wallaroo_proto.replay.adapter import Hold
from wallaroo_proto.replay.recording import Frame, find

CAPTURES = Path(__file__).resolve().parents[1] / "captures"

# committer id 0x12345678; control records hold one body-less message (size 1, type)
TAKE_BECOMING_PRIMARY = bytes.fromhex("78563412 1a000000 c7f179c2cb842dda ffffffffffffffff 020b")
TAKE_CHECKPOINT = bytes.fromhex("78563412 1a000000 fb747b895a9033f8 ffffffffffffffff 0202")
#: record 0 with two incoming self RPCs (method 3, Fork, args {})
RECORD_0 = bytes.fromhex("78563412 26000000 fe60ab7cdfe89249 0000000000000000 0c000006017b7d 0c000006017b7d")
#: the recovery checkpoint record for 5 bytes, and the bytes
CHECKPOINT_RECORD = bytes.fromhex("78563412 1b000000 0000000000000000 feffffffffffffff 04080a")
INITIAL = bytes.fromhex("0c 09 322e302e31")  # InitialMessage "2.0.1"
CHECKPOINT_3 = bytes.fromhex("04 08 06")  # Checkpoint of 3 bytes (they follow outside it)
SELF_RPC = bytes.fromhex("0e 00 00 00 06 01 7b7d")  # LB outgoing self RPC, method 3, Fork, {}


def record(header_committer: int, seq: int, body: bytes) -> bytes:
    """A log record written out by hand (IntFixed, IntFixed, xxHash64 of the body, LongFixed)."""
    return struct.pack("<iiQq", header_committer, 24 + len(body), xxhash.xxh64_intdigest(body), seq) + body


def frame(index: int, kind: str, raw: bytes, **fields) -> Frame:
    return Frame(index, {"type": kind, "packet": index + 1, **fields}, raw)


def ambrosia(side: str):
    return adapters.make("ambrosia", side)


# --- playing the IC -------------------------------------------------------------------------------


def test_a_record_waits_for_the_checkpoint_asked_for_and_all_its_bytes():
    ic = ambrosia("ic")
    assert (
        ic.outgoing(frame(0, "TakeBecomingPrimaryCheckpoint", TAKE_BECOMING_PRIMARY)) == TAKE_BECOMING_PRIMARY
    )
    assert isinstance(ic.outgoing(frame(4, "Record", RECORD_0)), Hold)
    ic.incoming({"type": "InitialMessage"}, INITIAL)
    assert isinstance(ic.outgoing(frame(4, "Record", RECORD_0)), Hold)
    ic.incoming({"type": "Checkpoint"}, CHECKPOINT_3)
    held = ic.outgoing(frame(4, "Record", RECORD_0))
    assert isinstance(held, Hold) and "checkpoint" in held.reason
    ic.incoming({"type": "CheckpointBytes"}, b"abc")
    assert ic.outgoing(frame(4, "Record", RECORD_0)) == RECORD_0
    # a later TakeCheckpoint quiesces the IC again; control records still go
    assert ic.outgoing(frame(5, "TakeCheckpoint", TAKE_CHECKPOINT)) == TAKE_CHECKPOINT
    assert isinstance(
        ic.outgoing(frame(6, "Record", record(0x12345678, 1, bytes.fromhex("0c000006017b7d")))), Hold
    )


def test_the_first_record_echoes_the_live_lbs_initial_message():
    recorded_body = bytes.fromhex("0c 09 322e302e31") + bytes.fromhex("0c000006017b7d")
    live_body = bytes.fromhex("08 09 392e39") + bytes.fromhex("0c000006017b7d")  # "9.9": size 4, zig-zag 8
    recorded = record(0x12345678, 0, recorded_body)
    ic = ambrosia("ic")
    ic.outgoing(frame(0, "TakeBecomingPrimaryCheckpoint", TAKE_BECOMING_PRIMARY))
    ic.incoming({"type": "InitialMessage"}, bytes.fromhex("08 09 392e39"))
    ic.incoming({"type": "Checkpoint"}, bytes.fromhex("04 08 00"))  # of 0 bytes: none owed
    assert ic.outgoing(frame(4, "Record", recorded)) == record(0x12345678, 0, live_body)


def test_a_record_echoing_the_same_initial_message_goes_as_recorded():
    recorded = record(0x12345678, 0, INITIAL)
    ic = ambrosia("ic")
    ic.outgoing(frame(0, "TakeBecomingPrimaryCheckpoint", TAKE_BECOMING_PRIMARY))
    ic.incoming({"type": "InitialMessage"}, INITIAL)
    ic.incoming({"type": "Checkpoint"}, bytes.fromhex("04 08 00"))
    assert ic.outgoing(frame(4, "Record", recorded)) == recorded


def test_the_recovery_checkpoint_and_its_bytes_go_as_recorded():
    ic = ambrosia("ic")
    assert ic.outgoing(frame(0, "CheckpointRecord", CHECKPOINT_RECORD)) == CHECKPOINT_RECORD
    assert ic.outgoing(frame(1, "CheckpointBytes", b"12345")) == b"12345"
    replayed = record(0x12345678, 2, bytes.fromhex("0c000006017b7d"))
    assert ic.outgoing(frame(2, "Record", replayed)) == replayed  # the replay asks for nothing


# --- playing the LB -------------------------------------------------------------------------------


def test_initial_message_and_checkpoint_wait_for_the_live_ics_first_start():
    lb = ambrosia("lb")
    assert isinstance(lb.outgoing(frame(1, "InitialMessage", INITIAL)), Hold)
    lb.incoming({"type": "TakeBecomingPrimaryCheckpoint"}, TAKE_BECOMING_PRIMARY)
    assert lb.outgoing(frame(1, "InitialMessage", INITIAL)) == INITIAL
    assert lb.outgoing(frame(2, "Checkpoint", CHECKPOINT_3)) == CHECKPOINT_3
    assert lb.outgoing(frame(3, "CheckpointBytes", b"abc")) == b"abc"
    assert lb.outgoing(frame(5, "RPC", SELF_RPC)) == SELF_RPC
    held = lb.outgoing(frame(6, "Checkpoint", CHECKPOINT_3))  # nobody asked for this one
    assert isinstance(held, Hold) and "asked" in held.reason
    lb.incoming({"type": "TakeCheckpoint"}, TAKE_CHECKPOINT)
    assert lb.outgoing(frame(6, "Checkpoint", CHECKPOINT_3)) == CHECKPOINT_3


def test_a_recovery_is_not_a_first_start():
    lb = ambrosia("lb")
    lb.incoming({"type": "CheckpointRecord"}, CHECKPOINT_RECORD)
    held = lb.outgoing(frame(1, "InitialMessage", INITIAL))
    assert isinstance(held, Hold) and "replay" in held.reason


def expected_record(index: int, seq: int, committer: int = 0x12345678, kind: str = "Record") -> Frame:
    return frame(index, kind, b"", seq_id=seq, committer_id=committer, check_bytes="00")


def test_the_live_ics_committer_id_stands_for_the_recorded_one():
    lb = ambrosia("lb")
    before = lb.expected(expected_record(0, -1, kind="TakeBecomingPrimaryCheckpoint"))
    first = lb.expected(expected_record(4, 0))
    assert first["committer_id"] == 0x12345678  # not known yet
    live = bytes.fromhex("07000000") + TAKE_BECOMING_PRIMARY[4:]  # committer 7, same control record
    lb.incoming({"type": "TakeBecomingPrimaryCheckpoint"}, live)
    assert (before["committer_id"], before["seq_id"]) == (7, -1)
    assert (first["committer_id"], first["seq_id"]) == (7, 0)  # a first start numbers from 0
    later = lb.expected(expected_record(5, 1))
    assert (later["committer_id"], later["seq_id"]) == (7, 1)
    assert later["check_bytes"] == "00"  # the body's hash: whoever commits it


def test_a_live_recovery_numbers_on_from_its_own_log():
    lb = ambrosia("lb")
    lb.expected(expected_record(0, -2, kind="CheckpointRecord"))
    replayed = lb.expected(expected_record(2, 2))
    lb.incoming({"type": "CheckpointRecord"}, bytes.fromhex("09000000") + CHECKPOINT_RECORD[4:])
    assert replayed["seq_id"] == 2  # the live log's numbering is not known before its first record
    live_record = struct.pack("<iiQq", 9, 24, xxhash.xxh64_intdigest(b""), 40)
    lb.incoming({"type": "Record"}, live_record)
    assert (replayed["committer_id"], replayed["seq_id"]) == (9, 40)
    assert lb.expected(expected_record(3, 3))["seq_id"] == 41


def test_the_lbs_rpcs_are_compared_one_by_one_batched_or_not():
    ic = ambrosia("ic")
    common = {"sender": "lb", "verdict": "accepted", "phase": "normal"}
    alone = {"type": "RPC", "packet": 8, "rpc_count": 1, "length": 8, **common}
    batch = {"type": "RPCBatch", "packet": 9, "rpc_count": 2, "length": 18, **common}
    rpc = {
        "destination": "",
        "method_id": 3,
        "rpc_type": "fork",
        "rpc_count": 1,
        "length": 8,
        "args_xxh64": f"{xxhash.xxh64_intdigest(b'{}'):016x}",
    }
    assert ic.expected(Frame(7, alone, SELF_RPC)) == [{**alone, **rpc}]
    # "24 05 04" an RPCBatch (size 18) of 2 messages, each the self RPC above
    parts = ic.units(batch, bytes.fromhex("24 05 04 0e00000006017b7d 0e00000006017b7d"))
    assert parts == [{**batch, **rpc, "type": "RPC"}] * 2
    assert ic.units({**batch, "sender": "ic"}, b"") == [{**batch, "sender": "ic"}]  # not the LB's


def test_a_batchs_violation_goes_with_its_first_rpc():
    ic = ambrosia("ic")
    batch = {"type": "RPCBatch", "sender": "lb", "verdict": "violation", "violations": ["batch: x"]}
    first, second = ic.units(batch, bytes.fromhex("24 05 04 0e00000006017b7d 0e00000006017b7d"))
    assert (first["verdict"], first["violations"]) == ("violation", ["batch: x"])
    assert second["verdict"] == "accepted" and "violations" not in second


def test_noise_is_where_not_what():
    noise = adapters.noise("ambrosia")
    assert {"lb", "direction", "ts", "packet"} <= noise
    assert not {"committer_id", "seq_id", "check_bytes", "record_size", "length", "type"} & noise


# --- the recorded conversation --------------------------------------------------------------------


def test_an_lbs_two_sockets_are_one_conversation_the_lb_opened_receive_port_first():
    conversation = find(CAPTURES / "ambrosia-first-start.pcap")
    assert [c.conn_index for c in conversation.connections] == [2, 1]  # receive socket, then send
    assert {c.initiator_side for c in conversation.connections} == {"lb"}
    assert conversation.side_named("client") == "lb" and conversation.side_named("server") == "ic"
    assert conversation.frames == 35  # every frame of both sockets (dissect: 35 rows)


def test_malformed_bytes_are_the_judges_not_the_adapters():
    lb, ic = ambrosia("lb"), ambrosia("ic")
    lb.incoming({"type": "Record"}, b"\x01\x02")
    ic.incoming({"type": "RPC"}, b"\xff")
    assert lb.outgoing(frame(0, "INVALID", b"\xff\xff")) == b"\xff\xff"
