"""mock-sink end to end: a hand-written worker (raw socket, frames packed by hand from the spec
tables) drives the real `wallaroo-proto mock-sink` process through every branch, kill -9s it at
each fault point, and checks the output directory with `mock-sink --check`."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest
from support import COMMAND, READY, Server, run_cli

pytestmark = pytest.mark.timeout(60)

# --- frames, by hand: u32 length (big endian) + u8 type + fields -----------------------------


def sb(value: bytes) -> bytes:
    return struct.pack(">H", len(value)) + value


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def hello(instance: bytes, version: bytes = b"v0.0.1", cookie: bytes = b"") -> bytes:
    return frame(b"\x00" + sb(version) + sb(cookie) + sb(b"hand-worker") + sb(instance))


def notify(stream: int = 1, name: bytes = b"out", por: int = 0) -> bytes:
    return frame(b"\x03" + struct.pack(">Q", stream) + sb(name) + struct.pack(">Q", por))


def message(stream: int, message_id: int, payload: bytes) -> bytes:
    # u64 stream_id, u64 message_id, i64 event_time, sb key (empty), payload
    return frame(b"\x05" + struct.pack(">QQqH", stream, message_id, 0, 0) + payload)


def list_uncommitted(rtag: int) -> bytes:
    return message(0, 0, bytes([201]) + struct.pack(">Q", rtag))


def phase1(txn: bytes, *where: tuple[int, int, int]) -> bytes:
    body = bytes([203]) + sb(txn) + struct.pack(">I", len(where))
    body += b"".join(struct.pack(">QQQ", *w) for w in where)
    return message(0, 0, body)


def phase2(txn: bytes, commit: bool) -> bytes:
    return message(0, 0, bytes([205]) + sb(txn) + bytes([commit]))


class Worker:
    """A raw-socket worker that reads the sink's frames by hand."""

    def __init__(self, port: int, instance: bytes | None = b"w1", rtag: int = 7, stream: int = 1) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.buf = b""
        self.stream = stream
        if instance is not None:
            self.send(hello(instance), notify(stream), list_uncommitted(rtag))
            assert self.read() == ("OK", 500)
            kind, success, got_stream, self.last_point = self.read()
            assert (kind, success, got_stream) == ("NOTIFY_ACK", 1, stream)
            kind, got_rtag, self.uncommitted = self.read()
            assert (kind, got_rtag) == ("REPLY_UNCOMMITTED", rtag)

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def _exact(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read(self):
        """The next frame as a tuple, or None at EOF."""
        head = self._exact(4)
        if head is None:
            return None
        (length,) = struct.unpack(">I", head)
        body = self._exact(length)
        kind = body[0]
        if kind == 1:
            return ("OK", struct.unpack(">I", body[1:5])[0])
        if kind == 2:
            (n,) = struct.unpack(">H", body[1:3])
            return ("ERROR", body[3 : 3 + n].decode())
        if kind == 4:
            success, stream, por = struct.unpack(">BQQ", body[1:])
            return ("NOTIFY_ACK", success, stream, por)
        if kind == 5:
            stream, _, _, key_len = struct.unpack(">QQqH", body[1:27])
            assert stream == 0
            payload = body[27 + key_len :]
            tag = payload[0]
            if tag == 202:
                rtag, count = struct.unpack(">QI", payload[1:13])
                pos, ids = 13, []
                for _ in range(count):
                    (n,) = struct.unpack(">H", payload[pos : pos + 2])
                    ids.append(payload[pos + 2 : pos + 2 + n])
                    pos += 2 + n
                return ("REPLY_UNCOMMITTED", rtag, ids)
            if tag == 204:
                (n,) = struct.unpack(">H", payload[1:3])
                return ("REPLY", payload[3 : 3 + n], payload[3 + n] == 1)
        raise AssertionError(f"unexpected frame {body!r}")

    def round(self, txn: bytes, start: int, end: int, *, commit: bool | None = None) -> bool:
        """PHASE1 -> REPLY vote -> PHASE2 (the vote, unless ``commit`` overrides)."""
        self.send(phase1(txn, (self.stream, start, end)))
        kind, got, vote = self.read()
        assert (kind, got) == ("REPLY", txn)
        self.send(phase2(txn, vote if commit is None else commit))
        return vote

    def close(self) -> None:
        self.sock.close()


def _sink(tmp_path, *args: str, out: str = "out") -> Server:
    return Server("mock-sink", "--port", "0", "--out-dir", str(tmp_path / out), *args)


def _check(tmp_path, out: str = "out") -> dict:
    result = run_cli("mock-sink", "--check", str(tmp_path / out), "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == (0 if report["ok"] else 1)
    return report


def _output(tmp_path, instance: str = "w1", out: str = "out") -> bytes:
    return (tmp_path / out / f"{instance}.out").read_bytes()


def _sync(worker: Worker) -> None:
    """A round trip, so everything sent before has been applied: LIST_UNCOMMITTED answers in order."""
    worker.send(list_uncommitted(99))
    assert worker.read()[:2] == ("REPLY_UNCOMMITTED", 99)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sink")
    with Server("mock-sink", "--port", "0", "--out-dir", str(tmp / "out")) as server:
        yield server, tmp


def test_handshake_data_commit_and_check(shared):
    server, tmp = shared
    w = Worker(server.port, b"commit")
    assert w.uncommitted == [] and w.last_point == 0
    w.send(message(1, 0, b"hello "), message(1, 6, b"world\n"))
    assert w.round(b"t1", 0, 12) is True
    _sync(w)
    assert _output(tmp, "commit") == b"hello world\n"
    inst = {i["instance"]: i for i in _check(tmp)["instances"]}["commit"]
    assert inst["ok"] and inst["committed"] == 12 and inst["output_length"] == 12
    w.close()
    again = Worker(server.port, b"commit")  # a new session resumes at the committed offset
    assert again.last_point == 12 and again.uncommitted == []
    again.close()


def test_gap_votes_abort_and_phase2_abort_truncates(shared):
    server, tmp = shared
    w = Worker(server.port, b"gap")
    w.send(message(1, 0, b"aaaa"))
    assert w.round(b"t1", 0, 4) is True
    w.send(message(1, 4, b"bbbb"), message(1, 10, b"cc"))  # a gap at 8..10
    assert w.round(b"t2", 4, 8) is False  # the phase-2 decision follows the vote: abort
    _sync(w)
    assert _output(tmp, "gap") == b"aaaa"  # truncated back to the committed offset
    w.send(message(1, 4, b"bbbb"))  # re-sent from the committed offset: appended again
    assert w.round(b"t3", 4, 8) is True
    _sync(w)
    assert _output(tmp, "gap") == b"aaaabbbb"


def test_replay_is_accepted_only_when_the_bytes_match(shared):
    server, tmp = shared
    w = Worker(server.port, b"replay")
    w.send(message(1, 0, b"hello "), message(1, 0, b"hello world\n"))  # overlap matches, rest appended
    assert w.round(b"t1", 0, 12) is True
    w.send(message(1, 12, b"more"), message(1, 12, b"MORE"))  # same offset, other bytes
    assert w.round(b"t2", 12, 16) is False
    _sync(w)
    assert _output(tmp, "replay") == b"hello world\n"


def test_phase2_abort_of_a_commit_vote_truncates(shared):
    server, tmp = shared
    w = Worker(server.port, b"abort2")
    w.send(message(1, 0, b"keep"))
    assert w.round(b"t1", 0, 4) is True
    w.send(message(1, 4, b"drop me"))
    assert w.round(b"t2", 4, 11, commit=False) is True  # voted commit, the worker decides abort
    _sync(w)
    assert _output(tmp, "abort2") == b"keep"
    inst = {i["instance"]: i for i in _check(tmp)["instances"]}["abort2"]
    assert inst["committed"] == 4 and inst["undecided"] == []


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ((2, 4, 8), "stream 2"),
        ((1, 0, 8), "starts at 0"),
        ((1, 4, 99), "ends at 99"),
        ((1, 8, 4), "starts at 8"),
    ],
)
def test_bad_where_list_votes_abort(shared, where, why):
    server, tmp = shared
    name = f"where{where[0]}{where[1]}{where[2]}".encode()
    w = Worker(server.port, name)
    w.send(message(1, 0, b"aaaa"))
    assert w.round(b"t1", 0, 4) is True
    w.send(message(1, 4, b"bbbb"))
    w.send(phase1(b"t2", where))
    assert w.read() == ("REPLY", b"t2", False)
    w.send(phase2(b"t2", False))
    _sync(w)
    assert _output(tmp, name.decode()) == b"aaaa"


