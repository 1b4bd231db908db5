"""M1: N connections that connect and never send (default 1000), a good client while they hold,
then they all close; fds back, RSS, the server still serves, SIGTERM exits cleanly.
usage: m1_idle.py SERVER [N] [HOLD_SECONDS]"""

import signal
import sys
import time

from lib import *

name = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
hold = float(sys.argv[3]) if len(sys.argv) > 3 else 3
m = Mock(name)
time.sleep(0.5)
f0 = fds(m.p.pid)
r0 = m.sample()
print(f"{name}: start fds {f0} RSS {r0 / 1024:.1f} MiB")
t0 = time.monotonic()
socks = conns(m.port, n)
for port in [m.send_port] if m.send_port else []:
    socks += conns(port, n // 10)
time.sleep(hold)
r1 = m.sample()
print(
    f"  {len(socks)} silent connections in {time.monotonic() - t0:.1f}s: fds {fds(m.p.pid)} RSS {r1 / 1024:.1f} MiB"
)
print("  good client while they hold:", good_client(m, timeout=30))
closed = sum(closed_by_peer(s) for s in socks)
print(f"  closed by the server after {time.monotonic() - t0:.0f}s: {closed} of {len(socks)}")
for s in socks:
    s.close()
back = wait_until(lambda: fds(m.p.pid) <= f0 + 2, 30)
print(
    f"  after all closed: fds {fds(m.p.pid)} (start {f0}) {'back' if back else 'NOT BACK'}; RSS {m.sample() / 1024:.1f} MiB peak {m.peak / 1024:.1f}"
)
print("  good client after:", good_client(m, timeout=30))
print("  SIGTERM exit", m.stop(signal.SIGTERM), f"in {getattr(m, 'stop_seconds', 0):.1f}s")
m.report()
