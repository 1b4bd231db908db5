"""Benchmark `wallaroo-proto dissect` against tshark and scapy, and over each protocol's workload.

    python benchmarks/dissect.py [--case wallaroo|dcp|samples|all] [--runs 3]
    python benchmarks/dissect.py --case wallaroo [--packets 300000] [--large 900000] [--scapy-packets 30000]
    python benchmarks/dissect.py --case dcp [--dcp-vbuckets 16] [--dcp-items 12500] [--dcp-skip-large]
    python benchmarks/dissect.py --case samples [--samples-scale 1.0]
    python benchmarks/dissect.py --case filter [--samples-scale 1.0] [--filter EXPR ...]

The default, ``all``, runs every case one after the other. In each, every
tool runs --runs times (default 3) and the run with the least CPU time counts
(the least disturbed on a shared machine); rates are given per CPU second (user
+ system time of the whole process) and per wall second. The new cases run
their commands interleaved (one run of each in turn, so a change of load hits
all of them alike) and print the 1-minute load average at the end of each
counted run.

Case ``wallaroo``: the Wallaroo source protocol against tshark + our Lua plugin
and scapy. Generates a source-protocol capture shaped like a kernel capture on
loopback (Ethernet/IPv4/TCP via pcap_writer): one connection, 1 to 3 MESSAGE
frames of ~130 bytes per data segment, a bare TCP ACK from the worker's kernel
after every second data segment (delayed ACK; the tcpdump sample in captures/
has 20 payload-less packets out of 43), and an ACK frame every 200 messages:
about 1.3 frames per packet. Then, in the same run and on the same file:

* dissect: the real command in a subprocess, JSONL to /dev/null;
* tshark: `tshark -X lua_script:<generated plugin>` with TCP reassembly, writing
  every decoded protocol field as JSON (`-T json -j wallaroo`, the counterpart
  of dissect's JSONL; the baseline for the target), and, lighter, seven fields
  as text (`-T fields`), both to /dev/null;
* scapy: PcapReader with full per-packet dissection and the scapy layers of
  this package bound to the port (what a scapy user would run), on the first
  --scapy-packets packets (its rate is per packet, so a prefix measures it);
  its loop is timed without interpreter start-up and imports, so it is
  compared with dissect's rate without its start-up too (measured on a
  20-packet capture), as well as with dissect's whole run;
* memory: dissect's peak RSS on the capture and on one --large/--packets times
  bigger, to show it stays flat.

Prints packets/s, MB/s, peak RSS and the ratios against the targets
(>= 5x tshark, >= 20x scapy, peak RSS < 200 MB at both sizes).

Case ``dcp``: Couchbase DCP against tshark's built-in couchbase dissector (C).
The capture is recorded by the real CLI: ``dcp mock-producer --port 0
--vbuckets 16 --items 12500 --value-size 128 --keys 1000000000
--no-require-auth --record F`` streamed whole by ``dcp mock-consumer
--no-auth`` (about 35 MB, 203,000 DCP packets). Then, same run, same file:

* tshark: ``tshark -r F -d tcp.port==PORT,couchbase -T fields -e
  couchbase.opcode -e couchbase.key`` (PORT: the producer's), to /dev/null;
* ``dissect F --format jsonl`` and ``dissect F --summary``, to /dev/null;
* memory: dissect's peak RSS on a capture with 4x the items as well
  (``--dcp-skip-large`` leaves it out).

Before timing, tshark's opcodes (every DCP packet it decoded) are counted and
printed beside dissect's records, so both are seen to read the same packets.
Targets: jsonl at least 1x tshark's speed (tshark's time / dissect's), the
summary at least 2x, peak RSS under 100 MB at both sizes.

Case ``samples``: ``dissect --format jsonl`` and ``--summary`` over a generated
workload of each protocol, each about a second of dissect on 2 cores (scaled by
``--samples-scale``), made as the sample captures are (captures/make_samples.py),
with fixed seeds: Wallaroo by ``generate_source_capture`` (4 source
connections), Kinesis by ``kinesis mock-daemon --record`` driving
``mock-processor``, DCP by ``dcp mock-producer --record`` (as above, smaller),
AMBROSIA by ``ambrosia mock-ic --record`` serving ``mock-lb``, Tremor by ``tremor
mock-client --record`` against ``mock-node``. Prints records/s and µs per record
(whole process: start-up included), per wall and per CPU second, and peak RSS;
and the start-up alone (dissect of a 20-packet capture) to subtract.

Case ``filter``: the cost of ``-Y``. On the Wallaroo workload of case samples,
interleaved: ``dissect --format jsonl`` unfiltered, then per --filter expression
(default: one keeping about half the frames, one keeping none) with ``-Y EXPR``
and with the same selection in the older options (``--stream``/``--type``), so
the rows differ by the filter alone. Prints µs a frame per CPU second and the
filter's cost a frame (-Y minus the older options), and the compiled function's
own time a record, measured in this process over the capture's records.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.frames import Ack, Hello, Message, Notify, NotifyAck, Ok
from wallaroo_proto.protocols.wallaroo.wireshark import generate, tshark_command

PORT = 7100
CLI = [sys.executable, "-m", "wallaroo_proto_cli"]
DISSECT = [*CLI, "dissect"]
SEED = 7
CREDITS = 200


def generate_source_capture(
    path: str, target_bytes: int, *, seed: int, connections: int, payload: int
) -> int:
    """One capture of ``connections`` interleaved source sessions; returns its frame count."""
    t = 1_700_000_000.0 + seed * 10_000
    frames = 0
    with PcapWriter(path) as writer:
        sessions = []
        for c in range(connections):
            s = writer.tcp_session(("127.0.0.1", 40_000 + c), ("127.0.0.1", 7100), timestamp=t)
            stream = seed * 1000 + c + 1
            hello = encode(Hello("0.0.1", b"", "bench", f"conn-{seed}-{c}"))
            s.send(True, hello, t)
            s.send(False, encode(Ok(CREDITS)), t)
            s.send(True, encode(Notify(stream, f"stream-{stream}", 0)), t)
            s.send(False, encode(NotifyAck(True, stream, 0)), t)
            frames += 4
            sessions.append([s, stream, 1])
        body = b"x" * payload
        batch = CREDITS - 1
        written = 0
        while written < target_bytes:
            for entry in sessions:
                s, stream, n = entry
                t += 0.001
                msgs = b"".join(
                    encode(Message(stream, i, 1_700_000_000_000 + i, b"key-%04d" % (i % 1000), body))
                    for i in range(n, n + batch)
                )
                s.send(True, msgs, t)
                written += len(msgs) + 60 * (len(msgs) // 65_000 + 2)
                s.send(False, encode(Ack(batch, ((stream, n + batch),))), t + 0.0005)
                entry[2] = n + batch
                frames += batch + 1
        for s, _, _ in sessions:
            s.close(True, t + 0.01)
    return frames


def make_capture(path: Path, packets: int) -> None:
    """A source session: data segments of 1-3 MESSAGE frames, a bare ACK every second segment."""
    t = 1_763_700_000.0
    with PcapWriter(path) as w:
        s = w.tcp_session(("10.0.0.1", 40000), ("10.0.0.2", PORT), timestamp=t)
        s.send(True, encode(Hello("0.0.1", b"", "bench", "b1")), t)
        s.send(False, encode(Ok(1000)), t)
        s.send(True, encode(Notify(1, "bench", 0)), t)
        s.send(False, encode(NotifyAck(True, 1, 0)), t)
        payload = bytes(range(100))
        message_id = 0
        unacked = 0
        segments = 0
        while w.packets < packets:
            t += 1e-5
            frames = []
            for _ in range(1 + w.packets % 3):
                message_id += 1
                key = b"key-%d" % (message_id % 16)
                frames.append(encode(Message(1, message_id, int(t * 1e9), key, payload)))
            s.send(True, b"".join(frames), t)
            segments += 1
            if segments % 2 == 0:
                s.ack(False, t)
            unacked += len(frames)
            if unacked >= 200:
                s.send(False, encode(Ack(unacked, ((1, message_id),))), t)
                unacked = 0
        s.close(True, t)


class Run(NamedTuple):
    """One measured run of a command: its whole process, start-up included."""

    wall: float  # seconds
    cpu: float  # user + system seconds
    rss: float  # peak MB
    load: float  # the 1-minute load average as it ended


def best_of(runs: int, cmd: list[str]) -> Run:
    """The run with the least CPU time of ``runs`` runs (the least disturbed on a shared machine)."""
    return min((run_measured(cmd) for _ in range(runs)), key=lambda r: r.cpu)


def best_interleaved(runs: int, cmds: dict[str, list[str]]) -> dict[str, Run]:
    """Each command ``runs`` times, taking turns, so a change of load hits them alike; least CPU counts."""
    best: dict[str, Run] = {}
    for _ in range(runs):
        for name, cmd in cmds.items():
            run = run_measured(cmd)
            if name not in best or run.cpu < best[name].cpu:
                best[name] = run
    return best


def run_measured(cmd: list[str]) -> Run:
    """Wall and CPU seconds, peak RSS and load of one command, stdout to /dev/null."""
    with open(os.devnull, "wb") as devnull:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=devnull, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        proc.stderr.close()
    if code != 0:
        raise SystemExit(f"{cmd[0]} failed ({code}): {err[-2000:]}")
    return Run(elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, os.getloadavg()[0])


def count_frames_dissect(path: Path) -> int:
    """Frames dissect finds, counted as its output streams (nothing large held here)."""
    cmd = [*DISSECT, "--format", "jsonl", str(path)]
    lines = 0
    with subprocess.Popen(cmd, stdout=subprocess.PIPE) as proc:
        while chunk := proc.stdout.read(1 << 20):
            lines += chunk.count(b"\n")
    return lines


SCAPY_SCRIPT = r"""
import sys, time
from scapy.utils import PcapReader
from wallaroo_proto.protocols.wallaroo.scapy_layers import bind_port, frames_of
bind_port(int(sys.argv[2]))
limit = int(sys.argv[3])
n = frames = 0
start = time.perf_counter()
cpu = time.process_time()
for pkt in PcapReader(sys.argv[1]):
    frames += len(frames_of(pkt))
    n += 1
    if n >= limit:
        break
