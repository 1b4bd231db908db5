"""The DCP commands speak the grammar of docs/cli.md: --listen, --connect, -o/--output, -q/-v."""

from __future__ import annotations

import re
import socket

import pytest
from support import Server, run_cli

pytestmark = pytest.mark.slow


def test_listen_output_and_quiet_as_the_grammar_says(tmp_path):
    items = tmp_path / "items.jsonl"
    with Server(
        "dcp", "mock-producer", "--listen", "127.0.0.1:0", "--vbuckets", "3", "--items", "5"
    ) as server:
        result = run_cli("dcp", "mock-consumer", "--connect", server.address, "-o", str(items), "-q")
        assert result.returncode == 0, result.stderr
        (line,) = result.stdout.splitlines()  # -q: the summary line, not the table
        live = re.search(r"(\d+) live", line)
        assert line.startswith("dcp mock-consumer summary:") and live, line
        assert " over 1 connection, " in line and "0 rollbacks" in line  # counted words in the singular
        assert len(items.read_text().splitlines()) == int(live[1]) > 0
        rc, out, _ = server.stop()
    assert rc == 0 and "vbuckets" in out


def test_a_busy_port_and_a_bad_address_are_one_line_each():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("dcp", "mock-producer", "--listen", f"127.0.0.1:{port}", "--vbuckets", "1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"wallaroo-proto dcp mock-producer: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
    result = run_cli("dcp", "mock-consumer", "--connect", "127.0.0.1:99999")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "'127.0.0.1:99999' is not HOST:PORT" in result.stderr


def test_a_producer_never_reached_is_one_line_and_exit_2():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        result = run_cli("dcp", "mock-consumer", "--connect", f"127.0.0.1:{port}", "--retries", "1")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"wallaroo-proto dcp mock-consumer: cannot connect to 127.0.0.1:{port}: Connection refused; {then}"
        for then in ("reconnecting (1)", "giving up")
    ]
