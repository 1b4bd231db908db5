"""mock-source against mock-worker: two real processes over loopback.

The worker's ``--out`` JSON lines are the ground truth: every input message
must be there exactly once per stream, in order, whatever RESTARTs and dropped
connections the worker injects.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest
from support import COMMAND, Server, delivered, run_cli

from wallaroo_proto.protocols.wallaroo.inputs import stream_id_for

pytestmark = pytest.mark.e2e


def expected_generated(streams: int, count: int, size: int) -> dict[int, list[tuple[int, str]]]:
    out = {}
    for i in range(streams):
        name = f"stream-{i}"
        rows = []
        for n in range(1, count + 1):
            head = f"{name}:{n}:"
            rows.append((n, head + "." * (size - len(head))))
        out[stream_id_for(name)] = rows
    return out


def run_pair(tmp_path: Path, worker_args: list[str], source_args: list[str], **kwargs) -> tuple[dict, dict]:
    """Run a worker and one source to completion: (source summary, worker summary)."""
    out = tmp_path / "out.jsonl"
    with Server(
        "mock-worker",
        "--port",
        "0",
        "--out",
        str(out),
        "--checkpoint-ms",
        "20",
        "--format",
        "json",
        "--no-live",
        *worker_args,
    ) as worker:
        result = run_cli(
            "mock-source",
            "--connect",
            worker.address,
            "--format",
            "json",
            "-q",
            *source_args,
            timeout=90,
            **kwargs,
        )
        code, stdout, stderr = worker.stop()
    assert result.returncode == 0, result.stderr
    assert code == 0, stderr
    return json.loads(result.stdout.splitlines()[-1]), json.loads(stdout.splitlines()[-1])


@pytest.mark.timeout(90)
def test_many_streams_arrive_exactly_once_in_order(tmp_path: Path):
    source, worker = run_pair(
        tmp_path, ["--credits", "40"], ["--streams", "24", "--count", "150", "--payload-size", "32"]
    )
    assert delivered(tmp_path / "out.jsonl") == expected_generated(24, 150, 32)
    assert source["streams_done"] == 24 and source["messages"] == 24 * 150
    assert source["acknowledged"] == 24 * 150
    assert worker["messages"] == 24 * 150 and worker["violations"] == 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "fault", [["--restart-after", "230"], ["--drop-connection-after", "310"]], ids=["restart", "drop"]
)
def test_injected_faults_lose_nothing(tmp_path: Path, fault: list[str]):
    source, worker = run_pair(
        tmp_path, ["--credits", "64", *fault], ["--streams", "8", "--count", "400", "--retries", "20"]
    )
    assert delivered(tmp_path / "out.jsonl") == expected_generated(8, 400, 64)
    assert source["connections"] > 5 and source["replayed"] > 0
    assert source["restarts" if "--restart-after" in fault else "drops"] >= 5
    assert worker["messages"] == 8 * 400


@pytest.mark.timeout(90)
def test_stdin_and_files_survive_restarts(tmp_path: Path):
    lines = [f"line {i} " + "x" * (i % 17) for i in range(600)]
    text = tmp_path / "lines.txt"
    text.write_text("\n".join(lines) + "\n")
    records = tmp_path / "records.bin"
    records.write_bytes(b"".join(len(s).to_bytes(4, "big") + s.encode() for s in lines[:300]))
    source, _ = run_pair(
        tmp_path,
        ["--restart-after", "170"],
        [str(text), "-", "--stream-name", "file", "--stream-name", "piped", "--retries", "20"],
        input="\n".join(lines[::-1]) + "\n",
    )
    got = delivered(tmp_path / "out.jsonl")
    assert got[stream_id_for("file")] == list(enumerate(lines, 1))
    assert got[stream_id_for("piped")] == list(enumerate(lines[::-1], 1))
    assert source["restarts"] >= 3
    # Length-prefixed records, resumed by a second run against the worker's durable state.
    state = tmp_path / "state.json"
    out = tmp_path / "records.jsonl"
    with Server(
        "mock-worker",
        "--port",
        "0",
        "--out",
        str(out),
        "--state",
        str(state),
        "--checkpoint-ms",
        "20",
        "--no-live",
    ) as worker:
        first = run_cli(
            "mock-source",
            "--connect",
            worker.address,
            "--framing",
            "length-prefixed",
            str(records),
            "-q",
            "--stream-name",
            "rec",
        )
        worker.stop()
    assert first.returncode == 0, first.stderr
    with Server(
        "mock-worker", "--port", "0", "--out", str(out), "--state", str(state), "--no-live"
    ) as worker:
        again = run_cli(
            "mock-source",
            "--connect",
            worker.address,
            "--framing",
            "length-prefixed",
            str(records),
            "-q",
            "--stream-name",
            "rec",
            "--format",
            "json",
        )
        worker.stop()
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["messages"] == 0  # the worker said: resume at 301, past the end
    assert delivered(out)[stream_id_for("rec")] == list(enumerate(lines[:300], 1))


@pytest.mark.timeout(90)
def test_a_held_stream_is_refused_until_its_owner_ends_it(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    with Server(
        "mock-worker", "--port", "0", "--out", str(out), "--checkpoint-ms", "20", "--no-live"
    ) as worker:
        args = [*COMMAND, "mock-source", "--connect", worker.address, "--format", "json", "-q"]
        slow = subprocess.Popen(
            [*args, "--count", "60", "--rate", "30", "--stream-name", "shared"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 20
            while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
                time.sleep(0.05)  # until the slow source holds the stream
            # Same stream while the slow one holds it: refused, retried, then resumed past its end.
            second = run_cli(
                "mock-source",
                "--connect",
                worker.address,
                "--format",
                "json",
                "-q",
                "--count",
                "60",
                "--stream-name",
                "shared",
                "--retries",
                "30",
            )
            first_out, _ = slow.communicate(timeout=60)
        finally:
            slow.kill()
        worker.stop()
    assert slow.returncode == 0 and second.returncode == 0, second.stderr
    first, summary = json.loads(first_out), json.loads(second.stdout)
    assert summary["refusals"] >= 1
    assert first["messages"] == 60 and summary["messages"] == 0  # resumed at 61: nothing left to send
    rows = delivered(out)[stream_id_for("shared")]
    assert [n for n, _ in rows] == list(range(1, 61))


@pytest.mark.timeout(60)
def test_wrong_cookie_is_a_worker_error(tmp_path: Path):
    with Server("mock-worker", "--port", "0", "--cookie", "right", "--no-live") as worker:
        result = run_cli("mock-source", "--connect", worker.address, "--cookie", "wrong", "-q")
        worker.stop()
    assert result.returncode == 1
    assert "worker ERROR: Bad cookie" in result.stderr


def test_recorded_sample_session_opens_in_scapy():
    """captures/source-worker-session.pcap: a real mock-source -> mock-worker session with a RESTART."""
    from scapy.all import TCP, Raw, rdpcap

    packets = rdpcap(str(Path(__file__).resolve().parent.parent / "captures" / "source-worker-session.pcap"))
    connections: dict[int, dict[bool, bytes]] = defaultdict(lambda: {True: b"", False: b""})
    for packet in packets:
        tcp = packet[TCP]
        from_client = tcp.dport == 7100
        if Raw in packet:
            connections[tcp.sport if from_client else tcp.dport][from_client] += bytes(packet[Raw].load)
    assert len(connections) == 2

    def types(data: bytes) -> list[int]:
        out, pos = [], 0
        while pos < len(data):
            length = int.from_bytes(data[pos : pos + 4], "big")
            out.append(data[pos + 4])
            pos += 4 + length
        assert pos == len(data)
        return out

    first, second = (connections[port] for port in sorted(connections))
    assert types(first[True])[:3] == [0, 3, 3]  # HELLO, then a NOTIFY per stream
    assert types(first[False])[-1] == 7  # the worker's RESTART ends the first connection
    assert types(second[True]).count(5) == 4 and types(second[True])[-2:] == [8, 8]  # replay, then EOS x2
    # The second NOTIFY for stream-0 offers the point of reference the first connection's ACK gave.
    notify = second[True][second[True].index(b"stream-0") + 8 :][:8]
    assert int.from_bytes(notify, "big") == 5
