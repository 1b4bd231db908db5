"""The proxy's own output (the recording, the checker's pipe, stderr), written by threads of
their own so that the relay's event loop never waits on a reader.

A stalled reader used to freeze every connection and Ctrl-C with it, the loop sitting in
a pipe write. Here the loop only appends to a bounded queue; a thread writes it out,
blocking as long as the reader takes. How much may wait is bounded (``limit``): past it
the output is given up with one line (the recording, the checks), or lines are dropped
and counted (stderr), never the traffic.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable

#: Parts handed to one ``writev`` (Linux's IOV_MAX is 1024), and about the bytes.
_PARTS = 512
_BATCH = 1 << 18


class Spool:
    """Bytes for ``fd``, queued by the caller and written by a thread of this spool's own.

    ``write`` never blocks. ``backlog`` is what waits; once a write would take it past
    ``limit`` (one write alone, a frame held whole, may be larger) the spool stops
    (``stop``): ``on_stop(reason)`` is called once and nothing more is written; the
    same when a write fails (a full disk, a reader gone). With ``drop_lines`` a write that
    does not fit is dropped and counted instead, and ``dropped_line(n)`` goes where they were
    lost once there is room again (or at the end): for stderr, where a line lost is better
    than a relay stopped.
    """

    def __init__(
        self,
        fd: int,
        *,
        limit: int,
        on_stop: Callable[[str], None] | None = None,
        drop_lines: bool = False,
        dropped_line: Callable[[int], bytes] | None = None,
        close_fd: bool = False,
        name: str = "output",
    ) -> None:
        self.fd = fd
        self.limit = limit
        self.backlog = 0
        #: Bytes written so far, and when the last write returned or the spool became busy (for
        #: a stall's detection).
        self.written = 0
        self.progress_at = time.monotonic()
        self.stopped: str | None = None
        self.dropped = 0
        self._on_stop = on_stop
        self._drop_lines = drop_lines
        self._dropped_line = dropped_line
        self._close_fd = close_fd
        self._parts: deque[bytes | memoryview] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        #: Called (on the writer thread) each time the backlog falls to zero.
        self.on_drained: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name=f"proxy-{name}", daemon=True)
        self._thread.start()

    def write(self, *parts: bytes) -> None:
        """Queue these bytes, whole, in order; never waits."""
        size = sum(len(p) for p in parts)
        stop_reason = None
        with self._lock:
            if self.stopped is not None or self._closing:
                return
            if self.backlog + size > self.limit and self.backlog:
                if self._drop_lines:
                    self.dropped += 1
                    return
                stop_reason = f"{_mib(self.limit)} waited unwritten: its reader is not keeping up"
            else:
                if self.dropped and self._dropped_line is not None:
                    # Where the lines were lost, once there is room again.
                    parts = (self._dropped_line(self.dropped), *parts)
                    size += len(parts[0])
                    self.dropped = 0
                if not self.backlog:
                    self.progress_at = time.monotonic()  # busy from now: a stall counts from here
                self._parts.extend(parts)
                self.backlog += size
                self._wake.notify()
        if stop_reason is not None:
            self.stop(stop_reason)

    def stop(self, reason: str) -> None:
        """Write nothing more: what waits is dropped, ``on_stop(reason)`` told once."""
        with self._lock:
            if self.stopped is not None:
                return
            self.stopped = reason
            self._parts.clear()
            self.backlog = 0
            self._wake.notify()
        if self._on_stop is not None:
            self._on_stop(reason)
        if self.on_drained is not None:
            self.on_drained()

    def close(self, wait: float) -> bool:
        """Let what waits be written, for as long as the reader keeps taking it with no pause
        longer than ``wait`` seconds; True if all of it was."""
        with self._lock:
            if self.dropped and self._dropped_line is not None and self.stopped is None:
                note = self._dropped_line(self.dropped)
                self._parts.append(note)
                self.backlog += len(note)
                self.dropped = 0
            self._closing = True
            self.progress_at = max(self.progress_at, time.monotonic())
            self._wake.notify()
        while self._thread.is_alive() and self.stopped is None:
            self._thread.join(min(wait, 0.1))
            if time.monotonic() - self.progress_at > wait and self.backlog:
                return False
        return self.stopped is None

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._parts and not self._closing and self.stopped is None:
                    self._wake.wait()
                if self.stopped is not None or (self._closing and not self._parts):
                    break
                # A little at a time: a pipe's write returns when all of it is in, and each
                # return is the progress a stall is judged by.
                batch = [self._parts.popleft()]
                size = len(batch[0])
                while self._parts and len(batch) < _PARTS and size < _BATCH:
                    batch.append(self._parts.popleft())
                    size += len(batch[-1])
            try:
                self._write_all(list(batch))
            except OSError as err:
                self.stop(err.strerror or str(err))
                break
            with self._lock:
                self.backlog -= size
                drained = self.backlog == 0
            if drained and self.on_drained is not None:
                self.on_drained()
        if self._close_fd:
            os.close(self.fd)

    def _write_all(self, parts: list[bytes | memoryview]) -> None:
        while parts:
            done = os.writev(self.fd, parts)
            self.written += done
            self.progress_at = time.monotonic()
            while parts and done >= len(parts[0]):
                done -= len(parts[0])
                parts.pop(0)
            if parts and done:
                parts[0] = memoryview(parts[0])[done:]


class SpoolFile:
    """A spool as the binary file ``PcapWriter`` writes to."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool

    def write(self, data: bytes) -> int:
        self.spool.write(data)
        return len(data)

    def flush(self) -> None:
        """Written by the spool's thread as soon as it can."""

    def close(self) -> None:
        """Closed by the spool's owner."""


class SpoolText:
    """A spool as the text file a ``rich.Console`` prints to: whole lines, never waiting."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self._partial = ""

    def write(self, text: str) -> int:
        text = self._partial + text
        whole, _, self._partial = text.rpartition("\n")
        if whole:
            self.spool.write((whole + "\n").encode("utf-8", "replace"))
        return len(text)

    def flush(self) -> None:
        """A line goes out when it is whole."""

    def isatty(self) -> bool:
        return False


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


class Throttled:
    """``say`` at most once every ``every`` seconds, with how many times it happened since:
    what fails at each attempt (an accept without file descriptors) is a line, not a flood."""

    def __init__(self, say: Callable[[str], None], every: float = 1.0) -> None:
        self._say = say
        self._every = every
        self._last = -every
        self._count = 0

    def __call__(self, line: str) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._last >= self._every:
            times = f" ({self._count} times)" if self._count > 1 else ""
            self._say(line + times)
            self._last, self._count = now, 0
