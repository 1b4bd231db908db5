"""``conformance producer`` and ``conformance consumer``, proven both ways over real loopback.

dcp mock-producer passes every case (restarted once after a failover, so a
diverged history is there to roll back); a sloppy producer
(tests/peers/sloppy_dcp_producer.py: SUCCESS to everything, no flow control,
NOOPs whether answered or not) fails exactly the cases it breaks, each with the
DCP core's reason where the core judged the packet. dcp mock-consumer passes every
consumer case; a sloppy consumer (tests/peers/sloppy_dcp_consumer.py: acknowledges
more than it got, never asks again after a STREAM_END other than ok, keeps no copy)
fails those two cases and has the rollback case skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import COMMAND, READY, Server, run_cli

from wallaroo_proto.conformance import get_suite

PEERS = Path(__file__).resolve().parent / "peers"


def conformance(*args: str) -> tuple[int, dict]:
    done = run_cli("conformance", "producer", "--format", "json", *args, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_producer_suite_refuses_a_bad_vbucket_option() -> None:
    done = run_cli("conformance", "producer", "127.0.0.1:1", "--vbucket", "1024")
    assert done.returncode == 2 and "a vbucket is 0 to 1023" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_mock_producer_after_a_failover_passes_every_producer_case(tmp_path) -> None:
    state = str(tmp_path / "producer.json")
    with Server("dcp", "mock-producer", "--port", "0", "--vbuckets", "4", "--items", "60", "--state", state):
        pass  # the history is written before the ready line
    args = [
        "--vbuckets",
        "4",
        "--items",
        "20",
        "--failover",
        "25",
        "--state",
        state,
    ]  # auth required: the default
    args += ["--username", "conformance", "--password", "secret"]
    with Server("dcp", "mock-producer", "--port", "0", *args) as producer:
        auth = ["--user", "conformance", "--password", "secret", "--bucket", "default"]
        code, report = conformance(producer.address, *auth)
        exit_code, _, err = producer.stop()
    bad = [f"{c['id']}: {c['reason']}\n{c['seen']}" for c in report["cases"] if c["status"] != "pass"]
    assert code == 0 and not bad, "\n\n".join(bad)
    assert [c["id"] for c in report["cases"]] == [c.id for c in get_suite("producer").cases]
    seen = {c["id"]: c["seen"] for c in report["cases"]}
    assert seen["rollback.diverged"] == "ROLLBACK to 35, as the rule gives"  # 60 items, 25 lost at failover
    assert seen["stream.not-my-vbucket"].startswith("NOT_MY_VBUCKET for vbucket 1023")
    assert seen["refuse.unauthenticated"].endswith("then authenticates (SCRAM-SHA512)")
    assert seen["error-map.versions"] == "version 2 revision 1, 14 statuses; version 0: KEY_ENOENT"
    # the malformed cases are the only consumer violations the producer saw
    assert exit_code == 1 and "extras of 40 bytes" in err and "bad magic 0x42" in err
    assert "DCP_CONTROL: extras of 4 bytes, must be 0" in err
    assert "NOOP reply opaque" in err


#: What the sloppy producer breaks, and the reason each case gives.
SLOPPY_FAILURES = {
    "hello.features": "HELLO granted features not asked for: 0x12",
    "control.unknown-key": "an unknown control key answered SUCCESS, not EINVAL",
    "stream.erange-end": "stream request with a bad seqno range accepted (must be ERANGE)",
    "stream.erange-snapshot": "stream request with a bad seqno range accepted (must be ERANGE)",
    "stream.key-eexists": "a second stream for vbucket 0 accepted (must be KEY_EEXISTS)",
    "stream.not-my-vbucket": "SUCCESS where NOT_MY_VBUCKET was due",
    "rollback.unknown-uuid": "SUCCESS where ROLLBACK to 0 was due",
    "rollback.ahead": "SUCCESS where ROLLBACK to 20 was due",
    "flow.window": "sent with 1056 bytes unacknowledged of a 1024-byte buffer",
    "flow.buffer-ack": "sent with 1056 bytes unacknowledged of a 1024-byte buffer",
    "noop.one-at-a-time": "NOOP while the NOOP 0x00000002 is unanswered",
    "close-stream.stream-end": "no conclusion within 4 s (waiting for STREAM_END closed)",
    "close-stream.unknown": "closing a stream never opened answered SUCCESS, not KEY_ENOENT",
    "malformed.stream-req": "a STREAM_REQ with 40 bytes of extras answered SUCCESS",
    "malformed.control": "a DCP_CONTROL with no value answered SUCCESS",
    "malformed.magic": "no conclusion within 4 s (waiting for the producer to close the connection)",
    "malformed.control-extras": "a DCP_CONTROL with 4 bytes of extras answered SUCCESS, not EINVAL",
    "error-map.versions": "GET_ERROR_MAP version 2 answer (0 bytes) is no map of statuses "
    "(version, revision, errors by hex status with name, desc, attrs)",
    "refuse.open-twice": "a second DCP_OPEN answered SUCCESS, not EINVAL",
    "refuse.open-flags": "DCP_OPEN with flag 0x02 answered SUCCESS, not EINVAL",
    "refuse.before-open": "a STREAM_REQ before DCP_OPEN answered SUCCESS, not EINVAL",
    "refuse.unknown-opcode": "opcode 0xee answered SUCCESS, not UNKNOWN_COMMAND",
}


@pytest.mark.e2e
def test_a_sloppy_producer_fails_exactly_the_rules_it_breaks() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(PEERS / "sloppy_dcp_producer.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        match = READY.search(proc.stdout.readline())
        assert match, "the sloppy producer printed no ready line"
        code, report = conformance(f"{match.group(1)}:{match.group(2)}", "--timeout", "4")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert code == 1
    status = {c["id"]: c["status"] for c in report["cases"]}
    assert status["rollback.diverged"] == "skip"  # one failover entry: nothing diverged
    assert {c for c, s in status.items() if s == "skip" and c.startswith("refuse.")} == {
        "refuse.unauthenticated",  # no --user: the cases of a producer that requires authentication
        "refuse.wrong-password",
        "refuse.no-bucket",
        "refuse.unknown-bucket",
    }
    reasons = {c["id"]: c["reason"] for c in report["cases"] if c["status"] == "fail"}
    # It ignores a wrong NOOP answer and sends NOOPs without waiting: whichever shows first fails the case.
    assert reasons.pop("noop.wrong-opaque") in (
        "no conclusion within 4 s (waiting for the producer to close the connection)",
        "NOOP while the NOOP 0x00000003 is unanswered",
    )
    assert reasons == SLOPPY_FAILURES


# --- the consumer suite -------------------------------------------------------------------------------


def consumer_conformance(*args: str) -> tuple[int, dict]:
    done = run_cli("conformance", "consumer", "--format", "json", *args, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_consumer_suite_needs_a_command() -> None:
    done = run_cli("conformance", "consumer")
    assert done.returncode == 2 and "give the consumer's command" in done.stderr


@pytest.mark.e2e
def test_mock_consumer_with_a_state_and_a_small_buffer_passes_every_consumer_case() -> None:
    consumer = [*COMMAND, "dcp", "mock-consumer", "--connect", "{host}:{port}", "--state", "{state}"]
    code, report = consumer_conformance("--", *consumer, "--buffer-size", "4096")
    bad = [f"{c['id']}: {c['reason']}\n{c['seen']}" for c in report["cases"] if c["status"] != "pass"]
    assert code == 0 and not bad, "\n\n".join(bad)
    assert [c["id"] for c in report["cases"]] == [c.id for c in get_suite("consumer").cases]


@pytest.mark.e2e
def test_a_sloppy_consumer_fails_exactly_the_rules_it_breaks() -> None:
    sloppy = [sys.executable, str(PEERS / "sloppy_dcp_consumer.py"), "--connect", "{host}:{port}"]
    code, report = consumer_conformance("--", *sloppy)
    assert code == 1
    status = {c["id"]: (c["status"], c["reason"]) for c in report["cases"]}
    assert status["stream.all"][0] == status["stream.not-my-vbucket"][0] == "pass"
    assert status["flow.acks"][0] == "fail"
    assert status["flow.acks"][1].startswith("acknowledges 131072 bytes, only ")  # the core's reason
    assert status["stream-end.reopened"] == (
        "fail",
        "0 of 2 streams ended ok before the consumer stopped "
        "(stream ends: {'too_slow': 2}, NOT_MY_VBUCKET 0)",
    )
    assert status["rollback.obeyed"] == (
        "skip",
        "the consumer asked again from the start: it keeps no copy between runs ({state})",
    )