def test_data_stream_is_the_one_the_worker_notified(shared):
    server, tmp = shared
    w = Worker(server.port, b"stream7", stream=7)
    w.send(message(7, 0, b"seven\n"))
    assert w.round(b"t1", 0, 6) is True
    w.send(message(7, 6, b"more"), phase1(b"t2", (1, 6, 10)))  # the where-list names stream 1
    assert w.read() == ("REPLY", b"t2", False)
    w.send(phase2(b"t2", False), notify(8), notify(0), notify(7))  # one data stream, notified once
    assert [w.read() for _ in range(3)] == [("NOTIFY_ACK", 0, s, 0) for s in (8, 0, 7)]
    w.send(message(7, 6, b"again"))
    assert w.round(b"t3", 6, 11) is True
    _sync(w)
    assert _output(tmp, "stream7") == b"seven\nagain"


@pytest.mark.parametrize("stream", [1, 8])
def test_data_on_a_stream_that_was_not_notified_gets_error(shared, stream):
    server, tmp = shared
    name = f"not-notified{stream}".encode()
    w = Worker(server.port, name, stream=7)
    w.send(notify(8), message(7, 0, b"ok"))
    assert w.read() == ("NOTIFY_ACK", 0, 8, 0)
    w.send(message(stream, 2, b"stray"))
    reply = w.read()
    assert reply[0] == "ERROR" and f"Bad/unregistered stream_id {stream} with message_id 2" in reply[1]
    assert w.read() is None
    w = Worker(server.port, name, stream=7)  # nothing of the session was voted: nothing kept
    assert w.last_point == 0 and w.uncommitted == []
    w.close()


