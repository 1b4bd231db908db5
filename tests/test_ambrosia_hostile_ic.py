"""mock-lb against an IC that breaks the rules: a fake IC on two loopback ports, mock-lb a real process.

The IC's bytes are written by hand from the protocol notes (committer id 0x12345678):
TakeBecomingPrimaryCheckpoint's control record is
``78563412 1a000000 c7f179c2cb842dda ffffffffffffffff 020b``; a checkpoint record (-2)
announcing N raw bytes is ``78563412 <size> 0000000000000000 feffffffffffffff <msg>``.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import threading

import pytest
from support import COMMAND
from xxhash import xxh64_intdigest

from wallaroo_proto.protocols.ambrosia.immortal import Counter

TBPC = bytes.fromhex("78563412 1a000000 c7f179c2cb842dda ffffffffffffffff 020b")


def _huge_checkpoint_record() -> bytes:
    """A -2 record whose Checkpoint announces 2**60 bytes (ZigZagLong 2**61: eight ``80``, ``20``)."""
    message = bytes.fromhex("14 08") + bytes.fromhex("80" * 8 + "20")  # size 10 (zz 0x14), type 8
    header = bytes.fromhex("78563412") + struct.pack("<i", 24 + len(message)) + bytes(8)
    return header + bytes.fromhex("feffffffffffffff") + message


class FakeIC:
    """Two listening sockets; ``start`` runs mock-lb against them and accepts its two connections."""

    def __init__(self, rcvbuf: int | None = None) -> None:
        self.listen = []
        for _ in range(2):
            sock = socket.socket()
            if rcvbuf:  # accepted sockets take it: a small window for a receive port never read
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.bind(("127.0.0.1", 0))
            sock.listen(1)
            sock.settimeout(60)
            self.listen.append(sock)

    def start(self, *args: str) -> tuple[subprocess.Popen, socket.socket, socket.socket]:
        rport, sport = (s.getsockname()[1] for s in self.listen)
        lb = subprocess.Popen(
            [*COMMAND, "ambrosia", "mock-lb", "--receive-port", str(rport), "--send-port", str(sport)]
            + ["--format", "json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        receive = self.listen[0].accept()[0]
        send = self.listen[1].accept()[0]
        return lb, receive, send

    def close(self) -> None:
        for sock in self.listen:
            sock.close()


@pytest.fixture
def fake_ic():
    ic = FakeIC()
    yield ic
    ic.close()


def _end(lb: subprocess.Popen) -> tuple[int, dict, str]:
    out, err = lb.communicate(timeout=120)
    assert "Traceback" not in err
    return lb.returncode, json.loads(out.splitlines()[-1]), err


def test_a_stream_cut_inside_a_record_is_a_violation(fake_ic):
    lb, receive, send = fake_ic.start()
    send.sendall(TBPC[:10])
    send.shutdown(socket.SHUT_WR)
    code, summary, err = _end(lb)
    receive.close()
    send.close()
    assert code == 1
    assert summary["violations"] == ["framing: ic stream ended 10 bytes into a record"]


def test_a_checkpoint_too_big_to_hold_is_refused_not_buffered(fake_ic):
    lb, receive, send = fake_ic.start()
    send.sendall(_huge_checkpoint_record())
    stop = threading.Event()

    def flood() -> None:  # the announced bytes keep coming until the LB gives up on them
        chunk = b"{" * (1 << 16)
        try:
            while not stop.is_set():
                send.sendall(chunk)
        except OSError:
            pass

    feeder = threading.Thread(target=flood, daemon=True)
    feeder.start()
    try:
        code, summary, _ = _end(lb)
    finally:
        stop.set()
        send.close()
        receive.close()
        feeder.join(timeout=30)
    assert code == 1
    assert summary["violations"] == [
        f"checkpoint-message: a checkpoint of {1 << 60} bytes is above the {64 << 20}-byte limit"
    ]


def test_a_reset_socket_is_said_as_such(fake_ic):
    lb, receive, send = fake_ic.start()
    send.sendall(TBPC)
    assert receive.recv(1 << 16)  # the LB answered: it is connected and reading
    send.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    send.close()  # RST
    code, summary, err = _end(lb)
    receive.close()
    assert code == 1 and "cannot reach" not in err
    assert summary["lost"] == "the IC's socket failed: Connection reset by peer"


def _record(seq: int, body: bytes) -> bytes:
    """A normal record (committer 0x12345678); its check bytes are xxHash64 of the body."""
    return bytes.fromhex("78563412") + struct.pack("<iQq", 24 + len(body), xxh64_intdigest(body), seq) + body


def test_an_ic_that_reads_none_of_the_lbs_messages_is_reset_after_the_write_timeout():
    ic = FakeIC(rcvbuf=4096)
    try:
        lb, receive, send = ic.start("--write-timeout", "1")
        send.sendall(TBPC)
        # 100 RPCs a record, each add("555...5"): a multiple of 5, so each makes a 56-byte self call
        rpc = bytes.fromhex("6c 00 00 02 01") + b"5" * 50  # size 54 (zz 0x6c), RPC, reserved, method 1, Fork
        stop = threading.Event()

        def feed() -> None:
            seq = 0
            send.settimeout(1)
            try:
                while not stop.is_set():
                    send.sendall(_record(seq, rpc * 100))
                    seq += 1
            except OSError:
                pass

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            code, summary, err = _end(lb)
        finally:
            stop.set()
            feeder.join(timeout=60)
            receive.close()
            send.close()
    finally:
        ic.close()
    assert code == 1
    assert summary["lost"].startswith("the IC read nothing of ours for 1 s")
    assert summary["self_calls"] > 0


@pytest.mark.parametrize(
    "blob",
    [
        b"[]",
        b'"x"',
        b"null",
        b"[" * 100_000,
        b'{"rpcs":1,"total":1,"bonuses":1,"digest":5}',
        b'{"rpcs":1e400,"total":1,"bonuses":1,"digest":"5"}',
        b'{"rpcs":1,"total":1,"bonuses":1}',
        b"\xff\xfe",
    ],
)
def test_a_checkpoint_that_is_no_counter_state_is_a_value_error(blob):
    with pytest.raises(ValueError):
        Counter.load(blob)
