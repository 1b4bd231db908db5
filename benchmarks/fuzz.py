"""fuzz against a local mock, in executions a second, beside the plain plays of its seed.

1. A seed is recorded: mock-source streams 20 MESSAGEs into mock-worker with ``--record``
   (a conversation of about 30 frames, a connection set up and torn down).
2. Baseline, in the same run: replay's engine plays that seed unchanged to a mock-worker as
   many times as it can in ``--seconds`` (one process, one connection each): the floor an
   execution costs.
3. fuzz plays mutants of it to a mock-worker for ``--seconds`` (``--format json``): executions
   a second against the target (200), and the ratio to the plain plays.
4. Shrinking: the same campaign against mock-worker's planted break
   (``WALLAROO_PROTO_PLANT=worker-takes-connector-ack``, test-only): the seconds the finding
   took to shrink (target: under 60).

Run: ``python benchmarks/fuzz.py [--seconds S]`` (default 20; about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = [sys.executable, "-m", "wallaroo_proto_cli"]
READY = re.compile(r"listening on (\S+):(\d+)")
TARGET = 200.0
SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "orders.txt"


def start_worker(*extra: str, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [*COMMAND, "mock-worker", "--port", "0", "--no-live", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    match = READY.search(proc.stdout.readline())
    if not match:
        proc.kill()
        raise SystemExit("mock-worker did not start")
    return proc, int(match.group(2))


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def record(folder: Path) -> Path:
    capture = folder / "seed.pcap"
    worker, port = start_worker("--record", str(capture))
    try:
        args = [
            "mock-source",
            "--connect",
            f"127.0.0.1:{port}",
            "--count",
            "20",
            "--payload-size",
            "64",
            "-q",
        ]
        subprocess.run([*COMMAND, *args], check=True, capture_output=True)
    finally:
        stop(worker)
    return capture


def plain_plays(capture: Path, seconds: float) -> float:
    """Plays a second of the unchanged seed, with replay's engine in this process."""
    from wallaroo_proto.replay.engine import Options, Player
    from wallaroo_proto.replay.recording import find, frames

    conversation = find(capture)
    steps = list(frames(conversation))
    worker, port = start_worker()
    try:
        plays, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            options = Options("connector", connect=[("127.0.0.1", port)], answer_timeout=0.5, keep=10)
            Player(conversation, options, steps=steps).run()
            plays += 1
        return plays / (time.perf_counter() - started)
    finally:
        stop(worker)


def campaign(capture: Path, seconds: float, folder: Path, plant: str | None = None) -> dict:
    env = {"WALLAROO_PROTO_PLANT": plant} if plant else None
    worker, port = start_worker(env=env)
    try:
        args = ["fuzz", "--seeds", str(capture), "--play", "connector", "--connect", f"127.0.0.1:{port}",
                "--budget", f"{seconds:g}s", "--seed", "1", "--findings", str(folder / "found"),
                "--format", "json"]  # fmt: skip
        done = subprocess.run([*COMMAND, *args], capture_output=True, text=True)
        if done.returncode not in (0, 1):
            raise SystemExit(f"fuzz failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        stop(worker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        capture = record(folder)
        baseline = plain_plays(capture, args.seconds / 2)
        summary = campaign(capture, args.seconds, folder)
        rate = summary["executions_per_second"]
        print(f"plain plays of the seed  {baseline:7.1f}/s (replay's engine, one connection each)")
        print(f"fuzz executions          {rate:7.1f}/s ({summary['executions']:,} in "
              f"{summary['seconds']:.1f} s, {summary['states']} states, "
              f"{len(summary['findings'])} findings)")  # fmt: skip
        for finding in summary["findings"]:
            print(f"  finding: {finding['kind']}: {finding['mutation']}: {finding['detail']}")
        print(f"fuzz / plain             {rate / baseline:7.2f}x")
        missed = "" if rate >= TARGET else "  MISSED"
        print(f"against the target       {rate / TARGET:7.2f}x of {TARGET:g}/s{missed}")
        planted = campaign(capture, args.seconds, folder / "planted", "worker-takes-connector-ack")
        shrinks = [f["shrink_seconds"] for f in planted["findings"]]
        worst = max(shrinks, default=float("nan"))
        frames = [f["frames"] for f in planted["findings"]]
        print(f"planted break            {len(planted['findings'])} findings, shrunk in at most "
              f"{worst:.2f} s (target < 60 s), reproducers of {frames} frames")  # fmt: skip


if __name__ == "__main__":
    main()
