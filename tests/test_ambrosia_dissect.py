"""dissect and spark-replay read an LB's two AMBROSIA sockets as one pair: samples and hand-written bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_cli

from wallaroo_proto.capture.dissector import dissect
from wallaroo_proto.pcap_writer import PcapWriter

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
H = bytes.fromhex

# The notes' example bytes (committer id 0x12345678), written out by hand.
TBPC = H("78563412 1a000000 c7f179c2cb842dda ffffffffffffffff 020b")
INITIAL = H("0c 09 322e302e31")
CHECKPOINT_3 = H("04 08 06") + b"abc"
RECORD_0 = H("78563412 26000000 fe60ab7cdfe89249 0000000000000000 0c000006017b7d 0c000006017b7d")
SELF_RPC = H("0e 00 00 00 06 01 7b7d")
#: Record 1, same two RPCs, one check byte wrong.
RECORD_1_BAD = H("78563412 26000000 fe60ab7cdfe89248 0100000000000000 0c000006017b7d 0c000006017b7d")


def hand_written(
    path: Path, rport: int = 40000, sport: int = 40001, *, bad: bool = False, segment_size: int = 65_000
) -> Path:
    with PcapWriter(path) as w:
        t = 1_763_700_000.0
        rsock = w.tcp_session(
            ("127.0.0.1", 51000), ("127.0.0.1", rport), timestamp=t, segment_size=segment_size
        )
        ssock = w.tcp_session(
            ("127.0.0.1", 51001), ("127.0.0.1", sport), timestamp=t + 0.001, segment_size=segment_size
        )
        ssock.send(False, TBPC, t + 0.002)
        rsock.send(True, INITIAL, t + 0.003)
        rsock.send(True, CHECKPOINT_3, t + 0.004)
        ssock.send(False, RECORD_0, t + 0.005)
        rsock.send(True, SELF_RPC, t + 0.006)
        if bad:
            ssock.send(False, RECORD_1_BAD, t + 0.007)
        ssock.close(False, t + 0.008)
        rsock.close(False, t + 0.009)
    return path


def by_type(records: list[dict]) -> list[tuple[str, str, str]]:
    return [(r["sender"], r["type"], r["verdict"]) for r in records]


def test_hand_written_pair_on_any_ports(tmp_path):
    records, dissector = dissect(hand_written(tmp_path / "a.pcap"))
    assert by_type(records) == [
        ("ic", "TakeBecomingPrimaryCheckpoint", "accepted"),
        ("lb", "InitialMessage", "accepted"),
        ("lb", "Checkpoint", "accepted"),
        ("lb", "CheckpointBytes", "accepted"),
        ("ic", "Record", "accepted"),
        ("lb", "RPC", "accepted"),
    ]
    record0 = records[4]
    assert (record0["seq_id"], record0["committer_id"], record0["rpc_count"]) == (0, 0x12345678, 2)
    assert record0["check_bytes"] == "4992e8df7cab60fe"
    assert records[3]["checkpoint_length"] == 3 and records[3]["offset"] == 10  # after the 7 + 3 bytes
    assert (
        records[5]["destination"] == "" and records[5]["method_id"] == 3 and records[5]["rpc_type"] == "fork"
    )
    assert len({r["lb"] for r in records}) == 1  # both sockets, one pair
    assert {r["ambrosia_socket"] for r in records} == {"send", "receive"}
    assert dissector.violations() == 0
    assert all(s["paired"] for s in dissector.summaries())


def test_a_wrong_check_byte_is_a_violation(tmp_path):
    records, dissector = dissect(hand_written(tmp_path / "b.pcap", bad=True))
    [bad] = [r for r in records if r["verdict"] == "violation"]
    assert bad["seq_id"] == 1
    assert bad["violations"] == [
        "check-bytes: check bytes 0x4892e8df7cab60fe, the body's are 0x4992e8df7cab60fe"
    ]


def test_the_node_default_ports_need_no_detection(tmp_path):
    records, _ = dissect(hand_written(tmp_path / "c.pcap", 2000, 2001))
    assert len(records) == 6 and {r["protocol"] for r in records} == {"ambrosia"}


@pytest.mark.parametrize("ports", [(2000, 2001), (40000, 40001)], ids=["default-ports", "any-ports"])
@pytest.mark.parametrize("segment_size", [1, 5, 25])
def test_the_pair_in_tiny_segments_reads_as_in_whole_ones(tmp_path, ports, segment_size):
    """Which socket a connection is, and its protocol, wait for enough bytes, however they are cut."""
    whole, _ = dissect(hand_written(tmp_path / "w.pcap", *ports, bad=True))
    cut, dissector = dissect(hand_written(tmp_path / "c.pcap", *ports, bad=True, segment_size=segment_size))
    assert by_type(cut) == by_type(whole)
    assert [r["ambrosia_socket"] for r in cut] == [r["ambrosia_socket"] for r in whole]
    assert [r.get("violations") for r in cut] == [r.get("violations") for r in whole]
    assert dissector.violations() == 1  # the wrong check byte, nothing else


def test_sample_first_start():
    records, dissector = dissect(CAPTURES / "ambrosia-first-start.pcap")
    assert dissector.violations() == 0
    assert records[0]["type"] == "TakeBecomingPrimaryCheckpoint"
    ic_records = [r for r in records if r["type"] == "Record"]
    assert [r["seq_id"] for r in ic_records] == list(range(len(ic_records)))
    assert "InitialMessage" in ic_records[0]["message_types"]  # the echo
    assert sum(r["rpc_count"] for r in ic_records) == 60 + 12  # the input and the self calls


def test_sample_recovery_shows_the_replay():
    records, dissector = dissect(CAPTURES / "ambrosia-recovery.pcap")
    assert dissector.violations() == 0
    assert records[0]["type"] == "CheckpointRecord" and records[0]["seq_id"] == -2
    verdicts = [r["verdict"] for r in records if r["type"] == "Record"]
    assert verdicts[:2] == ["replayed", "replayed"] and set(verdicts[2:]) == {"accepted"}
    summary = dissector.summaries()[0]
    assert summary["start"] == "recovery" and summary["replayed"] == 2


def test_sample_faults():
    records, dissector = dissect(CAPTURES / "ambrosia-faults.pcap")
    reasons = [v for r in records for v in r.get("violations", ())]
    assert [v.split(":")[0] for v in reasons] == ["check-bytes", "sequence-gap"]


def test_dissect_cli_summary_and_jsonl():
    path = str(CAPTURES / "ambrosia-faults.pcap")
    result = run_cli("dissect", "--format", "jsonl", path)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {r["protocol"] for r in rows} == {"ambrosia"}
    text = run_cli("dissect", "--summary", path)
    assert "check-bytes" in text.stdout and "receive port" in text.stdout


@pytest.mark.e2e
def test_spark_replay_builds_the_ambrosia_tables(replayed_everything):
    paths = [str(CAPTURES / f"ambrosia-{name}.pcap") for name in ("first-start", "recovery", "faults")]
    rows = replayed_everything.ok().rows
    pairs = {r["capture"]: r for r in rows if r["table"] == "ambrosia_pairs"}
    assert set(pairs) == set(paths)
    recovery = pairs[paths[1]]
    assert (recovery["recoveries"], recovery["replayed"], recovery["violations"]) == (1, 2, 0)
    assert pairs[paths[0]]["rpcs_to_lb"] == 72 and pairs[paths[0]]["records"] == 7
    violations = [r for r in rows if r["table"] == "ambrosia_violations"]
    assert [r["reason"].split(":")[0] for r in violations] == ["check-bytes", "sequence-gap"]


def pair(path: Path, ic: list[bytes], lb: list[bytes], rport: int = 40000, sport: int = 40001) -> Path:
    """The LB's messages, then the IC's records, on a pair of sockets of any ports."""
    with PcapWriter(path) as w:
        t = 1_763_700_000.0
        rsock = w.tcp_session(("127.0.0.1", 51000), ("127.0.0.1", rport), timestamp=t)
        ssock = w.tcp_session(("127.0.0.1", 51001), ("127.0.0.1", sport), timestamp=t + 0.001)
        for i, raw in enumerate(ic):
            ssock.send(False, raw, t + 0.002 + i / 1000)
        for i, raw in enumerate(lb):
            rsock.send(True, raw, t + 0.1 + i / 1000)
        ssock.close(False, t + 0.2)
        rsock.close(False, t + 0.3)
    return path


def test_an_lbs_take_checkpoint_while_the_ic_waits_names_the_ics_request(tmp_path):
    """The IC asks back only once its own request is answered: fuzz owes nothing for it till then."""
    records, _ = dissect(pair(tmp_path / "d.pcap", [TBPC], [H("02 02"), INITIAL, CHECKPOINT_3, H("02 02")]))
    asks = [r for r in records if r["sender"] == "lb" and r["type"] == "TakeCheckpoint"]
    assert [r.get("ic_asked") for r in asks] == ["TakeBecomingPrimaryCheckpoint", None]


def test_a_send_socket_opening_with_a_normal_record_is_known_by_its_check_bytes(tmp_path):
    """A capture begun mid-run (or a fuzzed IC that dropped its first record): the IC's socket
    opens with record 0, whose check bytes are xxHash64 of its body: that says AMBROSIA."""
    records, _ = dissect(pair(tmp_path / "e.pcap", [RECORD_0], [SELF_RPC]))
    assert {r["protocol"] for r in records} == {"ambrosia"}
    assert [(r["sender"], r["type"], r.get("seq_id")) for r in records] == [
        ("ic", "Record", 0),
        ("lb", "RPC", None),
    ]
    assert records[0]["ambrosia_socket"] == "send" and records[0]["rpc_count"] == 2


def test_a_record_whose_check_bytes_do_not_match_is_not_taken(tmp_path):
    """One check byte wrong: bytes that only look like a record's header are no AMBROSIA."""
    records, _ = dissect(pair(tmp_path / "f.pcap", [RECORD_1_BAD], []))
    assert not any(r.get("protocol") == "ambrosia" for r in records)
