"""replay against the mock pair carrying the same traffic, in the same run (Wallaroo and DCP).

1. A conversation of N MESSAGEs (64-byte payloads, one stream) is recorded: mock-source
   streams into mock-worker with ``--record``.
2. Baseline: the mock pair carries the same traffic again (mock-source -> a fresh
   mock-worker), timed from mock-source's start to its exit.
3. replay plays the recorded connector to a fresh mock-worker: it reads the recording, adapts
   (credits), sends, judges every live frame and compares it. Timed from start to exit.
4. The ratio replay / mock pair is printed (target <= 1.5), with replay's peak RSS at N and at
   3N (memory stays flat: the recording is streamed, frames are kept only until matched).
5. DCP the same way: N items over 10 vbuckets, mock-consumer from a mock-producer (recorded by
   the producer), then against a fresh producer of the same seed: mock-consumer again, and
   replay playing the recorded consumer.

Run: ``python benchmarks/replay.py [--messages N]`` (default 100,000; about a minute).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = [sys.executable, "-m", "wallaroo_proto_cli"]
READY = re.compile(r"listening on (\S+):(\d+)")
TARGET = 1.5
WORKER = ["mock-worker", "--port", "0", "--no-live", "--checkpoint-every", "10000", "--checkpoint-ms", "0"]


def start_worker() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([*COMMAND, *WORKER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    match = READY.search(proc.stdout.readline())
    if not match:
        proc.kill()
        raise SystemExit("mock-worker did not start")
    return proc, int(match.group(2))


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def timed(args: list[str]) -> tuple[float, int, int]:
    """Wall seconds, exit code and peak RSS (KiB) of one command run to its end."""
    started = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args[2:5])} failed: {proc.stderr.read().decode()[-2000:]}")
    proc.stderr.close()
    return elapsed, proc.returncode, usage.ru_maxrss


def source(port: int, count: int, *extra: str) -> list[str]:
    return [*COMMAND, "mock-source", "--connect", f"127.0.0.1:{port}", "--count", str(count),
            "--payload-size", "64", "-q", *extra]  # fmt: skip


def record(folder: Path, count: int) -> Path:
    capture = folder / f"source-{count}.pcap"
    worker, port = start_worker()
    try:
        timed(source(port, count, "--record", str(capture)))
    finally:
        stop(worker)
    return capture


def pair(count: int) -> float:
    worker, port = start_worker()
    try:
        return timed(source(port, count))[0]
    finally:
        stop(worker)


def replay(capture: Path) -> tuple[float, int, int]:
    worker, port = start_worker()
    try:
        return timed(
            [*COMMAND, "replay", str(capture), "--play", "client", "--connect", f"127.0.0.1:{port}", "-q"]
        )
    finally:
        stop(worker)


def start_producer(items_per_vbucket: int, *extra: str) -> tuple[subprocess.Popen, int]:
    args = ["dcp", "mock-producer", "--port", "0", "--vbuckets", "10", "--items", str(items_per_vbucket)]
    proc = subprocess.Popen([*COMMAND, *args, "--seed", "7", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    match = READY.search(proc.stdout.readline())
    if not match:
        proc.kill()
        raise SystemExit("mock-producer did not start")
    return proc, int(match.group(2))


def dcp(folder: Path, items: int, runs: int) -> None:
    per_vbucket = items // 10
    capture = folder / "dcp.pcap"
    producer, port = start_producer(per_vbucket, "--record", str(capture))
    try:
        timed([*COMMAND, "dcp", "mock-consumer", "--connect", f"127.0.0.1:{port}", "-q"])
    finally:
        stop(producer)
    pairs, replays = [], []
    for _ in range(runs):
        producer, port = start_producer(per_vbucket)
        try:
            pairs.append(timed([*COMMAND, "dcp", "mock-consumer", "--connect", f"127.0.0.1:{port}", "-q"])[0])
        finally:
            stop(producer)
        producer, port = start_producer(per_vbucket)
        try:
            play = [
                *COMMAND,
                "replay",
                str(capture),
                "--play",
                "consumer",
                "--connect",
                f"127.0.0.1:{port}",
                "-q",
            ]
            replays.append(timed(play))
        finally:
            stop(producer)
    best_pair = min(pairs)
    best = min(replays, key=lambda r: r[0])
    print(f"DCP, {items:,} items: mock consumer {best_pair:.2f} s, replay {best[0]:.2f} s (exit {best[1]}, "
          f"{best[2] / 1024:.1f} MiB): {best[0] / best_pair:.2f}x (target <= {TARGET}x)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3, help="best of this many of each")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        capture = record(folder, args.messages)
        print(f"recorded {args.messages:,} messages: {capture.stat().st_size / 1e6:.1f} MB")
        pairs, replays = [], []
        for _ in range(args.runs):  # interleaved, so a change in load falls on both
            pairs.append(pair(args.messages))
            replays.append(replay(capture))
        best_pair = min(pairs)
        best = min(replays, key=lambda r: r[0])
        print(f"mock pair      {best_pair:6.2f} s  ({args.messages / best_pair:,.0f} msg/s)")
        print(f"replay         {best[0]:6.2f} s  ({args.messages / best[0]:,.0f} msg/s), exit {best[1]}")
        ratio = best[0] / best_pair
        print(f"replay / pair  {ratio:6.2f}x  (target <= {TARGET}x){'' if ratio <= TARGET else '  MISSED'}")
        big = record(folder, 3 * args.messages)
        big_run = replay(big)
        print(f"peak RSS       {best[2] / 1024:6.1f} MiB at {args.messages:,}; "
              f"{big_run[2] / 1024:.1f} MiB at {3 * args.messages:,} "
              f"({big_run[0]:.2f} s, exit {big_run[1]})")  # fmt: skip
        dcp(folder, args.messages, args.runs)


if __name__ == "__main__":
    main()
