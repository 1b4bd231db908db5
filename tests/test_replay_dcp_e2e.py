"""``replay`` of DCP conversations recorded by the mock pair, against live mocks as real processes.

Each mock-producer draws new vbucket uuids at start-up, so every live producer here differs
from the recorded one in its uuids (and with ``--state`` its failover log); the items are the
same when the seed is.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from support import COMMAND, Server, run_cli

pytestmark = pytest.mark.e2e

PRODUCER = ("--vbuckets", "2", "--items", "30", "--snapshot-size", "8", "--seed", "7")
#: A 1500-byte window acknowledged at half: the session holds BUFFER_ACKs.
CONSUMER = ("--buffer-size", "1500")


def producer(*args: str) -> Server:
    return Server("dcp", "mock-producer", "--port", "0", *args)


def consume(server: Server, *args: str) -> dict:
    done = run_cli("dcp", "mock-consumer", "--connect", server.address, "--format", "json", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def record(tmp_path: Path, name: str, producer_args=PRODUCER, consumer_args=CONSUMER) -> tuple[Path, int]:
    """A session of the mock pair, recorded by the producer: the capture and the port it used."""
    pcap = tmp_path / f"{name}.pcap"
    with producer(*producer_args, "--record", str(pcap)) as server:
        consume(server, *consumer_args)
        server.stop()
    return pcap, server.port


def records(pcap: Path, port: int) -> list[dict]:
    done = run_cli("dissect", str(pcap), "--port", str(port), "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def replay(pcap: Path, port: int, *args: str, answer_timeout: float = 20) -> tuple[int, dict]:
    """``--answer-timeout``: how long a frame that never comes is waited for (each wait ends at
    the first one missing after answers that came)."""
    timeout = str(answer_timeout)
    done = run_cli(
        "replay", str(pcap), "--port", str(port), "--format", "json", "--answer-timeout", timeout, *args
    )
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout.splitlines()[-1])


def first_bad(report: dict) -> dict:
    bad = [o for o in report["outcomes"] if o["result"] != "matched"]
    assert bad, report
    return min(bad, key=lambda o: o.get("recorded_packet") or 1 << 30)


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> tuple[Path, int, list[dict]]:
    tmp = tmp_path_factory.mktemp("recorded")
    pcap, port = record(tmp, "session")
    return pcap, port, records(pcap, port)


def test_a_recorded_consumer_replays_against_a_producer_with_other_uuids(session, tmp_path):
    pcap, port, recorded = session
    live = tmp_path / "live.pcapng"
    with producer(*PRODUCER) as server:
        rc, report = replay(
            pcap, port, "--play", "client", "--connect", server.address, "--record", str(live)
        )
    from_producer = [r for r in recorded if r["sender"] == "producer"]
    assert rc == 0, report
    assert report["counts"]["matched"] == len(from_producer) == report["received"]
    assert report["sent"] == len(recorded) - len(from_producer)
    # the live run, SCRAM redone and buffer acks adapted, is a clean DCP conversation of its own
    done = run_cli("dissect", str(live), "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    live_records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {r["verdict"] for r in live_records} == {"accepted"}
    assert any(r["type"] == "DCP_BUFFER_ACKNOWLEDGEMENT" for r in live_records)
    uuids = {r["vb_uuid"] for r in from_producer if r["type"] == "DCP_STREAM_REQ_RESPONSE"}
    live_uuids = {r["vb_uuid"] for r in live_records if r["type"] == "DCP_STREAM_REQ_RESPONSE"}
    assert uuids and live_uuids and not uuids & live_uuids


def test_a_resuming_consumer_names_the_live_nodes_vbucket_uuids(tmp_path):
    """The recorded consumer resumes with the recorded node's uuids; the live node, with the same
    history under other uuids, streams the rest rather than rolling back to 0."""
    pstate, cstate = tmp_path / "p.json", tmp_path / "c.json"
    with producer(*PRODUCER, "--state", str(pstate)) as server:
        consume(server, *CONSUMER, "--state", str(cstate))
    resume = ("--vbuckets", "2", "--items", "10", "--snapshot-size", "8", "--seed", "7")
    pcap, port = record(
        tmp_path, "resume", (*resume, "--state", str(pstate)), (*CONSUMER, "--state", str(cstate))
    )
    recorded = records(pcap, port)
    requests = [r for r in recorded if r["type"] == "DCP_STREAM_REQ"]
    assert requests and all(r["start_seqno"] == 30 and r["vb_uuid"] for r in requests)
    other = tmp_path / "other.json"
    with producer(*PRODUCER, "--state", str(other)):
        pass
    with producer(*resume, "--state", str(other)) as server:
        rc, report = replay(pcap, port, "--play", "client", "--connect", server.address)
    assert rc == 0, json.dumps(report["outcomes"])
    assert report["counts"]["matched"] == sum(r["sender"] == "producer" for r in recorded)


def test_a_producer_that_no_longer_serves_a_vbucket_is_reported_at_its_stream_answer(session):
    pcap, port, recorded = session
    with producer(*PRODUCER, "--not-my-vbucket", "1") as server:
        rc, report = replay(pcap, port, "--play", "client", "--connect", server.address, answer_timeout=5)
    assert rc == 1 and not report["stopped"], report
    answer = next(r for r in recorded if r["type"] == "DCP_STREAM_REQ_RESPONSE" and r["vbucket"] == 1)
    bad = first_bad(report)
    assert bad["result"] == "divergent" and bad["recorded_packet"] == answer["packet"]
    assert {"field": "status", "recorded": "SUCCESS", "live": "NOT_MY_VBUCKET"} in bad["fields"]
    # the rest of vbucket 1's stream never came; vbucket 0's did
    missing = [o for o in report["outcomes"] if o["result"] == "missing"]
    assert len(missing) == sum(r["sender"] == "producer" and r.get("vbucket") == 1 for r in recorded) - 1


def test_another_seed_carries_through_the_conversation_and_differs_at_the_first_changed_item(session):
    pcap, port, recorded = session
    other = [a if a != "7" else "8" for a in PRODUCER]
    with producer(*other) as server:
        rc, report = replay(pcap, port, "--play", "client", "--connect", server.address, answer_timeout=5)
    assert rc == 1 and not report["stopped"], report
    bad = first_bad(report)
    first_item = next(r for r in recorded if r["type"] in ("DCP_MUTATION", "DCP_DELETION"))
    assert bad["recorded_packet"] == first_item["packet"]
    # the streams still ended as recorded: the adaptation carried the conversation to its end
    ends = [r for r in recorded if r["type"] == "DCP_STREAM_END"]
    assert report["counts"]["matched"] >= len(ends) + 10


@pytest.fixture(scope="module")
def unbounded(tmp_path_factory) -> tuple[Path, int, list[dict]]:
    """A session whose consumer's window (1 MiB) is never reached: no BUFFER_ACK. (A mock consumer
    acknowledges once its reads cross half the window, so how many acknowledgements it sends
    follows how the bytes were segmented, which a replay does not reproduce.)"""
    tmp = tmp_path_factory.mktemp("unbounded")
    pcap, port = record(tmp, "unbounded", consumer_args=())
    return pcap, port, records(pcap, port)


def play_producer(
    pcap: Path, port: int, *consumer_args: str, live: Path | None = None
) -> tuple[int, dict, dict]:
    args = ["replay", str(pcap), "--port", str(port), "--play", "server", "--listen", "127.0.0.1:0"]
    args += ["--format", "json", "--answer-timeout", "20"]
    if live is not None:
        args += ["--record", str(live)]
    server = Server(*args)
    try:
        summary = consume(server, *consumer_args)
        rc, out, err = server.stop(sig=None)
    finally:
        server.kill()
    assert out.strip(), err
    return rc, json.loads(out.splitlines()[-1]), summary


def test_a_recorded_producer_replays_to_a_live_consumer(unbounded, tmp_path):
    pcap, port, recorded = unbounded
    live = tmp_path / "producer.pcapng"
    rc, report, summary = play_producer(pcap, port, live=live)
    assert rc == 0, report
    assert report["counts"]["matched"] == sum(r["sender"] == "consumer" for r in recorded)
    items = sum(r["type"] in ("DCP_MUTATION", "DCP_DELETION", "DCP_EXPIRATION") for r in recorded)
    assert summary["items_received"] == items and summary["stream_ends"] == {"ok": 2}
    assert run_cli("dissect", str(live)).returncode == 0


def test_a_live_consumer_with_a_small_window_is_reported_at_its_control_and_the_window_is_kept(unbounded):
    pcap, port, recorded = unbounded
    rc, report, summary = play_producer(pcap, port, "--buffer-size", "1000")
    assert rc == 1 and not report["stopped"], report
    control = next(r for r in recorded if r.get("control_key") == "connection_buffer_size")
    bad = first_bad(report)
    assert bad["recorded_packet"] == control["packet"]
    assert {"field": "control_value", "recorded": "1048576", "live": "1000"} in bad["fields"]
    # the stream waited for the live consumer's acknowledgements: no flow-control violation, every item
    assert summary["violations"] == 0 and summary["stream_ends"] == {"ok": 2}
    items = sum(r["type"] in ("DCP_MUTATION", "DCP_DELETION", "DCP_EXPIRATION") for r in recorded)
    assert summary["items_received"] == items and summary["buffer_acks"] > 2
    others = {o["type"] for o in report["outcomes"] if o["result"] != "matched"} - {"DCP_CONTROL"}
    assert others == {"DCP_BUFFER_ACKNOWLEDGEMENT"}  # what it sent more than the recorded consumer


def test_a_long_session_matches_with_the_live_producer_a_whole_window_ahead(tmp_path):
    """The live producer sends its 1 MiB window (some 8,000 items of this size) as soon as the
    streams open, far ahead of the replay's place in the recording: each waits for its match."""
    big = ("--vbuckets", "2", "--items", "6000", "--snapshot-size", "64", "--value-size", "16", "--seed", "3")
    pcap, port = record(tmp_path, "long", big, ())
    with producer(*big) as server:
        rc, report = replay(pcap, port, "--play", "client", "--connect", server.address)
    assert rc == 0, {k: report[k] for k in ("counts", "stopped")}
    assert report["counts"]["matched"] == report["received"] > 6_000


