"""dissect and spark-replay read Kinesis MLD conversations: recorded by mock-daemon, and hand-written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import run_cli

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.schema import field_names

PROCESSOR = [sys.executable, "-m", "wallaroo_proto_cli", "kinesis", "mock-processor"]
SHARDS = ("shardId-000000000000", "shardId-000000000001")


def record(path: Path, *processor_args: str) -> subprocess.CompletedProcess:
    """Two shards of 30 records through mock-daemon and mock-processor, recorded into ``path``."""
    result = run_cli(
        "kinesis",
        "mock-daemon",
        *("--shards", "2", "--records", "30", "--batch-size", "10", "--shard-end"),
        *("--checkpoint-error", "ThrottlingException@1", "--record", str(path)),
        "--",
        *PROCESSOR,
        *("--checkpoint-every", "10", *processor_args),
    )
    assert path.exists(), result.stderr
    return result


def jsonl(*args: str) -> list[dict]:
    result = run_cli("dissect", "--format", "jsonl", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kinesis") / "mld.pcap"
    assert record(path).returncode == 0
    return path


def test_a_recorded_conversation_is_summarised_per_shard(recorded):
    summaries = [s["summary"] for s in jsonl("--summary", str(recorded))]
    assert [s["shard_id"] for s in summaries] == list(SHARDS)
    for s in summaries:
        assert s["protocol"] == "kinesis" and s["daemon"] == "initiator"
        assert s["records"] == 30 and s["violations"] == 0 and s["expecting"] == "nothing (ended)"
        # three checkpoints at 10, 20 and 30 records (the first throttled, then retried) and SHARD_END
        assert s["checkpoint_errors"] == 1 and s["checkpoint_error_names"] == {"ThrottlingException": 1}
        assert s["checkpoints"] == 4 and s["last_checkpoint"] == "SHARD_END"
        # initialize, 3 processRecords and shardEnded, each answered by a status
        assert s["requests"] == 5 and s["latency"]["count"] == 5
        assert 0 <= s["latency"]["p50"] <= s["latency"]["p99"] <= s["latency"]["max"]
    shown = run_cli("dissect", "--summary", str(recorded))
    assert shown.returncode == 0
    assert "request to status" in shown.stdout and "shardId-000000000001" in shown.stdout


def test_a_recorded_conversation_as_records(recorded):
    records = jsonl(str(recorded))
    assert all(set(r) <= set(field_names()) for r in records)
    assert {r["protocol"] for r in records} == {"kinesis"}
    assert {r["verdict"] for r in records} == {"accepted"}
    for shard in SHARDS:
        mine = [r for r in records if r.get("shard_id") == shard]
        assert [r["type"] for r in mine[:3]] == ["initialize", "status", "processRecords"]
        assert mine[0]["sender"] == "daemon" and mine[0]["sequence_number"] == "TRIM_HORIZON"
        assert mine[1]["sender"] == "processor" and mine[1]["response_for"] == "initialize"
        assert sum(r.get("record_count") or 0 for r in mine) == 30
        replies = [r for r in mine if r["type"] == "checkpoint" and r["sender"] == "daemon"]
        assert [r["checkpoint_error"] for r in replies].count("ThrottlingException") == 1
        assert [r["line_number"] for r in mine if r["sender"] == "daemon"] == list(
            range(1, 1 + sum(r["sender"] == "daemon" for r in mine))
        )
    table = run_cli("dissect", "--type", "processrecords", str(recorded))
    assert table.returncode == 0 and "records=10" in table.stdout and "initialize" not in table.stdout


def test_a_processor_answering_the_wrong_request_is_a_violation(tmp_path):
    path = tmp_path / "bad.pcap"
    assert record(path, "--bad-response-after", "10").returncode == 1
    records = jsonl(str(path))
    bad = [r for r in records if r["verdict"] == "violation"]
    assert bad and all(r["protocol"] == "kinesis" and r["sender"] == "processor" for r in bad)
    expected = "status with responseFor 'processRecordz', expected 'processRecords'"
    assert expected in bad[0]["violations"][0] and bad[0]["type"] == "status"
    strict = run_cli("dissect", "--strict", "--summary", str(path))
    assert strict.returncode == 1 and "processRecordz" in strict.stdout


# A conversation written here from the MLD's documented lines (the daemon compact, kclpy's
# json.dumps between blank lines), on a port no protocol owns.
DAEMON_LINES = [
    b'{"action":"initialize","shardId":"shardId-7","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}\n',
    b'{"action":"processRecords","records":[{"action":"record","data":"YQ==","partitionKey":"k",'
    b'"sequenceNumber":"11","subSequenceNumber":0,"approximateArrivalTimestamp":1}],'
    b'"millisBehindLatest":0}\n',
    b'{"action":"checkpoint","sequenceNumber":"11","subSequenceNumber":0,"error":null}\n',
    b'{"action":"shardEnded"}\n',
    b'{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null,"error":null}\n',
]
PROCESSOR_LINES = [
    b'\n{"action": "status", "responseFor": "initialize"}\n',
    b'\n{"action": "checkpoint", "sequenceNumber": "11", "subSequenceNumber": 0}\n',
    b'\n{"action": "status", "responseFor": "processRecords"}\n',
    b'\n{"action": "checkpoint", "sequenceNumber": null, "subSequenceNumber": null}\n',
    b'\n{"action": "status", "responseFor": "shardEnded"}\n',
]


def write_conversation(path: Path, port: int, *, skip_first: bool = False) -> None:
    """Daemon (client) and processor take turns; ``skip_first`` leaves out the initialize."""
    with PcapWriter(path) as w:
        s = w.tcp_session(("10.1.0.1", 51000), ("10.1.0.2", port), timestamp=1_763_700_000.0)
        turns = [
            (True, DAEMON_LINES[0]),
            (False, PROCESSOR_LINES[0]),
            (True, DAEMON_LINES[1]),
            (False, PROCESSOR_LINES[1]),
            (True, DAEMON_LINES[2]),
            (False, PROCESSOR_LINES[2]),
            (True, DAEMON_LINES[3]),
            (False, PROCESSOR_LINES[3]),
            (True, DAEMON_LINES[4]),
            (False, PROCESSOR_LINES[4]),
        ]
        for i, (from_client, data) in enumerate(turns[1 if skip_first else 0 :]):
            s.send(from_client, data, 1_763_700_000.0 + (i + 1) / 1000)
        s.close(True, 1_763_700_001.0)
        s.close(False, 1_763_700_001.0)


def test_detected_by_its_first_bytes_on_any_port(tmp_path):
    path = tmp_path / "port-9999.pcap"
    write_conversation(path, 9999)
    records = jsonl(str(path))
    assert [(r["sender"], r["type"]) for r in records] == [
        ("daemon", "initialize"),
        ("processor", "status"),
        ("daemon", "processRecords"),
        ("processor", "checkpoint"),
        ("daemon", "checkpoint"),
        ("processor", "status"),
        ("daemon", "shardEnded"),
        ("processor", "checkpoint"),
        ("daemon", "checkpoint"),
        ("processor", "status"),
    ]
    assert {r["protocol"] for r in records} == {"kinesis"} and {r["verdict"] for r in records} == {"accepted"}
    assert records[2]["offset"] == len(DAEMON_LINES[0]) and records[2]["length"] == len(DAEMON_LINES[1]) - 1
    assert records[5]["latency"] == pytest.approx(0.003)  # processRecords at 3 ms, its status at 6 ms
    (summary,) = [s["summary"] for s in jsonl("--summary", str(path))]
    assert (summary["shard_id"], summary["records"], summary["checkpoints"]) == ("shardId-7", 1, 2)


def test_protocol_forces_how_a_connection_is_read(tmp_path):
    path = tmp_path / "midstream.pcap"
    write_conversation(path, 9999, skip_first=True)  # no initialize: nothing to detect it by
    assert jsonl(str(path)) == []
    forced = jsonl("--protocol", "kinesis", "--port", "9999", str(path))
    assert {r["protocol"] for r in forced} == {"kinesis"} and forced[0]["type"] == "status"
    as_wallaroo = jsonl("--protocol", "wallaroo", "--port", "9999", str(path))
    assert as_wallaroo and {r["protocol"] for r in as_wallaroo} == {"wallaroo"}
    unknown = run_cli("dissect", "--protocol", "nope", str(path))
    assert unknown.returncode == 2 and "nope" in unknown.stderr and "Traceback" not in unknown.stderr


def test_a_processor_sending_a_daemons_request_is_recorded_as_ignored(tmp_path):
    """The MLD decodes a processRecords from the processor and ignores it; its records are
    still objects of any shape (a damaged or odd capture), and the dissector records them."""
    path = tmp_path / "odd.pcap"
    odd = b'{"action":"processRecords","records":[{"sequenceNumber":"5","partitionKey":7}]}\n'
    with PcapWriter(path) as w:
        s = w.tcp_session(("10.1.0.1", 51000), ("10.1.0.2", 9999), timestamp=1_763_700_000.0)
        for i, (from_client, data) in enumerate(
            [(True, DAEMON_LINES[0]), (False, PROCESSOR_LINES[0]), (False, odd), (True, DAEMON_LINES[1])]
        ):
            s.send(from_client, data, 1_763_700_000.0 + (i + 1) / 1000)
    records = jsonl(str(path))
    assert [(r["sender"], r["type"], r["verdict"]) for r in records] == [
        ("daemon", "initialize", "accepted"),
        ("processor", "status", "accepted"),
        ("processor", "processRecords", "ignored"),
        ("daemon", "processRecords", "accepted"),
    ]
    assert (records[2]["record_count"], records[2]["sequence_number"]) == (1, "5")
    shown = run_cli("dissect", str(path))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr


@pytest.mark.e2e
def test_spark_replay_builds_the_kinesis_tables(replayed_everything):
    recorded, bad = replayed_everything.paths["kinesis"], replayed_everything.paths["kinesis-bad"]
    rows = replayed_everything.ok().rows
    shards = [r for r in rows if r["table"] == "kinesis_shards"]
    good = [r for r in shards if r["capture"] == str(recorded)]
    assert sorted(r["shard_id"] for r in good) == list(SHARDS)
    for r in good:
        assert (r["records"], r["requests"], r["checkpoints"], r["checkpoint_errors"]) == (30, 5, 4, 1)
        assert r["violations"] == 0 and 0 <= r["latency_p50"] <= r["latency_p99"] <= r["latency_max"]
    violations = [r for r in rows if r["table"] == "kinesis_violations"]
    assert violations and {r["capture"] for r in violations} == {str(bad)}
    assert sum(r["violations"] for r in shards if r["capture"] == str(bad)) == len(violations)
    # the bad status is among them (the other shard's own violation may come first: Spark keeps no order)
    assert any("processRecordz" in r["reason"] for r in violations), violations
    # The common views hold the Kinesis rows too: a query over them misses no protocol.
    common = [r for r in rows if r["table"] == "violations" and r["capture"] == str(bad)]
    assert len(common) == len(violations) and {r["protocol"] for r in common} == {"kinesis"}
    ours = [r for r in rows if r["table"] == "connections" and r["capture"] in (str(recorded), str(bad))]
    assert {r["protocol"] for r in ours} == {"kinesis"} and sum(r["violations"] for r in ours) == len(
        violations
    )


def test_a_recording_with_aggregates_and_a_reshard_reads_back_per_shard(tmp_path):
    path = tmp_path / "reshard.pcap"
    result = run_cli(
        "kinesis",
        "mock-daemon",
        *("--shards", "1", "--records", "6", "--batch-size", "4", "--aggregate", "3"),
        *("--reshard", "split", "--record", str(path), "--"),
        *PROCESSOR,
        *("--checkpoint-every", "1"),
    )
    assert result.returncode == 0, result.stderr
    summaries = {s["summary"]["shard_id"]: s["summary"] for s in jsonl("--summary", str(path))}
    assert sorted(summaries) == ["shardId-000000000000", "shardId-000000000001", "shardId-000000000002"]
    assert all(s["violations"] == 0 and s["records"] == 6 for s in summaries.values()), summaries
    assert summaries["shardId-000000000000"]["last_checkpoint"] == "SHARD_END"
    batches = [r for r in jsonl(str(path)) if r["type"] == "processRecords"]
    # a batch of 4 from aggregates of 3 ends inside the second aggregate
    assert [(r["record_count"], r["sub_sequence_number"]) for r in batches[:2]] == [(4, 0), (2, 2)]
    # The report reads the same recording: a ladder per shard's connection, no violation.
    html = tmp_path / "reshard.html"
    shown = run_cli("report", str(path), "-o", str(html))
    assert shown.returncode == 0, shown.stderr
    assert "3 connection(s)" in shown.stderr and "0 with violations" in shown.stderr
    assert "shardId-000000000002" in html.read_text()


def test_the_sample_capture_holds_two_shards_ended_and_checkpointed():
    """captures/kinesis-session.pcap: 2 shards of 5 records in batches of 2, then shardEnded."""
    from wallaroo_proto.capture.dissector import dissect

    _, dissector = dissect(Path(__file__).resolve().parent.parent / "captures" / "kinesis-session.pcap")
    summaries = dissector.summaries()
    assert [s["shard_id"] for s in summaries] == ["shardId-000000000000", "shardId-000000000001"]
    for s in summaries:
        assert s["records"] == 5 and s["violations"] == 0
        assert s["lines_by_type"]["processRecords"] == 3 and s["lines_by_type"]["shardEnded"] == 1
        assert s["last_checkpoint"] == "SHARD_END" and s["closed"] == "closed"
