"""The whole pipeline, mock-source -> mock-worker -> mock-sink, under randomized faults.

Three real processes over loopback. Each seed draws a schedule: abort votes and
closed connections at the sink (its fault file), RESTARTs from the worker, and
kill -9 of the worker and of the sink at random moments, each restarted from its
durable state. Afterwards the sink's committed output must hold every input
message exactly once, each stream in order, and ``mock-sink --check`` must agree.

WALLAROO_PIPELINE_SEEDS=N runs more seeds (default 4, to keep CI short).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support import COMMAND, Server, run_cli

pytestmark = pytest.mark.e2e

SEEDS = int(os.environ.get("WALLAROO_PIPELINE_SEEDS", "4"))
LINES = 1200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_inputs(tmp: Path, streams: int) -> list[Path]:
    paths = []
    for s in range(streams):
        path = tmp / f"in-{s}.txt"
        # Fixed-width records with a terminator: the sink's output is their concatenation.
        path.write_text("".join(f"s{s}-{i:06d};\n" for i in range(LINES)))
        paths.append(path)
    return paths


def committed_records(out_dir: Path) -> list[str]:
    """The records in the committed prefix of the sink's output, as its log and --check say."""
    check = run_cli("mock-sink", "--check", str(out_dir), "--format", "json")
    assert check.returncode == 0, check.stdout + check.stderr
    (instance,) = json.loads(check.stdout)["instances"]
    (out,) = out_dir.glob("*.out")
    return out.read_bytes()[: instance["committed"]].decode().split(";")[:-1]


class Restartable:
    """A server process on a fixed port that the schedule may kill -9 and start again.

    Keeps the stderr of every process it started, so assertions cover the whole run.
    """

    def __init__(self, *args: str) -> None:
        self.args = args
        self.server: Server | None = None
        self.kills = 0
        self.stderr: list[str] = []

    def start(self) -> None:
        self.server = Server(*self.args)

    def kill9(self) -> None:
        assert self.server is not None
        self.stderr.append(self.server.stop(signal.SIGKILL)[2])
        self.kills += 1

    def stop(self) -> tuple[int, str, str]:
        assert self.server is not None
        code, out, err = self.server.stop()
        self.stderr.append(err)
        return code, out, err

    def close(self) -> None:
        if self.server is not None:
            self.server.kill()


def wait_for_output(out_dir: Path, size: int, source: subprocess.Popen, timeout: float = 120) -> bool:
    """Wait until the sink's output file holds ``size`` bytes; False if the source ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(p.stat().st_size for p in out_dir.glob("*.out")) >= size:
            return True
        if source.poll() is not None:
            return False
        time.sleep(0.02)
    raise AssertionError(f"the sink's output never reached {size} bytes")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", range(SEEDS))
def test_committed_output_is_the_input_exactly_once_in_order(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    inputs = write_inputs(tmp_path, streams=rng.randint(1, 3))
    faults = {
        # The first PHASE1 each sink process sees votes abort: some process sees one, so it strikes.
        "abort_vote": [{"txn_id": "c_id=", "count": 1}],
        "close": [
            {
                "at": rng.choice(["before_phase1_reply", "after_phase1_reply"]),
                "skip": rng.randint(1, 6),
                "count": 1,
            }
        ],
    }
    fault_file = tmp_path / "faults.json"
    fault_file.write_text(json.dumps(faults))
    sink_port, worker_port = free_port(), free_port()
    sink = Restartable(
        "mock-sink",
        "--port",
        str(sink_port),
        "--out-dir",
        str(tmp_path / "sink"),
        "--faults",
        str(fault_file),
        "-v",  # a line per PHASE1 vote and PHASE2 decision: the log shows the abort struck
    )
    worker = Restartable(
        "mock-worker",
        "--port", str(worker_port),
        "--sink", f"127.0.0.1:{sink_port}",
        "--state", str(tmp_path / "worker-state.json"),
        "--checkpoint-every", str(rng.randint(50, 300)),
        "--checkpoint-ms", str(rng.randint(20, 200)),
        "--restart-after", str(rng.randint(300, 900)),
        "--sink-reply-timeout", "2",
        "--format", "json",
    )  # fmt: skip
    source = None
    try:
        sink.start()
        worker.start()
        source = subprocess.Popen(
            [*COMMAND, "mock-source", "--connect", f"127.0.0.1:{worker_port}", "--retries", "60",
             "--rate", "1500", "-q", "--format", "json", *map(str, inputs)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # The schedule: a few kill -9s of either server, each once the sink's output has reached
        # a drawn share of the input, so every kill strikes mid-stream however slow the machine.
        total = sum(p.stat().st_size for p in inputs)
        for share in sorted(rng.uniform(0.05, 0.85) for _ in range(rng.randint(1, 3))):
            if not wait_for_output(tmp_path / "sink", int(total * share), source):
                break
            victim = rng.choice([sink, worker])
            victim.kill9()
            victim.start()
        assert sink.kills + worker.kills >= 1, "no kill happened while the source streamed"
        out, err = source.communicate(timeout=180)
        assert source.returncode == 0, err
        code, worker_out, worker_err = worker.stop()
        assert code == 0, worker_err
        code, sink_out, sink_err = sink.stop()
        assert code == 0, sink_err
    finally:
        if source is not None and source.poll() is None:
            source.kill()
        worker.close()
        sink.close()

    records = committed_records(tmp_path / "sink")
    for s in range(len(inputs)):
        mine = [r for r in records if r.startswith(f"s{s}-")]
        assert mine == [f"s{s}-{i:06d}" for i in range(LINES)], f"stream {s} (seed {seed})"
    assert len(records) == LINES * len(inputs)
    # The sink's fault file struck during the run, in one of its processes.
    sink_log = "".join(sink.stderr)
    assert "vote abort" in sink_log and "PHASE2" in sink_log, sink_log
    check = run_cli("mock-sink", "--check", str(tmp_path / "sink"))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.timeout(120)
def test_sink_buffer_full_asks_for_a_checkpoint_instead_of_stalling(tmp_path: Path) -> None:
    """Checkpoints off: the forwarder's full buffer must trigger one, or the worker would wait forever."""
    lines = 5000  # more than the forwarder's buffer of 2000 messages
    source_file = tmp_path / "in.txt"
    source_file.write_text("".join(f"m{i:06d};\n" for i in range(lines)))
    with Server("mock-sink", "--port", "0", "--out-dir", str(tmp_path / "sink")) as sink:
        args = ("--sink", sink.address, "--checkpoint-every", "0", "--checkpoint-ms", "0", "--format", "json")
        with Server("mock-worker", "--port", "0", *args) as worker:
            source = run_cli("mock-source", "--connect", worker.address, "-q", str(source_file), timeout=100)
            assert source.returncode == 0, source.stderr
            code, _, err = worker.stop()
            assert code == 0, err
        sink.stop()
    assert committed_records(tmp_path / "sink") == [f"m{i:06d}" for i in range(lines)]


@pytest.mark.timeout(60)
def test_a_sink_that_refuses_the_worker_stops_it_with_the_reason(tmp_path: Path) -> None:
    with Server("mock-sink", "--port", "0", "--out-dir", str(tmp_path), "--cookie", "secret") as sink:
        with Server("mock-worker", "--port", "0", "--sink", sink.address, "--format", "json") as worker:
            worker.proc.wait(timeout=30)  # it stops by itself
            code, out, err = worker.stop()
        sink.stop()
    assert code == 1
    assert "stopped: sink: the sink refused our HELLO: Bad cookie" in err
    assert "Traceback" not in err
