"""mock-daemon and mock-processor as real processes: a kclpy processor, pipes, TCP, faults, restarts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from support import COMMAND, Server, as_foreground, run_cli, wait_for

PY = sys.executable
PROCESSOR = [PY, "-m", "wallaroo_proto_cli", "kinesis", "mock-processor"]

pytestmark = pytest.mark.e2e

# A record processor written against amazon_kclpy's v3 interface, as a KCL user writes one: it
# checkpoints at the end of each batch, retries a failed checkpoint, and logs what it saw.
KCLPY_PROCESSOR = """
import json, os, sys, time
from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

LOG = os.environ["KCL_TEST_LOG"]


class Processor(processor.RecordProcessorBase):
    shard = None

    def log(self, **event):
        with open(LOG, "a") as f:
            f.write(json.dumps({"shard": self.shard, **event}) + "\\n")

    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id
        self.log(event="initialize", sequenceNumber=initialize_input.sequence_number)

    def process_records(self, process_records_input):
        records = process_records_input.records
        for r in records:
            self.log(event="record", sequenceNumber=r.sequence_number, key=r.partition_key,
                     data=r.binary_data.decode())
        if os.environ.get("KCL_TEST_SLOW"):
            time.sleep(float(os.environ["KCL_TEST_SLOW"]))
        if records:
            self.checkpoint(process_records_input.checkpointer, records[-1].sequence_number)

    def lease_lost(self, lease_lost_input):
        self.log(event="leaseLost")

    def shard_ended(self, shard_ended_input):
        self.log(event="shardEnded")
        self.checkpoint(shard_ended_input.checkpointer, None)

    def shutdown_requested(self, shutdown_requested_input):
        self.log(event="shutdownRequested")
        self.checkpoint(shutdown_requested_input.checkpointer, None)

    def checkpoint(self, checkpointer, sequence_number):
        for _ in range(5):
            try:
                checkpointer.checkpoint(sequence_number)
                self.log(event="checkpoint", sequenceNumber=sequence_number)
                return
            except kcl.CheckpointError as err:
                self.log(event="checkpoint_error", error=err.value)
                if err.value == "ShutdownException":
                    return


if __name__ == "__main__":
    print("a debug line on stdout, which the daemon skips")
    kcl.KCLProcess(Processor()).run()
