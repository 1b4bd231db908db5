"""Tremor mock-node and mock-client as real processes over loopback: exchanges, faults, bad peers."""

from __future__ import annotations

import json
import signal
import socket
import time

import pytest
from support import Server, run_cli, wait_for
from wsproto.events import BytesMessage

from wallaroo_proto.protocols.tremor.peers import MockClient

pytestmark = pytest.mark.e2e


def client(*args: str, timeout: float = 120) -> tuple[int, dict | None, str]:
    result = run_cli("tremor", "mock-client", "--format", "json", *args, timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return result.returncode, json.loads(lines[-1]) if lines else None, result.stderr


def node(*args: str) -> Server:
    return Server("tremor", "mock-node", "--port", "0", "--format", "json", *args)


def test_generated_exchange_and_a_scripted_violation_against_one_node(tmp_path):
    with node() as n:
        code, summary, err = client("--connect", n.address, "--messages", "300", "--window", "16")
        assert code == 0, err
        assert summary["ok"] and summary["echoes"] == 300 and summary["delivered"] == 10
        script = tmp_path / "script.jsonl"
        script.write_text(
            "# the RFC 0021 walkthrough, then a stream that was never connected\n"
            '{"tremor":{"connect":{"protocol":"echo"}}}\n{"echo":"beep"}\n{"badger":"badger"}\n{"echo":1}\n'
        )
        code, summary, err = client("--connect", n.address, "--script", str(script))
        assert code == 0, err
        assert summary["error_close"] == "0.207: Protocol session not connected error"
        assert [s["replies"] for s in summary["steps"]][1] == ['{"echo":"beep"}']
        assert len(summary["steps"]) == 3  # the 4th line was not sent: the node closed the session
        rc, out, _ = n.stop(signal.SIGTERM)
    assert rc == 0
    stats = json.loads(out.splitlines()[-1])
    assert stats["sessions"] == 2 and stats["violations"] == 1


def test_faults_refuse_drop_delay_malformed():
    with node("--refuse") as n:
        code, _, err = client("--connect", n.address)
        assert code == 1 and "refused the upgrade (HTTP 503)" in err
    with node("--drop-after", "5") as n:
        code, summary, _ = client("--connect", n.address, "--timeout", "20")
        assert code == 1 and not summary["ok"]
        assert any("connection lost" in f or "closed" in f for f in summary["failures"]), summary["failures"]
    with node("--malformed-after", "4") as n:
        code, summary, _ = client("--connect", n.address, "--messages", "10")
        assert code == 1
        assert any("malformed" in f for f in summary["failures"])
    with node("--delay", "20") as n:
        code, summary, err = client(
            "--connect", n.address, "--messages", "5", "--window", "1", "--publish", "1"
        )
        assert code == 0, err
        assert summary["seconds"] >= 0.02 * 9  # every reply waited


def test_a_bad_client_does_not_disturb_the_others():
    with node() as n:
        good = MockClient(n.host, n.port)
        good.connect()
        good.send({"tremor": {"connect": {"protocol": "echo"}}})
        good.settle()
        raw = socket.create_connection((n.host, n.port), timeout=30)  # not even HTTP
        raw.sendall(b"\x00\x01garbage\r\n\r\n")
        raw.settimeout(30)
        assert raw.recv(4096).startswith(b"HTTP/1.1 400 ")  # wsproto's answer to a bad request
        raw.close()
        binary = MockClient(n.host, n.port)
        binary.connect()
        binary._write(binary.ws.send(BytesMessage(data=b"\x01\x02")))
        binary.receive(lambda: False, time.monotonic() + 30)
        assert binary.closed_by_server == 1003  # RFC 0019: binary frames close the connection
        binary.close()
        good.send({"echo": "still here"})
        good.settle()
        assert good.problems == [] and good.session.violations == 0
        good.close()


def test_port_in_use_is_a_usage_error():
    with node() as n:
        result = run_cli("tremor", "mock-node", "--port", str(n.port))
    assert result.returncode == 2 and "cannot listen" in result.stderr


def test_errors_are_one_line_in_the_tools_style():
    with node() as n:
        in_use = run_cli("tremor", "mock-node", "--listen", n.address)
    assert (in_use.returncode, in_use.stderr) == (
        2,
        f"wallaroo-proto tremor mock-node: cannot listen on {n.address}: Address already in use\n",
    )
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # bound, never listening: a connection is refused
        unreachable = run_cli("tremor", "mock-client", "--connect", f"127.0.0.1:{port}")
    assert (unreachable.returncode, unreachable.stderr) == (
        2,
        f"wallaroo-proto tremor mock-client: cannot connect to 127.0.0.1:{port}: Connection refused\n",
    )


def test_verbose_says_when_the_node_is_reached_and_quiet_leaves_out_the_table():
    with node() as n:
        loud = run_cli("tremor", "mock-client", "--connect", n.address, "--messages", "5", "-v")
        quiet = run_cli("tremor", "mock-client", "--connect", n.address, "--messages", "5", "-q")
    assert loud.returncode == 0 and quiet.returncode == 0, (loud.stderr, quiet.stderr)
    assert loud.stderr.splitlines() == [
        f"wallaroo-proto tremor mock-client: connected to {n.address}",
        "wallaroo-proto tremor mock-client: the node accepted the WebSocket upgrade",
    ]
    assert "exchange" in loud.stdout and "5 echoes" in loud.stdout
    assert "exchange" not in quiet.stdout and "5 echoes" in quiet.stdout and quiet.stderr == ""


def test_sigterm_tells_open_sessions_the_node_is_going_away():
    with node() as n:
        c = MockClient(n.host, n.port)
        c.connect()
        c.send({"tremor": {"connect": {"protocol": "echo"}}})
        c.settle()
        n.proc.send_signal(signal.SIGTERM)
        c.receive(lambda: False, time.monotonic() + 60)
        assert c.closed_by_server == 1001
        c.close()
        rc, out, _ = n.stop(None)
    assert rc == 0 and json.loads(out.splitlines()[-1])["sessions"] == 1


def test_values_the_node_could_not_send_back_get_the_error_close_and_one_log_line():
    """NaN, a lone surrogate escape and 100,000 levels of nesting: each session ends with the
    0.101 close and a Close frame, the node logs one line for each and serves on."""
    texts = ['{"e":NaN}', '{"e":"\\ud800"}', "[" * 100_000 + "]" * 100_000]
    with node() as n:
        for text in texts:
            c = MockClient(n.host, n.port, timeout=60)
            c.connect()
            c.send({"tremor": {"connect": {"protocol": "echo", "alias": "e"}}})
            c.settle()
            c.send(text)
            c.settle()
            c.receive(lambda: False, time.monotonic() + 60)
            assert c.session.error_close == "0.101: Malformed value - not a well-formed tremor value"
            assert c.ws_closed  # a Close frame, not a bare EOF
            c.close()
        rc, out, err = n.stop(signal.SIGTERM)
    assert rc == 0 and "Traceback" not in err
    assert len([line for line in err.splitlines() if "violation" in line]) == 3, err
    assert json.loads(out.splitlines()[-1])["internal_errors"] == 0


def test_handshake_and_write_timeouts_are_options():
    with node("--handshake-timeout", "1", "--write-timeout", "5") as n:
        raw = socket.create_connection((n.host, n.port), timeout=60)
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and no more
        assert raw.recv(4096).startswith(b"HTTP/1.1 408 ")
        raw.close()
        rc, out, err = n.stop(signal.SIGTERM)
    assert rc == 0 and "no WebSocket upgrade within 1 s" in err
    assert json.loads(out.splitlines()[-1])["timeouts"] == 1


def test_a_frame_sent_with_the_upgrade_is_answered_and_reported_as_a_violation():
    """RFC 6455 4.1: a client waits for the 101 before it sends. One that sends its first frame in
    the same write as the upgrade request gets its answer, and the broken rule is reported."""
    upgrade = (
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    connect = b'{"tremor":{"connect":{"protocol":"echo"}}}'
    # a final text frame, masked with the key 0 (legal, and the payload then reads as it is)
    frame = b"\x81" + bytes([0x80 | len(connect)]) + b"\x00\x00\x00\x00" + connect
    ack = b'{"tremor":{"connect-ack":{"protocol":"echo","alias":"echo"}}}'
    with node() as n:
        raw = socket.create_connection((n.host, n.port), timeout=60)
        raw.sendall(upgrade + frame)
        got = bytearray()

        def acked() -> bool:
            got.extend(raw.recv(4096))
            return b"\x81" + bytes([len(ack)]) + ack in got

        wait_for(acked, "the connect-ack", timeout=120)
        raw.close()
        rc, out, err = n.stop(signal.SIGTERM)
    # the RFC's own example key and accept token (1.3)
    assert (
        got.startswith(b"HTTP/1.1 101 ") and b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in got
    )
    assert rc == 0
    assert (
        "violation: session 1: 48 bytes came after the upgrade request before the node's 101 (RFC 6455 4.1"
        in err
    )
    summary = json.loads(out.splitlines()[-1])
    assert summary["violations"] == 1 and summary["messages_in"] == 1
