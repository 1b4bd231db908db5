"""mock-source -> mock-worker over loopback, against a bare socket baseline in the same run.

1. Throughput: mock-source streams 64-byte payloads to mock-worker (two real
   processes, the real CLI). Messages per second come from the source's own
   summary (connect to the last EOS acknowledged).
2. Baseline: the same MESSAGE frames, pre-encoded, pushed through a plain
   socket by one process and split by a bare ``struct.unpack_from`` loop in
   another. The ratio of the two is printed; the target is >= 40%.
3. The same with the worker's ``--out /dev/null`` and with ``--record``.
4. Latency: the source held to 10% and 80% of the peak rate (``--rate``); the worker's
   p99 from reading a MESSAGE off the socket to its delivery, and from a checkpoint's
   snapshot to its ACK leaving, from the worker's summary.
5. Slow consumer: mock-worker writes ``--out`` into a FIFO that nobody reads for
   a few seconds while mock-source pushes at full speed; the worker's RSS is
   sampled from /proc to show it stays flat (credits and TCP back-pressure,
   not buffers, absorb the pause).

Run: ``python benchmarks/source_to_worker.py`` (about 30 s on 2 cores);
``--check`` exits 1 when the ratio is below the target.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

COMMAND = [sys.executable, "-m", "wallaroo_proto_cli"]
READY = re.compile(r"listening on (\S+):(\d+)")
TARGET = 0.40
PAYLOAD = 64


def start_worker(*args: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [*COMMAND, "mock-worker", "--port", "0", "--no-live", "--format", "json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    match = READY.search(line)
    if not match:
        proc.kill()
        raise SystemExit(f"mock-worker did not start: {line!r} {proc.stderr.read()}")
    return proc, int(match.group(2))


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def source_args(port: int, streams: int, count: int, *extra: str) -> list[str]:
    return [
        *COMMAND, "mock-source", "--connect", f"127.0.0.1:{port}", "--streams", str(streams),
        "--count", str(count), "--payload-size", str(PAYLOAD), "--format", "json", "-q", *extra,
    ]  # fmt: skip


def run_mock(
    streams: int,
    count: int,
    credits: int,
    source_extra: tuple[str, ...] = (),
    worker_extra: tuple[str, ...] = (),
) -> dict:
    """One mock-source -> mock-worker run: the source's summary, with the worker's latency figures."""
    worker, port = start_worker("--credits", str(credits), "--checkpoint-ms", "100", *worker_extra)
    try:
        result = subprocess.run(
            source_args(port, streams, count, *source_extra), capture_output=True, text=True, timeout=600
        )
    finally:
        out, _ = stop(worker)
    if result.returncode != 0:
        raise SystemExit(f"mock-source failed: {result.stderr}")
    summary = json.loads(result.stdout.splitlines()[-1])
    try:
        summary["latency"] = json.loads(out.splitlines()[-1]).get("latency")
    except (ValueError, IndexError):
        summary["latency"] = None
    return summary


def run_latency(streams: int, count: int, credits: int, peak: float, share: float) -> dict:
    """The worker's p99 latencies with the source held to ``share`` of the peak rate (a few seconds)."""
    rate = peak * share
    per_stream = max(1000, min(count, int(rate * 4 / streams)))  # about four seconds of traffic
    run = run_mock(streams, per_stream, credits, ("--rate", f"{rate:.0f}"))
    latency = run.get("latency") or {}
    return {
        "share": share,
        "rate": round(rate),
        "achieved": round(run["messages_per_s"]),
        "delivery_p99_ms": (latency.get("arrival_to_delivery") or {}).get("p99_ms"),
        "ack_p99_ms": (latency.get("checkpoint_to_ack") or {}).get("p99_ms"),
    }


# --- the bare socket baseline -------------------------------------------------


