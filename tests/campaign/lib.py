"""Shared helpers of the campaign: start a mock server, measure it, run a well-behaved client, stop.

Loopback only. Every process a script starts is stopped by its PID before the script ends.
The command is ``wallaroo-proto`` on PATH, or the one ``WALLAROO_PROTO`` names (split like a shell).
"""

import atexit
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

W = shlex.split(os.environ.get("WALLAROO_PROTO", "wallaroo-proto"))
PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TMP = tempfile.mkdtemp(prefix="campaign-")
STARTED: list = []  # every process a script started: what atexit stops if the script fails midway


def _stop_all():
    for p in STARTED:
        if p.poll() is None:
            p.kill()
            p.wait(10)


atexit.register(_stop_all)


def spawn(cmd, **kw):
    """subprocess.Popen, remembered so that a script that fails midway stops it all the same."""
    p = subprocess.Popen(cmd, **kw)
    STARTED.append(p)
    return p


READY = re.compile(r"listening on \[?([^\s\]]+)\]?:(\d+)")

#: name -> the server's command line (without the command), with TMP folders filled in.
SERVERS = {
    "worker": ["mock-worker", "--listen", "127.0.0.1:0", "-q"],
    "sink": ["mock-sink", "--listen", "127.0.0.1:0", "-o", "{tmp}/sink", "-q"],
    "dcp": ["dcp", "mock-producer", "--listen", "127.0.0.1:0", "--vbuckets", "4", "--items", "10", "-q"],
    "tremor": ["tremor", "mock-node", "--listen", "127.0.0.1:0", "-q"],
    "ic": [
        "ambrosia",
        "mock-ic",
        "--listen",
        "127.0.0.1:0",
        "--send-listen",
        "127.0.0.1:0",
        "--rpcs",
        "50",
        "-v",
    ],
    "daemon": ["kinesis", "mock-daemon", "--listen", "127.0.0.1:0", "--shards", "1", "--records", "10", "-q"],
    "processor": ["kinesis", "mock-processor", "--listen", "127.0.0.1:0", "-q"],
}


class Mock:
    """A server started from SERVERS; its stdout and stderr are drained into lists by threads."""

    def __init__(self, name, *extra, env=None, nofile=None):
        self.name = name
        args = [a.replace("{tmp}", TMP) for a in SERVERS[name]] + list(extra)
        self.p = spawn(
            [*W, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=(lambda: __import__("resource").setrlimit(7, (nofile, nofile))) if nofile else None,
        )
        self.out, self.err = [], []
        threading.Thread(target=self._drain, args=(self.p.stderr, self.err), daemon=True).start()
        line = self.p.stdout.readline()
        self.out.append(line)
        m = READY.search(line)
        if not m:
            self.p.wait(30)
            raise RuntimeError(f"{name}: no ready line: {line!r} {''.join(self.err)[-500:]}")
        self.port = int(m.group(2))
        sm = re.search(r"send port (\d+)", line)
        self.send_port = int(sm.group(1)) if sm else None
        threading.Thread(target=self._drain, args=(self.p.stdout, self.out), daemon=True).start()
        self.peak = 0

    @staticmethod
    def _drain(pipe, into):
        for line in pipe:
            into.append(line)

    def sample(self):
        r = rss_kb(self.p.pid) or 0
        self.peak = max(self.peak, r)
        return r

    def stop(self, sig=signal.SIGINT, timeout=30):
        """Signal, wait: the exit code, or 'TIMEOUT' (then it is killed)."""
        t0 = time.monotonic()
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(10)
            return "TIMEOUT"
        self.stop_seconds = time.monotonic() - t0
        time.sleep(0.2)
        return self.p.returncode

    def stderr(self):
        return "".join(self.err)

    def report(self):
        e = self.stderr()
        tb = e.count("Traceback")
        print(f"  {self.name}: stderr {e.count(chr(10))} lines, {tb} tracebacks; last lines:")
        for line in e.splitlines()[-4:]:
            print("    |", line[:200])


def rss_kb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None


def cpu_s(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError):
        return None


def wait_until(cond, timeout=30, step=0.05):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return None


def good_client(m, timeout=60):
    """Run the project's own well-behaved peer of server ``m``: (exit code, seconds, last stderr line)."""
    a = f"127.0.0.1:{m.port}"
    tmp = tempfile.mkdtemp(dir=TMP)
    cmd = {
        "worker": ["mock-source", os.path.join(ROOT, "samples", "orders.txt"), "--connect", a],
        "sink": [
            "mock-worker",
            "--sink-connect",
            a,
            "--input",
            "gen:20",
            "-q",
            "--sink-instance",
            os.path.basename(tmp),
        ],
        "dcp": ["dcp", "mock-consumer", "--connect", a, "--state", f"{tmp}/s.json", "-o", f"{tmp}/o.jsonl"],
        "tremor": ["tremor", "mock-client", "--connect", a],
        "ic": ["ambrosia", "mock-lb", "--connect", a, "--send-connect", f"127.0.0.1:{m.send_port}"],
        "daemon": ["kinesis", "mock-processor", "--connect", a],
        "processor": ["kinesis", "mock-daemon", "--connect", a, "--records", "10"],
    }[m.name]
    t0 = time.monotonic()
    if m.name == "ic":  # mock-lb runs as long as the IC stays up: served is the IC's "an LB connected"
        before = m.stderr().count("an LB connected")
        try:
            subprocess.run([*W, *cmd], capture_output=True, text=True, timeout=min(timeout, 15))
        except subprocess.TimeoutExpired:
            pass
        served = m.stderr().count("an LB connected") > before
        return ("served" if served else "NOT served"), round(time.monotonic() - t0, 1), ""
    try:
        r = subprocess.run([*W, *cmd], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return "TIMEOUT", time.monotonic() - t0, (e.stderr or b"")[-200:]
    last = (r.stderr.strip().splitlines() or [""])[-1][:160]
    return r.returncode, round(time.monotonic() - t0, 1), last


def conns(port, n, host="127.0.0.1", send=b""):
    """Open n connections (sending ``send`` on each); the list of sockets that connected."""
    out = []
    for _ in range(n):
        try:
            s = socket.create_connection((host, port), timeout=5)
            if send:
                s.sendall(send)
            out.append(s)
        except OSError as e:
            print("  connect failed after", len(out), repr(e))
            break
    return out


def closed_by_peer(s, timeout=0.0):
    """True when the server closed (EOF or RST) this socket; what it sent is read and dropped."""
    s.settimeout(timeout)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


def rst(s):
    """Close with RST (SO_LINGER 0)."""
    import struct

    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
