"""mock-ic against a language binding that breaks the rules or stops reading: a fake LB of plain sockets.

The LB's bytes are written by hand from the protocol notes: a message is
``[size: ZigZagInt of len(type + data)][type][data]``, so InitialMessage "2.0.1" is
``0c 09 322e302e31`` and a Checkpoint of the 2 bytes ``{}`` is ``04 08 04`` then ``7b 7d``.
The IC's first record, TakeBecomingPrimaryCheckpoint, is 26 bytes (24 of header, ``02 0b``).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time

import pytest
from support import Server

pytestmark = pytest.mark.timeout(300)

PORTS = re.compile(r"receive port (\d+), send port (\d+)")
FIRST_START_ANSWER = bytes.fromhex("0c 09 322e302e31") + bytes.fromhex("04 08 04 7b7d")
DEADLINE = 60  # generous: a loaded machine three times slower


def start_ic(*args: str) -> tuple[Server, int, int]:
    ic = Server("ambrosia", "mock-ic", "--format", "json", *args)
    rport, sport = map(int, PORTS.search(ic.lines[-1]).groups())
    return ic, rport, sport


def connect_lb(rport: int, sport: int, rcvbuf: int | None = None) -> tuple[socket.socket, socket.socket]:
    """The receive port, then the send port (refused until the IC took the first)."""
    receive = socket.create_connection(("127.0.0.1", rport), timeout=DEADLINE)
    deadline = time.monotonic() + DEADLINE
    while True:
        send = socket.socket()
        if rcvbuf:
            send.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: a small window
        send.settimeout(DEADLINE)
        try:
            send.connect(("127.0.0.1", sport))
            return receive, send
        except ConnectionRefusedError:
            send.close()
            assert time.monotonic() < deadline, "the IC never listened on its send port"
            time.sleep(0.05)


def first_start(receive: socket.socket, send: socket.socket, answer: bytes = FIRST_START_ANSWER) -> None:
    got = b""
    while len(got) < 26:
        chunk = send.recv(26 - len(got))
        assert chunk, "the IC closed before its first record"
        got += chunk
    assert got[-2:] == bytes.fromhex("020b")  # TakeBecomingPrimaryCheckpoint
    receive.sendall(answer)


def closed_by_peer(sock: socket.socket) -> bool:
    """Reads to the end: True when the peer closed (or reset) within the deadline."""
    sock.settimeout(DEADLINE)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize(
    "bad, reason",
    [
        (bytes.fromhex("02 03"), "lb: lb-message-type: Commit: 'Illegal leading byte'"),
        # a Checkpoint whose length is no ZigZag varint: its one byte says "more follows"
        (bytes.fromhex("04 08 ff"), "lb: checkpoint-message: Checkpoint message without its length"),
    ],
)
def test_a_rule_break_closes_both_sockets_and_ends_the_ic(bad, reason):
    ic, rport, sport = start_ic("--rpcs", "100")
    with ic:
        receive, send = connect_lb(rport, sport)
        first_start(receive, send)
        receive.sendall(bad)
        assert closed_by_peer(send), "the IC kept its send port open after a rule break"
        assert closed_by_peer(receive), "the IC kept its receive port open after a rule break"
        code, out, err = ic.stop(sig=None, timeout=DEADLINE)
        receive.close()
        send.close()
    assert code == 1 and "Traceback" not in err
    summary = json.loads(out.splitlines()[-1])
    assert summary["fatal"] == reason
    assert err.splitlines()[-1].endswith(reason)


def test_a_checkpoint_too_big_to_store_is_a_rule_break_not_a_buffer():
    ic, rport, sport = start_ic("--rpcs", "100")
    with ic:
        receive, send = connect_lb(rport, sport)
        # the first start answered with a Checkpoint announcing 2**60 bytes (ZigZagLong 2**61: eight
        # 80s, then 20), and then bytes
        first_start(
            receive, send, bytes.fromhex("0c 09 322e302e31") + bytes.fromhex("14 08" + "80" * 8 + "20")
        )
        stop = threading.Event()

        def flood() -> None:
            try:
                while not stop.is_set():
                    receive.sendall(b"[" * (1 << 16))
            except OSError:
                pass

        feeder = threading.Thread(target=flood, daemon=True)
        feeder.start()
        try:
            code, out, err = ic.stop(sig=None, timeout=DEADLINE)
        finally:
            stop.set()
            receive.close()
            send.close()
            feeder.join(timeout=DEADLINE)
    assert code == 1 and "Traceback" not in err
    assert json.loads(out.splitlines()[-1])["fatal"].startswith(
        f"lb: checkpoint-message: a checkpoint of {1 << 60} bytes is above the"
    )


def test_an_lb_that_reads_no_records_is_reset_after_the_write_timeout():
    """It acknowledged the first record, then reads nothing while the IC has records to send."""
    ic, rport, sport = start_ic("--rpcs", "5000000", "--write-timeout", "1")
    with ic:
        receive, send = connect_lb(rport, sport, rcvbuf=4096)
        first_start(receive, send)
        assert closed_by_peer(receive), "an LB that reads nothing was held open"
        deadline = time.monotonic() + DEADLINE
        while "read nothing of ours for 1 s" not in ic.stderr():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        send.close()
        receive.close()
        code, out, err = ic.stop(signal.SIGTERM, timeout=DEADLINE)
    assert code == 0 and "Traceback" not in err  # a server stopped, no rule broken
    summary = json.loads(out.splitlines()[-1])
    assert summary["stalls"] == 1 and summary["violations"] == []
