"""A server's rule for a peer that never reads: none of our bytes taken for N seconds, reset.

What counts is what the peer acknowledged: asyncio's write buffer plus, on Linux, the
kernel's send queue (SIOCOUTQ: bytes sent but not yet acknowledged). Waiting for
asyncio's buffer alone is not enough, as the kernel's socket buffers absorb megabytes
first, and a peer that never reads but keeps sending never makes ``drain()`` wait.
Checked on a timer, never per write, and still while a closed connection flushes (a
closing transport holding unsent bytes stays open until the peer takes them). Shared
by the servers of every protocol.
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
    _OUTQ_UNSENT = 0x894B  # SIOCOUTQNSD: bytes of it not yet let into the peer's window
_TCP_CLOSE = 7  # tcpi_state of a connection the peer reset
_NO_LINGER = struct.pack("ii", 1, 0)  # close with RST: nothing left for a stalled peer to hold


class WriteWatch:
    """Resets ``transport`` once the peer took none of our bytes for ``timeout`` seconds.

    The owner counts what it writes with ``wrote``. At a stall the connection is reset,
    then ``on_stall(reason)`` is called once, the reason naming ``what`` (the peer) in the
    words of ``said`` (a template of ``what``, ``timeout`` and ``pending``).
    """

    SAID = "{what} read nothing of ours for {timeout:g} s ({pending} bytes waiting); connection reset"

    def __init__(
        self,
        transport: asyncio.BaseTransport,
        timeout: float,
        on_stall: Callable[[str], None],
        what: str = "the peer",
        said: str = SAID,
    ) -> None:
        self.transport = transport
        self.timeout = timeout
        self.on_stall = on_stall
        self.what = what
        self.said = said
        self.written = 0
        self.stalled: str | None = None
        self._sock: socket.socket | None = transport.get_extra_info("socket")
        self._ask_kernel = _OUTQ is not None and self._sock is not None
        self._loop = asyncio.get_running_loop()
        self._tick = min(max(timeout / 4, 0.05), 1.0)
        self._progress_at = self._loop.time()
        self._consumed = 0
        self._timer: asyncio.TimerHandle | None = None
        if timeout and self._sock is not None:
            self._timer = self._loop.call_later(self._tick, self._check)

    def wrote(self, n: int) -> None:
        self.written += n

    def unacknowledged(self, *, unsent: bool = False) -> int:
        """Bytes written that the peer has not acknowledged (``unsent``: not even let into its
        window): asyncio's buffer and the kernel's queue."""
        pending = self.transport.get_write_buffer_size()
        fd = self._sock.fileno() if self._ask_kernel else -1
        if fd < 0:
            return pending
        try:
            queued = struct.unpack("i", fcntl.ioctl(fd, _OUTQ_UNSENT if unsent else _OUTQ, b"\0\0\0\0"))[0]
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
            if pending == 0 and self.transport.is_closing():
                return  # closed with everything taken
        self._consumed = consumed
        if now - self._progress_at >= self.timeout:
            self.stalled = self.said.format(what=self.what, timeout=self.timeout, pending=pending)
            self.reset()
            self.on_stall(self.stalled)
            return
        self._timer = self._loop.call_later(self._tick, self._check)

    def reset(self) -> None:
        """Abort with RST: the peer keeps nothing of ours, and the server waits on nothing."""
        self.stop()
        reset(self.transport)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def no_linger(sock: socket.socket) -> None:
    """Make the socket's close an RST (SO_LINGER 0): nothing left queued for the peer."""
    if sock.fileno() >= 0:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)


def reset(transport: asyncio.BaseTransport) -> None:
    """Close with RST (SO_LINGER 0): nothing left queued for a peer that does not read."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        no_linger(sock)
    transport.abort()
