"""A peer that leaves our bytes unacknowledged: found on a timer, by what its TCP acknowledged.

asyncio's own write buffer is not enough to see it: the kernel's socket buffers take
megabytes first, so drain() returns long after the peer stopped reading. On Linux the
kernel's send queue (SIOCOUTQ: bytes the peer has not acknowledged) is added to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
from collections.abc import Callable

_OUTQ: int | None = None
if sys.platform == "linux":
    import fcntl
    import termios

    _OUTQ = termios.TIOCOUTQ
_NO_LINGER = struct.pack("ii", 1, 0)


class WriteWatch:
    """Calls ``on_stall(reason)`` once the peer took none of ``writer``'s bytes for ``timeout`` s.

    The owner counts what it writes with ``wrote``; the watch is a timer, never a per-write cost.
    """

    def __init__(
        self, writer: asyncio.StreamWriter, timeout: float, on_stall: Callable[[str], None], what: str
    ) -> None:
        self.writer = writer
        self.timeout = timeout
        self.on_stall = on_stall
        self.what = what
        self.written = 0
        self._sock = writer.get_extra_info("socket")
        self._loop = asyncio.get_running_loop()
        self._tick = min(max(timeout / 4, 0.05), 1.0)
        self._progress_at = self._loop.time()
        self._consumed = 0
        self._timer: asyncio.TimerHandle | None = None
        if timeout and self._sock is not None:
            self._timer = self._loop.call_later(self._tick, self._watch)

    def wrote(self, n: int) -> None:
        self.written += n

    def unconsumed(self) -> int:
        """Bytes written that the peer has not acknowledged: asyncio's buffer plus the kernel's queue."""
        pending = self.writer.transport.get_write_buffer_size()
        if _OUTQ is None or self._sock.fileno() < 0:
            return pending
        try:
            return pending + struct.unpack("i", fcntl.ioctl(self._sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
        except OSError:
            return pending

    def _watch(self) -> None:
        self._timer = None
        if self._sock.fileno() < 0 or self.writer.transport.is_closing():
            return
        pending = self.unconsumed()
        consumed = self.written - pending
        now = self._loop.time()
        if pending == 0 or consumed > self._consumed:
            self._progress_at = now
        self._consumed = consumed
        if now - self._progress_at >= self.timeout:
            self.on_stall(
                f"{self.what} read nothing for {self.timeout:g} s ({pending} bytes waiting); connection reset"
            )
            return
        self._timer = self._loop.call_later(self._tick, self._watch)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST: nothing left queued for a peer that does not read."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.fileno() >= 0:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
    writer.transport.abort()