def test_diff_finds_two_recordings_of_one_session_the_same_and_another_seed_at_its_first_item(
    session, tmp_path
):
    pcap, port, recorded = session
    again, again_port = record(tmp_path, "again")
    other, other_port = record(tmp_path, "other", [a if a != "7" else "8" for a in PRODUCER])
    ports = ("--port", str(port), "--port", str(again_port), "--port", str(other_port))
    same = run_cli("diff", str(pcap), str(again), *ports, "--format", "json")
    assert same.returncode == 0, same.stdout + same.stderr
    assert json.loads(same.stdout)["counts"]["matched"] == len(recorded)
    differs = run_cli("diff", str(pcap), str(other), *ports, "--format", "json")
    assert differs.returncode == 1, differs.stderr
    report = json.loads(differs.stdout)
    first_item = next(r for r in recorded if r["type"] in ("DCP_MUTATION", "DCP_DELETION"))
    assert first_bad(report)["recorded_packet"] == first_item["packet"]


# ----------------------------------------------------------------------------- NOOPs are timing


def live_records(pcap: Path) -> list[dict]:
    done = run_cli("dissect", str(pcap), "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def record_until_a_noop(tmp_path: Path, interval: str) -> tuple[Path, int]:
    """A following consumer's session with NOOPs every ``interval`` s, recorded until it answered one."""
    pcap = tmp_path / "noops.pcap"
    with producer(*PRODUCER, "--record", str(pcap)) as server:
        follow = [*COMMAND, "dcp", "mock-consumer", "--connect", server.address, "--follow"]
        consumer = subprocess.Popen(
            [*follow, *CONSUMER, "--noop-interval", interval, "--timeout", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            while not (
                pcap.exists() and any(r["type"] == "DCP_NOOP_RESPONSE" for r in records(pcap, server.port))
            ):
                assert consumer.poll() is None and time.monotonic() < deadline, "no NOOP was answered"
        finally:
            consumer.terminate()
            consumer.wait(timeout=60)
        server.stop()
    return pcap, server.port


def test_recorded_noops_the_live_producer_has_not_sent_yet_are_neither_waited_for_nor_answered(tmp_path):
    """The replay walks faster than the recorded session ran: the live producer's first NOOP is
    due an interval after it enabled them (a replay waiting for the recorded one would miss it)."""
    pcap, port = record_until_a_noop(tmp_path, "3")
    assert any(r["type"] == "DCP_NOOP" for r in records(pcap, port))
    with producer(*PRODUCER) as server:
        rc, report = replay(pcap, port, "--play", "client", "--connect", server.address, answer_timeout=5)
    assert rc == 0 and not report["stopped"], report
    assert not any("NOOP" in json.dumps(o) for o in report["outcomes"]), report


def test_live_noops_the_recording_never_had_are_answered_as_they_come(tmp_path):
    """Recorded at the same interval, but the replay outlasts the recorded session: it waits out
    the answer timeout for the stream of a vbucket the live node does not serve, and the live
    producer sends a NOOP every half second meanwhile (it sends none while one is unanswered)."""
    pcap, port = record(tmp_path, "quick", consumer_args=(*CONSUMER, "--noop-interval", "0.5"))
    live = tmp_path / "live.pcapng"
    with producer(*PRODUCER, "--not-my-vbucket", "1") as server:
        rc, report = replay(
            pcap,
            port,
            "--play",
            "client",
            "--connect",
            server.address,
            "--record",
            str(live),
            answer_timeout=4,
        )
    assert rc == 1 and not report["stopped"], report
    assert not any("NOOP" in json.dumps(o) for o in report["outcomes"]), report
    played = live_records(live)
    noops = [r["opaque"] for r in played if r["type"] == "DCP_NOOP"]
    replies = [r["opaque"] for r in played if r["type"] == "DCP_NOOP_RESPONSE"]
    assert len(replies) >= 2 and replies == noops[: len(replies)], (noops, replies)
    assert len(noops) - len(replies) <= 1  # the last may come as the replay closes
    assert {r["verdict"] for r in played} == {"accepted"}