print(n, frames, time.perf_counter() - start, time.process_time() - cpu)
"""


def wallaroo_case(args: argparse.Namespace) -> None:
    """The source protocol against tshark + the Lua plugin and scapy."""
    dissect_cmd = [*DISSECT, "--format", "jsonl"]
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        small = tmpdir / "bench.pcap"
        start = time.perf_counter()
        make_capture(small, args.packets)
        size_mb = small.stat().st_size / 1e6
        took = time.perf_counter() - start
        print(f"capture: {args.packets} packets, {size_mb:.1f} MB (generated in {took:.1f} s)")
        frames = count_frames_dissect(small)
        print(f"frames: {frames} ({frames / args.packets:.2f} per packet)")

        d_wall, d_cpu, d_rss, _ = best_of(args.runs, [*dissect_cmd, str(small)])
        fields_cmd = [*DISSECT, str(small), "-T", "fields", "-e", "type", "-e", "stream_id"]
        f_wall, f_cpu, f_rss, _ = best_of(args.runs, fields_cmd)
        # Interpreter start-up and imports, measured on a 20-packet capture: the scapy
        # figure times its loop only, so the like-for-like dissect rate leaves this out too.
        tiny = tmpdir / "tiny.pcap"
        make_capture(tiny, 20)
        _, startup_cpu, _, _ = best_of(args.runs, [*dissect_cmd, str(tiny)])
        plugin = tmpdir / "wallaroo.lua"
        plugin.write_text(generate([PORT]))
        fields = ("frame.number", "wallaroo.type", "wallaroo.stream_id", "wallaroo.message_id")
        fields += ("wallaroo.event_time", "wallaroo.key", "wallaroo.payload")
        t_wall, t_cpu, t_rss, _ = best_of(args.runs, tshark_command(str(plugin), str(small), *fields))
        json_cmd = [*tshark_command(str(plugin), str(small)), "-T", "json", "-j", "wallaroo"]
        j_wall, j_cpu, j_rss, _ = best_of(args.runs, json_cmd)
        scapy_runs = []
        for _ in range(args.runs):
            proc = subprocess.run(
                [sys.executable, "-c", SCAPY_SCRIPT, str(small), str(PORT), str(args.scapy_packets)],
                capture_output=True,
                text=True,
                check=True,
            )
            scapy_runs.append(proc.stdout.split())
        s_packets, _s_frames, s_wall, s_cpu = min(scapy_runs, key=lambda r: float(r[3]))
        s_packets = int(s_packets)

        large = tmpdir / "bench-large.pcap"
        make_capture(large, args.large)
        l_wall, l_cpu, l_rss, _ = best_of(args.runs, [*dissect_cmd, str(large)])

    def row(name: str, packets: int, wall: float, cpu: float, mb: float, rss: float | None) -> float:
        rss_text = f"{rss:8.0f}" if rss is not None else "       -"
        rate = packets / cpu
        print(
            f"{name:<34} {packets:>8} {wall:7.2f} {cpu:7.2f} {rate:>10,.0f} {packets / wall:>10,.0f}"
            f" {mb / cpu:7.1f} {rss_text}"
        )
        return rate

    print()
    print(
        f"{'tool':<34} {'packets':>8} {'wall s':>7} {'CPU s':>7} {'pkts/CPUs':>10} {'pkts/wall':>10}"
        f" {'MB/CPUs':>7} {'peak MB':>8}"
    )
    d_rate = row("dissect --format jsonl", args.packets, d_wall, d_cpu, size_mb, d_rss)
    f_rate = row("dissect -T fields (2 fields)", args.packets, f_wall, f_cpu, size_mb, f_rss)
    j_rate = row("tshark + Lua plugin (-T json)", args.packets, j_wall, j_cpu, size_mb, j_rss)
    t_rate = row("tshark + Lua plugin (-T fields, 7)", args.packets, t_wall, t_cpu, size_mb, t_rss)
    s_mb = size_mb * s_packets / args.packets
    s_rate = row(
        f"scapy PcapReader + layers ({s_packets})", s_packets, float(s_wall), float(s_cpu), s_mb, None
    )
    large_mb = size_mb * args.large / args.packets
    row(f"dissect --format jsonl ({args.large})", args.large, l_wall, l_cpu, large_mb, l_rss)
    print()
    json_ratio = f"{d_rate / j_rate:.1f}x per CPU second, {j_wall / d_wall:.1f}x wall"
    print(f"dissect vs tshark -T json:   {json_ratio} (target >= 5x)")
    fields_ratio = f"{d_rate / t_rate:.1f}x per CPU second, {t_wall / d_wall:.1f}x wall"
    print(f"dissect vs tshark -T fields: {fields_ratio} (lighter output: 7 fields as text)")
    print(f"dissect -T fields vs --format jsonl: {f_rate / d_rate:.2f}x per CPU second")
    s_wall_rate = s_packets / float(s_wall)
    wall_ratio = args.packets / d_wall / s_wall_rate
    scapy_ratio = f"{d_rate / s_rate:.1f}x per CPU second, {wall_ratio:.1f}x wall"
    print(f"dissect vs scapy:            {scapy_ratio} (dissect including its start-up)")
    steady = args.packets / (d_cpu - startup_cpu)
    print(
        f"dissect vs scapy, loops only: {steady / s_rate:.1f}x per CPU second (target >= 20x; dissect"
        f" {steady:,.0f} packets/s without its {startup_cpu:.2f} s start-up)"
    )
    sizes = f"{d_rss:.0f} MB at {args.packets} packets, {l_rss:.0f} MB at {args.large}"
    print(f"peak RSS: {sizes} (target < 200 MB)")
    print(f"frames per CPU second (dissect): {frames / d_cpu:,.0f}")
    print(f"load average {load_average()}")


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def start_server(cmd: list[str]) -> tuple[subprocess.Popen, str, int]:
    """A peer started with ``--port 0``; its host and port from the ready line."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on \[?([^\s\]]+)\]?:(\d+)", line)
    if not match:
        proc.kill()
        proc.communicate()
        raise SystemExit(f"no ready line from {' '.join(cmd[2:5])}: {line!r}")
    return proc, match.group(1), int(match.group(2))


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, as an operator stops it; it must exit cleanly (its capture is then complete)."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"peer exited {proc.returncode}: {out[-2000:]}")


