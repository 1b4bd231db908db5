"""Replaying recorded MLD conversations against live peers: mock-processor and the kclpy sample
spawned as the MLD spawns a processor (pipes), mock-daemon over TCP, and peers started with faults."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support import COMMAND, Server, run_cli

from wallaroo_proto.replay import engine, links, recording

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "captures" / "kinesis-session.pcap"
SAMPLE = ROOT / "samples" / "kcl_processor.py"
PY = sys.executable
MOCK_PROCESSOR = shlex.join([*COMMAND, "kinesis", "mock-processor"])
#: Seconds each live answer is waited for (a planted fault that stops a replay waits it once).
ANSWER = 10.0


def play(capture: Path, side: str, *, shard: int = 0, **options) -> engine.Report:
    """One shard's conversation of ``capture`` (by its shard id), ``side`` played live."""
    shard_id = f"shardId-{shard:012d}"
    conv = recording.find(capture, display_filter=lambda r: r.get("shard_id") == shard_id)
    return engine.run(conv, engine.Options(side=side, **{"answer_timeout": ANSWER, **options}))


def bad(report: engine.Report) -> list[tuple[str, str, int | None]]:
    """(result, type, recorded packet) of each frame that did not match."""
    return [(o.result.value, o.type, (o.recorded or {}).get("packet")) for o in report.outcomes]


def dissected(path: Path) -> list[dict]:
    result = run_cli("dissect", "--format", "jsonl", str(path))
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def record_session(path: Path, *processor: str, shards: int = 1) -> None:
    """A mock-daemon session of ``shards`` shards of 5 records in batches of 2, ending the shards."""
    result = run_cli(
        "kinesis",
        "mock-daemon",
        *("--shards", str(shards), "--records", "5", "--batch-size", "2", "--shard-end"),
        *("--record", str(path), "--", *processor),
    )
    assert result.returncode == 0 and path.exists(), result.stderr