def _frames(streams: int, count: int) -> bytes:
    """The MESSAGE frames mock-source sends, encoded by hand (spec layout), round-robin over streams."""
    head = struct.Struct(">IBQQqH")
    parts = []
    for n in range(1, count + 1):
        for s in range(streams):
            label = f"stream-{s}:{n}:".encode()
            payload = label + b"." * (PAYLOAD - len(label))
            parts.append(head.pack(27 + len(payload), 5, s + 1, n, 0, 0) + payload)
    return b"".join(parts)


def _bare_receiver(port_queue, expected: int, result_queue) -> None:
    """Accept one connection and split frames with a bare struct loop until ``expected`` arrived."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port_queue.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    unpack = struct.Struct(">I").unpack_from
    buf = b""
    frames = 0
    started = None
    while frames < expected:
        data = conn.recv(256 * 1024)
        if not data:
            break
        if started is None:
            started = time.perf_counter()
        buf = buf + data if buf else data
        pos, n = 0, len(buf)
        while n - pos >= 4:
            (length,) = unpack(buf, pos)
            if pos + 4 + length > n:
                break
            frames += 1
            pos += 4 + length
        buf = buf[pos:]
    conn.sendall(b"k")
    result_queue.put((frames, time.perf_counter() - (started or time.perf_counter())))
    conn.close()


def run_baseline(streams: int, count: int) -> dict:
    data = _frames(streams, count)
    ctx = multiprocessing.get_context("fork")
    port_queue, result_queue = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_bare_receiver, args=(port_queue, streams * count, result_queue))
    receiver.start()
    port = port_queue.get(timeout=30)
    sock = socket.create_connection(("127.0.0.1", port))
    started = time.perf_counter()
    view = memoryview(data)
    for pos in range(0, len(data), 256 * 1024):
        sock.sendall(view[pos : pos + 256 * 1024])
    sock.recv(1)
    elapsed = time.perf_counter() - started
    sock.close()
    frames, _ = result_queue.get(timeout=30)
    receiver.join(timeout=30)
    return {"messages": frames, "elapsed_s": elapsed, "messages_per_s": frames / elapsed}


# --- the slow consumer --------------------------------------------------------


def _rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in KiB."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def run_slow_consumer(streams: int, count: int, pause: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        fifo = Path(tmp) / "out.fifo"
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open, but nobody reads yet
        worker, port = start_worker("--out", str(fifo), "--checkpoint-ms", "100")
        idle_rss, _ = _rss_kib(worker.pid)
        samples: list[tuple[float, int]] = []
        stop_sampling = threading.Event()

        def sample() -> None:
            t0 = time.monotonic()
            while not stop_sampling.is_set() and worker.poll() is None:
                try:
                    samples.append((time.monotonic() - t0, _rss_kib(worker.pid)[0]))
                except OSError:
                    return
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # A replay buffer big enough for the whole run: the source never waits on checkpoint
        # ACKs here, so only the worker's credits and its reading of the socket hold it back.
        extra = ("--max-unacked", str(streams * count + 1))
        source = subprocess.Popen(
            source_args(port, streams, count, *extra), stdout=subprocess.PIPE, text=True
        )
        time.sleep(pause)
        paused_samples = list(samples)
        os.set_blocking(reader, True)
        lines = 0
        expected = streams * count
        last_progress = time.monotonic()
        while lines < expected and time.monotonic() - last_progress < 5:
            ready, _, _ = select.select([reader], [], [], 0.5)
            if ready:
                chunk = os.read(reader, 1 << 20)
                if not chunk:
                    break
                lines += chunk.count(b"\n")
                last_progress = time.monotonic()
        stop_sampling.set()
        sampler.join()
        _, hwm = _rss_kib(worker.pid)
        source.kill()
        source.communicate()
        os.close(reader)
        out, err = stop(worker)
        try:
            errors = json.loads(out.splitlines()[-1]).get("errors", [])
        except (ValueError, IndexError):
            last = err.strip().splitlines()[-1] if err.strip() else "nothing on stderr"
            errors = [{"reason": f"exit {worker.returncode} without a summary: {last}"}]
    return {
        "messages": expected,
        "lines_read": lines,
        "pause_s": pause,
        "idle_rss_mib": idle_rss / 1024,
        "paused_peak_rss_mib": max((r for _, r in paused_samples), default=0) / 1024,
        "paused_last_rss_mib": (paused_samples[-1][1] if paused_samples else 0) / 1024,
        "peak_rss_mib": hwm / 1024,
        "samples": len(samples),
        "worker_errors": sorted({str(e.get("reason")) for e in errors}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--count", type=int, default=100_000, help="messages per stream")
    parser.add_argument("--credits", type=int, default=5000)
    parser.add_argument("--pause", type=float, default=3.0, help="seconds the consumer does not read")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each; the best counts")
    parser.add_argument("--check", action="store_true", help="exit 1 below the target ratio")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["out_dev_null", "record"],
        choices=["out_dev_null", "record"],
        help="worker options measured beside the plain run",
    )
    args = parser.parse_args()

    # Best of --repeat for each: the machine is shared, so the best run is the least disturbed.
    baseline = max(
        (run_baseline(args.streams, args.count) for _ in range(args.repeat)),
        key=lambda r: r["messages_per_s"],
    )
    mock = max(
        (run_mock(args.streams, args.count, args.credits) for _ in range(args.repeat)),
        key=lambda r: r["messages_per_s"],
    )
    ratio = mock["messages_per_s"] / baseline["messages_per_s"]
    variants = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, worker_extra in (
            ("out_dev_null", ("--out", "/dev/null")),
            ("record", ("--record", str(Path(tmp) / "worker.pcap"))),
        ):
            if name in args.variants:
                run = run_mock(args.streams, args.count, args.credits, worker_extra=worker_extra)
                variants[name] = round(run["messages_per_s"])
    latencies = [
        run_latency(args.streams, args.count, args.credits, mock["messages_per_s"], share)
        for share in (0.1, 0.8)
    ]
    slow = run_slow_consumer(args.streams, args.count // 2, args.pause)
    report = {
        "payload_bytes": PAYLOAD,
        "messages": args.streams * args.count,
        "baseline_messages_per_s": round(baseline["messages_per_s"]),
        "mock_messages_per_s": round(mock["messages_per_s"]),
        "ratio": round(ratio, 3),
        "target": TARGET,
        "variants_messages_per_s": variants,
        "variant_ratios": {k: round(v / baseline["messages_per_s"], 3) for k, v in variants.items()},
        "latency": latencies,
        "slow_consumer": {k: round(v, 1) if isinstance(v, float) else v for k, v in slow.items()},
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(f"source_to_worker: {report['messages']:,} messages of {PAYLOAD} bytes, {args.streams} streams")
        print(f"  bare socket + struct loop : {baseline['messages_per_s']:>12,.0f} msg/s")
        print(f"  mock-source -> mock-worker: {mock['messages_per_s']:>12,.0f} msg/s")
        print(f"  ratio                     : {ratio:>12.1%}  (target >= {TARGET:.0%})")
        for name, rate in variants.items():
            label = {"out_dev_null": "with --out /dev/null", "record": "with --record"}[name]
            print(f"  {label:<26}: {rate:>12,.0f} msg/s  ({rate / baseline['messages_per_s']:.1%})")
        for row in latencies:
            print(
                f"  at {row['share']:.0%} of peak ({row['rate']:,} msg/s asked, {row['achieved']:,} got): "
                f"p99 arrival->delivery {row['delivery_p99_ms']} ms, checkpoint->ACK {row['ack_p99_ms']} ms"
            )
        print(
            f"  slow consumer ({slow['pause_s']:.0f} s pause, {slow['messages']:,} msgs): worker RSS idle "
            f"{slow['idle_rss_mib']:.1f} MiB, peak while paused {slow['paused_peak_rss_mib']:.1f} MiB, "
            f"peak overall {slow['peak_rss_mib']:.1f} MiB; {slow['lines_read']:,} lines read after the pause"
        )
        for reason in slow["worker_errors"]:
            print(f"  (mock-worker reported during the slow-consumer run: {reason})")
    return 1 if args.check and ratio < TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