"""


@pytest.fixture
def kclpy_app(tmp_path: Path) -> tuple[list[str], Path]:
    pytest.importorskip("amazon_kclpy")
    script = tmp_path / "app.py"
    script.write_text(KCLPY_PROCESSOR)
    return [PY, str(script)], tmp_path / "events.jsonl"


def daemon(*args: str, env: dict | None = None, **kwargs) -> tuple[subprocess.CompletedProcess, dict]:
    result = run_cli(
        "kinesis", "mock-daemon", "--format", "json", *args, env={**os.environ, **(env or {})}, **kwargs
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary (exit {result.returncode}): {result.stdout}\n{result.stderr}"
    return result, json.loads(lines[-1])


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def leases(path: Path) -> dict[str, str]:
    return {shard: lease["checkpoint"] for shard, lease in json.loads(path.read_text())["leases"].items()}


def seq(shard_index: int, n: int) -> str:
    from wallaroo_proto.protocols.kinesis.records import sequence_number

    return sequence_number(shard_index, n)


# ----------------------------------------------------------------------------- a real kclpy processor


def test_kclpy_processor_gets_every_record_once_and_its_checkpoint_errors(kclpy_app, tmp_path):
    app, log = kclpy_app
    state = tmp_path / "leases.json"
    args = ["--shards", "2", "--records", "30", "--batch-size", "10", "--state", str(state), "--shard-end"]
    result, summary = daemon(
        *args, "--checkpoint-error", "ThrottlingException@1", "--", *app, env={"KCL_TEST_LOG": str(log)}
    )
    assert result.returncode == 0, result.stderr
    assert summary["ok"] and summary["records_delivered"] == 60
    for shard in summary["shards"]:
        assert (shard["delivered"], shard["redelivered"], shard["end"]) == (30, 0, "shardEnded")
        assert shard["checkpoint"] == "SHARD_END" and shard["checkpointed"] == 30
        assert shard["checkpoint_errors"] == {"ThrottlingException": 1}
        assert shard["exit_codes"] == [0]
    assert leases(state) == {"shardId-000000000000": "SHARD_END", "shardId-000000000001": "SHARD_END"}
    seen = events(log)
    for index, shard_id in enumerate(("shardId-000000000000", "shardId-000000000001")):
        mine = [e for e in seen if e["shard"] == shard_id]
        records = [e["sequenceNumber"] for e in mine if e["event"] == "record"]
        assert records == [seq(index, n) for n in range(30)]  # each once, in order
        assert [e["data"] for e in mine if e["event"] == "record"][:2] == [
            f"{shard_id} event 000000000",
            f"{shard_id} event 000000001",
        ]
        # the injected error reached the processor as its CheckpointError, and its retry succeeded
        assert [e["event"] for e in mine if e["event"].startswith("checkpoint")][:2] == [
            "checkpoint_error",
            "checkpoint",
        ]
        assert {e.get("error") for e in mine if e["event"] == "checkpoint_error"} == {"ThrottlingException"}
        assert [e["event"] for e in mine][-2:] == ["shardEnded", "checkpoint"]
    assert "skipped: not JSON" in result.stderr and "a debug line on stdout" in result.stderr

    # A second run finds both shards ended in the lease table.
    result, summary = daemon(*args, "--", *app, env={"KCL_TEST_LOG": str(log)})
    assert result.returncode == 0 and summary["records_delivered"] == 0
    assert {s["end"] for s in summary["shards"]} == {"already ended (lease at SHARD_END)"}


def test_kclpy_processor_resumes_from_the_lease_table(kclpy_app, tmp_path):
    app, log = kclpy_app
    state = tmp_path / "leases.json"
    env = {"KCL_TEST_LOG": str(log)}
    common = ["--shards", "2", "--records", "50", "--batch-size", "10", "--state", str(state)]
    result, summary = daemon(*common, "--lease-lost-after", "20", "--", *app, env=env)
    assert result.returncode == 0, result.stderr
    assert [s["end"] for s in summary["shards"]] == ["leaseLost", "leaseLost"]
    assert leases(state) == {"shardId-000000000000": seq(0, 19), "shardId-000000000001": seq(1, 19)}

    log.write_text("")
    result, summary = daemon(*common, "--shard-end", "--", *app, env=env)
    assert result.returncode == 0, result.stderr
    assert [s["delivered"] for s in summary["shards"]] == [30, 30]
    seen = events(log)
    for index, shard_id in enumerate(("shardId-000000000000", "shardId-000000000001")):
        mine = [e for e in seen if e["shard"] == shard_id]
        assert mine[0] == {"shard": shard_id, "event": "initialize", "sequenceNumber": seq(index, 19)}
        assert [e["sequenceNumber"] for e in mine if e["event"] == "record"] == [
            seq(index, n) for n in range(20, 50)
        ]


def test_a_killed_daemon_restarts_from_its_lease_table(kclpy_app, tmp_path):
    app, log = kclpy_app
    state = tmp_path / "leases.json"
    common = ["--shards", "2", "--records", "40", "--batch-size", "5", "--state", str(state)]
    env = {**os.environ, "KCL_TEST_LOG": str(log), "KCL_TEST_SLOW": "0.2"}
    proc = subprocess.Popen(
        [*COMMAND, "kinesis", "mock-daemon", *common, "--", *app],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # both shards have a checkpoint past their first batch
            if state.exists() and len(leases(state)) == 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("no checkpoint for both shards")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        while time.monotonic() < deadline:  # the orphaned processors see their input end and exit
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the killed daemon's processors did not exit")
    finally:
        if proc.poll() is None:
            proc.kill()
    at_kill = leases(state)
    assert all(v.isdigit() for v in at_kill.values())
    first_run = Counter((e["shard"], e["sequenceNumber"]) for e in events(log) if e["event"] == "record")

    log.write_text("")
    result, summary = daemon(*common, "--shard-end", "--", *app, env={"KCL_TEST_LOG": str(log)})
    assert result.returncode == 0, result.stderr
    seen = events(log)
    for index, shard in enumerate(summary["shards"]):
        shard_id = shard["shard_id"]
        done = [n for n in range(40) if seq(index, n) == at_kill[shard_id]][0] + 1
        assert shard["delivered"] == 40 - done and shard["checkpoint"] == "SHARD_END"
        initialize = next(e for e in seen if e["shard"] == shard_id and e["event"] == "initialize")
        assert initialize["sequenceNumber"] == at_kill[shard_id]
        second = [e["sequenceNumber"] for e in seen if e["shard"] == shard_id and e["event"] == "record"]
        assert second == [seq(index, n) for n in range(done, 40)]
        assert all((shard_id, seq(index, n)) in first_run for n in range(done))  # nothing lost in between


# --------------------------------------------------------------------------- mock-daemon with mock-processor


def _out_rows(pattern: Path, shard_id: str) -> list[dict]:
    return [
        json.loads(line) for line in Path(str(pattern).replace("{shard}", shard_id)).read_text().splitlines()
    ]


def test_daemon_and_processor_over_pipes_with_a_recording(tmp_path):
    out = tmp_path / "out-{shard}.jsonl"
    pcap = tmp_path / "conversation.pcap"
    result, summary = daemon(
        *("--shards", "3", "--records", "200", "--batch-size", "25", "--shard-end"),
        *("--checkpoint-error", "ThrottlingException@2", "--record", str(pcap)),
        "--",
        *PROCESSOR,
        *("--checkpoint-every", "50", "--out", str(out)),
    )
    assert result.returncode == 0, result.stderr
    assert summary["records_delivered"] == 600 and summary["records_checkpointed"] == 600
    for index, shard in enumerate(summary["shards"]):
        assert shard["checkpoint"] == "SHARD_END" and shard["checkpoint_errors"] == {"ThrottlingException": 1}
        rows = _out_rows(out, shard["shard_id"])
        assert [r["sequenceNumber"] for r in rows] == [seq(index, n) for n in range(200)]
        assert rows[7]["data"] == f"{shard['shard_id']} event 000000007" and rows[7]["partitionKey"] == "pk-7"
    data = pcap.read_bytes()
    assert data[:4] == bytes.fromhex("d4c3b2a1")
    assert b'{"action":"initialize","shardId":"shardId-000000000002","sequenceNumber":"TRIM_HORIZON"' in data
    assert b'\n{"action": "status", "responseFor": "shardEnded"}\n' in data
    dissected = run_cli("dissect", "--summary", str(pcap))
    assert dissected.returncode == 0, dissected.stderr


def test_daemon_connects_to_a_listening_processor_as_erlmld(tmp_path):
    out = tmp_path / "out.jsonl"
    with Server(
        "kinesis", "mock-processor", "--listen", "127.0.0.1:0", "--out", str(out), "--format", "json"
    ) as proc:
        result, summary = daemon(
            "--connect",
            proc.address,
            "--shards",
            "2",
            "--records",
            "100",
            "--batch-size",
            "30",
            "--shard-end",
        )
        assert result.returncode == 0, result.stderr
        assert [s["checkpoint"] for s in summary["shards"]] == ["SHARD_END", "SHARD_END"]
        code, stdout, stderr = proc.stop()
    assert code == 0, stderr
    processed = json.loads(stdout.splitlines()[-1])
    assert processed["records"] == 200 and len(processed["conversations"]) == 2
    assert {c["end"] for c in processed["conversations"]} == {"shardEnded"}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert Counter(r["shard"] for r in rows) == {"shardId-000000000000": 100, "shardId-000000000001": 100}


def test_processor_connects_to_a_listening_daemon(tmp_path):
    with Server(
        "kinesis", "mock-daemon", "--listen", "127.0.0.1:0", "--shards", "2", "--records", "60"
    ) as mld:
        result = run_cli("kinesis", "mock-processor", "--connect", mld.address, "--connections", "2")
        assert result.returncode == 0, result.stderr
        code, out, err = mld.stop(None)
    assert code == 0, err
    assert "120 records delivered" in out and "120 checkpointed" in out
    assert "records" in result.stdout and "end: leaseLost" in result.stdout


@pytest.mark.parametrize("dialect", ["v1", "v2"])
def test_old_dialects_end_to_end(tmp_path, dialect):
    state = tmp_path / "leases.json"
    result, summary = daemon(
        *(
            "--dialect",
            dialect,
            "--records",
            "30",
            "--batch-size",
            "10",
            "--shard-end",
            "--state",
            str(state),
        ),
        "--",
        *PROCESSOR,
        *("--checkpoint-every", "10"),
    )
    assert result.returncode == 0, result.stderr
    assert summary["shards"][0]["checkpoint"] == "SHARD_END" and summary["shards"][0]["checkpoints"] == 4


def test_a_killed_processor_is_replaced_and_resumes_after_its_checkpoint(tmp_path):
    out = tmp_path / "out.jsonl"
    result, summary = daemon(
        *("--records", "100", "--batch-size", "10", "--kill-after", "35", "--shard-end"),
        "--",
        *PROCESSOR,
        *("--checkpoint-every", "20", "--out", str(out)),
    )
    assert result.returncode == 0, result.stderr
    shard = summary["shards"][0]
    assert (shard["kills"], shard["spawns"], shard["redelivered"], shard["delivered"]) == (1, 2, 15, 115)
    rows = [json.loads(line)["sequenceNumber"] for line in out.read_text().splitlines()]
    assert len(rows) == 115 and sorted(set(rows)) == [seq(0, n) for n in range(100)]
    assert "killed the processor after 35 records" in result.stderr


# ------------------------------------------------------------------------- processors that break the protocol


BAD_JSON_THEN_EXIT = "import sys\nsys.stdout.write('{not json\\n')\n"


@pytest.mark.parametrize(
    ("processor", "expected"),
    [
        (
            [*PROCESSOR, "--bad-response-after", "10"],
            "line 4 of the processor's output: status with responseFor 'processRecordz', "
            "expected 'processRecords'",
        ),
        (
            [*PROCESSOR, "--crash-after", "10"],
            "closed its output before its status for processRecords (after line 2) (it exited with code 1)",
        ),
        (
            [PY, "-c", BAD_JSON_THEN_EXIT],
            "closed its output before its status for initialize (after line 1) (it exited with code 0)",
        ),
    ],
)
def test_a_processor_that_breaks_the_protocol_fails_the_daemon(processor, expected):
    result, summary = daemon("--shards", "2", "--records", "30", "--batch-size", "10", "--", *processor)
    assert result.returncode == 1
    assert not summary["ok"] and any(expected in failure for failure in summary["failures"]), summary[
        "failures"
    ]
    failed = summary["failures"][0].partition(":")[0]
    for shard in summary["shards"]:
        assert shard["end"] == "failed" or shard["end"].startswith(f"stopped: {failed} failed; "), shard
        # As the MLD: every processor's input closed and its exit awaited, none killed.
        assert shard["kills"] == 0 and len(shard["exit_codes"]) == 1 and shard["exit_codes"][0] >= 0, shard
    assert "Traceback" not in result.stderr


def test_skipped_lines_are_reported_with_their_reason():
    result, _ = daemon("--", PY, "-c", BAD_JSON_THEN_EXIT)
    assert "processor line 1 skipped: not JSON" in result.stderr and "'{not json'" in result.stderr


SKIPPED_STATUS_THEN_SILENCE = (
    "import sys, time\n"
    'sys.stdout.write(\'{"action":"status","responseFor":"initialize","extra":1}\\n\')\n'
    "sys.stdout.flush()\n"
    "time.sleep(600)\n"
)


def test_idle_timeout_fails_a_processor_that_never_answers():
    result, summary = daemon("--idle-timeout", "3", "--", PY, "-c", SKIPPED_STATUS_THEN_SILENCE)
    assert result.returncode == 1
    assert (
        "no line from the processor within 3 s (--idle-timeout); expected the processor's status for "
        "initialize" in (summary["failures"][0])
    )


# Answers its first batch after half a second, then never answers the second.
SLOW_THEN_SILENT = r"""
import json, sys, time
batches = 0
for line in sys.stdin:
    action = json.loads(line)["action"]
    if action == "processRecords":
        batches += 1
        if batches == 2:
            time.sleep(3600)
        time.sleep(0.5)
    sys.stdout.write(json.dumps({"action": "status", "responseFor": action}) + "\n")
    sys.stdout.flush()
