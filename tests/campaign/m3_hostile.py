"""M3: malformed frames of the server's protocol, one kind a connection, each followed by a good
client: random bytes, a maximum-size length then RST mid-frame, a frame cut by RST, a flood of
100k tiny frames from a peer that never reads, slowloris (a valid start at 2 bytes/s), half-close
at once. RSS and fds after each, SIGTERM at the end.  usage: m3_hostile.py SERVER"""

import os
import signal
import socket
import struct
import sys
import time

from lib import *

name = sys.argv[1]
WS = (
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def ws(op, payload, length=None):
    n = len(payload) if length is None else length
    head = bytes([0x80 | op]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 127]) + struct.pack(">Q", n))
    return head + b"\0\0\0\0" + payload


def dcp(op, body=b"", bodylen=None):
    return (
        struct.pack(">BBHBBHIIQ", 0x80, op, 0, 0, 0, 0, len(body) if bodylen is None else bodylen, 1, 0)
        + body
    )


wal = lambda body, n=None: struct.pack(">I", len(body) if n is None else n) + body
amb = lambda body, n=None: bytes([0xFE, 0xFF, 0xFF, 0xFF, 0x0F]) if n else bytes([len(body) * 2]) + body
# per protocol: (prefix a connection sends first, max-size header, cut frame, one tiny frame, a valid start)
P = {
    "wallaroo": (
        b"",
        wal(b"", 0xFFFFFFFF),
        wal(b"\x01" * 10, 5000),
        wal(b"\x00"),
        wal(b"\x01\x00\x05" + b"0.0.1" + b"\x00" * 20),
    ),
    "dcp": (b"", dcp(0x57, b"", 0xFFFFFFFF), dcp(0x57, b"x" * 10, 5000), dcp(0x0A), dcp(0x1F, b"x" * 8)),
    "tremor": (WS, ws(1, b"", 1 << 63 - 1), ws(1, b"x" * 10, 5000), ws(9, b""), WS),
    "ambrosia": (
        b"",
        amb(b"", True),
        bytes([0x90, 0x4E]) + b"x" * 10,
        bytes([2, 0]),
        bytes([0x20]) + b"\x0e" + b"\0" * 15,
    ),
    "kinesis": (
        b"",
        b"{" + b"x" * (1 << 20),
        b'{"action":"initialize","shardId":"',
        b"\n",
        b'{"action": "status", "responseFor": "initialize"}\n',
    ),
}
proto = {
    "worker": "wallaroo",
    "sink": "wallaroo",
    "dcp": "dcp",
    "tremor": "tremor",
    "ic": "ambrosia",
    "daemon": "kinesis",
    "processor": "kinesis",
}[name]
first, maxhdr, cut, tiny, valid = P[proto]
m = Mock(name)
time.sleep(0.5)
f0 = fds(m.p.pid)
m.sample()
print(f"{name}: start fds {f0} RSS {m.peak / 1024:.1f} MiB")


def attempt(label, fn):
    t0 = time.monotonic()
    try:
        what = fn()
    except Exception as e:
        what = repr(e)[:100]
    r = m.sample()
    back = wait_until(lambda: (fds(m.p.pid) or 0) <= f0 + 2, 20)
    gc = good_client(m, timeout=30) if name not in ("ic", "daemon") else "-"
    print(
        f"  {label}: {what}; {time.monotonic() - t0:.1f}s, RSS {r / 1024:.1f} MiB, fds {fds(m.p.pid)}"
        f"{'' if back else ' NOT BACK'}; alive {m.p.poll() is None}; good client {gc}"
    )


def answer(s, t=3):
    s.settimeout(t)
    got = b""
    try:
        while len(got) < 1 << 16:
            d = s.recv(65536)
            if not d:
                return f"closed after {len(got)} bytes {got[:60]!r}"
            got += d
    except TimeoutError:
        return f"open, {len(got)} bytes {got[:60]!r}"
    except OSError as e:
        return f"{e.__class__.__name__} after {len(got)} bytes"
    return f"{len(got)} bytes"


def random_bytes():
    s = socket.create_connection(("127.0.0.1", m.port))
    s.sendall(first + os.urandom(65536))
    a = answer(s)
    s.close()
    return a


def max_header():
    s = socket.create_connection(("127.0.0.1", m.port))
    s.sendall(first + maxhdr + os.urandom(4000))
    a = answer(s)
    rst(s)
    return a


def cut_rst():
    s = socket.create_connection(("127.0.0.1", m.port))
    s.sendall(first + cut)
    time.sleep(0.3)
    rst(s)
    return "reset"


def tiny_flood():
    s = socket.create_connection(("127.0.0.1", m.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(15)
    sent = 0
    s.sendall(first)
    try:
        block = tiny * 1000
        for _ in range(100):
            s.sendall(block)
            sent += 1000
    except OSError:
        pass
    r = m.sample()
    s.close()
    return f"{sent} tiny frames sent unread, RSS then {r / 1024:.1f} MiB"


def slowloris():
    s = socket.create_connection(("127.0.0.1", m.port))
    t0 = time.monotonic()
    n = 0
    data = (first + valid) * 3
    try:
        for b in data:
            if time.monotonic() - t0 > 12:
                break
            s.send(bytes([b]))
            n += 1
            time.sleep(0.5)
    except OSError as e:
        return f"{e.__class__.__name__} after {n} bytes, {time.monotonic() - t0:.0f}s"
    a = answer(s, 1)
    s.close()
    return f"{n} bytes in {time.monotonic() - t0:.0f}s; {a}"


def half_close():
    s = socket.create_connection(("127.0.0.1", m.port))
    s.sendall(first + valid)
    s.shutdown(socket.SHUT_WR)
    a = answer(s, 5)
    s.close()
    return a


def many_garbage():
    socks = conns(m.port, 300, send=first + os.urandom(200))
    time.sleep(2)
    closed = sum(closed_by_peer(s, 0.01) for s in socks)
    for s in socks:
        s.close()
    return f"{len(socks)} garbage connections, {closed} closed by the server in 2s"


for label, fn in [
    ("random 64 KiB", random_bytes),
    ("maximum length header", max_header),
    ("cut frame + RST", cut_rst),
    ("100k tiny frames, never read", tiny_flood),
    ("slowloris", slowloris),
    ("valid start + half-close", half_close),
    ("300 garbage connections", many_garbage),
]:
    attempt(label, fn)
if name == "ic":
    print("  good client at the end:", good_client(m, timeout=30))
print(f"  peak RSS {m.peak / 1024:.1f} MiB; SIGTERM exit", m.stop(signal.SIGTERM))
m.report()
