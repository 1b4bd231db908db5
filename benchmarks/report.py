"""Benchmark `wallaroo-proto report` against `dissect --summary` on the same capture.

    python benchmarks/report.py [--messages 200000] [--scale 3]

Writes a source session (pcap_writer): HELLO, OK, NOTIFY, then --messages
MESSAGEs of ~40 bytes, with an ACK granting credits each time the connector runs
out (every 100 messages, a zero-credit spell each time). Then, in the same run,
on it and on one --scale times bigger:

* dissect: `dissect --summary` (reads every frame, prints a summary): the baseline;
* report: `report -o FILE` (reads every frame, keeps the bounded content, draws it).

Prints the CPU time (user + system of the process) of each and the ratio
report / dissect (most of the gap is matplotlib's import and drawing, a constant),
peak RSS (target: flat between the two sizes) and the report's size (target:
flat too, it is bounded).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.frames import Ack, Hello, Message, Notify, NotifyAck, Ok

COMMAND = [sys.executable, "-m", "wallaroo_proto_cli"]
CREDITS = 100


def write_capture(path: Path, messages: int) -> None:
    t = 1_000_000.0
    with PcapWriter(path) as w:
        s = w.tcp_session(("127.0.0.1", 50000), ("127.0.0.1", 7100), timestamp=t)
        s.send(True, encode(Hello("0.0.1", b"", "bench", "b-1")), t)
        s.send(False, encode(Ok(CREDITS + 1)), t)
        s.send(True, encode(Notify(1, "s", 0)), t)
        s.send(False, encode(NotifyAck(True, 1, 0)), t)
        batch = []
        for i in range(1, messages + 1):
            batch.append(encode(Message(1, i, i, b"key", b"payload %08d" % i)))
            t += 0.00001
            if i % CREDITS == 0:
                s.send(True, b"".join(batch), t)
                batch.clear()
                t += 0.0005
                s.send(False, encode(Ack(CREDITS, ((1, i),))), t)
        if batch:
            s.send(True, b"".join(batch), t)
        s.close(True, t + 0.001)


def measure(*args: str) -> tuple[float, float]:
    """CPU seconds and peak RSS (MB) of one run of the command."""
    proc = subprocess.Popen([*COMMAND, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args[0]} failed")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def best(runs: int, *args: str) -> tuple[float, float]:
    results = [measure(*args) for _ in range(runs)]
    return min(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--scale", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for messages in (args.messages, args.messages * args.scale):
            capture = Path(tmp) / f"bench-{messages}.pcap"
            write_capture(capture, messages)
            out = Path(tmp) / "report.html"
            dissect_cpu, dissect_rss = best(args.runs, "dissect", "--summary", str(capture))
            report_cpu, report_rss = best(args.runs, "report", str(capture), "-o", str(out))
            size_mb = capture.stat().st_size / 1e6
            print(
                f"{messages:>9,} messages ({size_mb:.0f} MB): dissect --summary {dissect_cpu:.2f} s CPU, "
                f"{dissect_rss:.0f} MB RSS; report {report_cpu:.2f} s CPU, {report_rss:.0f} MB RSS, "
                f"file {out.stat().st_size / 1024:.0f} KiB; report / dissect {report_cpu / dissect_cpu:.2f}x"
            )


if __name__ == "__main__":
    main()
