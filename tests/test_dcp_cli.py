"""The DCP commands speak the grammar of docs/cli.md: --listen, --connect, -o/--output, -q/-v."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support import COMMAND, Server, as_foreground, run_cli

pytestmark = pytest.mark.e2e


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


def _syn_sent_to(port: int) -> int:
    """How many sockets here are in SYN_SENT towards ``port`` (/proc/net/tcp, state 02)."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for f in map(str.split, lines) if f[2].endswith(f":{port:04X}") and f[3] == "02")


@pytest.mark.timeout(120)
def test_ctrl_c_stops_a_consumer_still_connecting_to_a_producer_that_never_answers():
    with contextlib.ExitStack() as stack:
        full = stack.enter_context(socket.socket())
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        for _ in range(3):  # the backlog fills; further SYNs go unanswered, connect() waits
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        waiting = _syn_sent_to(port)  # the fillers beyond the backlog
        consumer = subprocess.Popen(
            [*COMMAND, "dcp", "mock-consumer", "--connect", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_foreground,
        )
        try:
            deadline = time.monotonic() + 60
            while _syn_sent_to(port) == waiting:
                assert consumer.poll() is None, consumer.communicate()
                assert time.monotonic() < deadline, "the consumer never began to connect"
                time.sleep(0.05)
            consumer.send_signal(signal.SIGINT)
            _, err = consumer.communicate(timeout=30)
        finally:
            consumer.kill()
    assert consumer.returncode == 130, err
    assert "Traceback" not in err
