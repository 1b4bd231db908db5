"""The live peer's process, when fuzz starts it (``--spawn``), and the commands run around cases.

* With ``--listen``, the peer is a client: it is started for each case (``{port}`` in the
  command is the port listened on, ``{port2}`` the second ``--listen``'s) and stopped after it.
* With ``--connect``, the peer is a server: it is started once, and again after it exited
  (which is a finding), and waited for until it accepts connections; with ``--reset-cmd``, it
  is stopped before each case and started afresh after the command ran.
* With neither, replay's ``SpawnLink`` starts it for each case and speaks over its stdin and
  stdout (a Kinesis record processor); its exit status is read after the case.

Its memory is read from ``/proc`` (the process and its children), for ``--max-rss``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path


class PeerError(Exception):
    """The peer could not be started or reached (exit 2)."""


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            out += [int(p) for p in task.read_text().split()]
    return out


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants, in MiB (0 if gone)."""
    total = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
        todo += _children(current)
    return total / 1024


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"the peer's process was killed by {signal.Signals(-code).name}"
    return f"the peer's process exited with status {code}"


class PeerProcess:
    """Starts and watches the peer (see the module's docstring)."""

    def __init__(
        self,
        command: str | None,
        mode: str,
        ports: tuple[int, ...] = (),
        connect: tuple[str, int] | None = None,
        max_rss: float | None = None,
        reset_cmd: str | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        self.command = command
        self.mode = mode  # "client", "server" or "stdio"
        self.ports = ports
        self.connect = connect
        self.max_rss = max_rss
        self.reset_cmd = reset_cmd
        self.start_timeout = start_timeout
        self.process: subprocess.Popen | None = None
        #: The last case ended with the process past ``--max-rss`` (a finding even for a client).
        self.over_rss = False

    def _start(self) -> None:
        assert self.command is not None
        line = self.command
        for n, port in enumerate(self.ports, 1):  # {port} the first listened on, {portN} the Nth
            line = line.replace(f"{{port{n}}}", str(port))
        line = line.replace("{port}", str(self.ports[0]) if self.ports else "")
        try:
            self.process = subprocess.Popen(  # noqa: S603 - the user's own command line
                shlex.split(line),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except (ValueError, OSError) as err:
            raise PeerError(
                f"cannot start --spawn {line!r}: {getattr(err, 'strerror', None) or err}"
            ) from None

    def _wait_listening(self) -> None:
        assert self.connect is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise PeerError(
                    f"--spawn: {_describe_exit(self.process.returncode)} before it listened on "
                    f"{self.connect[0]}:{self.connect[1]}"
                )
            try:
                socket.create_connection(self.connect, timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise PeerError(
                        f"--spawn: nothing listened on {self.connect[0]}:{self.connect[1]} "
                        f"within {self.start_timeout:g} s"
                    ) from None
                time.sleep(0.05)

    def before(self) -> None:
        """Ready the peer for a case: the reset command, then the process started if it is not
        running (a server fuzz started is stopped first, so it starts afresh: state kept in memory
        is wiped only so)."""
        if self.reset_cmd and self.mode == "server" and self.command is not None:
            self.stop()
        if self.reset_cmd:
            result = subprocess.run(shlex.split(self.reset_cmd), capture_output=True, check=False)  # noqa: S603
            if result.returncode != 0:
                raise PeerError(
                    f"--reset-cmd exited with status {result.returncode}: "
                    + result.stderr.decode(errors="replace").strip()[:200]
                )
        if self.command is None or self.mode == "stdio":
            return
        if self.mode == "client":
            self._start()
        elif self.process is None or self.process.poll() is not None:
            self._start()
            self._wait_listening()

    def healthy(self) -> bool:
        """The health check before a case, once a server refused a connection: it takes one again
        within the start timeout (restarted first, if fuzz started it)."""
        if self.connect is None:
            return True
        try:
            if self.command is not None and self.mode == "server":
                self.stop()
                self._start()
            self._wait_listening()
        except PeerError:
            return False
        return True

    def after(self) -> str | None:
        """After a case: how the peer's process ended if it did (a crash), or its memory if past
        ``--max-rss``; a client's process is stopped."""
        process = self.process
        self.over_rss = False
        if process is None:
            return None
        code = process.poll()
        if code is None and self.max_rss is not None:
            rss = rss_mib(process.pid)
            if rss > self.max_rss:
                self.over_rss = True
                self.stop()
                return f"the peer's memory grew to {rss:.0f} MiB, beyond --max-rss {self.max_rss:g}"
        if self.mode == "client":
            if code is None:
                self.stop()
                return None
            self.process = None
            return _describe_exit(code) if code != 0 else None
        if code is not None:
            self.process = None
            return _describe_exit(code)
        return None

    def stop(self) -> None:
        process = self.process
        self.process = None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