"""


def test_the_rate_counts_the_records_answered_over_the_span_it_covers():
    """It was the records sent over the span to the last answer: a batch never answered counted."""
    result, summary = daemon(
        "--records", "200", "--batch-size", "100", "--idle-timeout", "3", "--", PY, "-c", SLOW_THEN_SILENT
    )
    assert result.returncode == 1 and summary["records_delivered"] == 200, result.stderr
    answered = summary["records_per_second"] * summary["delivery_seconds"]
    assert 95 < answered < 105, summary


def test_sigterm_stops_a_daemon_waiting_for_processors():
    with Server("kinesis", "mock-daemon", "--listen", "127.0.0.1:0", "--shards", "2") as mld:
        code, out, err = mld.stop(signal.SIGTERM)
    assert code == 0, err
    assert out.count("stopped before start") == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give exactly one of"),
        (["--listen", "127.0.0.1:0", "--connect", "127.0.0.1:1"], "give exactly one of"),
        (["--checkpoint-error", "Throttling@x", "--", PY], "expected NAME, NAME@N or NAME@N-M"),
        (["--", "/no/such/processor"], "is not an executable file"),
        (["--listen", "nowhere"], "is not HOST:PORT"),
        (["--input", "/no/such/file", "--", PY], "cannot read --input /no/such/file"),
    ],
)
def test_daemon_usage_errors_exit_2(args, message):
    result = run_cli("kinesis", "mock-daemon", *args)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unusable_state_file_exits_2(tmp_path):
    state = tmp_path / "state.json"
    state.write_text('{"something": "else"}')
    result = run_cli("kinesis", "mock-daemon", "--state", str(state), "--", PY)
    assert result.returncode == 2 and "is not a wallaroo-proto kinesis lease table" in result.stderr


def test_input_lines_are_routed_by_partition_key(tmp_path):
    lines = [f"line {n}" for n in range(40)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    result, summary = daemon(
        "--input", str(tmp_path / "in.txt"), "--shards", "2", "--", *PROCESSOR, "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["data"] for r in rows) == sorted(lines)
    from wallaroo_proto.protocols.kinesis.records import shard_for_key

    assert all(r["shard"] == f"shardId-{shard_for_key(r['partitionKey'], 2):012d}" for r in rows)
    assert [s["records"] for s in summary["shards"]] == [
        sum(shard_for_key(str(n), 2) == i for n in range(40)) for i in range(2)
    ]


def test_mock_processor_answers_a_recorded_conversation_with_kclpys_bytes(tmp_path):
    mld = tmp_path / "from-mld.txt"
    mld.write_bytes(
        b'{"action":"initialize","shardId":"shardId-000000000003","sequenceNumber":"TRIM_HORIZON",'
        b'"subSequenceNumber":0}\n'
        b'{"action":"processRecords","records":[{"data":"aGVsbG8=","partitionKey":"k1","sequenceNumber":"11",'
        b'"approximateArrivalTimestamp":1700000000000,"subSequenceNumber":0,"action":"record"},'
        b'{"data":"d29ybGQ=","partitionKey":"k2","sequenceNumber":"12",'
        b'"approximateArrivalTimestamp":1700000000001,"subSequenceNumber":0,"action":"record"}],'
        b'"millisBehindLatest":0}\n'
        b'{"action":"shardEnded"}\n'
        b'{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null,"error":null}\n'
    )
    out = tmp_path / "records.jsonl"
    with open(mld, "rb") as stdin:
        result = subprocess.run(
            [*PROCESSOR, "--checkpoint-every", "0", "--out", str(out)],
            stdin=stdin,
            capture_output=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        b'\n{"action": "status", "responseFor": "initialize"}\n'
        b'\n{"action": "status", "responseFor": "processRecords"}\n'
        b'\n{"action": "checkpoint", "sequenceNumber": null, "subSequenceNumber": null}\n'
        b'\n{"action": "status", "responseFor": "shardEnded"}\n'
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["shard"], r["sequenceNumber"], r["partitionKey"], r["data"]) for r in rows] == [
        ("shardId-000000000003", "11", "k1", "hello"),
        ("shardId-000000000003", "12", "k2", "world"),
    ]


def test_mock_processor_reports_a_daemon_line_it_cannot_read(tmp_path):
    mld = tmp_path / "from-mld.txt"
    mld.write_bytes(
        b'{"action":"initialize","shardId":"s","sequenceNumber":null,"subSequenceNumber":null}\n\n'
    )
    with open(mld, "rb") as stdin:
        result = subprocess.run([*PROCESSOR], stdin=stdin, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "line 2 from the daemon: the processor cannot read this line: a blank line" in result.stderr


def test_a_processor_gone_before_its_pipe_is_sized_still_gets_a_channel():
    """A child can exit while it is being spawned; its stdin pipe is then closed when sized."""
    import asyncio
    from types import SimpleNamespace

    from wallaroo_proto.protocols.kinesis.daemon import ChildChannel

    read_end, write_end = os.pipe()
    os.close(read_end)
    closed = os.fdopen(write_end, "wb")
    closed.close()

    class Transport:
        def set_write_buffer_limits(self, high: int) -> None:
            pass

        def get_extra_info(self, name: str):
            return closed

    async def spawn() -> None:
        stderr = asyncio.StreamReader()
        stderr.feed_eof()
        proc = SimpleNamespace(stdin=SimpleNamespace(transport=Transport()), stderr=stderr)
        channel = ChildChannel(proc, "shardId-000000000000", lambda line: None)
        await channel._stderr

    asyncio.run(spawn())


# ------------------------------------------------------------------------- hostile daemons and processors


class RawDaemon:
    """A listening socket that sends ``data`` to the first connection and holds it open."""

    def __init__(self, data: bytes) -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = threading.Event()
        self.conn = None

        def serve() -> None:
            self.conn, _ = self.sock.accept()
            self.accepted.set()
            self.conn.sendall(data)

        threading.Thread(target=serve, daemon=True).start()

    def __enter__(self) -> RawDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.conn is not None:
            self.conn.close()
        self.sock.close()


DEEP_INITIALIZE = b'{"action":"initialize","shardId":' + b"[" * 100_000 + b"\n"


def test_mock_processor_reports_a_line_nested_too_deeply_over_stdin(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(DEEP_INITIALIZE)
    with open(path, "rb") as stdin:
        result = subprocess.run([*PROCESSOR], stdin=stdin, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert (
        "line 1 from the daemon: the processor cannot read this line: not readable JSON: nested too deeply"
        in (result.stderr)
    )
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (DEEP_INITIALIZE, "line 1 from the daemon: the processor cannot read this line: not readable JSON"),
        # garbage with no line end: no JSON object can start this way, so no need to wait for the end
        (
            bytes(range(14, 256)) * 20,
            "no line end yet): the processor cannot read this line: not JSON",
        ),
    ],
)
def test_mock_processor_over_tcp_fails_promptly_on_a_line_it_cannot_read(data, expected):
    with RawDaemon(data) as mld:
        result = run_cli(
            "kinesis", "mock-processor", "--connect", mld.address, "--format", "json", timeout=60
        )
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert len(summary["conversations"]) == 1 and expected in summary["failures"][0], summary
    assert "Traceback" not in result.stderr


def test_mock_processor_interrupted_while_connected_exits_130():
    with RawDaemon(b"") as mld:
        proc = subprocess.Popen(
            [*PROCESSOR, "--connect", mld.address],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_foreground,
        )
        assert mld.accepted.wait(60)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "summary" in out and "Traceback" not in err


# A processor that writes what the MLD skips (nesting past Jackson's limit), then asks for a
# checkpoint far beyond any record (5,000 digits: the KCL compares BigIntegers and refuses it).
HOSTILE_PROCESSOR = r"""
import json, sys
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    action = json.loads(line)["action"]
    if action == "initialize":
        sys.stdout.write("[" * 100000 + "\n")
        sys.stdout.write('{"action":"checkpoint","sequenceNumber":' + "7" * 5000 + "}\n")
    if action == "processRecords":
        send({"action": "checkpoint", "sequenceNumber": "9" * 5000, "subSequenceNumber": 0})
        reply = json.loads(sys.stdin.readline())
        sys.stderr.write("reply " + str(reply["error"]) + "\n")
    send({"action": "status", "responseFor": action})
    if action in ("leaseLost", "shardEnded"):
        break