def checked_run(cmd: list[str], timeout: float = 1800) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:5])} exited {result.returncode}: {result.stderr[-2000:]}")
    return result


def record_dcp(path: Path, vbuckets: int, items: int, value_size: int = 128) -> int:
    """A DCP capture: mock-producer --record streamed whole by mock-consumer; the producer's port."""
    producer, host, port = start_server(
        [
            *CLI,
            *("dcp", "mock-producer", "--port", "0", "--vbuckets", str(vbuckets), "--items", str(items)),
            *("--value-size", str(value_size), "--keys", str(10**9), "--seed", str(SEED)),
            *("--no-require-auth", "--record", str(path), "--quiet"),
        ]
    )
    try:
        checked_run([*CLI, "dcp", "mock-consumer", "--connect", f"{host}:{port}", "--no-auth", "--quiet"])
    finally:
        stop_server(producer)
    return port


def count_tshark(cmd: list[str]) -> tuple[int, int]:
    """(packets, DCP packets) tshark reads: a line a packet, its opcodes comma-joined in field one."""
    packets = opcodes = 0
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        for line in proc.stdout:
            packets += 1
            first = line.split(b"\t", 1)[0].strip()
            if first:
                opcodes += first.count(b",") + 1
    if proc.returncode != 0:
        raise SystemExit(f"tshark exited {proc.returncode}")
    return packets, opcodes