def test_second_connection_of_a_connected_instance_gets_error(shared):
    server, tmp = shared
    first = Worker(server.port, b"dup")
    second = Worker(server.port, None)
    second.send(hello(b"dup"), notify(), list_uncommitted(1))
    assert second.read() == ("ERROR", "instance 'dup' is already connected to this sink")
    assert second.read() is None  # and closed
    other = Worker(server.port, b"dup-other")  # other names carry on, and so does the first
    first.send(message(1, 0, b"x"))
    assert first.round(b"t1", 0, 1) is True
    other.close()
    first.close()


def test_a_worker_back_before_the_sink_saw_it_leave_is_served(tmp_path):
    faults = tmp_path / "faults.toml"
    faults.write_text('[[delay]]\nreply = "uncommitted"\nms = 300\ncount = 1\n')
    with _sink(tmp_path, "--faults", str(faults)) as server:
        first = Worker(server.port, None)
        first.send(hello(b"w1"), notify(), list_uncommitted(1))
        assert first.read() == ("OK", 500) and first.read()[:2] == ("NOTIFY_ACK", 1)
        first.close()  # gone while its session still waits to send REPLY_UNCOMMITTED
        second = Worker(server.port)  # not "already connected": the old session ends first
        second.send(message(1, 0, b"x"))
        assert second.round(b"t1", 0, 1) is True
        _sync(second)
    assert _output(tmp_path) == b"x"


