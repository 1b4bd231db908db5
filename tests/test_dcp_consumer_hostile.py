"""dcp mock-consumer, a real process, against scripted hostile producers on loopback.

Each producer here is a few lines on a blocking socket that answers the
consumer's setup as a data node does and then misbehaves in one way: a short
answer, silence (before any answer, mid-packet, after a stream), an answer to
the wrong opaque, a stream that always ends too_slow or rolls back, a flood of
noops it never reads the answers to. The consumer must end each time with exit
1 and a line that says what happened, never a traceback and never a hang.
Timeouts are made short with ``--timeout`` or ``--noop-interval``; nothing
asserts on how long a run took.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable

import pytest
from support import COMMAND, Server, as_foreground, run_cli

from wallaroo_proto.protocols.dcp import codec

pytestmark = pytest.mark.e2e

UUID = 0x5EED


def read_packet(sock: socket.socket) -> codec.Packet | None:
    """The next whole packet the consumer sent, or None at its end of the connection."""
    head = _exactly(sock, 24)
    if head is None:
        return None
    body = _exactly(sock, int.from_bytes(head[8:12], "big"))
    return None if body is None else codec.decode_packet(head + body)


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def answer_setup(sock: socket.socket, high: bytes = codec.vb_seqnos_value([(0, 2)])) -> None:
    """HELLO, DCP_OPEN and the controls answered SUCCESS; GET_ALL_VB_SEQNOS with ``high``."""
    while (p := read_packet(sock)) is not None:
        value = high if p.opcode == codec.GET_ALL_VB_SEQNOS else b""
        sock.sendall(codec.response(p.opcode, opaque=p.opaque, value=value))
        if p.opcode == codec.GET_ALL_VB_SEQNOS:
            return


def accept(p: codec.Packet) -> bytes:
    return codec.response(codec.STREAM_REQ, opaque=p.opaque, value=codec.failover_log_value([(UUID, 0)]))


def wait_for_end(sock: socket.socket) -> None:
    """Say nothing more; read until the consumer closes."""
    while read_packet(sock) is not None:
        pass


class HostileProducer:
    """A listening socket whose connections are each handled by ``script`` in a thread."""

    def __init__(self, script: Callable[[socket.socket], None]) -> None:
        self.script = script
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            self.connections.append(sock)
            threading.Thread(target=self._run, args=(sock,), daemon=True).start()

    def _run(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self.script(sock)

    def __enter__(self) -> HostileProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()
        for sock in self.connections:
            sock.close()


def consume(producer: HostileProducer, *args: str, login: bool = False) -> tuple[int, dict, str]:
    """Run mock-consumer against the script (without SASL and SELECT_BUCKET unless ``login``)."""
    auth = () if login else ("--no-auth",)
    command = ("dcp", "mock-consumer", *auth, "--connect", producer.address, "--format", "json")
    result = run_cli(*command, *args, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout.splitlines()[-1]), result.stderr


# ------------------------------------------------------------------------- short answers


def test_a_five_byte_high_seqno_list_is_one_violation_line_and_exit_1():
    def script(sock: socket.socket) -> None:
        answer_setup(sock, high=b"\x00\x00\x00\x00\x05")  # half of a {vb u16, seqno u64} entry
        wait_for_end(sock)

    with HostileProducer(script) as producer:
        rc, summary, stderr = consume(producer)
    assert rc == 1
    assert "violation: offset 120: GET_ALL_VB_SEQNOS: vbucket seqnos: 5 bytes is no multiple of 10" in stderr
    assert summary["violations"] == 1


def test_a_three_byte_failover_log_is_one_violation_line_and_exit_1():
    def script(sock: socket.socket) -> None:
        answer_setup(sock)
        p = read_packet(sock)
        sock.sendall(codec.response(codec.STREAM_REQ, opaque=p.opaque, value=b"abc"))  # entries are 16 bytes
        wait_for_end(sock)

    with HostileProducer(script) as producer:
        rc, summary, stderr = consume(producer)
    assert rc == 1
    assert "DCP_STREAM_REQ: failover log of 3 bytes is no multiple of 16" in stderr
    assert summary["violations"] == 1


# ------------------------------------------------------------------------- silence


def silent_from_the_start(sock: socket.socket) -> None:
    wait_for_end(sock)


def silent_mid_body(sock: socket.socket) -> None:
    p = read_packet(sock)  # HELLO: an answer header that promises 10 bytes, then 3 of them
    sock.sendall(codec.response(p.opcode, opaque=p.opaque, value=b"0123456789")[:27])
    wait_for_end(sock)


def silent_after_a_stream(sock: socket.socket) -> None:
    answer_setup(sock, high=codec.vb_seqnos_value([(0, 1), (1, 1)]))
    first, second = read_packet(sock), read_packet(sock)
    sock.sendall(accept(first) + accept(second))
    sock.sendall(
        codec.snapshot_marker(0, first.opaque, 1, 1, codec.SNAP_MEMORY)
        + codec.mutation(0, first.opaque, 1, 1, b"k", b"v")
        + codec.stream_end(0, first.opaque, codec.END_OK)
    )  # and vbucket 1's stream never comes
    wait_for_end(sock)


def trickling_a_huge_body(sock: socket.socket) -> None:
    p = read_packet(sock)  # HELLO: an answer that promises 10 MB, then a kilobyte every 50 ms
    sock.sendall(codec.HEADER.pack(codec.RES, p.opcode, 0, 0, 0, 0, 10_000_000, p.opaque, 0))
    while True:  # until the consumer goes (OSError)
        sock.sendall(b"x" * 1000)
        time.sleep(0.05)


@pytest.mark.parametrize(
    "script", [silent_from_the_start, silent_mid_body, silent_after_a_stream, trickling_a_huge_body]
)
def test_a_silent_producer_is_given_up_after_the_timeout(script):
    with HostileProducer(script) as producer:
        rc, summary, stderr = consume(producer, "--timeout", "0.5")
    assert rc == 1
    assert summary["failures"] == ["connection lost: the producer sent no whole packet for 0.5 s"]
    assert "giving up" in stderr


def test_a_producer_that_sends_noops_but_never_answers_the_stream_request_is_given_up():
    def script(sock: socket.socket) -> None:
        answer_setup(sock)
        read_packet(sock)  # the stream request, never answered
        sock.settimeout(0.05)
        opaque = 10_000_000
        while True:  # alive: a noop every 50 ms, answers read, until the consumer goes
            opaque += 1
            sock.sendall(codec.noop(opaque))
            try:
                if not sock.recv(65536):  # the noop answers, not looked at
                    return
            except TimeoutError:
                pass

    with HostileProducer(script) as producer:
        rc, summary, _ = consume(producer, "--noop-interval", "0.25")
    assert rc == 1 and summary["noops_answered"] > 0
    assert summary["failures"] == ["connection lost: no answer to DCP_STREAM_REQ for vbucket 0 in 0.5 s"]


def test_without_a_timeout_the_silence_limit_is_twice_the_noop_interval():
    with HostileProducer(silent_after_a_stream) as producer:
        rc, summary, _ = consume(producer, "--noop-interval", "0.25")
    assert rc == 1
    assert summary["failures"] == ["connection lost: the producer sent no whole packet for 0.5 s"]
    assert summary["items_received"] == 1 and summary["stream_ends"] == {"ok": 1}


def test_a_silent_producer_is_reconnected_to_with_retries():
    with HostileProducer(silent_from_the_start) as producer:
        rc, summary, stderr = consume(producer, "--timeout", "0.3", "--retries", "2", "--retry-delay", "0")
    assert rc == 1 and summary["connections"] == 3
    assert stderr.count("reconnecting") == 2


# ------------------------------------------------------------------------- violations


def wrong_opaque(sock: socket.socket) -> None:
    p = read_packet(sock)
    sock.sendall(codec.response(p.opcode, opaque=p.opaque + 100))
    wait_for_end(sock)


def test_an_answer_to_the_wrong_opaque_stops_the_consumer_at_once():
    with HostileProducer(wrong_opaque) as producer:
        rc, summary, stderr = consume(producer)  # the default silence limit is 20 s: not what ends it
    assert rc == 1
    assert "violation: offset 0: HELLO: response opaque 0x00000065 answers no request" in stderr
    assert summary["failures"] == ["stopped at the first violation (--keep-going goes on)"]


def test_keep_going_goes_on_after_the_violation_until_the_silence_limit():
    with HostileProducer(wrong_opaque) as producer:
        rc, summary, stderr = consume(producer, "--keep-going", "--timeout", "0.5")
    assert rc == 1 and summary["violations"] == 1
    assert summary["failures"] == ["connection lost: no answer to HELLO in 0.5 s"]


# ------------------------------------------------------------------------- endless retries


class Restreamer:
    """Answers every stream request with ``answer`` and counts them."""

    def __init__(self, answer: Callable[[codec.Packet], bytes], high: int = 2) -> None:
        self.answer = answer
        self.high = high
        self.requests = 0

    def __call__(self, sock: socket.socket) -> None:
        answer_setup(sock, codec.vb_seqnos_value([(0, self.high)]))
        while (p := read_packet(sock)) is not None:
            if p.opcode == codec.STREAM_REQ:
                self.requests += 1
                sock.sendall(self.answer(p))


def test_a_stream_that_always_ends_too_slow_is_given_up_after_the_retries():
    script = Restreamer(lambda p: accept(p) + codec.stream_end(0, p.opaque, codec.END_TOO_SLOW))
    with HostileProducer(script) as producer:
        rc, summary, stderr = consume(producer, "--stream-retries", "3")
    assert rc == 1 and script.requests == 4  # the first request and three more
    failure = "vbucket 0: stream end too_slow; given up after asking again 3 times in a row with no new seqno"
    assert summary["failures"] == [failure] and summary["vbuckets"][0]["status"] == "error"
    assert stderr.count(failure) == 1 and stderr.count("; asking again from") == 3


def test_a_rollback_to_0_every_time_is_given_up_after_the_retries():
    # A request from seqno 0 never rolls back: a violation, so only --keep-going gets this far.
    script = Restreamer(lambda p: codec.rollback_response(p.opaque, 0))
    with HostileProducer(script) as producer:
        rc, summary, _ = consume(producer, "--stream-retries", "2", "--keep-going")
    assert rc == 1 and script.requests == 3
    assert summary["failures"] == [
        "vbucket 0: rollback to 0; given up after asking again 2 times in a row with no new seqno"
    ]


def test_a_stream_that_ends_after_an_item_each_time_is_asked_for_again_until_done():
    # Progress resets the count: five too_slow ends with an item each are fine with --stream-retries 1.
    def answer(p: codec.Packet) -> bytes:
        req = codec.parse(p)
        seqno = req.start + 1
        out = accept(p) + codec.snapshot_marker(0, p.opaque, seqno, seqno, codec.SNAP_MEMORY)
        out += codec.mutation(0, p.opaque, seqno, 1, b"k%d" % seqno, b"v")
        return out + codec.stream_end(0, p.opaque, codec.END_OK if seqno == 5 else codec.END_TOO_SLOW)

    script = Restreamer(answer, high=5)
    with HostileProducer(script) as producer:
        rc, summary, _ = consume(producer, "--stream-retries", "1")
    assert rc == 0, summary
    assert script.requests == 5 and summary["items_received"] == 5


# ------------------------------------------------------------------------- a producer that reads nothing


def test_a_producer_that_floods_noops_and_reads_none_of_the_answers_is_given_up():
    def script(sock: socket.socket) -> None:
        answer_setup(sock)
        sock.sendall(accept(read_packet(sock)))  # the stream is open; nothing of ours is read after this
        opaque = 0
        while True:  # until the consumer cuts the connection (OSError)
            sock.sendall(b"".join(codec.noop(opaque + n) for n in range(1, 10_001)))
            opaque += 10_000

    with HostileProducer(script) as producer:
        rc, summary, _ = consume(producer, "--timeout", "1")
    assert rc == 1
    assert summary["failures"] == ["connection lost: the producer read nothing of ours for 1 s"]


# ------------------------------------------------------------------------- many vbuckets


def test_the_text_summary_lists_at_most_1024_vbuckets():
    def many(sock: socket.socket) -> None:
        answer_setup(sock, high=codec.vb_seqnos_value([(vb, 0) for vb in range(1500)]))
        while (p := read_packet(sock)) is not None:
            if p.opcode == codec.STREAM_REQ:  # nothing to send: the stream ends at once
                sock.sendall(accept(p) + codec.stream_end(p.vbucket, p.opaque, codec.END_OK))

    with HostileProducer(many) as producer:
        result = run_cli("dcp", "mock-consumer", "--no-auth", "--connect", producer.address, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "... and 476 more vbuckets (--format json lists every one)" in result.stdout
    assert "│ 1023 " in result.stdout and "│ 1024 " not in result.stdout


# ------------------------------------------------------------------------- quiet but alive


def test_a_following_consumer_stays_with_an_idle_producer_that_sends_noops(tmp_path):
    """The silence limit counts the producer's noops: an idle, live producer is not given up."""
    with Server("dcp", "mock-producer", "--port", "0", "--vbuckets", "1", "--items", "3") as server:
        state = tmp_path / "copy.json"
        proc = subprocess.Popen(
            [*COMMAND, "dcp", "mock-consumer", "--connect", server.address, "--follow", "--state", str(state)]
            + ["--noop-interval", "1", "--format", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_foreground,
        )
        try:
            # The copy reached seqno 3 (it is written once the snapshot is complete): streaming.
            deadline = time.monotonic() + 120
            while not (state.exists() and '"seqno": 3' in state.read_text()) and proc.poll() is None:
                assert time.monotonic() < deadline, "the copy never reached seqno 3"
                time.sleep(0.05)
            # Idle for twice the silence limit (2 s): what is tested is that nothing ends it.
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=4)
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    assert proc.returncode == 130, stderr
    summary = json.loads(stdout.splitlines()[-1])
    assert summary["connections"] == 1 and summary["failures"] == []
    # the copy reached the producer's high seqno (3 items; fewer when two drew the same key)
    assert [vb["seqno"] for vb in summary["vbuckets"]] == [3]
    assert summary["noops_answered"] >= 2