def mock_daemon(listener: links.Listener, *args: str) -> subprocess.Popen:
    """mock-daemon opening its one shard's connection to the replay (erlmld's bridge)."""
    host, port = listener.address
    return subprocess.Popen(
        [*COMMAND, "kinesis", "mock-daemon", "--connect", f"{host}:{port}", "--format", "json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


ONE_SHARD = ("--shards", "1", "--records", "5", "--batch-size", "2", "--shard-end")


# ----------------------------------------------------------------------------- the daemon played


def test_the_recorded_daemon_plays_to_mock_processor_over_its_pipes(tmp_path):
    out = tmp_path / "live.pcapng"
    report = play(CAPTURE, "daemon", spawn=MOCK_PROCESSOR, record=str(out))
    assert report.ok, report.as_dict()
    assert report.counts["matched"] == 6 and report.sent == 6 and report.received == 6
    live = dissected(out)
    assert [r["type"] for r in live] == [r["type"] for r in dissected(CAPTURE) if r["conn_index"] == 1]
    assert all(r["verdict"] == "accepted" for r in live)


def test_a_processor_answering_the_wrong_request_is_reported_at_its_recorded_frame():
    """mock-processor --bad-response-after 3: its status for the second batch (records 3 and 4)
    names processRecordz; the MLD would fail it, so the replay stops there."""
    report = play(CAPTURE, "daemon", spawn=f"{MOCK_PROCESSOR} --bad-response-after 3", answer_timeout=5)
    assert not report.ok
    first = report.outcomes[0]
    assert (first.result.value, first.type, first.recorded["packet"]) == ("violation", "status", 13)
    assert ("response_for", "processRecords", "processRecordz") in first.fields
    assert report.counts["matched"] == 2  # the statuses for initialize and the first batch
    assert report.stopped and "status for processRecords" in report.stopped


def test_checkpoints_the_recording_never_had_are_answered_and_reported_extra(tmp_path):
    """mock-processor --checkpoint-every 2 checkpoints after the first two batches; the recorded
    one did not. Each is answered as the KCL answers it, so every status still comes."""
    out = tmp_path / "live.pcapng"
    report = play(CAPTURE, "daemon", spawn=f"{MOCK_PROCESSOR} --checkpoint-every 2", record=str(out))
    assert bad(report) == [("extra", "checkpoint", None)] * 2
    assert report.counts["matched"] == 6 and not report.stopped and not report.own_violations
    live = dissected(out)
    replies = [r for r in live if r["type"] == "checkpoint" and r["sender"] == "daemon"]
    assert [r["checkpoint_error"] for r in replies] == [None, None, None]


def test_a_recorded_kclpy_session_replays_to_the_kclpy_sample(tmp_path):
    pytest.importorskip("amazon_kclpy")
    capture = tmp_path / "kclpy.pcap"
    record_session(capture, PY, str(SAMPLE))
    report = play(capture, "daemon", spawn=shlex.join([PY, str(SAMPLE)]))
    assert report.ok, report.as_dict()
    # three statuses for the batches, one for initialize and one for shardEnded; four checkpoints
    assert report.counts["matched"] == 9 and report.sent == 9


def test_the_sample_capture_replays_to_the_kclpy_sample_which_checkpoints_more():
    pytest.importorskip("amazon_kclpy")
    report = play(CAPTURE, "daemon", spawn=shlex.join([PY, str(SAMPLE)]))
    assert bad(report) == [("extra", "checkpoint", None)] * 3  # one per batch
    assert report.counts["matched"] == 6 and not report.stopped


# ----------------------------------------------------------------------------- the processor played


def test_the_recorded_processor_plays_to_mock_daemon_over_tcp(tmp_path):
    out = tmp_path / "live.pcapng"
    listener = links.Listener(("127.0.0.1", 0))
    daemon = mock_daemon(listener, *ONE_SHARD)
    try:
        report = play(CAPTURE, "processor", listeners=[listener], record=str(out))
    finally:
        listener.close()
        stdout, stderr = daemon.communicate(timeout=60)
    assert report.ok, report.as_dict()
    assert report.counts["matched"] == 6 and report.sent == 6
    assert daemon.returncode == 0, stderr
    assert json.loads(stdout.splitlines()[-1])["shards"][0]["checkpoints"] == 1
    assert [r["sender"] for r in dissected(out)][:2] == ["daemon", "processor"]


def test_the_processors_checkpoints_follow_the_live_daemons_sequence_numbers(tmp_path):
    """Shard 1's recorded processor played to a daemon serving shard 0, whose records have other
    sequence numbers: each checkpoint asks for the live record at the recorded one's place, and
    the daemon accepts it (a recorded number would lie beyond every record it delivered)."""
    capture = tmp_path / "two.pcap"
    record_session(capture, *shlex.split(MOCK_PROCESSOR), "--checkpoint-every", "2", shards=2)
    state = tmp_path / "leases.json"
    listener = links.Listener(("127.0.0.1", 0))
    daemon = mock_daemon(listener, *ONE_SHARD, "--state", str(state))
    out = tmp_path / "live.pcapng"
    try:
        report = play(
            capture,
            "processor",
            shard=1,
            listeners=[listener],
            record=str(out),
            ignore=frozenset({"shard_id", "sequence_number"}),
        )
    finally:
        listener.close()
        _, stderr = daemon.communicate(timeout=60)
    assert report.ok, report.as_dict()
    assert daemon.returncode == 0, stderr
    recorded = [
        r["sequence_number"]
        for r in dissected(capture)
        if r["type"] == "checkpoint" and r["sender"] == "processor" and r["shard_id"].endswith("1")
    ]
    live = [r for r in dissected(out) if r["type"] == "checkpoint"]
    asked = [r["sequence_number"] for r in live if r["sender"] == "processor"]
    assert len(asked) == len(recorded) == 3 and asked[-1] is None  # the shard's end
    assert asked[:2] != recorded[:2] and [s[:20] for s in asked[:2]] == ["49590338000000000000"] * 2
    assert [r["checkpoint_error"] for r in live if r["sender"] == "daemon"] == [None] * 3


def test_a_daemon_refusing_a_checkpoint_is_reported_at_its_recorded_reply():
    listener = links.Listener(("127.0.0.1", 0))
    daemon = mock_daemon(listener, *ONE_SHARD, "--checkpoint-error", "ThrottlingException@1")
    try:
        report = play(CAPTURE, "processor", listeners=[listener])
    finally:
        listener.close()
        daemon.communicate(timeout=60)
    assert not report.ok
    first = report.outcomes[0]
    assert (first.result.value, first.type, first.recorded["packet"]) == ("divergent", "checkpoint", 18)
    assert ("checkpoint_error", None, "ThrottlingException") in first.fields
    assert report.counts["matched"] == 5


# ----------------------------------------------------------------------------- the command


def test_the_replay_command_plays_the_daemon_to_a_spawned_processor(tmp_path):
    out = tmp_path / "live.pcapng"
    args = ["replay", str(CAPTURE), "--connection", "1", "--play", "client", "--format", "json"]
    same = run_cli(*args, "--spawn", MOCK_PROCESSOR, "--record", str(out))
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["counts"]["matched"] == 6
    assert run_cli("dissect", str(out)).returncode == 0
    # the MLD stops at a wrong status; so does the replay, once the right one was waited for
    planted = run_cli(*args, "--answer-timeout", "5", "--spawn", f"{MOCK_PROCESSOR} --bad-response-after 3")
    assert planted.returncode == 1, planted.stderr
    first = json.loads(planted.stdout)["outcomes"][0]
    assert (first["result"], first["type"], first["recorded_packet"]) == ("violation", "status", 13)


def test_the_replay_command_plays_the_processor_to_mock_daemon_connecting_to_it():
    with Server(
        "replay", str(CAPTURE), "--connection", "1", "--play", "server", "--listen", "127.0.0.1:0", "-q"
    ) as replay:
        daemon = run_cli("kinesis", "mock-daemon", "--connect", replay.address, *ONE_SHARD)
        code, stdout, stderr = replay.stop(None)
    assert daemon.returncode == 0, daemon.stderr
    assert code == 0, stdout + stderr
    assert "6 matched" in stdout
