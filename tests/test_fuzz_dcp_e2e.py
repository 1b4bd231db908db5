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

pytestmark = pytest.mark.e2e

PRODUCER = ("--vbuckets", "1", "--items", "10", "--snapshot-size", "4", "--seed", "7")
FUZZ = ("--play", "consumer", "--budget", "100", "--seed", "1", "--answer-timeout", "0.2")
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


def campaign(seed, tmp_path, plant: str | None):
    """Fuzz a fresh mock-producer (planted or not): the exit code, the summary, and the finding of
    the planted kind rerun against the same producer (exit code), if there is one."""
    env = {"WALLAROO_PROTO_PLANT": plant} if plant else {}
    findings = tmp_path / "findings"
    with Server("dcp", "mock-producer", "--port", "0", *PRODUCER, env=env) as server:
        done = run_cli(
            "fuzz", "--seeds", str(seed), "--connect", server.address, *FUZZ, "--findings", str(findings),
            timeout=600,
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
    rc, summary, planted, rerun = campaign(seed, tmp_path, PLANT)
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


def test_without_the_plant_the_same_campaign_has_no_violation(seed, tmp_path):
    rc, summary, planted, _ = campaign(seed, tmp_path, None)
    assert rc in (0, 1), summary
    assert summary["executions"] >= 100
    assert not [f for f in summary["findings"] if f["kind"] == "violation"], summary["findings"]
    assert not planted
