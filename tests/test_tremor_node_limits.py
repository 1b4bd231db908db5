"""Tremor mock-node in-process over loopback: its own failures and the peers that would hold it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

from wallaroo_proto.protocols.tremor import peers
from wallaroo_proto.protocols.tremor.peers import MockClient, MockNode


def _serve(node: MockNode, client_side) -> object:
    """Run ``client_side(host, port)`` in a thread while the node serves; its result."""

    async def main():
        host, port = await node.start()
        try:
            return await asyncio.to_thread(client_side, host, port)
        finally:
            await node.stop()

    return asyncio.run(main())


def test_a_failure_of_the_nodes_own_closes_that_connection_with_1011_and_one_line(monkeypatch):
    def broken(self, texts):
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    lines: list[str] = []
    node = MockNode(port=0, log=lines.append)
    monkeypatch.setattr(peers._NodeConnection, "_send_texts", broken)

    def client(host, port):
        c = MockClient(host, port, timeout=60)
        c.connect()  # the upgrade is accepted; sending the greeting after it fails
        c.receive(lambda: False, time.monotonic() + 60)
        c.close()
        return c.closed_by_server

    assert _serve(node, client) == 1011
    assert node.stats.internal_errors == 1
    assert lines == [
        "session 1: internal error: UnicodeEncodeError: 'utf-8' codec can't encode "
        "character '\\ud800' in position 0: surrogates not allowed"
    ]


_UPGRADE = (
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def _read_to_eof(sock: socket.socket, deadline: float) -> bytes:
    got = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(4096)
        except (ConnectionResetError, TimeoutError):
            break
        if not data:
            break
        got += data
    return got


def test_a_slowloris_and_a_cut_short_upgrade_get_408_at_the_handshake_deadline():
    lines: list[str] = []
    node = MockNode(port=0, log=lines.append, handshake_timeout=1.0)

    def peers_(host, port):
        slow = socket.create_connection((host, port), timeout=60)
        cut = socket.create_connection((host, port), timeout=60)
        cut.sendall(_UPGRADE[:40])  # then silence
        deadline = time.monotonic() + 60
        answer = b""
        for byte in _UPGRADE[:-1]:  # one byte at a time, never the last
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                break
            slow.settimeout(0.05)
            with contextlib.suppress(TimeoutError):
                answer += slow.recv(4096)
            if answer or time.monotonic() > deadline:
                break
        answer += _read_to_eof(slow, deadline)
        return answer, _read_to_eof(cut, deadline)

    slow, cut = _serve(node, peers_)
    assert slow.startswith(b"HTTP/1.1 408 ") and cut.startswith(b"HTTP/1.1 408 ")
    assert node.stats.timeouts == 2 and node.stats.sessions == 0
    assert all("no WebSocket upgrade within 1 s; answered 408 and closed" in line for line in lines)
    assert len(lines) == 2


def test_a_peer_that_never_reads_is_aborted_at_the_write_timeout_and_the_others_carry_on():
    lines: list[str] = []
    node = MockNode(port=0, log=lines.append, write_timeout=1.0)

    def peers_(host, port):
        good = MockClient(host, port, timeout=60)
        good.connect()
        good.send({"tremor": {"connect": {"protocol": "echo", "alias": "e"}}})
        good.settle()
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
        stuck.connect((host, port))
        ws = WSConnection(ConnectionType.CLIENT)
        stuck.sendall(ws.send(Request(host="x", target="/")))
        stuck.settimeout(60)
        while not any(isinstance(e, AcceptConnection) for e in ws.events()):
            ws.receive_data(stuck.recv(4096))  # the upgrade's answer, and nothing more is ever read
        stuck.sendall(ws.send(TextMessage(data='{"tremor":{"connect":{"protocol":"echo","alias":"e"}}}')))
        echo = ws.send(TextMessage(data='{"e":"' + "x" * 65536 + '"}'))
        deadline = time.monotonic() + 120
        reset = False
        while time.monotonic() < deadline and not reset:  # echoes it never reads the answers of
            stuck.settimeout(0.5)
            try:
                stuck.sendall(echo)
            except TimeoutError:
                continue  # the node stopped reading too; its watch goes on
            except OSError:
                reset = True
        good.send({"e": "still served"})
        good.settle()
        ok = good.session.violations == 0 and good.problems == []
        good.close()
        return reset, ok

    reset, ok = _serve(node, peers_)
    assert reset and ok
    assert node.stats.timeouts == 1
    assert len(lines) == 1 and "read nothing of ours for 1 s" in lines[0] and "connection reset" in lines[0]


@pytest.mark.e2e
def test_a_slow_reader_that_keeps_taking_bytes_is_never_aborted():
    """The rule is about progress, not time: replies taken a little at a time, for longer than
    the write timeout and with the node's bytes waiting all along, are all delivered."""
    node = MockNode(port=0, write_timeout=1.0)
    count = 30

    def client(host, port):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # the node's bytes wait in its queue
        sock.settimeout(60)
        sock.connect((host, port))
        ws = WSConnection(ConnectionType.CLIENT)
        sock.sendall(ws.send(Request(host="x", target="/")))
        while not any(isinstance(e, AcceptConnection) for e in ws.events()):
            ws.receive_data(sock.recv(4096))
        wire = ws.send(TextMessage(data='{"tremor":{"connect":{"protocol":"echo","alias":"e"}}}'))
        wire += b"".join(ws.send(TextMessage(data='{"e":"' + "x" * 65536 + '"}')) for _ in range(count))
        sender = threading.Thread(target=sock.sendall, args=(wire,))
        sender.start()
        messages = 0
        started = time.monotonic()
        while messages < count + 2 and time.monotonic() - started < 120:
            time.sleep(0.1)  # then one read: about 64 KiB every tenth of a second
            data = sock.recv(65536)
            if not data:
                break
            ws.receive_data(data)
            messages += sum(isinstance(e, TextMessage) and e.message_finished for e in ws.events())
        took = time.monotonic() - started
        sender.join(60)
        sock.close()
        return messages, took

    messages, took = _serve(node, client)
    assert messages == count + 2  # the greeting, the connect-ack and every echo
    assert took > 1.0  # longer than the write timeout, so the rule was put to the test
    assert node.stats.timeouts == 0


def test_a_ping_flood_then_a_reset_is_not_answered_into_the_closed_connection(caplog):
    """Pongs for pings read after the peer reset are not written: asyncio would log a warning each."""
    node = MockNode(port=0, log=lambda line: None)

    def flooder(host, port):
        sock = socket.create_connection((host, port), timeout=60)
        sock.sendall(_UPGRADE)
        sock.recv(4096)  # the 101 (and perhaps the greeting); nothing more is read
        sock.sendall(bytes([0x89, 0x80, 0, 0, 0, 0]) * 20000)  # empty masked pings
        sock.close()  # unread pongs: the close is a reset
        deadline = time.monotonic() + 60
        while node._live and time.monotonic() < deadline:
            time.sleep(0.02)
        return not node._live

    with caplog.at_level("WARNING", logger="asyncio"):
        assert _serve(node, flooder)
    assert not [r for r in caplog.records if "socket.send() raised exception" in r.getMessage()]
