"""D1: hostile pcap/pcapng streams into `dissect -` through a pipe: truncated and bad headers,
huge snaplen/caplen, giant pcapng block lengths, one connection's packets that never complete a
frame (RSS over time), 20k connections, a writer that stalls mid-record then SIGINT/SIGTERM.
usage: d1_dissect_pipe.py [CASE ...]"""

import signal
import struct
import subprocess
import sys
import time

from lib import *


def ghdr(snap=65535, magic=0xA1B2C3D4, link=1):
    return struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snap, link)


def tcp(payload, sport=40000, dport=7100, seq=1, flags=0x18, src=b"\x7f\0\0\1", dst=b"\x7f\0\0\1"):
    t = struct.pack(">HHIIBBHHH", sport, dport, seq, 0, 5 << 4, flags, 65535, 0, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(t) + len(payload), 0, 0, 64, 6, 0, src, dst)
    return b"\0" * 12 + b"\x08\x00" + ip + t + payload


def rec(frame, caplen=None, ts=1):
    return struct.pack("<IIII", ts, 0, len(frame) if caplen is None else caplen, len(frame)) + frame


SHB = struct.pack("<IIIHHq", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1) + struct.pack("<I", 28)


def run(label, chunks, *args, stall=None, sig=None, sample_every=None):
    """Feed chunks (bytes or a generator) to `dissect - ARGS`; stall: seconds of silence then sig."""
    p = spawn(
        [*W, "dissect", "-", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=open(f"{TMP}/d1.err", "w"),
    )
    t0 = time.monotonic()
    n = 0
    peak = 0
    samples = []
    try:
        for c in chunks:
            p.stdin.write(c)
            n += len(c)
            if sample_every and n // sample_every != (n - len(c)) // sample_every:
                r = rss_kb(p.pid) or 0
                peak = max(peak, r)
                samples.append(f"{n >> 20}MiB:{r // 1024}")
            if time.monotonic() - t0 > 90:
                break
        p.stdin.flush()
    except BrokenPipeError:
        pass
    peak = max(peak, rss_kb(p.pid) or 0)
    how = "eof"
    if stall is not None:
        time.sleep(stall)
        peak = max(peak, rss_kb(p.pid) or 0)
        t1 = time.monotonic()
        p.send_signal(sig)
        try:
            p.wait(20)
            how = f"{signal.Signals(sig).name} -> exit in {time.monotonic() - t1:.1f}s"
        except subprocess.TimeoutExpired:
            how = f"{signal.Signals(sig).name} IGNORED 20s"
            p.kill()
    try:
        p.stdin.close()
    except BrokenPipeError:
        pass
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        how += ", HUNG at eof (killed)"
    e = open(f"{TMP}/d1.err", errors="replace").read()
    last = e.strip().splitlines()[-2:] if e.strip() else []
    print(
        f"{label}: exit {p.returncode} ({how}), {n} bytes in, {time.monotonic() - t0:.1f}s, peak RSS {peak / 1024:.1f} MiB,"
        f" {e.count(chr(10))} stderr lines, {e.count('Traceback')} tracebacks {samples[-6:] if samples else ''}"
    )
    for line in last:
        print("    |", line[:220])


def one_conn_never_whole(total):
    yield ghdr()
    yield rec(tcp(b"", flags=0x02, seq=0))
    yield rec(tcp(struct.pack(">I", 0xFFFFFF00) + b"\x01", seq=1))
    seq = 6
    body = b"x" * 1400
    while seq < total:
        yield rec(tcp(body, seq=seq)) * 1
        seq += 1400


def many_conns(n):
    yield ghdr()
    for i in range(n):
        yield rec(
            tcp(
                struct.pack(">I", 100) + b"\x01",
                sport=1024 + i % 60000,
                src=bytes([127, 1, i >> 8 & 255, i & 255]),
            )
        )


def tiny_frames(n):
    yield ghdr()
    seq = 1
    one = struct.pack(">I", 1) + b"\x09"
    for i in range(n):
        yield rec(tcp(one * 200, seq=seq))
        seq += 1000


def stall_mid_record():
    yield ghdr()
    yield rec(tcp(b"\0\0\0\1\x09"))[:20]


CASES = {
    "truncated-global-header": lambda: run("truncated global header", [ghdr()[:10]]),
    "bad-magic": lambda: run("bad magic", [b"\xde\xad\xbe\xef" + b"\0" * 100]),
    "huge-snaplen": lambda: run("snaplen 0xFFFFFFFF", [ghdr(snap=0xFFFFFFFF), rec(tcp(b"\0\0\0\1\x09"))]),
    "huge-caplen": lambda: run(
        "caplen 0xFFFFFFF0, 1 MiB follows",
        [ghdr(), struct.pack("<IIII", 1, 0, 0xFFFFFFF0, 0xFFFFFFF0), b"\0" * (1 << 20)],
    ),
    "caplen-over-snaplen": lambda: run(
        "caplen 200 MiB > snaplen, 1 MiB follows",
        [ghdr(), struct.pack("<IIII", 1, 0, 200 << 20, 200 << 20), b"\0" * (1 << 20)],
    ),
    "pcapng-giant-block": lambda: run(
        "pcapng block length 0xFFFFFFF0", [SHB, struct.pack("<II", 6, 0xFFFFFFF0) + b"\0" * 4096]
    ),
    "pcapng-tiny-block": lambda: run(
        "pcapng block length 4 (below minimum)", [SHB, struct.pack("<II", 6, 4) + b"\0" * 64]
    ),
    "pcapng-no-idb": lambda: run(
        "pcapng EPB without an IDB",
        [SHB, struct.pack("<IIIIIII", 6, 32, 0, 0, 0, 0, 0) + struct.pack("<I", 32)],
    ),
    "never-whole": lambda: run(
        "one connection, 4 GiB frame announced, 200 MiB of it",
        one_conn_never_whole(200 << 20),
        sample_every=40 << 20,
    ),
    "many-conns": lambda: run("20k connections, one cut frame each", many_conns(20000), sample_every=1 << 20),
    "tiny-frames": lambda: run(
        "1M tiny Wallaroo frames (-q --stats conv)", tiny_frames(5000), "-q", "--stats", "conv"
    ),
    "stall-sigint": lambda: run(
        "writer stalls mid-record, SIGINT", stall_mid_record(), stall=2, sig=signal.SIGINT
    ),
    "stall-sigterm": lambda: run(
        "writer stalls mid-record, SIGTERM", stall_mid_record(), stall=2, sig=signal.SIGTERM
    ),
    "stall-header-sigterm": lambda: run(
        "writer stalls in the global header, SIGTERM", [ghdr()[:7]], stall=2, sig=signal.SIGTERM
    ),
}
for name in sys.argv[1:] or CASES:
    CASES[name]()
