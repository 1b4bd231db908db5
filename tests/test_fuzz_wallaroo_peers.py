"""fuzz against the shipped Wallaroo peers (``../shared/peers/wallaroo``, run, never copied).

The shipped connector library cannot follow a RESTART (handle_restart raises outside its
reconnect loop, handle_error closes for good, join() never returns): a fuzzer playing the
worker must find that, and shrink it to a short capture. The shipped test sink ``aloc_sink``
is fuzzed as a server. Without the peers these tests skip and say why (the interop tests'
``pytestmark``).
"""

from __future__ import annotations

import json
import sys

import pytest
from support import Server, run_cli
from test_interop_wallaroo import (  # noqa: F401 - the skip mark is used by name
    CONNECTOR,
    COOKIE,
    PEERS,
    finish_connector,
    free_port,
    peer_env,
    pytestmark,
    start_connector,
)
from test_replay_wallaroo_peers import _aloc_sink


def fuzz(*args: str, cwd=None, timeout: float = 400) -> tuple[int, dict, str]:
    result = run_cli("fuzz", *args, "--format", "json", timeout=timeout, env=peer_env(), cwd=cwd)
    lines = result.stdout.strip().splitlines()
    return result.returncode, json.loads(lines[-1]) if lines else {}, result.stderr


@pytest.mark.e2e
def test_the_shipped_connector_s_restart_hang_is_found_and_shrunk(tmp_path) -> None:
    (tmp_path / "celsius.msg").write_bytes((PEERS / "celsius.msg").read_bytes())
    seed = tmp_path / "worker.pcap"
    args = ("--port", "0", "--no-live", "--cookie", COOKIE, "--checkpoint-every", "20", "--record", str(seed))
    with Server("mock-worker", *args) as worker:
        finish_connector(start_connector(worker.port, tmp_path, "celsius.msg"))
        assert worker.stop()[0] == 0
    spawn = f"{sys.executable} -W ignore {CONNECTOR} 127.0.0.1 {{port}} {COOKIE} celsius.msg"
    code, summary, err = fuzz(
        "--seeds", str(seed), "--play", "worker", "--listen", "127.0.0.1:0", "--spawn", spawn,
        "--budget", "180s", "--stop-after", "2", "--answer-timeout", "1", "--confirm", "2",
        "--shrink-time", "15", "--findings", str(tmp_path / "found"),
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 1, err
    # the deterministic stage finds two, in this order (at about 45 s here); the budget is a ceiling
    assert [f["kind"] for f in summary["findings"]] == ["accepted", "no-reconnect"], summary["findings"]
    hangs = [f for f in summary["findings"] if f["kind"] == "no-reconnect"]
    assert hangs, summary["findings"]
    hang = hangs[0]
    assert "RESTART" in hang["mutation"] and hang["frames"] <= 10, hang
    shown = run_cli("dissect", hang["reproducer"], "--format", "jsonl")
    assert shown.returncode == 0, shown.stderr
    kinds = [json.loads(line)["type"] for line in shown.stdout.splitlines()]
    assert kinds[:2] == ["HELLO", "OK"] and "RESTART" in kinds and len(kinds) <= 10
    again = run_cli(
        "fuzz", "--rerun", hang["reproducer"], "--play", "worker", "--listen", ":0", "--spawn", spawn,
        env=peer_env(), cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert again.returncode == 1 and "no-reconnect" in again.stdout, again.stdout + again.stderr


@pytest.mark.e2e
def test_aloc_sink_is_fuzzed_as_a_server_restarted_whenever_it_exits(tmp_path) -> None:
    """The shipped test sink exits the whole process on many errors (PROTOCOL-NOTES.md): each
    exit is a finding. It keeps its offsets in memory and in its files, so each case starts it
    afresh (--reset-cmd: fuzz stops it, the command wipes its files, fuzz starts it again)."""
    seed = tmp_path / "sink.pcap"
    sink, port = _aloc_sink(tmp_path, "seed")
    try:
        args = ["--sink-connect", f"127.0.0.1:{port}", "--sink-cookie", COOKIE, "--input", "gen:20"]
        done = run_cli(
            "mock-worker", *args, "--checkpoint-every", "10", "--sink-record", str(seed), "--no-live"
        )
        assert done.returncode == 0, done.stderr
    finally:
        sink.kill()
        sink.wait()
    folder = tmp_path / "fuzzed"
    folder.mkdir()
    (folder / "rules.mock-worker").write_text("")
    port = free_port()
    spawn = f"{sys.executable} -W ignore {PEERS / 'aloc_sink'} {folder / 'out'} {folder / 'rules'} {port}"
    code, summary, err = fuzz(
        "--seeds", str(seed), "--play", "worker", "--connect", f"127.0.0.1:{port}", "--spawn", spawn,
        "--reset-cmd", f"rm -f {folder / 'out.mock-worker'} {folder / 'out.mock-worker.txnlog'}",
        "--budget", "8", "--confirm", "2", "--shrink-time", "10", "--findings", str(tmp_path / "found"),
        cwd=PEERS,
    )  # fmt: skip
    assert code in (0, 1), err
    assert summary["executions"] >= 8, summary  # a process started for each case: about 1.3 a second
    for finding in summary["findings"]:
        shown = run_cli("dissect", finding["reproducer"], "--format", "jsonl")
        assert shown.returncode == 0 and shown.stdout, (finding, shown.stderr)
