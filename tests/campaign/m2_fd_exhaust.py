"""M2: the server runs out of file descriptors (its RLIMIT_NOFILE set to 64 at start): 150 silent
connections, then all closed; does it say so once, recover, and serve again?  usage: m2_fd_exhaust.py SERVER"""

import signal
import sys
import time

from lib import *

name = sys.argv[1]
m = Mock(name, nofile=64)
time.sleep(0.5)
f0 = fds(m.p.pid)
socks = conns(m.port, 150)
time.sleep(3)
print(f"{name}: limit 64, {len(socks)} connections open, server fds {fds(m.p.pid)}, cpu {cpu_s(m.p.pid)}s")
t = time.monotonic()
c0 = cpu_s(m.p.pid)
time.sleep(2)
print(f"  cpu while exhausted: {cpu_s(m.p.pid) - c0:.2f}s of 2s")
for s in socks:
    s.close()
back = wait_until(lambda: fds(m.p.pid) <= f0 + 2, 30)
print(f"  after close: fds {fds(m.p.pid)} (start {f0}) {'back' if back else 'NOT BACK'}")
print("  good client after:", good_client(m, timeout=30))
print("  SIGINT exit", m.stop(signal.SIGINT))
m.report()
e = m.stderr()
print("  distinct stderr lines:", len(set(e.splitlines())))