@pytest.mark.parametrize(
    ("instance", "frames", "reason"),
    [
        (None, hello(b"bad1", cookie=b"nope"), "Bad cookie"),
        (None, hello(b"bad2", version=b"0.0.1"), "Unknown protocol version: 0.0.1"),
        (None, hello(b"bad3") + message(5, 0, b"x"), "Bad/unregistered stream_id 5"),
        (None, hello(b"bad4") + notify() + message(1, 0, b"x"), "needs a successful NOTIFY_ACK first"),
        (b"bad5", phase1(b"t1", (1, 0, 0)) + message(1, 0, b"x"), "between PHASE1"),
        (None, b"\x00\x00\x00\x01\x63", "Invalid frame"),
        (b"bad6", phase2(b"never", True), "never voted commit"),
        (b"bad7", hello(b"bad7"), "HELLO in state Streaming"),
    ],
)
def test_misbehaving_worker_gets_error_and_close_and_the_sink_serves_on(shared, instance, frames, reason):
    server, tmp = shared
    w = Worker(server.port, instance)
    w.send(frames)
    seen = []
    while (f := w.read()) is not None:
        seen.append(f)
    assert seen and seen[-1][0] == "ERROR" and reason in seen[-1][1], seen
    assert server.proc.poll() is None
    Worker(server.port, b"after-bad").close()


def test_version_and_cookie_options(tmp_path):
    with _sink(tmp_path, "--version", "v9", "--cookie", "s3cret") as server:
        w = Worker(server.port, None)
        w.send(hello(b"w", cookie=b"s3cret"))
        assert w.read() == ("ERROR", "Unknown protocol version: v0.0.1")
        w = Worker(server.port, None)
        w.send(hello(b"w", version=b"v9", cookie=b"s3cret"), notify(), list_uncommitted(3))
        assert w.read() == ("OK", 500)


def test_reply_uncommitted_after_kill_9_between_phase1_reply_and_phase2(tmp_path):
    for decision in (True, False):
        out = f"out{int(decision)}"
        server = _sink(tmp_path, out=out)
        w = Worker(server.port)
        w.send(message(1, 0, b"committed;"))
        assert w.round(b"t1", 0, 10) is True
        w.send(message(1, 10, b"voted;"))
        w.send(phase1(b"t2", (1, 10, 16)))
        assert w.read() == ("REPLY", b"t2", True)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        report = _check(tmp_path, out)
        [inst] = report["instances"]
        assert report["ok"] and inst["committed"] == 10
        assert inst["undecided"] == [{"txn_id": "t2", "start": 10, "end": 16}]
        with _sink(tmp_path, out=out) as server:
            w = Worker(server.port)
            assert w.uncommitted == [b"t2"] and w.last_point == 10
            assert _output(tmp_path, out=out) == b"committed;voted;"
            w.send(phase2(b"t2", decision))
            _sync(w)
            assert w.uncommitted == [b"t2"]
            expected = b"committed;voted;" if decision else b"committed;"
            assert _output(tmp_path, out=out) == expected
            w.send(message(1, len(expected), b"next"))
            assert w.round(b"t3", len(expected), len(expected) + 4) is True
            _sync(w)
        assert _output(tmp_path, out=out) == expected + b"next"
        assert _check(tmp_path, out)["ok"]


@pytest.mark.parametrize(
    ("point", "extra", "after_restart", "undecided"),
    [
        ("after_data_write", "skip = 1\n", b"aaaa", []),
        ("before_phase1_fsync", 'txn_id = "t2"\n', b"aaaa", []),
        ("after_phase1_reply", 'txn_id = "t2"\n', b"aaaabbbb", [b"t2"]),
        ("before_phase2_apply", 'txn_id = "t2"\n', b"aaaabbbb", [b"t2"]),
    ],
)
def test_hard_exit_at_each_fault_point_then_recovery(tmp_path, point, extra, after_restart, undecided):
    faults = tmp_path / "faults.toml"
    faults.write_text(f'[[exit]]\nat = "{point}"\ncode = 137\n{extra}')
    server = _sink(tmp_path, "--faults", str(faults))
    w = Worker(server.port)
    w.send(message(1, 0, b"aaaa"))
    assert w.round(b"t1", 0, 4) is True
    w.send(message(1, 4, b"bbbb"), phase1(b"t2", (1, 4, 8)))
    reply = w.read()
    if point in ("after_data_write", "before_phase1_fsync"):
        assert reply is None  # died before voting
    else:
        assert reply == ("REPLY", b"t2", True)
        w.send(phase2(b"t2", True))
    assert server.proc.wait(10) == 137
    report = _check(tmp_path)
    assert report["ok"] and report["instances"][0]["committed"] == 4
    with _sink(tmp_path) as server:
        assert _output(tmp_path) == after_restart  # committed bytes there, unvoted ones gone
        w = Worker(server.port)
        assert w.uncommitted == undecided
        for txn in undecided:
            w.send(phase2(txn, True))
        _sync(w)
    assert _check(tmp_path)["instances"][0]["committed"] == len(after_restart)


