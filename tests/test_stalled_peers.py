"""Peers that stop reading: aborted after --write-timeout, whatever the kernel's buffers absorb.

Each stuck peer is a plain socket with a small receive buffer that never reads. What
the worker sends it stays in the worker's kernel queue, so asyncio's own buffer never
backs up and drain() never waits: only what the peer acknowledges tells it stalled.
Frames are the hand-written ones of test_mock_worker (built with struct from the spec).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest
from support import Server
from test_mock_worker import (
    Connector,
    hello,
    message,
    notify,
    notify_ack_bytes,
    ok_bytes,
    stop_json,
)

from wallaroo_proto import write_watch
from wallaroo_proto.protocols.wallaroo.peer import FramedConnection, PeerStalled
from wallaroo_proto.protocols.wallaroo.protocol import Side, Use

pytestmark = pytest.mark.timeout(180)

ESTABLISHED = 1  # tcpi_state
#: Generous: the worker needs write-timeout (1 s) plus a watchdog tick, on a slow, loaded machine.
DEADLINE = 60


def wait_until(condition: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.05)


def tcp_state(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


def never_reading_peer(host: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connect: a small window
    sock.settimeout(30)
    sock.connect((host, port))
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def test_a_peer_that_floods_notifies_and_never_reads_is_aborted_and_frees_its_stream() -> None:
    args = ("--write-timeout", "1", "--credits", "1000000", "--format", "json")
    with Server("mock-worker", "--port", "0", *args) as server:
        stuck = never_reading_peer(server.host, server.port)
        stuck.sendall(hello(instance=b"flood"))
        assert recv_exactly(stuck, 9) == ok_bytes(1000000)
        stuck.sendall(notify(4243, b"raw-stream", 1))
        assert recv_exactly(stuck, 22) == notify_ack_bytes(1, 4243, 1)  # the last read it ever does
        # Repeated NOTIFYs: 22-byte NOTIFY_ACK 0s pile up unread, under 64 KiB in all (asyncio's
        # high-water mark), so the worker's writes never wait.
        stuck.sendall(notify(4243, b"raw-stream", 1) * 1000)
        stuck.setblocking(False)

        def aborted() -> bool:
            try:
                stuck.send(notify(4243, b"raw-stream", 1))  # it keeps sending
            except BlockingIOError:
                pass
            except OSError:
                return True
            return tcp_state(stuck) != ESTABLISHED

        wait_until(aborted, "the worker never aborted the flooding peer that stopped reading")

        other = Connector(server)
        other.handshake(1000000)
        other.send(notify(4243, b"raw-stream", 1))
        assert other.read_frame() == notify_ack_bytes(1, 4243, 1)  # released by the aborted connection
        other.close()
        stuck.close()
        summary = stop_json(server)
    assert summary["timeouts"] == 1
    [stalled] = [e for e in summary["errors"] if e["kind"] == "stalled"]
    assert "read nothing of our frames for 1 s" in stalled["reason"]


def test_a_silent_peer_that_never_reads_is_aborted_while_the_worker_sends_it_acks() -> None:
    """It stops reading and sending after its messages: the worker's checkpoint ACK stays unread."""
    args = ("--write-timeout", "1", "--credits", "1000000", "--checkpoint-ms", "100", "--format", "json")
    streams = range(1, 1001)
    with Server("mock-worker", "--port", "0", *args) as server:
        stuck = never_reading_peer(server.host, server.port)
        stuck.sendall(hello(instance=b"silent"))
        assert recv_exactly(stuck, 9) == ok_bytes(1000000)
        stuck.sendall(b"".join(notify(s, b"s%d" % s) for s in streams))
        assert recv_exactly(stuck, 22 * len(streams)) == b"".join(notify_ack_bytes(1, s, 0) for s in streams)
        stuck.sendall(b"".join(message(s, 1, b"m") for s in streams))  # then it only waits, reading nothing
        # The checkpoint's ACK carries 1000 streams (16 KB), well past its window.
        wait_until(lambda: tcp_state(stuck) != ESTABLISHED, "the worker never aborted the silent peer")

        other = Connector(server)
        other.handshake(1000000)
        other.send(notify(7, b"s7"))
        assert other.read_frame() == notify_ack_bytes(1, 7, 1)  # free, at its checkpoint
        other.close()
        stuck.close()
        summary = stop_json(server)
    assert summary["messages"] == 1000
    assert summary["acks_sent"] >= 1
    assert summary["timeouts"] == 1
    [stalled] = [e for e in summary["errors"] if e["kind"] == "stalled"]
    assert "read nothing of our frames for 1 s" in stalled["reason"]


@pytest.mark.parametrize("outq", [True, False], ids=["kernel-queue", "asyncio-buffer-only"])
def test_framed_connection_aborts_a_peer_that_takes_nothing(monkeypatch, outq: bool) -> None:
    """What mock-source and mock-sink get too; without SIOCOUTQ, asyncio's buffer still counts."""
    if not outq:
        monkeypatch.setattr(write_watch, "_OUTQ", None)
    # With the kernel queue a few KB is enough; without it, only bytes the kernel refused count.
    size = 8 * 1024 if outq else 32 * 1024 * 1024

    async def scenario() -> None:
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(lambda r, w: accepted.set_result((r, w)), "127.0.0.1", 0)
        stuck = never_reading_peer(*server.sockets[0].getsockname()[:2])
        reader, writer = await accepted
        conn = FramedConnection(reader, writer, use=Use.SOURCE, our_side=Side.WORKER, write_timeout=0.5)
        writer.write(b"\0" * size)  # never drained: only the watchdog can notice
        conn._watch.wrote(size)
        async with asyncio.timeout(DEADLINE):
            with pytest.raises(PeerStalled, match="read nothing of our frames for 0.5 s"):
                await conn.receive()
        await conn.close()
        wait_until(lambda: tcp_state(stuck) != ESTABLISHED, "not reset")  # not left holding our bytes
        stuck.close()
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())