def print_rows(rows: list[tuple[str, int, float, Run]]) -> None:
    """A table of (tool, records, MB, best run): rates per CPU and wall second, µs a record, peak RSS."""
    print(
        f"{'tool':<30} {'records':>9} {'wall s':>7} {'CPU s':>7} {'rec/CPU s':>10} {'rec/wall s':>10}"
        f" {'us/rec CPU':>10} {'us/rec wall':>11} {'MB/CPU s':>8} {'peak MB':>7} {'load':>5}"
    )
    for name, records, mb, run in rows:
        print(
            f"{name:<30} {records:>9,} {run.wall:7.2f} {run.cpu:7.2f} {records / run.cpu:>10,.0f}"
            f" {records / run.wall:>10,.0f} {run.cpu / records * 1e6:>10.1f}"
            f" {run.wall / records * 1e6:>11.1f}"
            f" {mb / run.cpu:8.1f} {run.rss:7.0f} {run.load:5.1f}"
        )


def dcp_case(args: argparse.Namespace) -> None:
    """DCP: dissect's jsonl and summary against tshark's built-in couchbase dissector."""
    print(f"== DCP: dissect against tshark's couchbase dissector (load average {load_average()})")
    with tempfile.TemporaryDirectory() as tmp:
        capture = Path(tmp, "dcp.pcap")
        start = time.perf_counter()
        port = record_dcp(capture, args.dcp_vbuckets, args.dcp_items)
        size_mb = capture.stat().st_size / 1e6
        took = time.perf_counter() - start
        tshark = ["tshark", "-r", str(capture), "-d", f"tcp.port=={port},couchbase", "-T", "fields"]
        tshark += ["-e", "couchbase.opcode", "-e", "couchbase.key"]
        packets, opcodes = count_tshark(tshark)
        records = count_frames_dissect(capture)
        print(
            f"capture: dcp mock-producer --record, {args.dcp_vbuckets} vbuckets x {args.dcp_items:,} items,"
            f" 128-byte values, seed {SEED}: {size_mb:.1f} MB, {packets:,} packets (recorded in {took:.1f} s)"
        )
        same = "the same" if opcodes == records else "DIFFERENT"
        print(f"DCP packets: tshark decodes {opcodes:,} opcodes, dissect writes {records:,} records ({same})")
        if opcodes != records:
            raise SystemExit("tshark and dissect do not read the same DCP packets: the figures would mislead")

        commands = {
            "tshark -T fields (2 fields)": tshark,
            "dissect --format jsonl": [*DISSECT, str(capture), "--format", "jsonl"],
            "dissect --summary": [*DISSECT, str(capture), "--summary"],
            # The same two fields as tshark's: the opcode's name and the key.
            "dissect -T fields (2 fields)": [
                *DISSECT,
                str(capture),
                "-T",
                "fields",
                "-e",
                "type",
                "-e",
                "dcp_key",
            ],
        }
        best = best_interleaved(args.runs, commands)
        counted = {name: records for name in commands} | {"tshark -T fields (2 fields)": opcodes}
        rows = [(name, counted[name], size_mb, best[name]) for name in commands]
        if not args.dcp_skip_large:
            capture.unlink()
            large = Path(tmp, "dcp-large.pcap")
            record_dcp(large, args.dcp_vbuckets, args.dcp_items * 4)
            large_records = count_frames_dissect(large)
            large_mb = large.stat().st_size / 1e6
            big = best_interleaved(
                1,
                {
                    "jsonl": [*DISSECT, str(large), "--format", "jsonl"],
                    "summary": [*DISSECT, str(large), "--summary"],
                },
            )
            rows.append(("dissect --format jsonl, 4x", large_records, large_mb, big["jsonl"]))
            rows.append(("dissect --summary, 4x", large_records, large_mb, big["summary"]))

    print()
    print_rows(rows)
    print()
    t = best["tshark -T fields (2 fields)"]
    for name, target in (
        ("dissect --format jsonl", 1.0),
        ("dissect --summary", 2.0),
        ("dissect -T fields (2 fields)", 1.0),
    ):
        run = best[name]
        verdict = "met" if t.cpu / run.cpu >= target else "not met"
        print(
            f"{name + ' vs tshark:':<36} {t.cpu / run.cpu:.2f}x per CPU second, {t.wall / run.wall:.2f}x wall"
            f" (target >= {target:g}x: {verdict})"
        )
    peaks = ", ".join(f"{name} {run.rss:.0f} MB" for name, _, _, run in rows)
    print(f"peak RSS: {peaks} (target < 100 MB for dissect)")
    print(f"load average {load_average()}")


