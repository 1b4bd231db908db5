"""ambrosia mock-ic -> mock-lb RPCs/s, against a bare loop of the same bytes in the same run.

1. Mock: mock-ic (the real CLI, ``--no-fsync`` so the disk is not what is
   measured; its log is still written) serves mock-lb (the real CLI): a first
   start, then generated RPCs in log records of ``--batch``, a checkpoint every
   ``--checkpoint-every`` records, every RPC applied to the counter immortal
   and every fifth one's self call sent back and logged. The rate is the IC's
   own: input RPCs from the first record sent to the last (start-up left out).
2. Baseline: the same log records, encoded beforehand, written by a bare loop
   into a loopback TCP socket; a child process reads them, splits records by
   their header's size and walks each message's ZigZag size (the least a
   binding does to find its RPCs), then says how many it found.

3. Mixed batches: the mock run again with mock-ic's default ``--batches
   mixed`` (plain RPCs, RPCBatch and CountReplayableRPCBatch, as a busy IC
   logs them), beside the run without batches in the same pair; the target is
   at most 1.5x slower (the median of the pairs' own ratios).

The ratio mock/bare is printed; the target is >= 0.4x. The two sides run in
pairs, ``--runs`` of them, which of the two goes first alternating, and two
ratios are printed: best run against best run, and the median of each pair's
own ratio (the steadier figure on a machine shared with other work, since a
pair's two runs see much the same load). The load average is printed with them.

Run: ``python benchmarks/ambrosia.py`` (about 15 s on 2 cores); ``--check``
exits 1 when either ratio is below the target.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from wallaroo_proto.protocols.ambrosia.codec import encode_record
from wallaroo_proto.protocols.ambrosia.immortal import RpcSource

CLI = [sys.executable, "-m", "wallaroo_proto_cli", "ambrosia"]
TARGET = 0.4
#: The most the default run (mixed batches) may take over the run without them.
MIXED_TARGET = 1.5

BARE_CHILD = """
import socket, struct, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
buf = bytearray()
rpcs = 0
unpack = struct.Struct("<i").unpack_from
while True:
    data = sock.recv(1 << 18)
    if not data:
        break
    buf += data
    pos = 0
    while len(buf) - pos >= 24:
        size = unpack(buf, pos + 4)[0]
        if len(buf) - pos < size:
            break
        p, end = pos + 24, pos + size
        while p < end:
            raw = shift = 0
            while True:
                b = buf[p]
                p += 1
                raw |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
            p += raw >> 1
            rpcs += 1
        pos = end
    del buf[:pos]
