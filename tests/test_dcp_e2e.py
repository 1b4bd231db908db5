"""dcp mock-producer and mock-consumer as real processes on loopback: streams, faults, failovers, kill -9."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support import COMMAND, Server, run_cli

from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.store import Bucket

pytestmark = pytest.mark.e2e


def producer(*args: str) -> Server:
    return Server("dcp", "mock-producer", "--port", "0", *args)


def consume(server: Server, *args: str, timeout: float = 120) -> tuple[int, dict]:
    result = run_cli(
        "dcp", "mock-consumer", "--connect", server.address, "--format", "json", *args, timeout=timeout
    )
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout.splitlines()[-1])


def producer_items(state: Path) -> dict[tuple[int, str], str]:
    """The producer's latest state of every vbucket, from its --state file."""
    bucket = Bucket.from_json(state.read_bytes())
    return {(vb.vb, k): v for vb in bucket.vbuckets.values() for k, v in vb.state().items()}


def consumer_items(out: Path) -> dict[tuple[int, str], str]:
    items = {}
    for line in out.read_text().splitlines():
        obj = json.loads(line)
        items[(obj["vbucket"], obj["key"])] = obj["value"]
    return items


def test_a_consumer_copies_every_vbucket_with_noops_flow_control_and_stream_ids(tmp_path):
    pstate, out, pcap = tmp_path / "p.json", tmp_path / "items.jsonl", tmp_path / "r.pcap"
    with producer(
        "--vbuckets",
        "4",
        "--items",
        "400",
        "--keys",
        "30",
        "--state",
        str(pstate),
        "--snapshot-size",
        "16",
        "--record",
        str(pcap),
        "--format",
        "json",
    ) as server:
        rc, summary = consume(
            server,
            "--state",
            str(tmp_path / "c.json"),
            "--out",
            str(out),
            "--noop-interval",
            "0.1",
            "--buffer-size",
            "3000",
            "--stream-ids",
        )
        assert rc == 0, summary
        assert summary["violations"] == 0 and summary["stream_ends"] == {"ok": 4}
        assert summary["buffer_acks"] > 10
        assert [v["status"] for v in summary["vbuckets"]] == ["done"] * 4
        assert [v["seqno"] for v in summary["vbuckets"]] == [400] * 4
        rc, stdout, _ = server.stop(signal.SIGTERM)
    assert rc == 0
    psum = json.loads(stdout.splitlines()[-1])
    assert psum["violations"] == [] and psum["flow_control_stalls"] > 0 and psum["streams"] == 4
    assert consumer_items(out) == producer_items(pstate)
    assert len(consumer_items(out)) > 50
    assert pcap.stat().st_size > 10_000


def test_faults_not_my_vbucket_stream_end_and_a_dropped_connection(tmp_path):
    out = tmp_path / "items.jsonl"
    pstate = tmp_path / "p.json"
    args = (
        "--vbuckets",
        "3",
        "--items",
        "200",
        "--state",
        str(pstate),
        "--not-my-vbucket",
        "1",
        "--stream-end",
        "too_slow@20",
        "--drop-after",
        "150",
    )
    with producer(*args) as server:
        rc, summary = consume(server, "--out", str(out), "--retries", "3", "--retry-delay", "0.05")
        assert rc == 0, summary
    status = {v["vbucket"]: v["status"] for v in summary["vbuckets"]}
    assert status == {0: "done", 1: "not_my_vbucket", 2: "done"}
    assert summary["stream_ends"]["too_slow"] == 2 and summary["connections"] == 2
    want = {k: v for k, v in producer_items(pstate).items() if k[0] != 1}
    assert consumer_items(out) == want


def test_failover_makes_the_consumer_roll_back_and_converge(tmp_path):
    pstate, cstate, out = tmp_path / "p.json", tmp_path / "c.json", tmp_path / "items.jsonl"
    with producer("--vbuckets", "2", "--items", "120", "--state", str(pstate), "--seed", "1") as server:
        rc, first = consume(server, "--state", str(cstate))
        assert rc == 0 and first["rollbacks"] == 0
        server.kill()
    # the promoted replica missed the last 30 items of each vbucket, then took 10 new ones
    args = ("--failover", "30", "--items", "10", "--state", str(pstate), "--seed", "2")
    with producer(*args) as server:
        rc, second = consume(server, "--state", str(cstate), "--out", str(out))
        assert rc == 0, second
        assert second["rollbacks"] == 2 and second["violations"] == 0
        assert [v["seqno"] for v in second["vbuckets"]] == [100, 100]
    assert consumer_items(out) == producer_items(pstate)
    uuids = {v["uuid"] for v in first["vbuckets"]} & {v["uuid"] for v in second["vbuckets"]}
    assert not uuids  # the consumer took the new failover logs


