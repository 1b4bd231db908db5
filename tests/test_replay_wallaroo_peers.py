"""replay against the shipped Wallaroo peers (``../shared/peers/wallaroo``, run, never copied).

Each conversation is recorded with our mock against the real peer, then one side of it is
played again to a fresh real peer: the shipped connector library must send what it sent,
and the shipped test sink ``aloc_sink`` must answer as it answered. Without the peers these
tests skip and say why (the module's ``pytestmark``, from the interop tests).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from support import Server, run_cli
from test_interop_wallaroo import (  # noqa: F401 - the fixture and the skip mark are used by name
    COOKIE,
    PEERS,
    finish_connector,
    free_port,
    inputs,
    peer_env,
    pytestmark,
    start_connector,
)


@pytest.mark.e2e
def test_a_recorded_worker_played_as_the_server_to_the_shipped_connector_matches(tmp_path, inputs) -> None:
    capture = tmp_path / "worker.pcap"
    args = (
        "--port",
        "0",
        "--no-live",
        "--cookie",
        COOKIE,
        "--checkpoint-every",
        "100",
        "--record",
        str(capture),
    )
    with Server("mock-worker", *args) as worker:
        finish_connector(start_connector(worker.port, tmp_path, *inputs))
        assert worker.stop()[0] == 0
    with Server("replay", str(capture), "--play", "worker", "--listen", "127.0.0.1:0") as replay:
        finish_connector(start_connector(replay.port, tmp_path, *inputs))
        code, out, err = replay.stop(sig=None)
    assert code == 0, out + err
    assert "the same (2005 matched" in out  # OK... no: 2 NOTIFYs, 2,000 MESSAGEs, 2 EOS and the HELLO


def _aloc_sink(tmp_path, name: str) -> tuple[subprocess.Popen, int]:
    """A fresh shipped test sink with its own output folder; waits until it listens."""
    port = free_port()
    folder = tmp_path / name
    folder.mkdir()
    (folder / "rules.mock-worker").write_text("")
    command = [
        sys.executable,
        "-W",
        "ignore",
        str(PEERS / "aloc_sink"),
        str(folder / "out"),
        str(folder / "rules"),
    ]
    log = open(folder / "aloc_sink.log", "w")  # noqa: SIM115 - the sink's, closed with the test's tmp_path
    sink = subprocess.Popen([*command, str(port)], cwd=PEERS, env=peer_env(), stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return sink, port
        except OSError:
            assert sink.poll() is None, (folder / "aloc_sink.log").read_text()
            assert time.monotonic() < deadline, "aloc_sink never listened"
            time.sleep(0.05)


@pytest.mark.e2e
def test_a_recorded_worker_drives_the_shipped_sink_to_the_recorded_answers_and_bytes(tmp_path) -> None:
    capture = tmp_path / "sink.pcap"
    sink, port = _aloc_sink(tmp_path, "first")
    try:
        args = ["--sink-connect", f"127.0.0.1:{port}", "--sink-cookie", COOKIE, "--input", "gen:500"]
        done = run_cli(
            "mock-worker", *args, "--checkpoint-every", "100", "--sink-record", str(capture), "--no-live"
        )
        assert done.returncode == 0, done.stderr
    finally:
        sink.kill()
        sink.wait()
    sink, port = _aloc_sink(tmp_path, "second")
    try:
        played = run_cli("replay", str(capture), "--play", "worker", "--connect", f"127.0.0.1:{port}")
    finally:
        sink.kill()
        sink.wait()
    assert played.returncode == 0, played.stdout + played.stderr
    assert "the same (9 matched" in played.stdout  # OK, NOTIFY_ACK, REPLY_UNCOMMITTED, 6 REPLYs... see below
    assert (tmp_path / "second/out.mock-worker").read_bytes() == (
        tmp_path / "first/out.mock-worker"
    ).read_bytes()