print(rpcs, flush=True)
"""


def run_mock(rpcs: int, batch: int, checkpoint_every: int, batches: str = "none") -> dict:
    with tempfile.TemporaryDirectory() as log_dir:
        ic = subprocess.Popen(
            [
                *CLI,
                "mock-ic",
                "--rpcs",
                str(rpcs),
                "--batch",
                str(batch),
                "--checkpoint-every",
                str(checkpoint_every),
            ]
            + ["--log-dir", log_dir, "--no-fsync", "--exit-when-done", "--format", "json"]
            + ["--args", "raw", "--batches", batches],  # the figures' bytes: bare numbers
            stdout=subprocess.PIPE,
            text=True,
        )
        ports = re.search(r"receive port (\d+), send port (\d+)", ic.stdout.readline())
        lb = subprocess.run(
            [
                *CLI,
                "mock-lb",
                "--receive-port",
                ports.group(1),
                "--send-port",
                ports.group(2),
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        out, _ = ic.communicate(timeout=600)
    if ic.returncode or lb.returncode:
        raise SystemExit(f"mock run failed: IC {ic.returncode}, LB {lb.returncode}: {lb.stderr[-2000:]}")
    summary = json.loads(out.splitlines()[-1])
    state = json.loads(lb.stdout.splitlines()[-1])["state"]
    if state != RpcSource(rpcs, arg_form="raw", batching=batches).expected():
        raise SystemExit(f"the immortal's state is wrong: {state}")
    return {"rpcs": summary["rpcs_logged"], "seconds": summary["delivery_seconds"]}


def run_bare(stream: bytes, rpcs: int) -> dict:
    server = socket.create_server(("127.0.0.1", 0))
    child = subprocess.Popen(
        [sys.executable, "-c", BARE_CHILD, str(server.getsockname()[1])], stdout=subprocess.PIPE, text=True
    )
    conn, _ = server.accept()
    start = time.perf_counter()
    view = memoryview(stream)
    for first in range(0, len(stream), 1 << 16):
        conn.sendall(view[first : first + (1 << 16)])
    conn.shutdown(socket.SHUT_WR)
    found = int(child.stdout.readline())  # the count, not the child's exit as well
    seconds = time.perf_counter() - start
    child.wait(timeout=60)
    conn.close()
    server.close()
    if found != rpcs:
        raise SystemExit(f"bare loop found {found} RPCs, not {rpcs}")
    return {"rpcs": rpcs, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rpcs", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--checkpoint-every", type=int, default=200)
    parser.add_argument("--runs", type=int, default=9, help="pairs of runs")
    parser.add_argument("--check", action="store_true", help="exit 1 below the target ratio")
    parser.add_argument(
        "--no-mixed",
        dest="mixed",
        action="store_false",
        help="leave out the third run of each pair: mock-ic's default, mixed batches",
    )
    args = parser.parse_args()

    source = RpcSource(args.rpcs, arg_form="raw")
    stream = b"".join(
        encode_record(7, seq, b"".join(source.encoded(first, min(first + args.batch, args.rpcs))))
        for seq, first in enumerate(range(0, args.rpcs, args.batch))
    )
    print(
        f"{args.rpcs:,} RPCs in records of {args.batch} ({len(stream) / args.rpcs:.1f} bytes an RPC), "
        f"checkpoint every {args.checkpoint_every} records; {args.runs} pairs of runs, "
        f"load average {_load()}"
    )
    best_mock = best_bare = best_mixed = 0.0
    ratios, slowdowns = [], []
    for run in range(1, args.runs + 1):
        mixed = None
        if run % 2:
            bare = run_bare(stream, args.rpcs)
            mock = run_mock(args.rpcs, args.batch, args.checkpoint_every)
            if args.mixed:
                mixed = run_mock(args.rpcs, args.batch, args.checkpoint_every, "mixed")
        else:
            if args.mixed:
                mixed = run_mock(args.rpcs, args.batch, args.checkpoint_every, "mixed")
            mock = run_mock(args.rpcs, args.batch, args.checkpoint_every)
            bare = run_bare(stream, args.rpcs)
        bare_rate, mock_rate = bare["rpcs"] / bare["seconds"], mock["rpcs"] / mock["seconds"]
        best_bare, best_mock = max(best_bare, bare_rate), max(best_mock, mock_rate)
        ratios.append(mock_rate / bare_rate)
        line = (
            f"  pair {run}: bare loop {bare_rate:,.0f} RPCs/s, mock-ic -> mock-lb {mock_rate:,.0f} RPCs/s, "
            f"ratio {ratios[-1]:.2f}x"
        )
        if mixed is not None:
            mixed_rate = mixed["rpcs"] / mixed["seconds"]
            best_mixed = max(best_mixed, mixed_rate)
            slowdowns.append(mock_rate / mixed_rate)
            line += f"; mixed batches {mixed_rate:,.0f} RPCs/s, {slowdowns[-1]:.2f}x slower"
        print(line)
    best, median = best_mock / best_bare, statistics.median(ratios)
    print(f"bare loop (baseline)     {best_bare:12,.0f} RPCs/s (best)")
    print(f"mock-ic -> mock-lb       {best_mock:12,.0f} RPCs/s (best)")
    print(
        f"ratio mock/bare: {best:.2f}x best/best, {median:.2f}x median of the pairs "
        f"(target at least {TARGET}x); load average {_load()}"
    )
    slow = 0.0
    if slowdowns:
        slow = statistics.median(slowdowns)
        print(f"mixed batches (mock-ic's default) {best_mixed:12,.0f} RPCs/s (best)")
        print(
            f"without batches / mixed: {best_mock / best_mixed:.2f}x best/best, {slow:.2f}x median of the "
            f"runs (target at most {MIXED_TARGET}x)"
        )
    if args.check and (min(best, median) < TARGET or slow > MIXED_TARGET):
        sys.exit(1)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
