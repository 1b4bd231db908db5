"""``proxy`` in the middle: throughput against the same peers connected directly, and added latency.

In one run, interleaved (direct, then through the proxy, --runs times; the best of each):

1. Wallaroo: mock-source streams to mock-worker (4 streams, 64-byte payloads);
   messages per second from the source's own summary.
2. DCP: mock-consumer streams a mock-producer's vbuckets to the end; items per
   second from the consumer's summary.
3. Latency: a 100-byte ping answered by a bare echo server, --pings round trips
   one at a time, direct and through the proxy: the p50 and p99 the proxy adds.

The proxy records nothing here but dissects everything live (its default); the
target is at least 0.7x of direct throughput for both protocols.

Runs of about a second direct (200,000 messages or items), so that neither side's start
weighs in the rates.

    python benchmarks/proxy.py [--runs 3] [--messages 200000] [--items 200000] [--pings 5000]
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
import threading
import time
from collections.abc import Callable

COMMAND = [sys.executable, "-m", "wallaroo_proto_cli"]
READY = re.compile(r"listening on (\S+?):(\d+)")


def start(*args: str) -> tuple[subprocess.Popen, int]:
    """A server subprocess and the port its ready line names."""
    proc = subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    match = READY.search(line)
    if not match:
        proc.kill()
        raise SystemExit(f"{args[0]} gave no ready line: {line!r}")
    return proc, int(match.group(2))


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def through(port: int, proxied: bool, run: Callable[[int], float]) -> float:
    """``run(port)`` directly, or with a proxy in front of ``port``."""
    if not proxied:
        return run(port)
    proxy, proxy_port = start("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{port}", "-q")
    try:
        return run(proxy_port)
    finally:
        stop(proxy)


def wallaroo(args: argparse.Namespace, proxied: bool) -> float:
    worker, port = start("mock-worker", "--port", "0", "--credits", "500", "--checkpoint-ms", "100", "-q")

    def source(target: int) -> float:
        result = subprocess.run(
            [
                *(*COMMAND, "mock-source", "--connect", f"127.0.0.1:{target}", "--streams", "4"),
                *("--count", str(args.messages // 4), "--payload-size", "64", "--format", "json", "-q"),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if result.returncode != 0:
            raise SystemExit(f"mock-source failed: {result.stderr}")
        return json.loads(result.stdout.splitlines()[-1])["messages_per_s"]

    try:
        return through(port, proxied, source)
    finally:
        stop(worker)


def dcp(args: argparse.Namespace, proxied: bool) -> float:
    producer, port = start(
        *("dcp", "mock-producer", "--port", "0", "--vbuckets", "4", "--items", str(args.items // 4)),
        *("--value-size", "128", "--seed", "1"),
    )

    def consumer(target: int) -> float:
        result = subprocess.run(
            [*COMMAND, "dcp", "mock-consumer", "--connect", f"127.0.0.1:{target}", "--format", "json"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if result.returncode != 0:
            raise SystemExit(f"mock-consumer failed: {result.stdout}\n{result.stderr}")
        summary = json.loads(result.stdout.splitlines()[-1])
        return summary["items_received"] / summary["stream_seconds"]

    try:
        return through(port, proxied, consumer)
    finally:
        stop(producer)


def echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def round_trips(port: int, pings: int) -> list[float]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ping = b"p" * 100
    times = []
    for _ in range(pings):
        start = time.perf_counter()
        sock.sendall(ping)
        got = 0
        while got < len(ping):
            got += len(sock.recv(65536))
        times.append(time.perf_counter() - start)
    sock.close()
    return times


def percentile(values: list[float], share: float) -> float:
    return statistics.quantiles(values, n=1000)[int(share * 1000) - 1]


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--pings", type=int, default=5000)
    args = parser.parse_args()
    print(f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for name, case, unit in (("Wallaroo", wallaroo, "msg/s"), ("DCP", dcp, "items/s")):
        best = {False: 0.0, True: 0.0}
        for _ in range(args.runs):
            for proxied in (False, True):
                best[proxied] = max(best[proxied], case(args, proxied))
        print(
            f"{name}: direct {best[False]:,.0f} {unit}, through the proxy {best[True]:,.0f} {unit}: "
            f"{best[True] / best[False]:.2f}x (target at least 0.7x)"
        )
    server, port = echo_server()
    direct = round_trips(port, args.pings)
    proxied = through(port, True, lambda target: round_trips(target, args.pings))
    server.close()
    for share in (0.5, 0.99):
        d, p = percentile(direct, share), percentile(proxied, share)
        print(
            f"round trip p{share * 100:g}: direct {d * 1e6:.0f} µs, through the proxy {p * 1e6:.0f} µs "
            f"(+{(p - d) * 1e6:.0f} µs)"
        )
    print(f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
