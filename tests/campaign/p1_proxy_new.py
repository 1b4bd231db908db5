"""P1: the proxy where the old campaign did not go: 2000 connections that never send, TLS
ClientHello bytes and HTTP into a Wallaroo upstream, an upstream that accepts and never reads,
a 20 s idle connection, then SIGTERM.  usage: p1_proxy_new.py"""

import os
import signal
import socket
import subprocess
import threading
import time

from lib import *

up = Mock("worker")
noread = socket.socket()
noread.bind(("127.0.0.1", 0))
noread.listen(5000)  # accepts (backlog), never reads


def proxy(upport, tag):
    p = spawn(
        [*W, "proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{upport}", "--no-live"],
        stdout=subprocess.PIPE,
        stderr=open(f"{TMP}/{tag}.err", "w"),
        text=True,
    )
    port = int(READY.search(p.stdout.readline()).group(2))
    # Its summary (a block a connection: 2000 here) comes to stdout at the end: read it, or the
    # proxy waits in a pipe write as any program writing to a pipe nobody reads would.
    threading.Thread(target=p.stdout.read, daemon=True).start()
    return p, port


p, port = proxy(up.port, "p1")
time.sleep(0.5)
f0 = fds(p.pid)
print(f"proxy fds at start {f0}, RSS {rss_kb(p.pid) / 1024:.1f} MiB")
socks = conns(port, 2000)
time.sleep(3)
print(
    f"  2000 silent: proxy fds {fds(p.pid)} RSS {rss_kb(p.pid) / 1024:.1f} MiB, checker RSS {sum(rss_kb(c) or 0 for c in [int(x) for x in open(f'/proc/{p.pid}/task/{p.pid}/children').read().split()]) / 1024:.1f} MiB; worker fds {fds(up.p.pid)}"
)
print(
    "  good client through the proxy:",
    good_client(type("M", (), {"name": "worker", "port": port, "send_port": None})(), 30),
)
for s in socks:
    s.close()
print("  fds back:", bool(wait_until(lambda: fds(p.pid) <= f0 + 2, 30)), fds(p.pid))
tls = bytes.fromhex("160301002f0100002b0303") + os.urandom(32) + bytes.fromhex("000002002f0100")
for label, data in [("TLS ClientHello", tls), ("HTTP GET", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")]:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(data)
    s.settimeout(5)
    try:
        got = s.recv(200)
    except Exception as e:
        got = repr(e)
    print(f"  {label}: answer {got[:80]!r}")
    s.close()
s = socket.create_connection(("127.0.0.1", port))
time.sleep(20)
s.sendall(b"\0\0\0\1\x09")
s.settimeout(5)
try:
    got = s.recv(200)
except Exception as e:
    got = repr(e)
print(f"  after 20 s idle, a bad frame: answer {got[:60]!r}")
s.close()
q, qport = proxy(noread.getsockname()[1], "p1b")
t0 = time.monotonic()
c = socket.create_connection(("127.0.0.1", qport))
c.settimeout(2)
sent = 0
try:
    while time.monotonic() - t0 < 15:
        c.sendall(b"x" * 65536)
        sent += 65536
except OSError:
    pass
print(
    f"  upstream that never reads: {sent >> 20} MiB taken before backpressure; proxy RSS {rss_kb(q.pid) / 1024:.1f} MiB"
)
c.close()
for proc, tag in [(p, "p1"), (q, "p1b")]:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = "TIMEOUT"
    e = open(f"{TMP}/{tag}.err").read()
    print(
        f"  {tag} SIGTERM exit {rc}; stderr {e.count(chr(10))} lines, {e.count('Traceback')} tracebacks; last: {e.strip().splitlines()[-1:]}"
    )
print("  worker SIGTERM exit", up.stop(signal.SIGTERM))
noread.close()
