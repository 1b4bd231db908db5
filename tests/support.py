"""Helpers for end-to-end tests: run the real command as a subprocess."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

READY = re.compile(r"listening on (\S+):(\d+)")
COMMAND = [sys.executable, "-m", "wallaroo_proto_cli"]


def run_cli(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run ``wallaroo-proto ARGS`` to completion."""
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout, **kwargs)


class Server:
    """A wallaroo-proto server subprocess started with ``--port 0``; knows its port from the ready line."""

    def __init__(self, *args: str, ready_timeout: float = 30, env: dict | None = None) -> None:
        self.proc = subprocess.Popen(
            [*COMMAND, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + ready_timeout
        self.lines: list[str] = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"server exited before its ready line: {self.proc.stderr.read()}")
            self.lines.append(line)
            match = READY.search(line)
            if match:
                self.host, self.port = match.group(1), int(match.group(2))
                return
        raise RuntimeError("no ready line")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str, str]:
        """Signal the server and wait: (exit code, rest of stdout, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, "".join(self.lines) + out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
