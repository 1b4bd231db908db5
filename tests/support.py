"""Helpers for end-to-end tests: run the real command as a subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

READY = re.compile(r"listening on (\S+):(\d+)")
COMMAND = [sys.executable, "-m", "wallaroo_proto_cli"]
#: Environment for a command's output as on a wide terminal without colours (rich's TTY_COMPATIBLE):
#: ``dissect`` writes one line a frame to a pipe, its tables only to a terminal.
TABLE = {"TTY_COMPATIBLE": "1", "TERM": "dumb", "COLUMNS": "200"}


def run_cli(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run ``wallaroo-proto ARGS`` to completion."""
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout, **kwargs)


class Server:
    """A wallaroo-proto server subprocess started with ``--port 0``; knows its port from the ready line.

    After the ready line, threads drain stdout and stderr, so a chatty server can
    never block on a full pipe however long a test runs.
    """

    def __init__(self, *args: str, ready_timeout: float = 60, env: dict | None = None) -> None:
        self.proc = subprocess.Popen(
            [*COMMAND, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._err: list[str] = []
        self._drains = [threading.Thread(target=self._drain, args=(self.proc.stderr, self._err), daemon=True)]
        self._drains[0].start()
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(timeout=30)
                self._drains[0].join(timeout=30)
                raise RuntimeError(f"server exited before its ready line: {''.join(self._err)}")
            self.lines.append(line)
            match = READY.search(line)
            if match:
                self.host, self.port = match.group(1), int(match.group(2))
                out = threading.Thread(target=self._drain, args=(self.proc.stdout, self.lines), daemon=True)
                out.start()
                self._drains.append(out)
                return
        raise RuntimeError("no ready line")

    @staticmethod
    def _drain(pipe, into: list[str]) -> None:
        for line in pipe:
            into.append(line)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stderr(self) -> str:
        """What the server wrote to stderr so far."""
        return "".join(self._err)

    def stop(self, sig: int | None = signal.SIGTERM, timeout: float = 60) -> tuple[int, str, str]:
        """Signal the server (``None``: let it end by itself) and wait: (exit code, stdout, stderr)."""
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=timeout)
        for thread in self._drains:
            thread.join(timeout=timeout)
        return self.proc.returncode, "".join(self.lines), "".join(self._err)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def packet_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each packet record: pcap records, or pcapng enhanced packet blocks."""
    spans = []
    if data[:4] == b"\x0a\x0d\x0d\x0a":
        order = "<" if data[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
        pos = 0
        while pos + 8 <= len(data):
            block_type, length = struct.unpack_from(order + "II", data, pos)
            if length < 12:
                break
            if block_type == 6:
                spans.append((pos, pos + length))
            pos += length
    else:
        order = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
        pos = 24
        while pos + 16 <= len(data):
            (incl_len,) = struct.unpack_from(order + "I", data, pos + 8)
            spans.append((pos, pos + 16 + incl_len))
            pos += 16 + incl_len
    return spans


def wait_for(condition, what: str, timeout: float = 60) -> None:
    """Poll ``condition`` until it holds, failing with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def as_foreground() -> None:
    """``preexec_fn`` for a child a test sends Ctrl-C: SIGINT at its default, as a shell gives a
    foreground job (a test run started in the background inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def delivered(out: Path) -> dict[int, list[tuple[int, str]]]:
    """(message id, payload) per stream id, in the order the worker delivered them."""
    per_stream: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for line in out.read_text().splitlines():
        record = json.loads(line)
        per_stream[record["stream_id"]].append((record["message_id"], record["payload"]))
    return per_stream
