"""``fuzz`` against our DCP mock-producer, with and without a rule broken on purpose.

The planted break is switched on by the environment variable ``WALLAROO_PROTO_PLANT``,
read by the mock only (no CLI flag, not for users):

* ``close-stream-goes-on``: mock-producer answers a CLOSE_STREAM of an open stream SUCCESS
  but keeps streaming it, so the stream's next messages ride an opaque with no open stream
  (the core's ``no-stream`` rule). Only a CLOSE_STREAM while a stream is open shows it: the
  fuzzer has to insert one mid-stream.

The seed is mock-consumer's session with mock-producer (one vbucket, a 100-byte flow-control
buffer, so a BUFFER_ACK follows each message and most of the consumer's frames are sent while
the stream is open), recorded by the producer; a fixed --seed makes the campaign the same each
run, given the mock's same answers.
"""

from __future__ import annotations

import json

import pytest
from support import Server, run_cli

from wallaroo_proto.pcap_writer import PcapWriter

pytestmark = pytest.mark.e2e

PRODUCER = ("--vbuckets", "1", "--items", "10", "--snapshot-size", "4", "--seed", "7")
FUZZ = ("--play", "consumer", "--seed", "1", "--answer-timeout", "0.2")
FUZZ += ("--shrink-time", "5", "--confirm", "2", "--format", "json")
PLANT = "close-stream-goes-on"


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    pcap = tmp_path_factory.mktemp("fuzz-dcp") / "seed.pcap"
    with Server("dcp", "mock-producer", "--port", "0", *PRODUCER, "--record", str(pcap)) as server:
        done = run_cli(
            "dcp",
            "mock-consumer",
            "--connect",
            server.address,
            "--noop-interval",
            "60",
            "--buffer-size",
            "100",
        )
        server.stop()
    assert done.returncode == 0, done.stderr
    return pcap


def campaign(seed, tmp_path, plant: str | None, budget: int):
    """Fuzz a fresh mock-producer (planted or not) for ``budget`` executions: the exit code, the
    summary, and the finding of the planted kind rerun against the same producer (exit code), if
    there is one."""
    env = {"WALLAROO_PROTO_PLANT": plant} if plant else {}
    findings = tmp_path / "findings"
    with Server("dcp", "mock-producer", "--port", "0", *PRODUCER, env=env) as server:
        done = run_cli(
            "fuzz", "--seeds", str(seed), "--connect", server.address, *FUZZ, "--budget", str(budget),
            "--findings", str(findings), timeout=600,
        )  # fmt: skip
        summary = json.loads(done.stdout.splitlines()[-1])
        planted = [f for f in summary["findings"] if "no open stream" in f["detail"]]
        rerun = None
        if planted:
            again = run_cli(
                "fuzz", "--rerun", planted[0]["reproducer"], "--play", "consumer",
                "--connect", server.address, "--answer-timeout", "0.2", "--format", "json",
            )  # fmt: skip
            rerun = again.returncode
    return done.returncode, summary, planted, rerun


def test_the_planted_close_stream_break_is_found_shrunk_and_reproduced(seed, tmp_path):
    rc, summary, planted, rerun = campaign(seed, tmp_path, PLANT, 100)
    assert rc == 1, summary
    assert planted, summary["findings"]
    finding = planted[0]
    assert finding["kind"] == "violation"
    assert "DCP_CLOSE_STREAM inserted" in finding["mutation"], finding
    assert finding["deterministic"], finding
    # shrunk: the setup, the stream request, a few messages and acks, the inserted CLOSE_STREAM
    assert finding["frames"] < 44, finding
    assert run_cli("dissect", finding["reproducer"]).returncode in (0, 1)
    assert rerun == 1


def test_without_the_plant_a_longer_campaign_finds_nothing(seed, tmp_path):
    rc, summary, _, _ = campaign(seed, tmp_path, None, 300)
    assert summary["executions"] >= 300
    assert summary["findings"] == [] and rc == 0, summary["findings"]


# HELLO "fuzz" (opaque 1) and its answer, then a NOOP reply with no NOOP sent (opaque 0), by hand:
# magic, opcode, key length, extras length, datatype, vbucket or status, body length, opaque, cas.
HELLO = bytes.fromhex("80 1f 0004 00 00 0000 00000004 00000001 0000000000000000 66757a7a")
HELLO_OK = bytes.fromhex("81 1f 0000 00 00 0000 00000000 00000001 0000000000000000")
NOOP_REPLY = bytes.fromhex("81 5c 0000 00 00 0000 00000000 00000000 0000000000000000")


def test_a_close_refusing_our_last_illegal_frame_is_waited_for_before_we_end(tmp_path):
    """Our last frame is a NOOP reply to no NOOP: mock-producer closes on it (as a data node does,
    producer.cc handleResponse), which is its refusal only if it comes before our own half-close."""
    capture = tmp_path / "noop-reply.pcap"
    with PcapWriter(capture) as w:
        s = w.tcp_session(("127.0.0.1", 50000), ("127.0.0.1", 11210), timestamp=1.0)
        for n, (client, wire) in enumerate([(True, HELLO), (False, HELLO_OK), (True, NOOP_REPLY)]):
            s.send(client, wire, 1.001 + n / 1000)
        s.close(True, 1.1)
    with Server("dcp", "mock-producer", "--port", "0", *PRODUCER) as server:
        done = run_cli(
            "fuzz", "--rerun", str(capture), "--play", "consumer", "--connect", server.address,
            "--answer-timeout", "2", "--format", "json",
        )  # fmt: skip
    assert json.loads(done.stdout.splitlines()[-1])["findings"] == [], done.stdout
    assert done.returncode == 0, done.stderr
