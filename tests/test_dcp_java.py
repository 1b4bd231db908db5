"""Couchbase's own DCP client (java-dcp-client, unmodified) streams from dcp mock-producer.

The client comes from ../shared/peers/couchbase-dcp (see its README); tests/peers/DcpDriver.java
drives it and is compiled with javac into a temporary folder. Skipped, with the reason, when
the client's folder or javac is absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support import Server, run_cli

from wallaroo_proto.protocols.dcp.store import Bucket

pytestmark = pytest.mark.e2e

# DCP_CLIENT_PEER names the client's folder; by default shared/peers/couchbase-dcp beside the checkout.
BESIDE = Path(__file__).resolve().parents[2] / "shared" / "peers" / "couchbase-dcp"
PEER = Path(os.environ.get("DCP_CLIENT_PEER", BESIDE))
DRIVER = Path(__file__).parent / "peers" / "DcpDriver.java"
#: The client's own log (log4j2) to stderr: its info lines, and the conductor's debug ones (stream retries).
LOG_CONFIG = Path(__file__).parent / "peers" / "dcp-client-log4j2.properties"


@pytest.fixture(scope="module")
def classpath(tmp_path_factory) -> str:
    if not (PEER / "lib").is_dir():
        pytest.skip(f"java-dcp-client is not at {PEER}: no real client to stream with")
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("javac/java not installed (apt-get install openjdk-17-jdk-headless)")
    jars = ":".join(str(j) for j in sorted((PEER / "lib").glob("*.jar")))
    out = tmp_path_factory.mktemp("driver")
    done = subprocess.run(
        ["javac", "-d", str(out), "-cp", jars, str(DRIVER)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return f"{out}:{jars}"


def stream(
    classpath: str, server: Server, *args: str, timeout: int = 120, log: Path | None = None
) -> tuple[int, list[list[str]]]:
    """Run the driver: exit code and its event lines, split; with ``log``, the client's log goes there."""
    logging = [f"-Dlog4j2.configurationFile={LOG_CONFIG}"] if log else []
    command = ["java", f"-Ddriver.timeout={timeout}", *logging, "-cp", classpath, "DcpDriver"]
    with open(log or os.devnull, "w") as err:
        done = subprocess.run(
            [*command, server.address, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=timeout + 120,
        )
    return done.returncode, [line.split(" ") for line in done.stdout.splitlines()]


def live_keys(events: list[list[str]], start: dict[int, set[str]] | None = None) -> dict[int, set[str]]:
    """Each vbucket's live keys after the events, in order (a deletion removes its key)."""
    live = {vb: set(keys) for vb, keys in (start or {}).items()}
    for e in events:
        if e[0] == "MUTATION":
            live.setdefault(int(e[1]), set()).add(e[4])
        elif e[0] == "DELETION":
            live.setdefault(int(e[1]), set()).discard(e[4])
    return live


def producer_keys(state: Path) -> dict[int, set[str]]:
    bucket = Bucket.from_json(state.read_bytes())
    return {vb.vb: set(vb.state()) for vb in bucket.vbuckets.values()}


def offsets(events: list[list[str]], path: Path, state: Path) -> None:
    """The driver's last offsets, each with the vbucket's high seqno in ``state`` to stream until."""
    high = {vb.vb: vb.high_seqno for vb in Bucket.from_json(state.read_bytes()).vbuckets.values()}
    lines = [e[1:] + [str(high[int(e[1])])] for e in events if e[0] == "OFFSET"]
    path.write_text("".join(" ".join(line) + "\n" for line in lines))


def test_the_client_streams_every_vbucket_once_with_a_small_flow_control_buffer(classpath, tmp_path):
    state = tmp_path / "p.json"
    pcap = tmp_path / "java.pcap"
    args = (
        "--vbuckets",
        "8",
        "--items",
        "300",
        "--state",
        str(state),
        "--require-auth",
        "--record",
        str(pcap),
    )
    with Server("dcp", "mock-producer", "--port", "0", *args) as server:
        rc, events = stream(classpath, server, "default", "Administrator", "password", "2000")
        _, _, stderr = server.stop()
    assert rc == 0, events[-5:]
    assert sorted(e[1] for e in events if e[0] == "END") == [str(vb) for vb in range(8)]
    assert {e[2] for e in events if e[0] == "END"} == {"OK"}
    items = [(e[1], e[2]) for e in events if e[0] in ("MUTATION", "DELETION")]
    assert len(items) == len(set(items))  # every (vbucket, seqno) once
    assert live_keys(events) == {vb: keys for vb, keys in producer_keys(state).items() if keys}
    assert "Traceback" not in stderr and "VIOLATION" not in stderr
    # Each item as the producer holds it: its CAS (from the hybrid logical clock, never 0), and
    # deletions and expirations both as deletions, not due to expiration (the client asked for no
    # expiry opcode), as a data node sends them.
    versions = {
        (vb.vb, v.seqno): v for vb in Bucket.from_json(state.read_bytes()).vbuckets.values() for v in vb.log
    }
    ops = {"MUTATION": {"mutation"}, "DELETION": {"deletion", "expiration"}}
    for e in events:
        if e[0] in ops:
            v = versions[(int(e[1]), int(e[2]))]
            assert v.op in ops[e[0]] and v.key == e[4] and int(e[3]) == v.cas > 0
            assert e[0] == "MUTATION" or e[5] == "false"
    assert {v.op for v in versions.values()} == {"mutation", "deletion", "expiration"}
    # dissect reads the client's traffic, SCRAM steps and the bucket config included, as the rules allow.
    done = run_cli("dissect", str(pcap), "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {r["verdict"] for r in records} == {"accepted"}
    types = {r["type"] for r in records}
    assert {"SASL_STEP_RESPONSE", "GET_CLUSTER_CONFIG_RESPONSE", "DCP_BUFFER_ACKNOWLEDGEMENT"} <= types
    done = run_cli("report", str(pcap), "-o", str(tmp_path / "java.html"))
    assert done.returncode == 0 and "0 with violations" in done.stdout + done.stderr, done.stderr


def test_the_client_resumes_from_saved_offsets_and_rolls_back_after_a_failover(classpath, tmp_path):
    state, saved = tmp_path / "p.json", tmp_path / "offsets.txt"
    common = ("--port", "0", "--vbuckets", "4", "--state", str(state))
    login = ("default", "Administrator", "password", "5000")
    with Server("dcp", "mock-producer", *common, "--items", "60") as server:
        rc, first = stream(classpath, server, *login)
    assert rc == 0
    before = live_keys(first)
    with Server("dcp", "mock-producer", *common, "--items", "10") as server:  # ten more per vbucket
        offsets(first, saved, state)
        rc, resumed = stream(classpath, server, *login, str(saved))
    assert rc == 0, resumed[-5:]
    assert not [e for e in resumed if e[0] == "ROLLBACK"]
    assert {int(e[2]) for e in resumed if e[0] in ("MUTATION", "DELETION")} <= set(range(61, 71))
    assert live_keys(resumed, before) == producer_keys(state)
    # A failover that lost the newest 25 of 70, then 5 new items: the client at 70 rolls back to 45.
    with Server("dcp", "mock-producer", *common, "--items", "5", "--failover", "25") as server:
        offsets(resumed, saved, state)
        rc, rolled = stream(classpath, server, *login, str(saved))
    assert rc == 0, rolled[-5:]
    rollbacks = [(e[1], e[2]) for e in rolled if e[0] == "ROLLBACK"]
    assert sorted(rollbacks[:4]) == [(str(vb), "45") for vb in range(4)]  # the server's rule
    # The client asks again from 45 with vbucket uuid 0 (it kept no failover log for a resumed
    # offset), which the rule, as on a data node, answers with ROLLBACK to 0: it streams anew.
    assert sorted(rollbacks[4:]) == [(str(vb), "0") for vb in range(4)]
    assert live_keys(rolled) == producer_keys(state)


def test_the_client_survives_a_connection_dropped_mid_stream(classpath, tmp_path):
    state = tmp_path / "p.json"
    args = ("--vbuckets", "4", "--items", "500", "--state", str(state), "--drop-after", "300")
    with Server("dcp", "mock-producer", "--port", "0", *args, "--format", "json") as server:
        rc, events = stream(classpath, server, "default", "Administrator", "password", "2000")
        _, stdout, _ = server.stop()
    assert rc == 0, events[-5:]
    assert '"dropped_connections": 1' in stdout
    assert {e[2] for e in events if e[0] == "END"} == {"OK"} and len(
        [e for e in events if e[0] == "END"]
    ) == 4
    assert live_keys(events) == {vb: keys for vb, keys in producer_keys(state).items() if keys}


def test_a_vbucket_that_moves_to_another_node_is_followed_there_as_the_client_follows_a_rebalance(
    classpath, tmp_path
):
    state, log = tmp_path / "p.json", tmp_path / "client.log"
    args = ("--vbuckets", "4", "--items", "50", "--state", str(state), "--require-auth", "--format", "json")
    with Server("dcp", "mock-producer", "--port", "0", *args, "--move-vbucket", "2") as server:
        second = int(server.lines[0].rsplit(":", 1)[1])  # "second node on HOST:PORT"
        rc, events = stream(classpath, server, "default", "Administrator", "password", "2000", log=log)
        _, stdout, _ = server.stop()
    assert rc == 0, events[-5:]
    assert sorted((e[1], e[2]) for e in events if e[0] == "END") == [(str(vb), "OK") for vb in range(4)]
    items = [(e[1], e[2]) for e in events if e[0] in ("MUTATION", "DELETION")]
    assert len(items) == len(set(items))
    assert live_keys(events) == {vb: keys for vb, keys in producer_keys(state).items() if keys}
    # The client took the config in the NOT_MY_VBUCKET body (rev 2), connected to the node it
    # names, and opened vbucket 2's stream there; the first node streamed the three others.
    client = log.read_text()
    assert "Received bucket config from NotMyVbucket" in client
    assert f"Adding DCP Channel against 127.0.0.1:{second}" in client
    assert (
        "Rescheduling Stream Start for vbid 2 due to com.couchbase.client.dcp.conductor.NotMyVbucketException"
        in client
    )
    summary = json.loads(stdout.splitlines()[-1])
    assert summary["moved"] == [2] and summary["not_my_vbucket"] == 1 and not summary["violations"]
    home, away = summary["nodes"]
    assert away["port"] == second and away["connections"] >= 1
    per_vb = {v["vbucket"]: v["items_sent"] for v in summary["vbuckets"]}
    assert away["items_sent"] == per_vb[2] > 0 and home["items_sent"] == sum(per_vb.values()) - per_vb[2]
