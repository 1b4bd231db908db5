"""dcp mock-producer -> mock-consumer items/s, against a bare socket loop of the same bytes in the same run.

1. Mock: ``dcp mock-producer`` (the real CLI) serves generated vbuckets;
   ``dcp mock-consumer`` streams them all to the end with flow control on
   (``connection_buffer_size`` 1 MiB, acknowledged at half) and every packet
   judged by the protocol core. The rate is the consumer's own: items over the
   seconds of its connection (process start-up left out).
2. Baseline: the same stream messages (snapshot markers and items, encoded
   beforehand from the same history) written by a bare loop into a loopback
   socket; the child reading them only cuts each packet at its header's body
   length and counts it (the framing and nothing else).

The ratio mock/bare is printed; the target is >= 0.4x. Each side runs
``--runs`` times, interleaved, and the best run counts.

Run: ``python benchmarks/dcp.py`` (about 30 s on 2 cores); ``--check`` exits 1
when the ratio is below the target.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys

from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.store import DELETION, EXPIRATION, Bucket

COMMAND = [sys.executable, "-m", "wallaroo_proto_cli", "dcp"]
TARGET = 0.4
SEED = 7

BARE_CHILD = """
import socket, sys, time
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
buf = bytearray()
items = 0
start = None
while True:
    data = conn.recv(256 * 1024)
    if not data:
        break
    if start is None:
        start = time.perf_counter()
    buf += data
    pos, n = 0, len(buf)
    while n - pos >= 24:
        end = pos + 24 + int.from_bytes(buf[pos + 8 : pos + 12], "big")
        if end > n:
            break
        if buf[pos + 1] != 0x56:
            items += 1
        pos = end
    del buf[:pos]
print(items, time.perf_counter() - start, flush=True)
"""


def producer_args(args: argparse.Namespace) -> list[str]:
    return [
        *("--vbuckets", str(args.vbuckets), "--items", str(args.items // args.vbuckets)),
        *("--keys", str(10**9), "--value-size", str(args.value_size), "--seed", str(SEED)),
        *("--snapshot-size", str(args.snapshot_size)),
    ]


def run_mock(args: argparse.Namespace) -> dict:
    producer = subprocess.Popen(
        [*COMMAND, "mock-producer", "--port", "0", *producer_args(args)], stdout=subprocess.PIPE, text=True
    )
    try:
        address = producer.stdout.readline().rsplit(" ", 1)[-1].strip()
        result = subprocess.run(
            [*COMMAND, "mock-consumer", "--connect", address, "--format", "json", "--noop-interval", "0"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        producer.terminate()
        producer.communicate(timeout=60)
    if result.returncode != 0:
        raise SystemExit(f"mock-consumer failed ({result.returncode}): {result.stdout}\n{result.stderr}")
    summary = json.loads(result.stdout.splitlines()[-1])
    return {"items": summary["items_received"], "seconds": summary["stream_seconds"]}


def stream_bytes(args: argparse.Namespace) -> tuple[list[bytes], int]:
    """The stream messages the producer sends for the same history, encoded beforehand."""
    bucket = Bucket.new(args.vbuckets, random.Random(0))
    bucket.generate(args.items // args.vbuckets, random.Random(SEED), 10**9, args.value_size)
    chunks, pending, items = [], [], 0
    for vb in bucket.vbuckets.values():
        for snap in vb.snapshots(0, vb.high_seqno, args.snapshot_size):
            pending.append(codec.snapshot_marker(vb.vb, 1, snap.start, snap.end, snap.flags))
            for v in snap.versions:
                if v.op == DELETION:
                    pending.append(codec.deletion(vb.vb, 1, v.seqno, v.rev, v.key.encode()))
                elif v.op == EXPIRATION:
                    pending.append(codec.expiration(vb.vb, 1, v.seqno, v.rev, v.key.encode()))
                else:
                    pending.append(codec.mutation(vb.vb, 1, v.seqno, v.rev, v.key.encode(), v.value.encode()))
                items += 1
            if len(pending) > 512:
                chunks.append(b"".join(pending))
                pending = []
    chunks.append(b"".join(pending))
    return chunks, items


def run_bare(chunks: list[bytes]) -> dict:
    child = subprocess.Popen([sys.executable, "-c", BARE_CHILD], stdout=subprocess.PIPE, text=True)
    port = int(child.stdout.readline())
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for chunk in chunks:
            sock.sendall(chunk)
    items, seconds = child.stdout.readline().split()
    child.wait(timeout=60)
    return {"items": int(items), "seconds": float(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--vbuckets", type=int, default=4)
    parser.add_argument("--value-size", type=int, default=512)
    parser.add_argument("--snapshot-size", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="exit 1 below the target ratio")
    args = parser.parse_args()

    chunks, items = stream_bytes(args)
    size = sum(map(len, chunks))
    print(
        f"{items:,} items over {args.vbuckets} vbuckets, {args.value_size}-byte values "
        f"({size / items:.0f} bytes an item on the wire), snapshots of {args.snapshot_size}; "
        f"best of {args.runs}"
    )
    best_mock = best_bare = 0.0
    pairs = []
    for run in range(1, args.runs + 1):
        bare = run_bare(chunks)
        mock = run_mock(args)
        if mock["items"] != items or bare["items"] != items:
            raise SystemExit(f"item counts differ: mock {mock['items']}, bare {bare['items']}, sent {items}")
        bare_rate = bare["items"] / bare["seconds"]
        mock_rate = mock["items"] / mock["seconds"]
        best_bare, best_mock = max(best_bare, bare_rate), max(best_mock, mock_rate)
        pairs.append(mock_rate / bare_rate)
        print(
            f"  run {run}: bare socket loop {bare_rate:,.0f} items/s, mock pair {mock_rate:,.0f} items/s, "
            f"ratio {pairs[-1]:.2f}x"
        )
    ratio = best_mock / best_bare
    mb = size / items / 1e6
    print(f"bare socket loop (baseline)     {best_bare:12,.0f} items/s  {best_bare * mb:7.1f} MB/s")
    print(f"mock-producer -> mock-consumer  {best_mock:12,.0f} items/s  {best_mock * mb:7.1f} MB/s")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"ratio mock/bare: {ratio:.2f}x best/best, {statistics.median(pairs):.2f}x median of the runs "
        f"(target at least {TARGET}x); load average {load}"
    )
    if args.check and ratio < TARGET:
        sys.exit(1)


if __name__ == "__main__":
    main()