"""


def test_mock_daemon_skips_unreadable_lines_and_refuses_a_huge_checkpoint():
    result, summary = daemon("--records", "3", "--", PY, "-c", HOSTILE_PROCESSOR)
    assert result.returncode == 0, result.stderr
    assert "processor line 1 skipped: not readable JSON: nested too deeply" in result.stderr
    assert "processor line 2 skipped: not readable JSON: a number too long" in result.stderr
    assert "reply IllegalArgumentException" in result.stderr
    assert summary["shards"][0]["checkpoint_errors"] == {"IllegalArgumentException": 1}
    # the sequence number and the range allowed, in the error line and in the summary
    why = "99999999...99999999 (5,000 digits)/0 is beyond the last record: allowed the shard's start to "
    assert f"refused with IllegalArgumentException: {why}" in result.stderr, result.stderr
    assert summary["shards"][0]["checkpoint_error_reasons"]["IllegalArgumentException"].startswith(why)
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------------- stopping as the KCL stops


def test_input_closed_between_requests_is_the_end_of_a_processor_not_a_failure(tmp_path):
    """The KCL's default stop closes the processor's stdin with no leaseLost; kclpy exits 0."""
    mld = tmp_path / "from-mld.txt"
    mld.write_bytes(
        b'{"action":"initialize","shardId":"shardId-000000000003","sequenceNumber":"TRIM_HORIZON",'
        b'"subSequenceNumber":0}\n'
    )
    with open(mld, "rb") as stdin:
        result = subprocess.run([*PROCESSOR], stdin=stdin, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "end: input closed (daemon stopped)" in result.stderr and "FAILED" not in result.stderr


@pytest.mark.parametrize("stderr", ["reader gone", "closed"])
def test_input_closed_is_exit_0_whether_or_not_stderr_is_still_read(tmp_path, stderr):
    """The real KCL 3.1.3 daemon's default stop: its JVM exits, closing the processor's stderr,
    before the processor's input ends. The summary is then lost, never the exit code, and never
    written to stdout (the daemon's pipe)."""
    mld = tmp_path / "from-mld.txt"
    mld.write_bytes(
        b'{"action":"initialize","shardId":"shardId-000000000003","sequenceNumber":"TRIM_HORIZON",'
        b'"subSequenceNumber":0}\n'
        b'{"action":"processRecords","millisBehindLatest":0,"records":[{"action":"record",'
        b'"data":"ZXZlbnQgMA==","partitionKey":"pk-0","sequenceNumber":"5","subSequenceNumber":0,'
        b'"approximateArrivalTimestamp":1700000000000}]}\n'
    )
    out = tmp_path / "records.jsonl"
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads the processor's stderr: each write fails with EPIPE
    try:
        with open(mld, "rb") as stdin:
            result = subprocess.run(
                [*PROCESSOR, "--output", str(out), "--checkpoint-every", "0"],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=write_end if stderr == "reader gone" else None,
                preexec_fn=(lambda: os.close(2)) if stderr == "closed" else None,
                timeout=120,
            )
    finally:
        os.close(write_end)
    assert result.returncode == 0
    # kclpy's answers (a blank line before each, as kclpy writes them) and nothing else
    assert result.stdout == (
        b'\n{"action": "status", "responseFor": "initialize"}\n'
        b'\n{"action": "status", "responseFor": "processRecords"}\n'
    )
    assert [json.loads(line)["data"] for line in out.read_text().splitlines()] == ["event 0"]


def stop_mid_delivery(tmp_path: Path, *daemon_args: str, ctrl_c: bool = False) -> tuple[int, dict, str]:
    """mock-daemon over two slow mock-processors, signalled once records flow: (exit, summary, stderr).

    They checkpoint only when asked to end: an input closed while a checkpoint awaits its reply
    ends a processor with exit 1, as kclpy. ``ctrl_c``: SIGINT to the daemon's whole process
    group, as a terminal sends it to its foreground job, instead of SIGTERM to the daemon."""
    out = tmp_path / "records.jsonl"
    mld = subprocess.Popen(
        [*COMMAND, "kinesis", "mock-daemon", "--format", "json", "--shards", "2", "--records", "100000"]
        + ["--batch-size", "10", *daemon_args, "--", *PROCESSOR, "--slow", "20", "--checkpoint-every", "0"]
        + ["--output", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_foreground if ctrl_c else None,
        start_new_session=ctrl_c,
    )
    deadline = time.monotonic() + 120
    while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline and mld.poll() is None:
        time.sleep(0.05)
    if ctrl_c:
        os.killpg(mld.pid, signal.SIGINT)
    else:
        mld.send_signal(signal.SIGTERM)
    stdout, stderr = mld.communicate(timeout=120)
    return mld.returncode, json.loads(stdout.splitlines()[-1]), stderr


def test_a_stop_without_grace_closes_every_processors_input_at_once(tmp_path):
    code, summary, stderr = stop_mid_delivery(tmp_path)
    assert code == 0, stderr
    for shard in summary["shards"]:
        assert shard["end"] == "input closed at the stop" and shard["exit_codes"] == [0], shard
    assert stderr.count("end: input closed (daemon stopped)") == 2, stderr
    assert "shutdownRequested" not in stderr.replace("no --shutdown-grace", "")


def test_ctrl_c_in_a_terminal_stops_the_daemon_and_not_its_processors_directly(tmp_path):
    """The terminal's SIGINT goes to the daemon's process group; the processors run in their own,
    so they are stopped by the daemon (their input closed) and end cleanly, not by the signal."""
    code, summary, stderr = stop_mid_delivery(tmp_path, ctrl_c=True)
    assert code == 0, stderr
    for shard in summary["shards"]:
        assert shard["end"] == "input closed at the stop" and shard["exit_codes"] == [0], shard
    assert "interrupted" not in stderr and "FAILED" not in stderr, stderr


def test_a_stop_with_grace_asks_each_processor_to_shut_down(tmp_path):
    code, summary, stderr = stop_mid_delivery(tmp_path, "--shutdown-grace", "60")
    assert code == 0, stderr
    for shard in summary["shards"]:
        assert shard["end"] == "shutdownRequested, leaseLost" and shard["exit_codes"] == [0], shard
    assert stderr.count("end: leaseLost") == 2, stderr


# A processor that never answers shutdownRequested: it reads on until its input closes, then exits 0.
DEAF_TO_SHUTDOWN = r"""
import json, sys
for line in sys.stdin:
    action = json.loads(line)["action"]
    if action != "shutdownRequested":
        sys.stdout.write(json.dumps({"action": "status", "responseFor": action}) + "\n")
        sys.stdout.flush()
    if action == "processRecords":
        open(sys.argv[1], "a").write("batch\n")
"""


def test_a_stop_whose_grace_runs_out_closes_the_inputs(tmp_path):
    marker = tmp_path / "batches"
    mld = subprocess.Popen(
        [*COMMAND, "kinesis", "mock-daemon", "--format", "json", "--shards", "2", "--records", "1000000"]
        + ["--shutdown-grace", "0.5", "--", PY, "-c", DEAF_TO_SHUTDOWN, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while (
        not (marker.exists() and marker.stat().st_size) and time.monotonic() < deadline and mld.poll() is None
    ):
        time.sleep(0.05)
    mld.send_signal(signal.SIGTERM)
    stdout, stderr = mld.communicate(timeout=120)
    assert mld.returncode == 0, stderr
    for shard in json.loads(stdout.splitlines()[-1])["shards"]:
        assert shard["end"] == "input closed at the stop (shutdown grace over)", shard
        assert shard["kills"] == 0 and shard["exit_codes"] == [0], shard


# A processor that logs each batch's record count and answers every request.
BATCH_LOGGER = r"""
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg["action"] == "processRecords":
        open(sys.argv[1], "a").write(f"{len(msg['records'])}\n")
    sys.stdout.write(json.dumps({"action": "status", "responseFor": msg["action"]}) + "\n")
    sys.stdout.flush()
"""


def test_waiting_at_the_end_sends_nothing_or_empty_batches_until_stopped(tmp_path):
    batches = tmp_path / "batches"
    mld = subprocess.Popen(
        [*COMMAND, "kinesis", "mock-daemon", "--format", "json", "--records", "5", "--wait-at-end"]
        + ["--empty-batches", "0.1", "--", PY, "-c", BATCH_LOGGER, str(batches)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and mld.poll() is None:
        if batches.exists() and batches.read_text().split().count("0") >= 3:
            break
        time.sleep(0.05)
    assert mld.poll() is None, "the daemon ended its lease instead of waiting"
    mld.send_signal(signal.SIGTERM)
    stdout, stderr = mld.communicate(timeout=120)
    assert mld.returncode == 0, stderr
    counts = batches.read_text().split()
    assert counts[0] == "5" and set(counts[1:]) == {"0"} and len(counts) >= 4, counts
    (shard,) = json.loads(stdout.splitlines()[-1])["shards"]
    assert shard["end"] == "input closed at the stop" and shard["delivered"] == 5, shard


def test_empty_batches_need_waiting_at_the_end():
    result = run_cli("kinesis", "mock-daemon", "--empty-batches", "1", "--", PY)
    assert result.returncode == 2 and "--empty-batches needs --wait-at-end" in result.stderr


# A processor that logs, in one file shared by all, when a shard starts and when it ended.
LIFECYCLE_LOGGER = r"""
import json, sys
shard = None
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    action = msg["action"]
    if action == "initialize":
        shard = msg["shardId"]
        with open(sys.argv[1], "a") as log:
            log.write(f"start {shard} {msg['sequenceNumber']}\n")
    if action == "shardEnded":
        send({"action": "checkpoint", "sequenceNumber": None, "subSequenceNumber": None})
        assert json.loads(sys.stdin.readline())["error"] is None
        with open(sys.argv[1], "a") as log:
            log.write(f"ended {shard}\n")
    send({"action": "status", "responseFor": action})
"""


@pytest.mark.parametrize(
    ("how", "children"),
    [
        (
            "split",
            {"shardId-000000000002": ["0"], "shardId-000000000003": ["0"], "shardId-000000000004": ["1"]},
        ),
        ("merge", {"shardId-000000000002": ["0", "1"]}),
    ],
)
def test_a_reshard_starts_each_child_at_trim_horizon_once_its_parents_ended(tmp_path, how, children):
    log = tmp_path / "lifecycle"
    result, summary = daemon(
        "--shards", "2", "--records", "10", "--reshard", how, "--", PY, "-c", LIFECYCLE_LOGGER, str(log)
    )
    assert result.returncode == 0, result.stderr
    events = log.read_text().splitlines()
    for child, parents in children.items():
        start = events.index(f"start {child} TRIM_HORIZON")
        for parent in parents:
            assert events.index(f"ended shardId-00000000000{parent}") < start, events
    shards = {s["shard_id"]: s for s in summary["shards"]}
    assert len(shards) == 2 + (4 if how == "split" else 1)
    assert {shards[f"shardId-00000000000{i}"]["checkpoint"] for i in (0, 1)} == {"SHARD_END"}
    assert all(s["delivered"] == 10 for s in shards.values()) and summary["records_delivered"] == 10 * len(
        shards
    )


@pytest.mark.parametrize("source", ["generated", "input"])
def test_aggregated_records_share_a_sequence_number_and_resume_inside_an_aggregate(tmp_path, source):
    """KPL aggregates of 4 arrive deaggregated; a processor killed after 5 records checkpointed at
    (first aggregate, sub 2), so its successor gets sub 3 of that aggregate first."""
    out, state = tmp_path / "out.jsonl", tmp_path / "leases.json"
    records = ["--records", "10"]
    if source == "input":
        lines = tmp_path / "lines.txt"
        lines.write_text("".join(f"line {n}\n" for n in range(10)))
        records = ["--input", str(lines)]
    result, summary = daemon(
        *records,
        *("--aggregate", "4", "--batch-size", "3", "--kill-after", "5", "--shard-end", "--state", str(state)),
        "--",
        *PROCESSOR,
        *("--checkpoint-every", "3", "--out", str(out)),
    )
    assert result.returncode == 0, result.stderr
    (shard,) = summary["shards"]
    assert (
        shard["checkpoint_errors"] == {} and shard["checkpoint"] == "SHARD_END" and shard["redelivered"] == 2
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    subs = [r["subSequenceNumber"] for r in rows]
    assert subs == [0, 1, 2, 3, 0] + [3, 0, 1, 2, 3, 0, 1], subs  # the second processor from (agg 0, sub 3)
    seqs = [r["sequenceNumber"] for r in rows]
    assert len(set(seqs)) == 3 and seqs[0] == seqs[3] == seqs[5] and seqs[4] == seqs[6] == seqs[9]
    assert rows[4]["approximateArrivalTimestamp"] == rows[9]["approximateArrivalTimestamp"]


@pytest.mark.parametrize("command", ["mock-daemon", "mock-processor"])
def test_an_address_in_use_is_named_host_port_with_the_reason(command):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("kinesis", command, "--listen", f"127.0.0.1:{port}", timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"wallaroo-proto kinesis {command}: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    )


def test_the_summary_counts_one_record_in_the_singular():
    result = run_cli("kinesis", "mock-daemon", "--records", "1", "--", *PROCESSOR, "--checkpoint-every", "0")
    assert result.returncode == 0, result.stderr
    assert "1 record delivered" in result.stdout and "1 checkpoint," in result.stdout, result.stdout


def test_a_rerun_on_a_used_lease_table_says_what_it_skipped_and_refuses_a_fault_it_cannot_fire(tmp_path):
    state = str(tmp_path / "leases.json")
    first = run_cli("kinesis", "mock-daemon", "--records", "20", "--state", state, "--", *PROCESSOR)
    assert first.returncode == 0, first.stderr
    again = run_cli("kinesis", "mock-daemon", "--records", "30", "--state", state, "-q", "--", *PROCESSOR)
    assert again.returncode == 0, again.stderr
    assert (
        "wallaroo-proto kinesis mock-daemon: shardId-000000000000 resumed from its checkpoint in "
        f"--state {state}: 20 of 30 records skipped" in again.stderr.splitlines()
    ), again.stderr
    faulty = run_cli(
        "kinesis", "mock-daemon", "--records", "30", "--state", state, "--kill-after", "5", "--", PY
    )
    assert faulty.returncode == 2
    assert faulty.stderr.splitlines()[-1] == (
        "wallaroo-proto kinesis mock-daemon: --kill-after 5 cannot fire: the most records a shard gets in "
        "this run is 0 (what --state holds as checkpointed is skipped)"
    )


@pytest.mark.parametrize("fault", ["--kill-after", "--lease-lost-after", "--shutdown-requested-after"])
def test_a_fault_counted_past_every_shards_records_is_refused(fault):
    result = run_cli("kinesis", "mock-daemon", "--shards", "2", "--records", "100", fault, "300", "--", PY)
    assert (result.returncode, result.stderr) == (
        2,
        f"wallaroo-proto kinesis mock-daemon: {fault} 300 cannot fire: the most records a shard gets in "
        "this run is 100\n",
    )


def test_a_processor_never_reached_is_one_line_without_a_python_tuple_and_exit_2():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # bound, never listening: a connection is refused
        result = run_cli("kinesis", "mock-daemon", "--connect", f"127.0.0.1:{port}", "--format", "json")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "wallaroo-proto kinesis mock-daemon: shardId-000000000000: cannot connect to the processor at "
        f"127.0.0.1:{port}: Connection refused\n"
    )


# A processor that answers every request but shutdownRequested, then never exits: a stuck
# shutdown handler, which reads no more and outlives its input.
STUCK_IN_SHUTDOWN = r"""
import json, sys, time
for line in sys.stdin:
    action = json.loads(line)["action"]
    if action == "shutdownRequested":
        time.sleep(3600)
    sys.stdout.write(json.dumps({"action": "status", "responseFor": action}) + "\n")
    sys.stdout.flush()
"""


def test_a_processor_killed_at_the_stop_fails_the_daemon_and_its_silence_is_told(tmp_path):
    """It was: after Ctrl-C, 'did not exit within 10 s; killed', 'input closed at the stop', exit 0;
    and the wait on its answer to shutdownRequested was silent."""
    mld = subprocess.Popen(
        [*COMMAND, "kinesis", "mock-daemon", "--format", "json", "--records", "5", "--exit-grace", "1"]
        + ["--", PY, "-c", STUCK_IN_SHUTDOWN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_foreground,
    )
    err: list[str] = []
    drain = threading.Thread(target=lambda: err.extend(mld.stderr), daemon=True)
    drain.start()
    try:
        wait_for(lambda: "waiting" in "".join(err), "the note on the processor's silence", timeout=120)
        mld.send_signal(signal.SIGINT)
        stdout = mld.communicate(timeout=120)[0]
    finally:
        mld.kill()
    drain.join(timeout=60)
    stderr = "".join(err)
    assert "waiting 5 s so far for the processor's status for shutdownRequested" in stderr, stderr
    assert stderr.count("waiting") == 1, stderr  # once per wait
    assert mld.returncode == 1, stderr
    (shard,) = json.loads(stdout.splitlines()[-1])["shards"]
    assert shard["end"] == "input closed at the stop; killed", shard
    assert shard["failure"] == (
        "the processor did not exit within 1 s (--exit-grace) after its input closed; killed"
    )
