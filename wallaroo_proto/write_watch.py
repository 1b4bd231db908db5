"""A server's rule for a peer that never reads: no progress on our bytes for N seconds, abort.

What counts is what the peer acknowledged: asyncio's write buffer plus, on Linux, the
kernel's send queue (SIOCOUTQ: bytes sent but not yet acknowledged). Waiting for
asyncio's buffer alone is not enough, as the kernel's socket buffers absorb megabytes
first, and a peer that never reads but keeps sending never makes ``drain()`` wait.
Checked on a timer, never per write, and still after the connection was closed (a
closed transport holding unsent bytes stays open until the peer takes them).
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
_NO_LINGER = struct.pack("ii", 1, 0)  # close with RST: nothing left for a stalled peer to hold


class WriteWatch:
    """Aborts ``transport`` once the peer took none of our bytes for ``timeout`` seconds.

    The owner calls ``wrote(n)`` for every write; ``on_stall(pending)`` is called once,
    just before the abort, with the bytes still waiting.
    """

    def __init__(
        self,
        transport: asyncio.WriteTransport,
        timeout: float,
        on_stall: Callable[[int], None],
    ) -> None:
        self.transport = transport
        self.timeout = timeout
        self.on_stall = on_stall
        self.written = 0
        self.stalled = False
        self._sock: socket.socket | None = transport.get_extra_info("socket")
        self._ask_kernel = _OUTQ is not None and self._sock is not None
        self._loop = asyncio.get_running_loop()
        self._tick = min(max(timeout / 4, 0.05), 1.0)
        self._progress_at = self._loop.time()
        self._consumed = 0
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(self._tick, self._check)

    def wrote(self, size: int) -> None:
        self.written += size

    def pending(self) -> int:
        """Bytes we wrote that the peer has not acknowledged."""
        pending = self.transport.get_write_buffer_size()
        if not self._ask_kernel or self._sock.fileno() < 0:
            return pending
        try:
            queued = struct.unpack("i", fcntl.ioctl(self._sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
        except OSError:
            self._ask_kernel = False  # not a TCP socket after all
            return pending
        return pending + queued

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if self._sock is None or self._sock.fileno() < 0:
            return  # the connection is gone
        pending = self.pending()
        consumed = self.written - pending
        now = self._loop.time()
        if pending == 0 or consumed > self._consumed:
            self._progress_at = now
            if pending == 0 and self.transport.is_closing():
                return  # closed with everything taken
        self._consumed = consumed
        if now - self._progress_at >= self.timeout:
            self.stalled = True
            self.on_stall(pending)
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
            self.transport.abort()
            return
        self._timer = self._loop.call_later(self._tick, self._check)
