"""``replay`` with Couchbase's own java-dcp-client (unmodified): a recorded producer session played
as the server to it, and its recorded session played as the client to a live mock-producer; and
``fuzz`` playing mutants of that producer session to it, one client started per case.

The client and its driver are those of ``test_dcp_java`` (skipped, with the reason, when the
client's folder or javac is absent). The client opens its connection with a random id in its
names, all its setup commands on opaque 0, asks each vbucket's failover log and streams with the
uuid it learnt, and reads the bucket config for where each vbucket lives.
"""

from __future__ import annotations

import json
import shlex

import pytest
from support import Server, run_cli
from test_dcp_java import classpath, stream  # noqa: F401 - classpath is a fixture

pytestmark = pytest.mark.e2e

PRODUCER = ("--vbuckets", "2", "--items", "20", "--snapshot-size", "8", "--seed", "7")
LOGIN = ("default", "Administrator", "password", "100000")


@pytest.fixture(scope="module")
def java_session(classpath, tmp_path_factory):  # noqa: F811 - the imported fixture
    pcap = tmp_path_factory.mktemp("java") / "java.pcap"
    with Server("dcp", "mock-producer", "--port", "0", *PRODUCER, "--record", str(pcap)) as server:
        rc, events = stream(classpath, server, *LOGIN)
        server.stop()
    assert rc == 0 and events[-1] == ["DONE", "2"], events[-5:]
    return pcap, server.port, events


def items(events: list[list[str]]) -> list[tuple[str, ...]]:
    """Each item the client got: kind, vbucket, seqno and key (not its CAS: a node's clock)."""
    return sorted((e[0], e[1], e[2], e[4]) for e in events if e[0] in ("MUTATION", "DELETION"))


def test_a_recorded_producer_replays_to_the_java_client(classpath, java_session, tmp_path):  # noqa: F811
    pcap, port, recorded_events = java_session
    live = tmp_path / "live.pcapng"
    args = ("--port", str(port), "--play", "server", "--listen", "127.0.0.1:0", "--format", "json")
    server = Server("replay", str(pcap), *args, "--answer-timeout", "20", "--record", str(live))
    try:
        rc_client, events = stream(classpath, server, *LOGIN, timeout=90)
        rc, out, err = server.stop(sig=None)
    finally:
        server.kill()
    report = json.loads(out.splitlines()[-1])
    # SCRAM answered for its nonce, the config naming this port, answers on its opaques: the same
    # conversation, and the client got every item as from the producer
    assert rc == 0, report
    assert rc_client == 0 and events[-1] == ["DONE", "2"]
    assert items(events) == items(recorded_events)
    assert report["counts"]["matched"] == report["received"] > 10
    assert run_cli("dissect", str(live)).returncode == 0


def test_the_java_clients_recorded_session_replays_against_a_producer_with_other_uuids(java_session):
    pcap, port, _ = java_session
    with Server("dcp", "mock-producer", "--port", "0", *PRODUCER) as server:
        done = run_cli(
            "replay", str(pcap), "--port", str(port), "--play", "client", "--connect", server.address,
            "--format", "json", "--answer-timeout", "20",
        )  # fmt: skip
    report = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 0, report
    assert report["counts"]["matched"] == report["received"]


def test_fuzz_plays_mutants_of_the_recorded_producer_to_the_java_client(classpath, java_session, tmp_path):  # noqa: F811
    pcap, port, _ = java_session
    driver = f"java -Ddriver.timeout=30 -cp {shlex.quote(classpath)} DcpDriver"
    client = f"{driver} 127.0.0.1:{{port}} {' '.join(LOGIN)}"
    findings = tmp_path / "findings"
    done = run_cli(
        "fuzz", "--seeds", str(pcap), "--port", str(port), "--play", "producer", "--listen", "127.0.0.1:0",
        "--spawn", client, "--budget", "25s", "--seed", "1", "--answer-timeout", "0.5", "--confirm", "1",
        "--shrink-time", "10", "--findings", str(findings), "--format", "json",
        timeout=600,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    # a JVM per case: a few executions a second at best, but the campaign ran
    assert summary["executions"] >= 5, summary
    for finding in summary["findings"]:
        assert finding["reproducer"] and run_cli("dissect", finding["reproducer"]).returncode in (0, 1), (
            finding
        )
