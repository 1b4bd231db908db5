"""``dissect -`` on a pipe is a live view: each frame is printed as the packet completing it
arrives, not when the writer exits. Real processes over real pipes; waits on output with
generous deadlines, never on the clock."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import COMMAND, READY, Server, as_foreground, run_cli
from test_mock_worker import hello

from wallaroo_proto.capture.pcap import WAIT, read_segments

pytestmark = pytest.mark.timeout(300)

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
#: How long a record may take to show after its packet was written (a loaded machine, 3x slower).
DEADLINE = 60


def pcap_pieces(path: Path) -> tuple[bytes, list[bytes]]:
    """A classic pcap's 24-byte file header and its packet records (16-byte header + data), as
    the file holds them (little-endian, as the samples are written)."""
    data = path.read_bytes()
    assert data[:4] == b"\xd4\xc3\xb2\xa1"
    records, pos = [], 24
    while pos < len(data):
        caplen = struct.unpack_from("<I", data, pos + 8)[0]
        records.append(data[pos : pos + 16 + caplen])
        pos += 16 + caplen
    return data[:24], records


def pcapng_pieces(path: Path) -> tuple[bytes, list[bytes]]:
    """A pcapng's blocks before the first packet (section header, interface), then one
    piece per enhanced packet block (type 6), each with any other blocks before it."""
    data = path.read_bytes()
    blocks, pos = [], 0
    while pos < len(data):
        kind, length = struct.unpack_from("<II", data, pos)
        blocks.append((kind, data[pos : pos + length]))
        pos += length
    first = next(i for i, (kind, _) in enumerate(blocks) if kind == 6)
    head = b"".join(block for _, block in blocks[:first])
    pieces, pending = [], b""
    for kind, block in blocks[first:]:
        pending += block
        if kind == 6:
            pieces.append(pending)
            pending = b""
    assert not pending
    return head, pieces


def expected_by_packet(path: Path, *args: str) -> dict[int, int]:
    """How many records the whole file gives per packet number (read as a file, not a pipe)."""
    done = run_cli("dissect", str(path), "--format", "jsonl", *args)
    assert done.returncode == 0, done.stderr
    counts: dict[int, int] = {}
    for line in done.stdout.splitlines():
        packet = json.loads(line)["packet"]
        counts[packet] = counts.get(packet, 0) + 1
    return counts


class Lines:
    """A process's stdout lines, read by a thread into a queue: a test waits with a deadline."""

    def __init__(self, pipe) -> None:
        self.queue: queue.Queue[bytes | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.queue.put(line)
        self.queue.put(None)

    def next(self, what: str) -> bytes:
        try:
            line = self.queue.get(timeout=DEADLINE)
        except queue.Empty:
            raise AssertionError(f"no output within {DEADLINE} s while waiting for {what}") from None
        assert line is not None, f"the output ended while waiting for {what}"
        return line

    def until(self, predicate, what: str) -> dict:
        while True:
            record = json.loads(self.next(what))
            if predicate(record):
                return record


def dissect_stdin(*args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    # SIGINT at its default, as a terminal's foreground job has it (a run in the background
    # inherits it ignored, and the interrupt test would wait for a signal never taken).
    return subprocess.Popen(
        [*COMMAND, "dissect", "-", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        preexec_fn=as_foreground,
    )


def feed_one_by_one(head: bytes, pieces: list[bytes], expected: dict[int, int], *args: str) -> None:
    """Write the capture a packet at a time; before each next packet, read the records the last
    one completes. Every record must come while the pipe is still open."""
    proc = dissect_stdin("--format", "jsonl", *args)
    lines = Lines(proc.stdout)
    try:
        proc.stdin.write(head)
        proc.stdin.flush()
        for number, piece in enumerate(pieces, 1):
            proc.stdin.write(piece)
            proc.stdin.flush()
            for _ in range(expected.get(number, 0)):
                record = json.loads(lines.next(f"a record of packet {number}"))
                assert record["packet"] == number
        assert sum(expected.values()) > 10  # the capture has frames to wait for
        proc.stdin.close()
        assert lines.queue.get(timeout=DEADLINE) is None  # nothing more once the pipe closes
        assert proc.wait(timeout=DEADLINE) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.e2e
def test_pcap_on_a_pipe_prints_each_frame_as_its_packet_arrives() -> None:
    path = CAPTURES / "sink-2pc.pcap"
    head, pieces = pcap_pieces(path)
    feed_one_by_one(head, pieces, expected_by_packet(path))


@pytest.mark.e2e
def test_pcapng_on_a_pipe_prints_each_frame_as_its_packet_arrives_filtered_too() -> None:
    # --connection sends the records through the filtering path, not the plain JSONL one.
    path = CAPTURES / "sink-2pc-ns.pcapng"
    head, pieces = pcapng_pieces(path)
    feed_one_by_one(head, pieces, expected_by_packet(path, "--connection", "1"), "--connection", "1")


def test_table_view_on_a_pipe_shows_rows_before_the_pipe_closes() -> None:
    head, pieces = pcap_pieces(CAPTURES / "sink-2pc.pcap")
    proc = dissect_stdin()
    lines = Lines(proc.stdout)
    proc.stdin.write(head + b"".join(pieces))
    proc.stdin.flush()  # and left open: the rows must come while the writer still writes
    try:
        while b"HELLO" not in lines.next("the HELLO row"):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_interrupt_on_a_waiting_pipe_is_one_line_and_exit_130() -> None:
    head, pieces = pcap_pieces(CAPTURES / "sink-2pc.pcap")
    proc = dissect_stdin("--format", "jsonl")
    lines = Lines(proc.stdout)
    try:
        proc.stdin.write(head + b"".join(pieces[:5]))
        proc.stdin.flush()
        lines.next("the first record")  # it is reading, and now waits for more
        # The writer stays open (as when only dissect is sent the signal): the signal may land
        # while dissect writes the record, just before its next read, and must still stop it.
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE) == 130
        assert proc.stderr.read().decode().splitlines() == ["wallaroo-proto dissect: interrupted"]
    finally:
        proc.kill()
        proc.wait()


def test_reader_gone_stops_quietly() -> None:
    # As `... | dissect - | head -1`: the reader closes; the next writes find no one.
    head, pieces = pcap_pieces(CAPTURES / "sink-2pc.pcap")
    proc = dissect_stdin("--format", "jsonl")
    try:
        proc.stdin.write(head + b"".join(pieces[:5]))
        proc.stdin.flush()
        assert proc.stdout.readline()
        proc.stdout.close()
        for piece in pieces[5:]:
            proc.stdin.write(piece)
            proc.stdin.flush()
        proc.stdin.close()
        assert proc.wait(timeout=DEADLINE) == 0
        assert proc.stderr.read() == b""
    except BrokenPipeError:  # dissect already left: what it wrote on the way out still counts
        assert proc.wait(timeout=DEADLINE) == 0
        assert proc.stderr.read() == b""
    finally:
        proc.kill()
        proc.wait()


# --- real traffic --------------------------------------------------------------------------


def connect_and_hello(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    sock.sendall(hello(program=b"live-view"))
    return sock


@pytest.mark.e2e
def test_tcpdump_piped_into_dissect_shows_a_mock_workers_traffic_live() -> None:
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        pytest.skip("tcpdump is not installed")
    with Server("mock-worker", "--port", "0") as worker:
        capture = subprocess.Popen(
            [tcpdump, "-i", "lo", "-U", "-w", "-", "tcp", "port", str(worker.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        proc = None
        try:
            started = capture.stderr.readline().decode()  # "listening on lo, ..." once it captures
            if "listening on" not in started:
                capture.kill()
                pytest.skip(f"tcpdump cannot capture on lo here: {started.strip() or 'no output'}")
            proc = subprocess.Popen(
                [*COMMAND, "dissect", "-", "--format", "jsonl", "--port", str(worker.port)],
                stdin=capture.stdout,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            capture.stdout.close()  # dissect holds the pipe now
            lines = Lines(proc.stdout)
            with connect_and_hello(worker.port):
                got = lines.until(lambda r: r["type"] == "HELLO", "the connector's HELLO")
                assert got["program_name"] == "live-view"
                assert got["responder_port"] == worker.port
                lines.until(lambda r: r["type"] == "OK", "the worker's OK")  # tcpdump still runs
            assert capture.poll() is None
            capture.send_signal(signal.SIGINT)
            capture.wait(timeout=DEADLINE)
            assert proc.wait(timeout=DEADLINE) == 0, proc.stderr.read()
        finally:
            capture.kill()
            capture.wait()
            if proc is not None:
                proc.kill()
                proc.wait()


@pytest.mark.e2e
def test_a_mocks_record_to_stdout_piped_into_dissect_is_live() -> None:
    worker = subprocess.Popen(
        [*COMMAND, "mock-worker", "--port", "0", "--record", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc = subprocess.Popen(
        [*COMMAND, "dissect", "-", "--format", "jsonl"], stdin=worker.stdout, stdout=subprocess.PIPE
    )
    worker.stdout.close()  # dissect holds the pipe now
    try:
        errors = Lines(worker.stderr)
        ready = READY.search(errors.next("the ready line on stderr").decode())
        assert ready, "no ready line on stderr"
        port = int(ready.group(2))
        lines = Lines(proc.stdout)
        with connect_and_hello(port):  # found on its port by its first bytes: no --port needed
            got = lines.until(lambda r: r["type"] == "HELLO", "the connector's HELLO")
            assert got["program_name"] == "live-view"
            lines.until(lambda r: r["type"] == "OK", "the worker's OK")
        assert worker.poll() is None  # the recorder still runs
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=DEADLINE) == 0
        while b"mock-worker summary" not in errors.next("the summary on stderr"):
            pass
        assert proc.wait(timeout=DEADLINE) == 0  # the recording's end is the pipe's
    finally:
        worker.kill()
        worker.wait()
        proc.kill()
        proc.wait()


@pytest.mark.e2e
def test_a_mock_whose_record_pipe_reader_left_keeps_serving() -> None:
    worker = subprocess.Popen(
        [*COMMAND, "mock-worker", "--port", "0", "--record", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        errors = Lines(worker.stderr)
        ready = READY.search(errors.next("the ready line on stderr").decode())
        assert ready, "no ready line on stderr"
        worker.stdout.close()  # the reader of the recording is gone
        for _ in range(2):  # the first connection finds the pipe closed; the worker goes on serving
            with connect_and_hello(int(ready.group(2))) as sock:
                reply = b""
                while len(reply) < 9:
                    data = sock.recv(9 - len(reply))
                    assert data, f"the worker closed the connection (got {reply!r})"
                    reply += data
                assert reply[:5] == b"\x00\x00\x00\x05\x01"  # OK: length 5, type 1, then the credits
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=DEADLINE) == 0
        rest = []
        while (line := errors.queue.get(timeout=DEADLINE)) is not None:
            rest.append(line.decode())
        text = "".join(rest)
        assert "recording stopped: its pipe's reader went away" in text
        assert "Traceback" not in text
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.e2e
def test_the_dcp_producers_record_to_stdout_piped_into_dissect_is_live() -> None:
    producer = subprocess.Popen(
        [*COMMAND, "dcp", "mock-producer", "--port", "0", "--no-require-auth"]
        + ["--vbuckets", "2", "--items", "3", "--record", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc = subprocess.Popen(
        [*COMMAND, "dissect", "-", "--format", "jsonl"], stdin=producer.stdout, stdout=subprocess.PIPE
    )
    producer.stdout.close()
    try:
        errors = Lines(producer.stderr)
        ready = READY.search(errors.next("the ready line on stderr").decode())
        assert ready, "no ready line on stderr"
        lines = Lines(proc.stdout)
        consumer = run_cli("dcp", "mock-consumer", "--connect", f"127.0.0.1:{ready.group(2)}", "--no-auth")
        assert consumer.returncode == 0, consumer.stderr
        # Found by its first bytes on the producer's port; shown while the producer still runs.
        lines.until(lambda r: r["type"] == "DCP_MUTATION", "a mutation the producer sent")
        lines.until(lambda r: r["type"] == "DCP_STREAM_END", "the end of a stream")
        assert producer.poll() is None
        producer.send_signal(signal.SIGTERM)
        assert producer.wait(timeout=DEADLINE) == 0
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        producer.kill()
        producer.wait()
        proc.kill()
        proc.wait()


# --- the reader itself: a pipe in any chunking reads as the file does --------------------------


class Pieces:
    """A pipe whose reads return the capture in exactly the given pieces, as a writer that
    pauses between them leaves it: ``read1`` gives the rest of the current piece at most,
    ``read`` waits for the next pieces. Its descriptor is a real pipe's, so it is read as one."""

    def __init__(self, data: bytes, cuts: list[int]) -> None:
        bounds = [0, *sorted(cuts), len(data)]
        self.pieces = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
        self.read_end, self.write_end = os.pipe()  # never written: a reader would wait on it

    def fileno(self) -> int:
        return self.read_end

    def read1(self, n: int) -> bytes:
        if not self.pieces:
            return b""
        piece = self.pieces.pop(0)
        if len(piece) > n:
            self.pieces.insert(0, piece[n:])
        return piece[:n]

    def read(self, n: int = -1) -> bytes:
        out = b""
        while (n < 0 or len(out) < n) and self.pieces:
            out += self.read1(n - len(out) if n >= 0 else len(self.pieces[0]))
        return out

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


@pytest.mark.parametrize("name", ["sink-2pc.pcap", "sink-2pc-ns.pcapng", "dcp-stream.pcap"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_pipe_written_in_any_pieces_reads_as_the_file(name: str, data) -> None:
    blob = (CAPTURES / name).read_bytes()
    cuts = data.draw(st.lists(st.integers(0, len(blob)), max_size=40))
    pipe = Pieces(blob, cuts)
    try:
        got = list(read_segments(pipe, waits=True))
    finally:
        pipe.close()
    assert [seg for seg in got if not seg[4] & WAIT] == list(read_segments(io.BytesIO(blob)))
    assert got[-1][4] & WAIT  # before the read that finds the end, a WAIT: nothing was there yet
    assert not any(seg[4] & WAIT for seg in read_segments(io.BytesIO(blob), waits=True))  # a file: none


def _recorded(command: list[str], peer=None) -> tuple[list[dict], bytes]:
    """Run a mock with ``--record -`` piped into ``dissect -``; ``peer(stderr_lines)`` drives it
    from its ready line if it needs one. The frames dissect read, and the mock's stderr."""
    end = command.index("--") if "--" in command else len(command)  # before a child's command
    mock = subprocess.Popen(
        [*COMMAND, *command[:end], "--record", "-", *command[end:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc = subprocess.Popen(
        [*COMMAND, "dissect", "-", "--format", "jsonl"], stdin=mock.stdout, stdout=subprocess.PIPE
    )
    mock.stdout.close()  # dissect holds the pipe now
    try:
        errors = Lines(mock.stderr)
        if peer is not None:
            peer(errors)
        assert mock.wait(timeout=DEADLINE * 2) == 0
        out, _ = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 0
        rest = []
        while (line := errors.queue.get(timeout=DEADLINE)) is not None:
            rest.append(line)
        return [json.loads(line) for line in out.splitlines()], b"".join(rest)
    finally:
        for p in (mock, proc):
            p.kill()
            p.wait()


def _ic_peer(errors: Lines) -> None:
    """mock-lb for a mock-ic whose ready line (on stderr) names its two ports."""
    ports = re.search(rb"receive port (\d+), send port (\d+)", errors.next("mock-ic's ready line on stderr"))
    assert ports, "no ready line on stderr"
    lb = run_cli("ambrosia", "mock-lb", "--receive-port", ports[1].decode(), "--send-port", ports[2].decode())
    assert lb.returncode == 0, lb.stderr


@pytest.mark.e2e
@pytest.mark.parametrize(
    "mock", ["ambrosia mock-ic", "kinesis mock-daemon", "mock-source", "tremor mock-client"]
)
def test_every_mock_with_a_recording_records_to_stdout_for_dissect(mock) -> None:
    """``--record -`` on each mock that records: the pcap on stdout, its own text on stderr."""
    if mock == "ambrosia mock-ic":
        frames, err = _recorded(
            ["ambrosia", "mock-ic", "--listen", "127.0.0.1:0", "--rpcs", "30", "--exit-when-done"], _ic_peer
        )
        want, summary = {"Record", "RPCBatch", "InitialMessage"}, b"ambrosia mock-ic summary"
    elif mock == "kinesis mock-daemon":
        processor = [*COMMAND, "kinesis", "mock-processor"]
        frames, err = _recorded(
            ["kinesis", "mock-daemon", "--shards", "1", "--records", "5", "--", *processor]
        )
        want, summary = {"initialize", "processRecords", "status"}, b"kinesis mock-daemon summary"
    elif mock == "mock-source":
        with Server("mock-worker", "--port", "0") as worker:
            frames, err = _recorded(["mock-source", "--connect", worker.address, "--count", "5"])
        want, summary = {"HELLO", "OK", "MESSAGE"}, b"mock-source"
    else:
        with Server("tremor", "mock-node", "--port", "0") as node:
            frames, err = _recorded(["tremor", "mock-client", "--connect", node.address, "--messages", "3"])
        want, summary = {"connect", "connect-ack"}, b"tremor mock-client"
    types = {f.get("type") for f in frames}
    assert want <= types, (types, err)
    assert summary in err and b"Traceback" not in err
