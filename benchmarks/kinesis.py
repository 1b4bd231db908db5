"""kinesis mock-daemon -> mock-processor records/s, against a bare pipe loop in the same run.

1. Mock: mock-daemon spawns mock-processor (both the real CLI) for one shard and
   delivers generated records in batches; the processor checkpoints every
   ``--checkpoint-every`` records. The rate is the daemon's own: from the first
   processRecords sent to the last one answered (process start-up left out).
2. Baseline: the same processRecords lines, encoded beforehand, written by a bare
   loop into a child's stdin; the child reads each line, ``json.loads`` it and
   answers one kclpy-style status line, which the loop reads before writing the
   next (the protocol's alternation and nothing else).

The ratio mock/bare is printed; the target is >= 0.5x. Each side runs
``--runs`` times, interleaved, and the best run counts.

Run: ``python benchmarks/kinesis.py`` (about 20 s on 2 cores); ``--check`` exits
1 when the ratio is below the target.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from wallaroo_proto.protocols.kinesis.records import generated

COMMAND = [sys.executable, "-m", "wallaroo_proto_cli", "kinesis"]
TARGET = 0.5

BARE_CHILD = """
import json, sys
out = sys.stdout.buffer
status = b'\\n{"action": "status", "responseFor": "processRecords"}\\n'
for line in sys.stdin.buffer:
    json.loads(line)
    out.write(status)
    out.flush()
"""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_mock(records: int, batch: int, checkpoint_every: int) -> dict:
    """Records/s from the daemon's summary; CPU of daemon and processor together (start-up included)."""
    daemon = [
        *COMMAND,
        "mock-daemon",
        "--records",
        str(records),
        "--batch-size",
        str(batch),
        "--format",
        "json",
    ]
    processor = [*COMMAND, "mock-processor", "--checkpoint-every", str(checkpoint_every)]
    cpu = children_cpu()
    result = subprocess.run([*daemon, "--", *processor], capture_output=True, text=True, timeout=600)
    cpu = children_cpu() - cpu
    if result.returncode != 0:
        raise SystemExit(f"mock-daemon failed ({result.returncode}): {result.stdout}\n{result.stderr}")
    summary = json.loads(result.stdout.splitlines()[-1])
    return {"records": summary["records_delivered"], "seconds": summary["delivery_seconds"], "cpu": cpu}


def run_bare(lines: list[bytes], records: int) -> dict:
    """The same lines through a pipe to a child that parses each and answers a status."""
    cpu = children_cpu() + time.process_time()
    child = subprocess.Popen(
        [sys.executable, "-c", BARE_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    write, flush, readline = child.stdin.write, child.stdin.flush, child.stdout.readline
    start = time.perf_counter()
    for line in lines:
        write(line)
        flush()
        while readline() in (b"\n", b""):
            pass
    seconds = time.perf_counter() - start
    child.stdin.close()
    child.wait(timeout=60)
    return {"records": records, "seconds": seconds, "cpu": children_cpu() + time.process_time() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--checkpoint-every", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="exit 1 below the target ratio")
    args = parser.parse_args()

    shard = generated(1, args.records)[0]
    shard.stamp(int(time.time() * 1000))
    lines = [
        shard.request(first, min(first + args.batch_size, args.records))[1]
        for first in range(0, args.records, args.batch_size)
    ]
    size = sum(map(len, lines))
    print(
        f"{args.records:,} records in batches of {args.batch_size} ({size / args.records:.0f} bytes a record "
        f"on the wire), checkpoint every {args.checkpoint_every:,}; best of {args.runs}"
    )
    idle = run_mock(0, args.batch_size, args.checkpoint_every)["cpu"]  # start-up and shutdown, no records
    best_mock = best_bare = 0.0
    cpu_mock = cpu_bare = float("inf")
    for run in range(1, args.runs + 1):
        bare = run_bare(lines, args.records)
        mock = run_mock(args.records, args.batch_size, args.checkpoint_every)
        bare_rate = bare["records"] / bare["seconds"]
        mock_rate = mock["records"] / mock["seconds"]
        best_bare, best_mock = max(best_bare, bare_rate), max(best_mock, mock_rate)
        cpu_bare = min(cpu_bare, bare["cpu"] / args.records * 1e6)
        cpu_mock = min(cpu_mock, max(mock["cpu"] - idle, 0.0) / args.records * 1e6)
        print(f"  run {run}: bare pipe loop {bare_rate:,.0f} records/s, mock pair {mock_rate:,.0f} records/s")
    ratio = best_mock / best_bare
    mb = size / args.records / 1e6
    print(f"bare pipe loop (baseline)       {best_bare:12,.0f} records/s  {best_bare * mb:6.1f} MB/s")
    print(f"mock-daemon -> mock-processor   {best_mock:12,.0f} records/s  {best_mock * mb:6.1f} MB/s")
    print(
        f"CPU per record, both processes: bare {cpu_bare:.2f} us, mock {cpu_mock:.2f} us (start-up left out)"
    )
    print(f"ratio mock/bare: {ratio:.2f}x (target at least {TARGET}x)")
    if args.check and ratio < TARGET:
        sys.exit(1)


if __name__ == "__main__":
    main()
