"""Servers install their SIGINT/SIGTERM handlers before they print the ready line.

A script may signal a server the moment its ready line appears. To catch the
moment deterministically, the server's stdout is a pipe the test has already
filled: the ready line's write blocks, and while the server sits in that write
the test checks the signal disposition and sends SIGTERM.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import time

import pytest
from support import COMMAND

WRITE_SYSCALL_X86_64 = "1"


def _fill(fd: int) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except BlockingIOError:
        pass
    fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def _blocked_writing_stdout(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] == WRITE_SYSCALL_X86_64 and int(fields[1], 16) == 1


def _catches(pid: int, sig: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        caught = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (sig - 1)))


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="reads the x86-64 syscall number from /proc")
@pytest.mark.parametrize("server", ["mock-sink", "mock-worker"])
def test_sigterm_sent_with_the_ready_line_exits_cleanly(server: str, tmp_path) -> None:
    args = {"mock-sink": ["--out-dir", str(tmp_path)], "mock-worker": ["--no-live"]}[server]
    read_end, write_end = os.pipe()
    _fill(write_end)
    proc = subprocess.Popen(
        [*COMMAND, server, "--port", "0", *args], stdout=write_end, stderr=subprocess.PIPE, text=True
    )
    os.close(write_end)
    try:
        deadline = time.monotonic() + 60
        while not _blocked_writing_stdout(proc.pid):
            assert proc.poll() is None, f"{server} exited early: {proc.stderr.read()}"
            assert time.monotonic() < deadline, f"{server} never reached its ready line"
            time.sleep(0.01)
        assert _catches(proc.pid, signal.SIGTERM), "SIGTERM is not handled yet when the ready line is written"
        proc.send_signal(signal.SIGTERM)
        with os.fdopen(read_end, "rb") as pipe:
            rest = pipe.read()
        assert b"listening on" in rest
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_DEFERRED = """
import os, signal, sys
from wallaroo_proto.main_thread_signals import signals_deferred
try:
    with signals_deferred():
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        print("the body ran to its end", flush=True)
except KeyboardInterrupt:
    print("then the interrupt", flush=True)
"""


@pytest.mark.parametrize(
    ("sig", "code", "said"), [("SIGINT", 0, "then the interrupt\n"), ("SIGTERM", -15, "")]
)
def test_a_signal_in_a_deferred_body_is_delivered_after_it(sig: str, code: int, said: str) -> None:
    """The demo starts each peer so: an interrupt cannot land between a child's fork and its
    ``Popen`` returning, which would leave the child running unknown to the demo."""
    done = subprocess.run([sys.executable, "-c", _DEFERRED, sig], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (code, "the body ran to its end\n" + said), done.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_shared_stop_signals_set_the_event_or_call_the_handler(sig: signal.Signals) -> None:
    """``runtime.on_stop_signals``, the one place every serving command installs its handlers."""
    from wallaroo_proto.runtime import on_stop_signals

    async def main() -> tuple[bool, list[str]]:
        stop = on_stop_signals()
        signal.raise_signal(sig)
        async with asyncio.timeout(30):
            await stop.wait()
        called: list[str] = []
        handed = on_stop_signals(lambda: called.append("handler"))
        signal.raise_signal(sig)
        async with asyncio.timeout(30):
            while not called:
                await asyncio.sleep(0)
        return handed.is_set(), called

    assert asyncio.run(main()) == (False, ["handler"])
