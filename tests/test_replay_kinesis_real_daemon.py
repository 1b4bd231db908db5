"""Replay with the real KCL MultiLangDaemon (kclpy-ext's JARs) against moto, as in
test_kinesis_real_daemon.py: a session of the real daemon and the kclpy sample, recorded by
the proxy, played again to the kclpy sample; and its processor side played to the real daemon
reading another stream, whose sequence numbers the replay's checkpoints must follow.

The daemon spawns its processor; a bridge it spawns in the processor's place carries the
lines over TCP (as erlmld's socat does), so the proxy can record them and the replay can
listen for them. Skipped, with the reason, where Java or the JARs are absent.
"""

from __future__ import annotations

import json
import math
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import READY, Server, run_cli
from test_kinesis_real_daemon import _client, _daemon, _leased, _leases, _stop, _wait, endpoint, jars  # noqa: F401

pytestmark = pytest.mark.e2e

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "kcl_processor.py"
RECORDS = 10

# In the processor's place: the daemon's lines to a TCP peer and back (stdin closed: half-close).
CONNECT = """
import os, socket, sys, threading
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def up():
    while data := os.read(0, 65536):
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := sock.recv(65536):
    os.write(1, data)
"""
# A processor behind a TCP port: the first connection becomes its stdin and stdout.
SERVE = """
import socket, subprocess, sys
server = socket.create_server(("127.0.0.1", 0))
print(f"listening on 127.0.0.1:{server.getsockname()[1]}", flush=True)
conn, _ = server.accept()
sys.exit(subprocess.call(sys.argv[1:], stdin=conn.fileno(), stdout=conn.fileno()))
"""


def _stream(url: str, name: str, before: int = 0) -> tuple[str, int]:
    """A one-shard stream of RECORDS records (after ``before`` others, a second earlier): the last
    one's sequence number, and a time in epoch seconds between the two (0 without ``before``).
    Its lease is already in the table (test_kinesis_real_daemon._leased: no 1-30 s wait), at
    TRIM_HORIZON, or with ``before`` at AT_TIMESTAMP (the daemon's initialPositionInStreamExtended)."""
    kinesis = _client("kinesis", url)
    kinesis.create_stream(StreamName=name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    _leased(url, name, "AT_TIMESTAMP" if before else "TRIM_HORIZON")
    for n in range(before):
        kinesis.put_record(StreamName=name, Data=f"earlier {n}".encode(), PartitionKey=f"pk-{n}")
    between = math.ceil(time.time()) if before else 0
    _wait(lambda: time.time() > between, 10, "the next second")
    last = ""
    for n in range(RECORDS):
        put = kinesis.put_record(StreamName=name, Data=f"event {n}".encode(), PartitionKey=f"pk-{n}")
        last = put["SequenceNumber"]
    return last, between


def _dissected(path: Path) -> list[dict]:
    result = run_cli("dissect", "--format", "jsonl", str(path))
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _checkpointed(url: str, name: str, last: str) -> None:
    def at() -> str | None:
        try:
            return _leases(url, name).get("shardId-000000000000")
        except Exception:  # noqa: BLE001 - the daemon has not made its lease table yet
            return None

    _wait(lambda: at() == last, 300, f"a checkpoint at {last}")


def test_a_real_daemon_session_replays_both_ways(jars, endpoint, tmp_path):  # noqa: F811
    pytest.importorskip("amazon_kclpy")
    connect, serve = tmp_path / "connect.py", tmp_path / "serve.py"
    connect.write_text(CONNECT)
    serve.write_text(SERVE)
    capture = tmp_path / "real.pcap"

    # 1. the real daemon and the kclpy sample, recorded by the proxy between them
    last, _ = _stream(endpoint, "replayrec")
    sample = subprocess.Popen(
        [sys.executable, str(serve), sys.executable, str(SAMPLE)], stdout=subprocess.PIPE
    )
    waited, _, _ = select.select([sample.stdout], [], [], 120)  # a bridge that never starts fails here
    ready = READY.search(sample.stdout.readline().decode()) if waited else None
    if ready is None:
        sample.kill()
    assert ready, "the sample's bridge gave no port within 120 s"
    with Server(
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        f"127.0.0.1:{ready.group(2)}",
        "--record",
        str(capture),
    ) as proxy:
        mld = _daemon(jars, endpoint, tmp_path, "replayrec", f"{sys.executable} {connect} {proxy.port}")
        try:
            _checkpointed(endpoint, "replayrec", last)
        finally:
            _stop(mld)
        assert sample.wait(timeout=120) == 0  # kclpy ends at its input's end
        code, _, stderr = proxy.stop(signal.SIGTERM)
    assert code == 0, stderr
    types = [r["type"] for r in _dissected(capture)]
    assert types[:3] == ["initialize", "status", "processRecords"] and "checkpoint" in types

    # 2. its daemon side played to the kclpy sample, spawned as the daemon spawns it
    again = run_cli(
        "replay",
        str(capture),
        "--play",
        "daemon",
        "--spawn",
        f"{sys.executable} {SAMPLE}",
        "--format",
        "json",
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        json.loads(again.stdout)["counts"]["matched"]
        == types.count("status") + types.count("checkpoint") // 2
    )

    # 3. its processor side played to the real daemon reading another stream from a time on:
    # the same records at other sequence numbers (its initialize says AT_TIMESTAMP)
    live_last, between = _stream(endpoint, "replaylive", before=RECORDS // 2)
    with Server(
        "replay", str(capture), "--play", "processor", "--listen", "127.0.0.1:0", "--format", "json",
        "--ignore", "sequence_number", "--answer-timeout", "120", "--record", str(tmp_path / "live.pcapng"),
    ) as replay:  # fmt: skip
        mld = _daemon(
            jars,
            endpoint,
            tmp_path,
            "replaylive",
            f"{sys.executable} {connect} {replay.port}",
            initialPositionInStreamExtended=between,  # AT_TIMESTAMP: the records after the earlier ones
        )
        try:
            # as in 1., the daemon stopped once its checkpointer took the checkpoint: the live
            # conversation ends as the recorded one did (otherwise the replay waits --answer-timeout
            # for the daemon's end, which only comes when the daemon is stopped)
            _checkpointed(endpoint, "replaylive", live_last)  # the real checkpointer took it
        finally:
            _stop(mld)
        code, stdout, stderr = replay.stop(None, timeout=300)
    assert code == 0, stdout + stderr
    asked = [
        r["sequence_number"]
        for r in _dissected(tmp_path / "live.pcapng")
        if r["type"] == "checkpoint" and r["sender"] == "processor"
    ]
    assert asked == [live_last] and live_last != last  # the recorded one's place, live