def kinesis_workload(path: Path, scale: float) -> None:
    """mock-daemon --record driving mock-processor: 2 shards, batches of 10 records."""
    records = max(1, round(10_000 * scale))
    daemon = ["kinesis", "mock-daemon", "--shards", "2", "--records", str(records), "--batch-size", "10"]
    checked_run([*CLI, *daemon, "--record", str(path), "--", *CLI, "kinesis", "mock-processor"])


def dcp_workload(path: Path, scale: float) -> None:
    """mock-producer --record streamed by mock-consumer: 4 vbuckets, 128-byte values."""
    record_dcp(path, 4, max(1, round(5000 * scale)))


def ambrosia_workload(path: Path, scale: float) -> None:
    """mock-ic --record serving mock-lb: RPCs in log records of 10, a checkpoint every 20 records."""
    rpcs = max(10, round(45_000 * scale))
    with tempfile.TemporaryDirectory() as log_dir:
        ic = subprocess.Popen(
            [
                *CLI,
                *("ambrosia", "mock-ic", "--rpcs", str(rpcs), "--batch", "10", "--checkpoint-every", "20"),
                *("--args", "raw", "--batches", "none", "--committer", "305419896", "--log-dir", log_dir),
                *("--no-fsync", "--exit-when-done", "--record", str(path)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # its start-up note
            text=True,
        )
        ports = re.search(r"receive port (\d+), send port (\d+)", ic.stdout.readline())
        if not ports:
            ic.kill()
            ic.communicate()
            raise SystemExit("ambrosia mock-ic gave no ready line")
        try:
            lb = ["ambrosia", "mock-lb", "--receive-port", ports.group(1), "--send-port", ports.group(2)]
            checked_run([*CLI, *lb])
        finally:
            out, _ = ic.communicate(timeout=300)
        if ic.returncode != 0:
            raise SystemExit(f"ambrosia mock-ic exited {ic.returncode}: {out[-2000:]}")


def tremor_workload(path: Path, scale: float) -> None:
    """mock-client --record against mock-node: echo messages, a window of 32, pub/sub events."""
    messages = max(1, round(5000 * scale))
    node, host, port = start_server([*CLI, "tremor", "mock-node", "--port", "0"])
    try:
        client = ["tremor", "mock-client", "--connect", f"{host}:{port}", "--messages", str(messages)]
        checked_run([*CLI, *client, "--publish", str(max(1, messages // 10)), "--record", str(path)])
    finally:
        stop_server(node)


def wallaroo_workload(path: Path, scale: float) -> None:
    """``generate_source_capture``: 4 source connections, 100-byte payloads, ACKs refilling credits."""
    generate_source_capture(str(path), round(8e6 * scale), seed=1, connections=4, payload=100)


WORKLOADS: dict[str, Callable[[Path, float], None]] = {
    "wallaroo": wallaroo_workload,
    "kinesis": kinesis_workload,
    "dcp": dcp_workload,
    "ambrosia": ambrosia_workload,
    "tremor": tremor_workload,
}


def samples_case(args: argparse.Namespace) -> None:
    """dissect's jsonl and summary over a generated workload of each protocol."""
    print(f"== dissect over each protocol's workload (load average {load_average()})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        captures = {}
        for protocol, make in WORKLOADS.items():
            path = Path(tmp, f"{protocol}.pcap")
            start = time.perf_counter()
            make(path, args.samples_scale)
            records = count_frames_dissect(path)
            size_mb = path.stat().st_size / 1e6
            took = time.perf_counter() - start
            print(f"{protocol}: {size_mb:.1f} MB, {records:,} records (made in {took:.1f} s)")
            captures[protocol] = (path, records, size_mb)
        commands = {}
        for protocol, (path, _, _) in captures.items():
            commands[f"{protocol} jsonl"] = [*DISSECT, str(path), "--format", "jsonl"]
            commands[f"{protocol} --summary"] = [*DISSECT, str(path), "--summary"]
        tiny = Path(tmp, "tiny.pcap")
        make_capture(tiny, 20)
        commands["start-up"] = [*DISSECT, str(tiny), "--format", "jsonl"]
        best = best_interleaved(args.runs, commands)
        startup = best.pop("start-up")
        for name, run in best.items():
            _, records, size_mb = captures[name.split()[0]]
            rows.append((name, records, size_mb, run))
    print()
    print_rows(rows)
    print(
        f"start-up (in every row above): {startup.cpu:.2f} CPU s, {startup.wall:.2f} s wall,"
        " dissect --format jsonl of a 20-packet Wallaroo capture"
    )
    print(f"load average {load_average()}")


#: -Y expressions and the same selection in the older options: about half the frames, and none.
FILTERS = {
    "stream_id in {1001 1002} and type == MESSAGE": [
        "--stream",
        "1001",
        "--stream",
        "1002",
        "--type",
        "message",
    ],
    "type == RESTART": ["--type", "restart"],
}


def filter_case(args: argparse.Namespace) -> None:
    """dissect -Y against the same selection by --stream/--type and against no filter, same run."""
    from wallaroo_proto.capture.dissector import iter_records
    from wallaroo_proto.display_filter import compile_filter

    print(f"== dissect -Y on the Wallaroo workload (load average {load_average()})")
    filters = {expr: FILTERS.get(expr) for expr in args.filter or FILTERS}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "wallaroo.pcap")
        wallaroo_workload(path, args.samples_scale)
        records = list(iter_records(str(path)))
        frames = len(records)
        size_mb = path.stat().st_size / 1e6
        print(f"wallaroo: {size_mb:.1f} MB, {frames:,} frames")
        base = [*DISSECT, str(path), "--format", "jsonl"]
        commands = {"no filter": base}
        for i, (expr, options) in enumerate(filters.items(), 1):
            kept = sum(map(compile_filter(expr), records))
            print(f"[{i}] -Y {expr!r} keeps {kept:,} frames ({kept / frames:.0%}); options: {options}")
            commands[f"[{i}] -Y"] = [*base, "-Y", expr]
            if options:
                commands[f"[{i}] the older options"] = [*base, *options]
        best = best_interleaved(args.runs, commands)
    print()
    print_rows([(name, frames, size_mb, run) for name, run in best.items()])
    print()
    for i, (expr, options) in enumerate(filters.items(), 1):
        keep = compile_filter(expr)
        start = time.process_time()
        for _ in range(5):
            for record in records:
                keep(record)
        alone = (time.process_time() - start) / (5 * frames) * 1e9
        with_y = best[f"[{i}] -Y"].cpu
        line = f"[{i}] the compiled filter alone {alone:.0f} ns a record"
        if options:
            older = best[f"[{i}] the older options"].cpu
            line += (
                f"; -Y {(with_y - older) / frames * 1e6:+.2f} µs a frame against the older options"
                f" ({with_y / older - 1:+.1%} CPU)"
            )
        print(line + f"; {with_y / best['no filter'].cpu - 1:+.1%} CPU against no filter")
    print(f"load average {load_average()}")


CASES = {"wallaroo": wallaroo_case, "dcp": dcp_case, "samples": samples_case, "filter": filter_case}


def main() -> None:
    # Measure the commands as installed, with their byte code cached: where PYTHONDONTWRITEBYTECODE is
    # set, every start compiles every module again (a third of a second here). The best run counts, so
    # the first, which writes the cache, does not.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", choices=[*CASES, "all"], default="all", help="What to measure.")
    parser.add_argument("--runs", type=int, default=3, help="Runs per tool; the least CPU time counts.")
    wallaroo = parser.add_argument_group("case wallaroo")
    wallaroo.add_argument("--packets", type=int, default=300_000)
    wallaroo.add_argument("--large", type=int, default=900_000, help="Second size, for the memory check.")
    wallaroo.add_argument("--scapy-packets", type=int, default=30_000)
    dcp = parser.add_argument_group("case dcp")
    dcp.add_argument("--dcp-vbuckets", type=int, default=16)
    dcp.add_argument("--dcp-items", type=int, default=12_500, help="Items per vbucket.")
    dcp.add_argument("--dcp-skip-large", action="store_true", help="No capture 4x bigger (memory check).")
    samples = parser.add_argument_group("case samples")
    samples.add_argument("--samples-scale", type=float, default=1.0, help="Size of every workload, x.")
    filters = parser.add_argument_group("case filter")
    filters.add_argument("--filter", action="append", metavar="EXPR", help="A -Y expression (repeat).")
    args = parser.parse_args()
    cases = list(CASES) if args.case == "all" else [args.case]
    if {"wallaroo", "dcp"} & set(cases) and not shutil.which("tshark"):
        raise SystemExit("tshark is not installed: apt-get install -y tshark")
    for i, case in enumerate(cases):
        if i:
            print()
        CASES[case](args)


if __name__ == "__main__":
    main()
