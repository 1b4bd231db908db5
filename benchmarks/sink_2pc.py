"""mock-sink two-phase-commit throughput and phase-1 latency, beside a bare write+fsync loop.

For each round size N (``--every``, messages per 2PC round), the same run measures:

* sink: ``--messages`` payloads of ``--size`` bytes driven by ``SinkDriver`` (in this
  process) into a real ``wallaroo-proto mock-sink`` process over loopback: stream-1
  MESSAGEs, and every N messages PHASE1 (the sink fsyncs data and its log record) ->
  REPLY -> PHASE2 (the sink fsyncs the decision record);
* baseline: a bare loop in this process writing the same payloads to a file with
  ``os.write`` and calling ``fsync`` every N messages (the durability the sink must
  give, with no protocol, no log and no network).

It prints messages/s and MB/s of both, the ratio sink/bare, and the phase-1 -> REPLY
latency p50/p99 seen by the driver. Temp files are removed at the end.

``--instances K`` (K > 1) measures instead K drivers with K instance names at once
against one mock-sink, each sending ``--messages`` / K payloads: whether one instance's
fsyncs hold up the others' rounds shows in the phase-1 -> REPLY p50/p99 over all rounds.

    python benchmarks/sink_2pc.py [--messages 200000] [--size 64] [--every 100 1000 10000]
    python benchmarks/sink_2pc.py --instances 8 --every 100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from wallaroo_proto.protocols.wallaroo.sink_driver import SinkDriver, drive

READY = re.compile(r"listening on (\S+):(\d+)")


def payloads(count: int, size: int) -> list[bytes]:
    body = b"x" * (size - 9)
    return [b"%08d" % (i % 100_000_000) + body + b"\n" for i in range(count)]


def bare_loop(path: str, data: list[bytes], every: int) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i, payload in enumerate(data, 1):
            os.write(fd, payload)
            if i % every == 0:
                os.fsync(fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def sink_run(
    out_dir: str, data: list[bytes], every: int, instances: int = 1
) -> tuple[float, list[SinkDriver]]:
    """Drive ``instances`` drivers at once (each sends all of ``data``); (seconds, drivers)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wallaroo_proto_cli", "mock-sink", "--port", "0", "--out-dir", out_dir, "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        match = READY.search(proc.stdout.readline())
        host, port = match.group(1), int(match.group(2))
        drivers = [
            SinkDriver(
                host,
                port,
                checkpoint_every_messages=every,
                checkpoint_every_ms=60_000,
                reply_timeout=30,
                instance_name=f"bench{i}" if instances > 1 else "bench",
            )
            for i in range(instances)
        ]

        async def run_all() -> None:
            await asyncio.gather(*(drive(driver, data) for driver in drivers))

        start = time.perf_counter()
        asyncio.run(run_all())
        elapsed = time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(30)
    for driver in drivers:
        size = os.path.getsize(os.path.join(out_dir, f"{driver.instance_name}.out"))
        assert size == sum(map(len, data)), "sink output does not hold every byte"
    return elapsed, drivers


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """(p50, p99) in ms."""
    lat = sorted(latencies)
    if not lat:
        return 0.0, 0.0
    return lat[len(lat) // 2] * 1000, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000


def many_instances(tmp: str, args: argparse.Namespace) -> None:
    per = args.messages // args.instances
    data = payloads(per, args.size)
    total = sum(map(len, data)) * args.instances
    print(
        f"{args.instances} instances at once, {per} messages of {args.size} bytes each ({total / 1e6:.1f} MB)"
    )
    print(
        f"{'round every':>12} {'msg/s':>10} {'MB/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        f" {'rounds':>7}"
    )
    for every in args.every:
        elapsed, drivers = sink_run(os.path.join(tmp, f"sink-{every}"), data, every, args.instances)
        latencies = [lat for driver in drivers for lat in driver.stats.phase1_latencies]
        p50, p99 = percentiles(latencies)
        print(
            f"{every:>12} {per * args.instances / elapsed:>10,.0f} {total / elapsed / 1e6:>7.1f} "
            f"{p50:>8.2f} {p99:>8.2f} {max(latencies, default=0) * 1000:>8.2f} {len(latencies):>7}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--every", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--instances", type=int, default=1, help="K > 1: K instances at once")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="sink-2pc-bench-")
    if args.instances > 1:
        try:
            many_instances(tmp, args)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    data = payloads(args.messages, args.size)
    total = sum(map(len, data))
    try:
        print(f"{args.messages} messages of {args.size} bytes ({total / 1e6:.1f} MB) per run")
        print(
            f"{'round every':>12} {'bare msg/s':>12} {'bare MB/s':>10} {'sink msg/s':>12} {'sink MB/s':>10} "
            f"{'sink/bare':>10} {'p50 ms':>8} {'p99 ms':>8} {'rounds':>7}"
        )
        for every in args.every:
            bare = bare_loop(os.path.join(tmp, "bare.out"), data, every)
            out_dir = os.path.join(tmp, f"sink-{every}")
            elapsed, [driver] = sink_run(out_dir, data, every)
            stats = driver.stats.as_dict()
            print(
                f"{every:>12} {args.messages / bare:>12,.0f} {total / bare / 1e6:>10.1f} "
                f"{args.messages / elapsed:>12,.0f} {total / elapsed / 1e6:>10.1f} "
                f"{bare / elapsed:>9.2f}x {stats.get('phase1_reply_p50_ms', 0):>8.2f} "
                f"{stats.get('phase1_reply_p99_ms', 0):>8.2f} {stats['rounds']:>7}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