def test_fault_rules_abort_vote_close_and_delay(tmp_path):
    faults = tmp_path / "faults.json"
    faults.write_text(
        json.dumps(
            {
                "abort_vote": [{"txn_id": "c_id=2$"}, {"payload": "poison"}],
                "close": [
                    {"at": "before_phase1_reply", "txn_id": "c_id=4$"},
                    {"at": "after_phase1_reply", "txn_id": "c_id=5$"},
                ],
                "delay": [{"reply": "phase1", "ms": 20}],
            }
        )
    )
    with _sink(tmp_path, "--faults", str(faults)) as server:
        w = Worker(server.port)
        w.send(message(1, 0, b"a"))
        assert w.round(b"x:c_id=1", 0, 1) is True
        w.send(message(1, 1, b"b"))
        assert w.round(b"x:c_id=2", 1, 2) is False  # txn id rule
        w.send(message(1, 1, b"poison"))
        assert w.round(b"x:c_id=3", 1, 7) is False  # payload rule
        w.send(message(1, 1, b"c"), phase1(b"x:c_id=4", (1, 1, 2)))
        assert w.read() is None  # closed before the reply
        w = Worker(server.port)
        assert w.uncommitted == [b"x:c_id=4"]  # it voted (durably) before the close
        w.send(phase2(b"x:c_id=4", False), message(1, 1, b"d"), phase1(b"x:c_id=5", (1, 1, 2)))
        assert w.read() == ("REPLY", b"x:c_id=5", True)
        assert w.read() is None  # closed after the reply
        w = Worker(server.port)
        assert w.uncommitted == [b"x:c_id=5"]
        w.send(phase2(b"x:c_id=5", True))
        _sync(w)
    assert _output(tmp_path) == b"ad"


def test_bad_fault_file_is_a_usage_error(tmp_path):
    faults = tmp_path / "faults.toml"
    faults.write_text('[[exit]]\nat = "whenever"\n')
    result = run_cli("mock-sink", "--port", "0", "--out-dir", str(tmp_path / "o"), "--faults", str(faults))
    assert result.returncode == 2
    assert "exit[0].at: must be one of" in result.stderr and "Traceback" not in result.stderr


def test_torn_and_corrupt_logs_on_restart(tmp_path):
    with _sink(tmp_path) as server:
        for name in (b"torn", b"corrupt"):
            w = Worker(server.port, name)
            w.send(message(1, 0, b"data"))
            assert w.round(b"t1", 0, 4) is True
            _sync(w)
            w.close()
    out = tmp_path / "out"
    with open(out / "torn.txnlog", "ab") as f:
        f.write(b"\x00\x00\x00\x40\x12\x34")  # a record header cut short: a torn append
    log = bytearray((out / "corrupt.txnlog").read_bytes())
    log[12] ^= 0x20  # inside the header record, with good records after it
    (out / "corrupt.txnlog").write_bytes(bytes(log))
    report = _check(tmp_path)
    by_name = {i["log"] if "log" in i else i["instance"]: i for i in report["instances"]}
    assert not report["ok"]
    assert any(not i["ok"] and "corrupt record" in i["problems"][0] for i in report["instances"])
    assert any(i["ok"] and i["torn_log_bytes"] == 6 for i in report["instances"]), by_name
    with _sink(tmp_path) as server:
        w = Worker(server.port, b"torn")  # recovered, torn record dropped
        assert w.last_point == 4
        w.close()
        w = Worker(server.port, None)
        w.send(hello(b"corrupt"))
        error = w.read()
        assert error[0] == "ERROR" and "corrupt record" in error[1]
        Worker(server.port, b"fine").close()  # the sink carries on for the others


