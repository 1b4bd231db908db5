"""A server connection's watchdog: reset a peer that acknowledged none of our bytes for too long.

Waiting for asyncio's write buffer to back up is not enough to notice a peer
that never reads: the kernel's socket buffers absorb megabytes first, and a
peer that keeps sending never makes a drain() wait at all. So the measure is
what the peer acknowledged: on Linux the kernel's send queue (SIOCOUTQ) plus
asyncio's buffer, elsewhere asyncio's buffer alone, checked on a timer (never
per write). A peer with bytes of ours waiting and none taken for ``timeout``
seconds is reset (RST), so it holds nothing of the server's.
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

    _OUTQ = termios.TIOCOUTQ  # SIOCOUTQ: bytes in the send queue the peer has not acknowledged
_TCP_CLOSE = 7  # tcpi_state of a connection the peer reset
_NO_LINGER = struct.pack("ii", 1, 0)


class StallWatch:
    """Counts what was written (``wrote``) and calls ``on_stall`` and resets the connection at a stall."""

    def __init__(self, transport: asyncio.Transport, timeout: float, on_stall: Callable[[str], None]) -> None:
        self.transport = transport
        self.timeout = timeout
        self.on_stall = on_stall
        self.written = 0
        self.stalled: str | None = None
        self._sock: socket.socket | None = transport.get_extra_info("socket")
        self._ask_kernel = _OUTQ is not None and self._sock is not None
        self._loop = asyncio.get_running_loop()
        self._tick = min(max(timeout / 4, 0.05), 1.0)
        self._progress_at = self._loop.time()
        self._consumed = 0
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(self._tick, self._check)

    def wrote(self, n: int) -> None:
        self.written += n

    def unacknowledged(self) -> int:
        """Bytes written that the peer has not acknowledged: asyncio's buffer and the kernel's queue."""
        pending = self.transport.get_write_buffer_size()
        fd = self._sock.fileno() if self._ask_kernel else -1
        if fd < 0:
            return pending
        try:
            queued = struct.unpack("i", fcntl.ioctl(fd, _OUTQ, b"\0\0\0\0"))[0]
            if queued and self._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == _TCP_CLOSE:
                return 0  # reset by the peer: nothing of ours will be taken, nor held
        except OSError:
            self._ask_kernel = False  # not a TCP socket after all
            return pending
        return pending + queued

    def _check(self) -> None:
        self._timer = None
        if self._sock is None or self._sock.fileno() < 0:
            return  # closed (a closing transport is still watched while it flushes)
        pending = self.unacknowledged()
        consumed = self.written - pending
        now = self._loop.time()
        if pending == 0 or consumed > self._consumed:
            self._progress_at = now
        self._consumed = consumed
        if now - self._progress_at >= self.timeout:
            self.stalled = (
                f"read nothing of ours for {self.timeout:g} s ({pending} bytes waiting); connection reset"
            )
            self.reset()
            self.on_stall(self.stalled)
            return
        self._timer = self._loop.call_later(self._tick, self._check)

    def reset(self) -> None:
        """Abort with RST: the peer keeps nothing of ours, and the server waits on nothing."""
        self.stop()
        if self._sock is not None and self._sock.fileno() >= 0:
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
        self.transport.abort()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