def test_a_consumer_killed_with_sigkill_resumes_from_its_state(tmp_path):
    pstate, cstate, out = tmp_path / "p.json", tmp_path / "c.json", tmp_path / "items.jsonl"
    with producer("--vbuckets", "2", "--items", "20000", "--keys", "5000", "--state", str(pstate)) as server:
        proc = subprocess.Popen(
            [
                *COMMAND,
                "dcp",
                "mock-consumer",
                "--connect",
                server.address,
                "--state",
                str(cstate),
                "--buffer-size",
                "20000",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not cstate.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, "the consumer finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        saved = json.loads(cstate.read_text())["vbuckets"]
        resumed_from = sum(v["seqno"] for v in saved.values())
        assert 0 < resumed_from < 40000
        rc, summary = consume(server, "--state", str(cstate), "--out", str(out))
        assert rc == 0, summary
    assert summary["items_received"] <= sum(v["items_received"] for v in summary["vbuckets"])
    assert consumer_items(out) == producer_items(pstate)


def test_a_bad_peer_gets_an_error_and_the_others_are_served(tmp_path):
    items = tmp_path / "items.jsonl"  # five distinct keys: generated ones may collide and dedupe
    items.write_text("".join(f'{{"key": "k{n}", "value": "v{n}", "vbucket": 0}}\n' for n in range(5)))
    with producer("--vbuckets", "1", "--items", "0", "--input", str(items)) as server:
        with socket.create_connection((server.host, server.port), timeout=30) as bad:
            bad.sendall(codec.encode(codec.Packet(0x80, codec.MUTATION, 0, 9, 0, 0, b"\0" * 3, b"k")))
            answer = b""
            while len(answer) < 24:
                chunk = bad.recv(100)
                if not chunk:
                    break
                answer += chunk
        assert answer[:2] == b"\x81\x57" and answer[6:8] == b"\x00\x04"  # EINVAL, then closed
        rc, summary = consume(server)
        assert rc == 0 and summary["items_received"] == 5
        rc, stdout, stderr = server.stop()
    assert rc == 1 and "extras of 3 bytes, must be 31" in stderr


def test_a_packet_whose_parts_exceed_its_body_is_counted_at_sigterm(tmp_path):
    """DCP_CONTROL with key 50 + extras 4 in a 10-byte body: EINVAL, closed, one line, exit 1."""
    bad = bytes.fromhex("805e0032040000000000000a00000009") + bytes(8) + b"x" * 10
    with producer("--vbuckets", "1", "--items", "0") as server:
        with socket.create_connection((server.host, server.port), timeout=30) as peer:
            peer.sendall(bad)
            answer = b""
            while chunk := peer.recv(100):
                answer += chunk
        assert answer == bytes.fromhex("815e0000000000040000000000000009") + bytes(8)
        rc, _, stderr = server.stop()
    assert rc == 1 and "Traceback" not in stderr
    assert stderr.count("exceed the body length 10 (at byte offset 0); closing") == 1


def test_a_refused_login_or_bucket_is_one_line_and_exit_1_without_retries():
    """The same account gets the same answer: --retries is for connections lost, not refusals."""
    account = ("--username", "reader", "--password", "s3cret", "--bucket", "travel")
    with producer("--vbuckets", "2", "--items", "5", *account) as server:
        for wrong in (("--password", "nope"), ("--bucket", "nowhere")):
            args = ("--username", "reader", "--password", "s3cret", "--bucket", "travel", *wrong)
            result = run_cli(
                "dcp", "mock-consumer", "--connect", server.address, "--format", "json", "--retries", "3",
                "--retry-delay", "0", *args, timeout=120,
            )  # fmt: skip
            summary = json.loads(result.stdout.splitlines()[-1])
            assert result.returncode == 1 and summary["connections"] == 1, result.stderr
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and "refused" in lines[0] and "reconnecting" not in lines[0], lines


def test_usage_errors_exit_2(tmp_path):
    bad = tmp_path / "state.json"
    bad.write_text("{not json")
    result = run_cli("dcp", "mock-producer", "--port", "0", "--state", str(bad))
    assert result.returncode == 2 and "not a mock-producer state file" in result.stderr
    result = run_cli("dcp", "mock-consumer", "--vbuckets", "1-x")
    assert result.returncode == 2 and "ranges like 0,3,5-7" in result.stderr
    result = run_cli("dcp", "mock-producer", "--stream-end", "sleepy@3")
    assert result.returncode == 2 and "REASON@N" in result.stderr
    result = run_cli("dcp", "mock-consumer", "--state", str(bad), "--connect", "127.0.0.1:1")
    assert result.returncode == 2 and "not a mock-consumer state file" in result.stderr
    assert "Traceback" not in result.stderr
    os.remove(bad)


def test_a_consumer_logs_in_with_scram_and_selects_the_bucket_a_producer_requires_by_default(tmp_path):
    pcap = tmp_path / "auth.pcap"
    account = ("--username", "reader", "--password", "s3cret", "--bucket", "travel")
    with producer("--vbuckets", "2", "--items", "5", *account, "--record", str(pcap)) as server:
        rc, summary = consume(server, *account)
        wrong, refused = consume(server, "--username", "reader", "--password", "nope", "--bucket", "travel")
        anonymous, nothing = consume(server, "--no-auth")
    assert rc == 0 and summary["ok"], summary
    assert wrong == 1 and refused["failures"] == ["SASL SCRAM-SHA512 as 'reader' refused: AUTH_ERROR"]
    assert anonymous == 1 and nothing["failures"] == ["DCP_OPEN refused: EACCESS"]
    # The first connection's setup, as the capture holds it: SCRAM-SHA512 in two steps, then the bucket.
    done = run_cli("dissect", str(pcap), "--format", "jsonl")
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    first = [(r["type"], r.get("status"), r.get("dcp_key")) for r in records if r["conn_index"] == 1][:10]
    assert first[:9] == [
        ("HELLO", None, "wallaroo-proto-mock-consumer"),
        ("HELLO_RESPONSE", "SUCCESS", None),
        ("SASL_LIST_MECHS", None, None),
        ("SASL_LIST_MECHS_RESPONSE", "SUCCESS", None),
        ("SASL_AUTH", None, "SCRAM-SHA512"),
        ("SASL_AUTH_RESPONSE", "AUTH_CONTINUE", None),
        ("SASL_STEP", None, "SCRAM-SHA512"),
        ("SASL_STEP_RESPONSE", "SUCCESS", None),
        ("SELECT_BUCKET", None, "travel"),
    ]