def _limited_sink(tmp_path, limit: int) -> subprocess.Popen:
    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.Popen(
        [*COMMAND, "mock-sink", "--port", "0", "--out-dir", str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit_file_size,
    )
    line = proc.stdout.readline()
    proc.port = int(READY.search(line).group(2))
    return proc


# A disk on which the fsyncs of instance "slow" hang while the flag file exists: mock-sink
# itself, in its own process, with os.fsync wrapped before it starts.
_SLOW_DISK = """
import os, sys, time
from pathlib import Path

flag = Path(sys.argv[1])
real_fsync = os.fsync

def fsync(fd):
    if flag.exists() and "slow" in os.readlink(f"/proc/self/fd/{fd}"):
        flag.with_name("blocked").touch()
        deadline = time.monotonic() + 60
        while flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    real_fsync(fd)

os.fsync = fsync
sys.argv = ["wallaroo-proto", *sys.argv[2:]]
from wallaroo_proto_cli.main import main
main()
"""


def test_an_instance_waiting_on_its_disk_does_not_hold_up_the_others(tmp_path):
    flag = tmp_path / "hang"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SLOW_DISK,
            str(flag),
            "mock-sink",
            "--port",
            "0",
            "--out-dir",
            str(tmp_path / "out"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(READY.search(proc.stdout.readline()).group(2))
        slow, fast = Worker(port, b"slow"), Worker(port, b"fast")
        flag.touch()
        slow.send(message(1, 0, b"slow data"), phase1(b"s1", (1, 0, 9)))
        deadline = time.monotonic() + 60
        while not (tmp_path / "blocked").exists():  # its PHASE1's fsync hangs
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.01)
        fast.send(message(1, 0, b"fast data"))
        assert fast.round(b"f1", 0, 9) is True  # served meanwhile (a 15 s socket timeout otherwise)
        _sync(fast)
        assert _output(tmp_path, "fast") == b"fast data"
        flag.unlink()
        assert slow.read() == ("REPLY", b"s1", True)
        slow.send(phase2(b"s1", True))
        _sync(slow)
    finally:
        flag.unlink(missing_ok=True)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert _output(tmp_path, "slow") == b"slow data"
    assert _check(tmp_path)["ok"]


def test_disk_that_refuses_writes_gives_a_clear_error_and_loses_no_committed_byte(tmp_path):
    proc = _limited_sink(tmp_path, 2048)  # RLIMIT_FSIZE: writes past 2 KiB fail with EFBIG
    try:
        w = Worker(proc.port)
        committed = b"x" * 1000
        w.send(message(1, 0, committed))
        assert w.round(b"t1", 0, 1000) is True
        w.send(message(1, 1000, b"y" * 1500))  # crosses the limit
        error = w.read()
        assert error[0] == "ERROR" and "sink storage failure" in error[1] and "File too large" in error[1]
        assert w.read() is None
        w = Worker(proc.port)  # still serving; nothing lost
        assert w.last_point == 1000 and w.uncommitted == []
        w.send(message(1, 1000, b"z" * 10))
        assert w.round(b"t2", 1000, 1010) is True
        _sync(w)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "STORAGE FAILURE" in err and "Traceback" not in err
    assert _output(tmp_path) == committed + b"z" * 10
    assert _check(tmp_path)["ok"]


def test_sigterm_prints_a_summary_and_exits_0(tmp_path):
    server = _sink(tmp_path, "--format", "json")
    Worker(server.port).close()
    time.sleep(0.1)
    code, out, _ = server.stop()
    assert code == 0
    summary = json.loads(out.strip().splitlines()[-1])["summary"]
    assert summary["connections"] == 1 and summary["instances"] == ["w1"]


def test_check_of_a_missing_directory_is_a_usage_error(tmp_path):
    result = run_cli("mock-sink", "--check", str(tmp_path / "nope"))
    assert result.returncode == 2 and "not a directory" in result.stderr


def test_full_disk_enospc_on_a_small_tmpfs(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        server = Server("mock-sink", "--port", "0", "--out-dir", str(disk / "out"))
        try:
            w = Worker(server.port)
            w.send(message(1, 0, b"c" * 100))
            assert w.round(b"t1", 0, 100) is True
            _sync(w)
            fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)  # take every free block
            try:
                while os.write(fd, b"\0" * 4096):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
            w.send(message(1, 100, b"d" * 20_000))
            error = w.read()
            assert error[0] == "ERROR" and "No space left on device" in error[1], error
            assert server.proc.poll() is None
            (disk / "filler").unlink()
            w = Worker(server.port)
            assert w.last_point == 100
            w.send(message(1, 100, b"e" * 10))
            assert w.round(b"t2", 100, 110) is True
            _sync(w)
        finally:
            code, _, err = server.stop()
        assert code == 0 and "STORAGE FAILURE" in err
        assert (disk / "out" / "w1.out").read_bytes() == b"c" * 100 + b"e" * 10
        report = json.loads(run_cli("mock-sink", "--check", str(disk / "out"), "--format", "json").stdout)
        assert report["ok"]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# --- the command-line grammar (docs/cli.md) -------------------------------------------------------


def test_the_grammars_words_and_verbose_rounds_in_words(tmp_path):
    out = tmp_path / "sink-out"
    with Server(
        "mock-sink", "--listen", ":0", "-o", str(out), "--protocol-version", "v0.0.7", "-v"
    ) as server:
        w = Worker(server.port, instance=None)
        w.send(hello(b"w1", version=b"v0.0.7"), notify(), list_uncommitted(7))
        assert w.read() == ("OK", 500)
        w.read(), w.read()  # NOTIFY_ACK, REPLY_UNCOMMITTED
        assert w.round(b"t1", 0, 0) is True
        w.send(list_uncommitted(8))  # answered after the PHASE2 before it is done
        assert w.read() == ("REPLY_UNCOMMITTED", 8, [])
        w.close()
        code, _out, err = server.stop()
    assert code == 0, err
    assert any(out.iterdir())
    assert "PHASE1 't1' (stream 1 bytes 0-0) -> vote commit" in err
    assert "PHASE2 't1' commit" in err


def test_rounds_are_not_logged_without_verbose(tmp_path):
    server = _sink(tmp_path)
    w = Worker(server.port)
    assert w.round(b"t1", 0, 0) is True
    w.send(list_uncommitted(8))
    assert w.read() == ("REPLY_UNCOMMITTED", 8, [])
    w.close()
    code, _out, err = server.stop()
    assert code == 0, err
    assert "PHASE1" not in err and "mock-sink summary: 1 connection(s)" in err


def test_an_output_folder_through_a_file_says_what_is_wrong(tmp_path):
    (tmp_path / "five.txt").write_text("a file\n")
    result = run_cli("mock-sink", "--listen", ":0", "-o", str(tmp_path / "five.txt" / "out"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"wallaroo-proto mock-sink: cannot use --output {tmp_path / 'five.txt' / 'out'}: "
        "a part of that path is a file where a folder is needed"
    )


def test_a_fault_that_never_fired_is_said(tmp_path):
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"abort_vote": [{"txn_id": "c_id=99$"}]}))
    server = _sink(tmp_path, "--faults", str(faults))
    w = Worker(server.port)
    assert w.round(b"c_id=1", 0, 0) is True
    w.send(list_uncommitted(8))
    assert w.read() == ("REPLY_UNCOMMITTED", 8, [])
    w.close()
    code, _out, err = server.stop()
    assert code == 0, err
    assert "wallaroo-proto mock-sink: fault abort_vote[0] never fired: nothing matched 'c_id=99$'" in err
