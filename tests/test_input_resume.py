"""mock-worker --sink --input with --state: a worker killed -9 at any moment resumes exactly once.

Real processes over loopback: a mock-sink, and a worker fed by --input that is killed at
random points (once the sink's committed output has passed a seeded threshold) and started
again with the same --state until it finishes. The sink must then hold the input exactly
once, in order, with nothing left undecided.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import COMMAND, Server, run_cli

from wallaroo_proto.protocols.wallaroo.registry import STATE_FORMAT, STATE_VERSION
from wallaroo_proto.protocols.wallaroo.txnlog import instance_paths, scan_log

LINES = 20_000
KILLS = 3
DEADLINE = 120.0  # seconds: generous, for a slow and busy machine
INSTANCE = "w"


def wait_for(condition, what: str, timeout: float = DEADLINE):
    """Poll ``condition`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


def sink_log(out_dir: Path) -> Path:
    return instance_paths(out_dir, INSTANCE)[0]


def committed(out_dir: Path) -> int:
    log = sink_log(out_dir)
    return scan_log(log).committed if log.exists() else 0


def worker_args(sink: str, spec: str, state: Path, *extra: str) -> list[str]:
    return [
        "mock-worker",
        "--sink",
        sink,
        "--input",
        spec,
        "--state",
        str(state),
        "--sink-instance",
        INSTANCE,
        "--checkpoint-every",
        "200",
        "--format",
        "json",
        *extra,
    ]


def finish_and_check(args: list[str], out_dir: Path, expected: bytes) -> dict:
    """Run the worker to its end, then the sink must hold exactly ``expected``, all decided."""
    done = run_cli(*args, timeout=DEADLINE)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not scan_log(sink_log(out_dir)).undecided, "the sink to apply the last PHASE2")
    check = run_cli("mock-sink", "--check", str(out_dir), "--format", "json")
    assert check.returncode == 0, check.stdout + check.stderr
    (instance,) = json.loads(check.stdout)["instances"]
    assert instance["undecided"] == []
    assert instance["committed"] == len(expected)
    (out,) = out_dir.glob("*.out")
    assert out.read_bytes()[: instance["committed"]] == expected
    return json.loads(done.stdout.strip().splitlines()[-1])


def gen_lines(count: int) -> bytes:
    """What --input gen:N sends: line i is i in 31 zero-padded digits and a newline."""
    return b"".join(f"{i:031d}\n".encode() for i in range(count))


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["gen", "file"])
def test_worker_killed_at_random_points_resumes_exactly_once(tmp_path: Path, kind: str) -> None:
    rng = random.Random(f"input-resume-{kind}")
    if kind == "gen":
        spec, expected = f"gen:{LINES}", gen_lines(LINES)
    else:  # lines of uneven length: offsets are not a multiple of anything
        expected = b"".join(f"{i}:{'x' * rng.randrange(40)}\n".encode() for i in range(LINES))
        path = tmp_path / "in.txt"
        path.write_bytes(expected)
        spec = str(path)
    # A short delay of each phase-1 reply keeps the run long enough for every kill to land mid-run.
    faults = tmp_path / "faults.toml"
    faults.write_text('[[delay]]\nreply = "phase1"\nms = 5\n')
    out_dir, state = tmp_path / "out", tmp_path / "state.json"
    thresholds = sorted(rng.sample(range(len(expected) // 10, len(expected) * 8 // 10), KILLS))
    with Server("mock-sink", "--port", "0", "--out-dir", str(out_dir), "--faults", str(faults), "-q") as sink:
        args = worker_args(sink.address, spec, state)
        kills = 0
        for threshold in thresholds:
            worker = subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                wait_for(
                    lambda: worker.poll() is not None or committed(out_dir) >= threshold,  # noqa: B023
                    f"{threshold} bytes committed",
                )
            finally:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGKILL)
                    kills += 1
                _, err = worker.communicate(timeout=DEADLINE)
            if worker.returncode != -signal.SIGKILL:
                assert worker.returncode == 0, err.decode()
                break  # finished before this threshold's kill: nothing left to kill
        assert kills >= 1
        finish_and_check(args, out_dir, expected)


def test_txn_voted_and_in_the_state_is_committed_after_a_restart(tmp_path: Path) -> None:
    """Killed after writing its state and before the sink got PHASE2: the listed txn is committed.

    The sink closes the connection right after its commit vote for c_id=3 (so that PHASE2 is
    lost) and holds the worker's reconnect in LIST_UNCOMMITTED: the worker is killed there, the
    sink too, and both restart. Aborting the txn instead would leave a gap before the state's offset.
    """
    faults = tmp_path / "faults.toml"
    faults.write_text(
        '[[close]]\nat = "after_phase1_reply"\ntxn_id = "c_id=3$"\n'
        '[[delay]]\nreply = "uncommitted"\nms = 600000\nskip = 1\n'
    )
    out_dir, state = tmp_path / "out", tmp_path / "state.json"
    txn = "mock-sink-output:c_id=3"

    def stuck() -> bool:
        if not state.exists() or json.loads(state.read_text())["sink"]["txn"] != txn:
            return False
        return txn.encode() in scan_log(sink_log(out_dir)).undecided

    sink = Server("mock-sink", "--port", "0", "--out-dir", str(out_dir), "--faults", str(faults), "-q")
    worker = None
    try:
        args = worker_args(sink.address, "gen:3000", state, "--sink-reply-timeout", "600")
        worker = subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for(lambda: stuck() or worker.poll() is not None, f"{txn} voted, in the state, undecided")
        assert worker.poll() is None, worker.communicate()[1].decode()
    finally:
        if worker is not None:
            worker.kill()
            worker.communicate(timeout=DEADLINE)
        sink.proc.send_signal(signal.SIGKILL)
        sink.kill()
    with Server("mock-sink", "--port", "0", "--out-dir", str(out_dir), "-q") as sink:
        summary = finish_and_check(worker_args(sink.address, "gen:3000", state), out_dir, gen_lines(3000))
    assert summary["settled"] == 1


@pytest.mark.parametrize(
    ("spec", "offset", "written_for", "message"),
    [
        ("-", None, None, "stdin (--input -) cannot be read again"),
        ("gen:20", 64, "gen:10", "written for --input gen:10"),
        ("gen:20", 50, "gen:20", "not a line boundary"),
        ("in.txt", 5, "in.txt", "is not the end of a line"),
        ("in.txt", 99, "in.txt", "is not the end of a line"),
    ],
)
def test_input_that_cannot_resume_from_the_state_is_refused(
    tmp_path: Path, spec: str, offset: int | None, written_for: str | None, message: str
) -> None:
    (tmp_path / "in.txt").write_bytes(b"abc\ndef\n")
    state = tmp_path / "state.json"
    if offset is not None:
        source = written_for if written_for.startswith("gen:") else str(tmp_path / written_for)
        position = {"offset": offset, "txn": "t", "next_cid": 3, "input": source}
        doc = {"format": STATE_FORMAT, "version": STATE_VERSION, "streams": [], "sink": position}
        state.write_text(json.dumps(doc))
    # No sink listens there: the refusal comes before any connection.
    done = run_cli(*worker_args("127.0.0.1:9", spec, state), cwd=tmp_path, input="x\n")
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
