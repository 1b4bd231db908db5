"""mock-source against a hand-written worker: a raw socket server in the test.

The worker's frames are written byte by byte with struct from the spec's
tables (PROTOCOL-NOTES.md "Frame bodies"), and the source's frames are split
and read back the same way, so nothing here goes through our codec.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
from pathlib import Path

import pytest
from support import COMMAND

# --- the worker's frames, by hand: u32 length, u8 type, fields (all big endian) ---


def sb(raw: bytes) -> bytes:
    return struct.pack(">H", len(raw)) + raw


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def ok(credits: int) -> bytes:
    return frame(struct.pack(">BI", 1, credits))


def error(reason: bytes) -> bytes:
    return frame(struct.pack(">B", 2) + sb(reason))


def notify_ack(success: int, stream_id: int, point: int) -> bytes:
    return frame(struct.pack(">BBQQ", 4, success, stream_id, point))


def ack(credits: int, pairs: list[tuple[int, int]]) -> bytes:
    body = struct.pack(">BII", 6, credits, len(pairs))
    for stream_id, point in pairs:
        body += struct.pack(">QQ", stream_id, point)
    return frame(body)


RESTART = frame(b"\x07")


class RawWorker:
    """One accepted connection, read frame by frame with a bare struct loop."""

    def __init__(self, listener: socket.socket, timeout: float = 15) -> None:
        listener.settimeout(timeout)
        self.sock, _ = listener.accept()
        self.sock.settimeout(timeout)
        self.buf = b""

    def _fill(self, n: int) -> bool:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                return False
            self.buf += data
        return True

    def body(self) -> bytes | None:
        """The next frame's body (type byte onwards), or None at EOF."""
        if not self._fill(4):
            assert self.buf == b"", f"EOF inside a length prefix: {self.buf!r}"
            return None
        (length,) = struct.unpack_from(">I", self.buf)
        assert self._fill(4 + length), "EOF inside a frame"
        body, self.buf = self.buf[4 : 4 + length], self.buf[4 + length :]
        return body

    def quiet_for(self, seconds: float) -> bool:
        """True if the peer sends nothing for ``seconds`` (it must not, without credits)."""
        if self.buf:
            return False
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(15)
        self.buf += data
        return False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


def parse(body: bytes) -> tuple:
    """A source frame's fields, decoded by hand from the spec's tables."""
    kind = body[0]
    if kind == 0:
        fields, pos = [], 1
        for _ in range(4):
            (n,) = struct.unpack_from(">H", body, pos)
            fields.append(body[pos + 2 : pos + 2 + n])
            pos += 2 + n
        assert pos == len(body)
        return ("HELLO", *fields)
    if kind == 3:
        (stream_id, n) = struct.unpack_from(">QH", body, 1)
        name = body[11 : 11 + n]
        (point,) = struct.unpack_from(">Q", body, 11 + n)
        assert len(body) == 19 + n
        return ("NOTIFY", stream_id, name, point)
    if kind == 5:
        stream_id, message_id, event_time, n = struct.unpack_from(">QQqH", body, 1)
        return ("MESSAGE", stream_id, message_id, body[27 : 27 + n], body[27 + n :])
    if kind == 8:
        (stream_id,) = struct.unpack_from(">Q", body, 1)
        message_id = struct.unpack_from(">Q", body, 9)[0] if len(body) == 17 else None
        return ("EOS", stream_id, message_id)
    if kind == 2:
        (n,) = struct.unpack_from(">H", body, 1)
        return ("ERROR", body[3 : 3 + n])
    raise AssertionError(f"a source never sends frame type {kind}: {body!r}")


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    yield sock
    sock.close()