def test_a_stream_that_rolls_back_to_the_same_item_again_and_again_is_given_up():
    # Item 1 then too_slow; asked from 1, ROLLBACK to 0; asked from 0, item 1 again: no rule is broken,
    # but the copy never gets past seqno 1.
    def answer(p: codec.Packet) -> bytes:
        if codec.parse(p).start == 1:
            return codec.rollback_response(p.opaque, 0)
        out = accept(p) + codec.snapshot_marker(0, p.opaque, 1, 1, codec.SNAP_MEMORY)
        out += codec.mutation(0, p.opaque, 1, 1, b"k", b"v")
        return out + codec.stream_end(0, p.opaque, codec.END_TOO_SLOW)

    script = Restreamer(answer)
    with HostileProducer(script) as producer:
        rc, summary, _ = consume(producer, "--stream-retries", "4")
    assert rc == 1 and summary["violations"] == 0
    assert summary["failures"] == [
        "vbucket 0: stream end too_slow; given up after asking again 4 times in a row with no new seqno"
    ]
    assert script.requests == 5  # the first brought seqno 1, the four asked again brought nothing newer


def test_sigint_ends_a_consumer_whose_producer_reads_nothing_at_once():
    """With no timeout the consumer waits on the producer; SIGINT must not wait for our bytes to go out."""
    piled = threading.Event()

    def script(sock: socket.socket) -> None:
        answer_setup(sock)
        sock.sendall(accept(read_packet(sock)))
        sock.setblocking(False)
        noops = b"".join(codec.noop(n) for n in range(1, 1001))
        left = memoryview(noops)
        blocked_since = None
        while True:  # noops, never reading the answers, until the consumer goes (OSError)
            try:
                left = left[sock.send(left) :] or memoryview(noops)
                blocked_since = None
            except BlockingIOError:
                # The consumer reads nothing only while it waits for its own bytes to go out.
                blocked_since = blocked_since or time.monotonic()
                if time.monotonic() - blocked_since > 1.0:
                    piled.set()
                time.sleep(0.01)

    with HostileProducer(script) as producer:
        proc = subprocess.Popen(
            [*COMMAND, "dcp", "mock-consumer", "--no-auth", "--connect", producer.address, "--timeout", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert piled.wait(timeout=120), "the consumer never fell behind"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr


def test_a_producer_that_offers_only_plain_gets_plain_and_one_that_offers_no_known_mechanism_a_line():
    seen: list[tuple[int, bytes, bytes]] = []

    def plain_only(sock: socket.socket) -> None:
        for _ in range(4):  # HELLO, SASL_LIST_MECHS, SASL_AUTH, SELECT_BUCKET
            p = read_packet(sock)
            seen.append((p.opcode, p.key, p.value))
            value = b"PLAIN" if p.opcode == codec.SASL_LIST_MECHS else b""
            sock.sendall(codec.response(p.opcode, opaque=p.opaque, value=value))
        answer_setup(sock)
        p = read_packet(sock)
        sock.sendall(accept(p) + codec.stream_end(0, p.opaque, codec.END_OK))
        wait_for_end(sock)

    with HostileProducer(plain_only) as producer:
        rc, summary, _ = consume(producer, "--username", "u", "--password", "p", "--bucket", "b", login=True)
    assert rc == 0, summary
    assert seen[1:] == [
        (codec.SASL_LIST_MECHS, b"", b""),
        (codec.SASL_AUTH, b"PLAIN", b"\x00u\x00p"),  # no authzid, the user, the password
        (codec.SELECT_BUCKET, b"b", b""),
    ]

    def oauth_only(sock: socket.socket) -> None:
        for _ in range(2):
            p = read_packet(sock)
            value = b"OAUTHBEARER" if p.opcode == codec.SASL_LIST_MECHS else b""
            sock.sendall(codec.response(p.opcode, opaque=p.opaque, value=value))
        wait_for_end(sock)

    with HostileProducer(oauth_only) as producer:
        rc, summary, _ = consume(producer, login=True)
    assert rc == 1
    assert summary["failures"] == ["no SASL mechanism in common: the producer offers OAUTHBEARER"]
