"""Tremor mock-client against hostile nodes: a fake node on loopback that breaks the rules."""

from __future__ import annotations

import base64
import hashlib
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Callable

import pytest
from support import COMMAND, as_foreground, run_cli

from wallaroo_proto.protocols.tremor.peers import (
    MAX_REPLY,
    ClientError,
    MockClient,
    generated_exchange,
)

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
_GREETING = b'\x81\x1f{"tremor":{"version":"0.10.2"}}'  # an unmasked text frame, 31 bytes


class FakeNode:
    """Accepts one connection and hands it to ``act`` (after answering the upgrade, if ``upgrade``)."""

    def __init__(self, act: Callable[[socket.socket], None], *, upgrade: bool = True) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.act, self.upgrade = act, upgrade
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.server.settimeout(60)
        conn, _ = self.server.accept()
        conn.settimeout(60)
        try:
            if self.upgrade:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(4096)
                key = next(
                    line.split(b":", 1)[1].strip()
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"sec-websocket-key:")
                )
                accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
                conn.sendall(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + _GREETING
                )
                conn.recv(4096)  # the client's first message
            self.act(conn)
        except OSError:
            pass  # the client hung up on us: what these tests want
        finally:
            conn.close()
            self.server.close()

    def __enter__(self) -> FakeNode:
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(timeout=60)


def _text_frame_header(length: int) -> bytes:
    return b"\x81\x7f" + struct.pack(">Q", length)  # FIN, text; 64-bit length, unmasked


def _endless_text(conn: socket.socket) -> None:
    conn.sendall(_text_frame_header(1 << 40))  # a terabyte declared, then bytes until the client hangs up
    chunk = b"x" * 65536
    for _ in range(100_000):
        conn.sendall(chunk)


def _client(port: int) -> MockClient:
    c = MockClient("127.0.0.1", port, timeout=30)
    c.connect()
    c.send({"tremor": {"connect": {"protocol": "echo"}}})
    return c


def test_a_message_without_end_is_cut_at_the_bound_with_1009():
    with FakeNode(_endless_text) as node:
        c = _client(node.port)
        with pytest.raises(ClientError, match=f"message over {MAX_REPLY} bytes; closed with 1009"):
            c.settle()
        assert c._parts == []  # nothing of it kept
        c.close()


def test_a_binary_frame_fails_the_session_at_once_with_1003():
    with FakeNode(lambda conn: (conn.sendall(b"\x82\x01\x00"), conn.recv(4096))) as node:
        c = _client(node.port)
        with pytest.raises(
            ClientError, match=r"binary frame \(RFC 0019: text frames only\); closed with 1003"
        ):
            c.settle()
        c.close()


def test_the_generated_exchange_stops_at_the_nodes_error_close():
    error_close = b'\x81\x1f{"tremor":{"close":"0.207: x"}}'

    def act(conn):
        conn.sendall(error_close)
        conn.recv(4096)  # the client's Close frame; then the fake hangs up

    with FakeNode(act) as node:
        c = MockClient("127.0.0.1", node.port, timeout=30)
        result = generated_exchange(c, messages=5, window=2, payload=4, publish=1)
    assert result.failures[0] == "the node closed the session: 0.207: x"
    assert result.sent == 1  # nothing after the close


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("act", "upgrade", "said"),
    [
        (lambda conn: conn.sendall(b"\x00\x01garbage\r\n\r\n"), False, "server broke WebSocket"),
        (lambda conn: conn.recv(4096), False, "the node closed the connection during the upgrade"),
        (
            lambda conn: (conn.recv(4096), conn.recv(4096)),
            False,
            "timed out waiting for the server (its answer to the upgrade)",
        ),
    ],
)
def test_a_node_that_answers_the_upgrade_badly_is_the_nodes_failure_exit_1(act, upgrade, said):
    with FakeNode(act, upgrade=upgrade) as node:
        result = run_cli("tremor", "mock-client", "--connect", f"127.0.0.1:{node.port}", "--timeout", "2")
    assert result.returncode == 1 and said in result.stderr, result.stderr


@pytest.mark.e2e
def test_a_script_that_is_not_utf8_is_a_usage_error_naming_the_line(tmp_path):
    script = tmp_path / "s.jsonl"
    script.write_bytes(b'{"tremor":"version"}\n{"e":"caf\xe9"}\n')
    result = run_cli("tremor", "mock-client", "--connect", "127.0.0.1:1", "--script", str(script))
    assert result.returncode == 2 and "line 2: not UTF-8 (byte 10 of the line)" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_node_that_never_reads_fails_the_send_after_the_timeout_saying_so():
    done = threading.Event()
    with FakeNode(lambda conn: done.wait(60)) as node:  # after the first message, reads nothing
        c = MockClient("127.0.0.1", node.port, timeout=1)
        c.connect()
        big = '{"e":"' + "x" * 65536 + '"}'
        with pytest.raises(ClientError, match="the node read none of our bytes for 1 s"):
            for _ in range(100_000):  # far more than the socket buffers on both sides hold
                c.send(big)
        c.sock.close()
        done.set()


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_a_silent_node_is_awaited_is_exit_130(tmp_path, sig):
    accepted = threading.Event()
    done = threading.Event()

    def act(conn):
        accepted.set()
        done.wait(60)

    with FakeNode(act) as node:
        pcap = tmp_path / "run.pcap"
        proc = subprocess.Popen(
            [*COMMAND, "tremor", "mock-client", "--connect", f"127.0.0.1:{node.port}", "--timeout", "60"]
            + ["--record", str(pcap)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_foreground,
        )
        assert accepted.wait(60)  # the client sent its first message and waits for the answer
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        done.set()
    assert proc.returncode == 130 and "Traceback" not in err and "interrupted" in err
    assert pcap.stat().st_size > 24  # the pcap header and what was said before the signal