def start_source(listener: socket.socket, *args: str) -> subprocess.Popen:
    port = listener.getsockname()[1]
    return subprocess.Popen(
        [*COMMAND, "mock-source", "--connect", f"127.0.0.1:{port}", "--format", "json", "-q", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=30)
    return proc.returncode, json.loads(out.strip().splitlines()[-1]), err


class CreditedReader:
    """Reads the source's frames while counting credits the way the worker must."""

    def __init__(self, worker: RawWorker, credits: int) -> None:
        self.worker = worker
        self.credits = credits

    def next(self) -> tuple:
        body = self.worker.body()
        assert body is not None, "the source closed the connection early"
        assert self.credits > 0, f"frame sent with no credits left: {parse(body)}"
        self.credits -= 1
        return parse(body)

    def give(self, credits: int, pairs: list[tuple[int, int]] = ()) -> None:
        self.credits += credits
        self.worker.send(ack(credits, list(pairs)))


def handshake(worker: RawWorker, credits: int) -> CreditedReader:
    hello = worker.body()
    assert hello is not None and hello[0] == 0
    worker.send(ok(credits))
    return CreditedReader(worker, credits)


@pytest.mark.timeout(60)
def test_hello_bytes_credits_and_resume_from_the_workers_point(listener):
    proc = start_source(
        listener,
        *("--stream-name", "s", "--stream-id", "42", "--count", "20", "--payload-size", "12"),
        *("--cookie", "c00kie", "--program-name", "prog", "--instance-name", "inst"),
    )
    worker = RawWorker(listener)
    try:
        expected = b"\x00" + sb(b"0.0.1") + sb(b"c00kie") + sb(b"prog") + sb(b"inst")
        assert worker.body() == expected
        worker.send(ok(3))
        peer = CreditedReader(worker, 3)
        assert peer.next() == ("NOTIFY", 42, b"s", 0)
        # The worker holds up to message 4 (the connector offered 0): resume above it, at 5.
        worker.send(notify_ack(1, 42, 4))
        assert peer.next()[:3] == ("MESSAGE", 42, 5)
        assert peer.next()[:3] == ("MESSAGE", 42, 6)
        assert peer.credits == 0
        assert worker.quiet_for(0.5), "the source sent a frame while holding no credit"
        seen = [5, 6]
        payloads = {}
        peer.give(4, [(42, 6)])
        while True:
            got = peer.next()
            if got[0] == "EOS":
                assert got == ("EOS", 42, 20)
                break
            assert got[:2] == ("MESSAGE", 42)
            seen.append(got[2])
            payloads[got[2]] = got[4]
            if peer.credits == 0:
                assert worker.quiet_for(0.2)
                peer.give(4)
        assert seen == list(range(5, 21))
        assert payloads[20] == b"s:20:......."
        worker.send(ack(0, [(42, 19)]))  # message 20 is not covered yet: the source must wait
        assert worker.quiet_for(0.3) and proc.poll() is None
        worker.send(ack(0, [(42, 20)]))
        code, summary, err = finish(proc)
    finally:
        worker.close()
        proc.kill()
    assert code == 0, err
    assert summary["messages"] == 16 and summary["replayed"] == 0
    assert summary["points_of_reference"] == {"s": 20}


@pytest.mark.timeout(60)
def test_restart_reconnects_and_replays_what_is_unacknowledged(listener, tmp_path: Path):
    pcap = tmp_path / "restart.pcap"
    proc = start_source(
        listener, "--stream-name", "r", "--stream-id", "7", "--count", "10", "--record", str(pcap)
    )
    first = RawWorker(listener)
    try:
        peer = handshake(first, 100)
        assert peer.next() == ("NOTIFY", 7, b"r", 0)
        first.send(notify_ack(1, 7, 0))
        got = [peer.next() for _ in range(11)]
        assert [g[2] for g in got[:10]] == list(range(1, 11))
        assert got[10] == ("EOS", 7, 10)
        # Checkpoint of 1..4 (point of reference 4), then RESTART: 5..10 were never acknowledged.
        first.send(ack(0, [(7, 4)]) + RESTART)
        assert first.body() is None, "the source must close after RESTART"
        second = RawWorker(listener)
        try:
            peer = handshake(second, 100)
            assert peer.next() == ("NOTIFY", 7, b"r", 4)  # offers its acknowledged point
            second.send(notify_ack(1, 7, 6))  # but the worker has up to 6: resume at 7
            again = [peer.next() for _ in range(5)]
            assert [g[:3] for g in again[:4]] == [("MESSAGE", 7, n) for n in (7, 8, 9, 10)]
            assert again[4] == ("EOS", 7, 10)
            second.send(ack(0, [(7, 10)]))
            code, summary, err = finish(proc)
        finally:
            second.close()
    finally:
        first.close()
        proc.kill()
    assert code == 0, err
    assert summary["restarts"] == 1 and summary["connections"] == 2
    assert summary["messages"] == 10 and summary["replayed"] == 4
    # One TCP session per connection attempt in the same pcap, read by hand.
    data = pcap.read_bytes()
    assert struct.unpack_from("<I", data)[0] == 0xA1B2C3D4
    pos, syns, client_bytes = 24, 0, []
    while pos < len(data):
        _, _, incl, _ = struct.unpack_from("<IIII", data, pos)
        packet = data[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        flags = packet[14 + 20 + 13]
        if flags == 0x02:
            syns += 1
        if packet[14 + 20 : 14 + 22] != struct.pack(">H", listener.getsockname()[1]):
            client_bytes.append(packet[14 + 40 :])
    assert syns == 2
    stream = b"".join(client_bytes)
    assert stream.startswith(
        frame(b"\x00" + sb(b"0.0.1") + sb(b"") + sb(b"wallaroo-proto") + sb(b"mock-source"))
    )


@pytest.mark.timeout(60)
def test_worker_error_is_reported_with_a_non_zero_exit(listener):
    proc = start_source(listener, "--count", "5")
    worker = RawWorker(listener)
    try:
        peer = handshake(worker, 10)
        assert peer.next()[0] == "NOTIFY"
        worker.send(error(b"Bad/unregistered stream_id 99 with message_id 1"))
        code, summary, err = finish(proc)
    finally:
        worker.close()
        proc.kill()
    assert code == 1
    assert "Bad/unregistered stream_id 99 with message_id 1" in err
    assert summary["error"] == "worker ERROR: Bad/unregistered stream_id 99 with message_id 1"


@pytest.mark.timeout(60)
def test_wrong_cookie_error_during_the_handshake(listener):
    proc = start_source(listener, "--cookie", "wrong")
    worker = RawWorker(listener)
    try:
        assert parse(worker.body())[2] == b"wrong"
        worker.send(error(b"Bad cookie"))
        code, _, err = finish(proc)
    finally:
        worker.close()
        proc.kill()
    assert code == 1 and "worker ERROR: Bad cookie" in err


@pytest.mark.timeout(60)
def test_refused_notify_is_retried_and_a_drop_is_survived(listener):
    proc = start_source(listener, "--stream-name", "x", "--stream-id", "3", "--count", "3")
    first = RawWorker(listener)
    try:
        peer = handshake(first, 50)
        assert peer.next() == ("NOTIFY", 3, b"x", 0)
        first.send(notify_ack(0, 3, 0))  # held by another connection
        assert peer.next() == ("NOTIFY", 3, b"x", 0)  # tries again after a back-off
        first.send(notify_ack(1, 3, 0))
        assert [peer.next()[2] for _ in range(3)] == [1, 2, 3]
        first.close()  # dropped without a RESTART
        second = RawWorker(listener)
        try:
            peer = handshake(second, 50)
            assert peer.next() == ("NOTIFY", 3, b"x", 0)
            second.send(notify_ack(1, 3, 0))
            assert [peer.next()[2] for _ in range(3)] == [1, 2, 3]
            assert peer.next() == ("EOS", 3, 3)
            second.send(ack(0, [(3, 3)]))
            code, summary, err = finish(proc)
        finally:
            second.close()
    finally:
        first.close()
        proc.kill()
    assert code == 0, err
    assert summary["refusals"] == 1 and summary["drops"] == 1 and summary["replayed"] == 3


@pytest.mark.timeout(60)
def test_garbage_from_the_worker_is_answered_with_error(listener):
    proc = start_source(listener)
    worker = RawWorker(listener)
    try:
        handshake(worker, 10)
        assert parse(worker.body())[0] == "NOTIFY"
        worker.send(frame(b"\x63garbage"))
        reply = worker.body()
        code, _, err = finish(proc)
    finally:
        worker.close()
        proc.kill()
    assert parse(reply)[0] == "ERROR" and b"unknown frame type 99" in parse(reply)[1]
    assert code == 1 and "not frames" in err


@pytest.mark.timeout(60)
def test_a_restart_read_together_with_bad_bytes_after_it_is_still_followed(listener):
    """The frames before bad bytes count, in order: a RESTART ends the connection, so what comes
    after it is moot. Found by fuzz playing the worker (mock-source answered the bad bytes with
    ERROR and gave up instead of reconnecting)."""
    proc = start_source(listener, "--stream-name", "r", "--stream-id", "7", "--count", "1")
    first = RawWorker(listener)
    try:
        handshake(first, 10)
        assert parse(first.body())[0] == "NOTIFY"
        first.send(RESTART + struct.pack(">I", 0xFFFFFFFF) + b"\x04")  # a length past any frame
        assert first.body() is None, "the source must close after RESTART, with no ERROR"
        second = RawWorker(listener)
        try:
            peer = handshake(second, 10)
            assert peer.next() == ("NOTIFY", 7, b"r", 0)
            second.send(notify_ack(1, 7, 0))
            assert peer.next()[:3] == ("MESSAGE", 7, 1)
            assert peer.next() == ("EOS", 7, 1)
            second.send(ack(0, [(7, 1)]))
            code, summary, err = finish(proc)
        finally:
            second.close()
    finally:
        first.close()
        proc.kill()
    assert code == 0, err
    assert summary["restarts"] == 1 and summary["connections"] == 2


@pytest.mark.timeout(60)
def test_gives_up_after_bounded_retries(listener):
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there any more
    proc = subprocess.run(
        [*COMMAND, "mock-source", "--connect", f"127.0.0.1:{port}", "--retries", "2", "-q"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2  # a peer that cannot be reached after the retries (docs/cli.md)
    assert proc.stderr.strip() == (
        f"wallaroo-proto mock-source: cannot connect to 127.0.0.1:{port}: connection refused (3 attempts)"
    )


@pytest.mark.timeout(60)
def test_bad_usage_exits_2():
    proc = subprocess.run(
        [*COMMAND, "mock-source", "--connect", "nowhere", "-q"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and "HOST:PORT" in proc.stderr
    proc = subprocess.run(
        [*COMMAND, "mock-source", "missing-file.txt", "-q"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and "missing-file.txt" in proc.stderr


@pytest.mark.timeout(60)
def test_sigterm_stops_cleanly_with_a_summary(listener):
    proc = start_source(listener, "--stream-name", "t", "--stream-id", "5", "--count", "1000")
    worker = RawWorker(listener)
    try:
        peer = handshake(worker, 4)
        assert peer.next() == ("NOTIFY", 5, b"t", 0)
        worker.send(notify_ack(1, 5, 0))
        assert [peer.next()[2] for _ in range(3)] == [1, 2, 3]
        assert worker.quiet_for(0.3)  # out of credits: it waits
        proc.terminate()
        code, summary, err = finish(proc)
        assert worker.body() is None  # it closed the connection
    finally:
        worker.close()
        proc.kill()
    assert code == 130 and "interrupted" in err
    assert summary["messages"] == 3 and summary["error"] == "interrupted"


@pytest.mark.timeout(60)
def test_replay_buffer_is_bounded_until_acks_trim_it(listener):
    proc = start_source(
        listener, "--stream-name", "b", "--stream-id", "8", "--count", "9", "--max-unacked", "5"
    )
    worker = RawWorker(listener)
    try:
        peer = handshake(worker, 100)
        assert peer.next() == ("NOTIFY", 8, b"b", 0)
        worker.send(notify_ack(1, 8, 0))
        assert [peer.next()[2] for _ in range(5)] == [1, 2, 3, 4, 5]
        assert worker.quiet_for(0.5), "read past --max-unacked while holding plenty of credits"
        worker.send(ack(0, [(8, 2)]))  # frees messages 1 and 2
        assert [peer.next()[2] for _ in range(2)] == [6, 7]
        assert worker.quiet_for(0.3)
        worker.send(ack(0, [(8, 7)]))
        assert [peer.next()[2] for _ in range(2)] == [8, 9]
        assert peer.next() == ("EOS", 8, 9)
        worker.send(ack(0, [(8, 9)]))
        code, summary, err = finish(proc)
    finally:
        worker.close()
        proc.kill()
    assert code == 0, err
    assert summary["messages"] == 9


@pytest.mark.timeout(60)
def test_restart_with_an_address_redirects(listener):
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    proc = start_source(listener, "--stream-name", "m", "--stream-id", "2", "--count", "2")
    first = RawWorker(listener)
    try:
        handshake(first, 10)
        address = f"127.0.0.1:{other.getsockname()[1]}".encode()
        first.send(frame(b"\x07" + struct.pack(">I", len(address)) + address))  # the shipped RESTART form
        while (body := first.body()) is not None:
            assert parse(body)[0] == "NOTIFY"  # sent before the RESTART arrived; then it closes
        second = RawWorker(other)
        try:
            peer = handshake(second, 10)
            assert peer.next() == ("NOTIFY", 2, b"m", 0)
            second.send(notify_ack(1, 2, 0))
            assert [peer.next()[:3] for _ in range(3)] == [
                ("MESSAGE", 2, 1),
                ("MESSAGE", 2, 2),
                ("EOS", 2, 2),
            ]
            second.send(ack(0, [(2, 2)]))
            code, summary, err = finish(proc)
        finally:
            second.close()
    finally:
        first.close()
        other.close()
        proc.kill()
    assert code == 0, err
    assert summary["restarts"] == 1 and summary["connections"] == 2


@pytest.mark.timeout(60)
def test_shipped_dialect_eos_is_eight_bytes_and_last_seen_ack_finishes(listener):
    proc = start_source(
        listener, "--dialect", "shipped", "--stream-name", "e", "--stream-id", "9", "--count", "4"
    )
    worker = RawWorker(listener)
    try:
        peer = handshake(worker, 20)
        assert peer.next() == ("NOTIFY", 9, b"e", 0)
        worker.send(notify_ack(1, 9, 0))
        assert [peer.next()[2] for _ in range(4)] == [1, 2, 3, 4]
        eos = worker.body()
        assert eos is not None and eos[0] == 8 and len(eos) == 1 + 8, f"not the shipped EOS form: {eos!r}"
        assert struct.unpack_from(">Q", eos, 1) == (9,)
        # What the shipped worker answers: no credits, the stream at the last id it saw.
        worker.send(ack(0, [(9, 4)]))
        code, summary, err = finish(proc)
    finally:
        worker.close()
        proc.kill()
    assert code == 0, err
    assert summary["streams_done"] == 1 and summary["connections"] == 1


@pytest.mark.e2e
@pytest.mark.timeout(90)
def test_re_acking_the_same_point_is_not_progress_and_retries_run_out(listener):
    proc = start_source(
        listener,
        *("--stream-name", "z", "--stream-id", "6", "--count", "5"),
        *("--retries", "2", "--idle-timeout", "0.3"),
    )
    connections = 0
    try:
        while True:
            try:
                worker = RawWorker(listener, timeout=5)
            except TimeoutError:
                break
            connections += 1
            assert connections <= 10, "the source keeps reconnecting"
            try:
                peer = handshake(worker, 100)
                assert peer.next()[:2] == ("NOTIFY", 6)
                worker.send(notify_ack(1, 6, 0))  # a worker that lost its state each time
                while peer.next()[0] != "EOS":
                    pass
                worker.send(ack(0, [(6, 3)]))  # the same point every time, never past it
                while worker.body() is not None:  # until the source times out and closes
                    pass
            finally:
                worker.close()
            if proc.poll() is not None:
                break
        code, summary, err = finish(proc)
    finally:
        proc.kill()
    assert code == 1, err
    assert "gave up after 3 attempts without progress" in err
    assert summary["connections"] == 4 == connections  # the first, whose ACK was new, and 3 without progress


# --- no silent no-ops: what a resumed stream skips is said ------------------------------------------


@pytest.mark.timeout(60)
def test_a_rerun_with_nothing_left_to_send_says_so(listener):
    proc = start_source(listener, "--stream-name", "s", "--stream-id", "7", "--count", "3")
    worker = RawWorker(listener)
    try:
        peer = handshake(worker, 10)
        assert peer.next() == ("NOTIFY", 7, b"s", 0)
        worker.send(notify_ack(1, 7, 10))  # an earlier run (--count 10) got this far
        assert peer.next()[0] == "EOS"
        worker.send(ack(0, [(7, 10)]))
        code, summary, err = finish(proc)
    finally:
        worker.close()
        proc.kill()
    assert code == 0, err
    assert summary["messages"] == 0
    assert summary["resumed"] == [{"stream": "s", "skipped": 3, "nothing_left": True}]
    assert "stream 's' resumed after 10: all 3 messages skipped, nothing left to send" in err  # even with -q


@pytest.mark.timeout(60)
def test_a_resumed_stdin_says_what_it_skipped(listener):
    port = listener.getsockname()[1]
    proc = subprocess.Popen(
        [*COMMAND, "mock-source", "-", "--connect", f"127.0.0.1:{port}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdin.write("alpha\nbeta\ngamma\n")
    proc.stdin.flush()
    proc.stdin.close()
    proc.stdin = None  # communicate() below must not flush it again
    worker = RawWorker(listener)
    try:
        peer = handshake(worker, 10)
        kind, stream_id, name, _ = peer.next()
        assert (kind, name) == ("NOTIFY", b"stdin")
        worker.send(notify_ack(1, stream_id, 2))  # the worker holds alpha and beta already
        assert peer.next()[:4] == ("MESSAGE", stream_id, 3, b"")
        assert peer.next()[0] == "EOS"
        worker.send(ack(0, [(stream_id, 3)]))
        out, err = proc.communicate(timeout=30)
    finally:
        worker.close()
        proc.kill()
    assert proc.returncode == 0, err
    assert (
        "stream 'stdin' resumed at 3: 2 messages skipped (the worker already holds its messages up to 2)"
        in err
    )
    assert "stdin: 2 skipped" in out


@pytest.mark.timeout(90)
def test_a_worker_that_owes_an_answer_is_named_after_a_few_seconds(listener):
    """An EOS whose ACK never comes (a proxy dropped it, say): the source says what it waits for
    after 5 s, long before it gives the connection up (here at 8 s, with no retry)."""
    port = listener.getsockname()[1]
    proc = subprocess.Popen(
        [*COMMAND, "mock-source", "--connect", f"127.0.0.1:{port}", "--format", "json"]
        + ["--stream-name", "e", "--stream-id", "9", "--count", "4", "--retries", "0", "--idle-timeout", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    worker = RawWorker(listener, timeout=30)
    try:
        peer = handshake(worker, 20)
        assert peer.next() == ("NOTIFY", 9, b"e", 0)
        worker.send(notify_ack(1, 9, 0))
        assert [peer.next()[2] for _ in range(4)] == [1, 2, 3, 4]
        assert worker.body() is not None  # the EOS, never acknowledged
        assert worker.body() is None  # the source gives the connection up
        _, err = proc.communicate(timeout=30)
    finally:
        worker.close()
        proc.kill()
    note = "no frame from the worker for 5s; waiting for its ACK of the EOS of stream 9 (e)"
    assert note in err
    assert err.index(note) < err.index("no frame from the worker for 8s")
