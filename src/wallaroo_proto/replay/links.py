"""The live connections a replay plays over: TCP it opens or accepts, or a process's pipes.

Non-blocking, so the engine waits on all of them at once with deadlines: a peer that stops
reading or answering is a finding, never a stuck command.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass, field

from wallaroo_proto.write_watch import no_linger


class LinkError(OSError):
    """A live connection could not be opened (nobody listening, no client came)."""


@dataclass
class Link:
    """One live connection: ``read_fd`` to wait on, bytes in and out, who is the client."""

    #: Whether the played side opened it (is the TCP client).
    we_are_client: bool
    client: tuple[str, int]
    server: tuple[str, int]
    eof: bool = field(default=False, init=False)
    #: The peer reset the connection (what it sent and was not read yet may be lost with it).
    reset: bool = field(default=False, init=False)

    @property
    def read_fd(self) -> int:
        raise NotImplementedError

    @property
    def write_fd(self) -> int:
        raise NotImplementedError

    def recv(self) -> bytes:
        """What is there (``b""`` at the end); BlockingIOError when nothing yet."""
        raise NotImplementedError

    def send(self, data: memoryview) -> int:
        raise NotImplementedError

    def shutdown_write(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Reset: stop at once, what was sent and unread lost (a pipe is closed)."""
        self.shutdown_write()
        self.eof = True

    def close(self) -> None:
        raise NotImplementedError


class TcpLink(Link):
    def __init__(self, sock: socket.socket, we_are_client: bool) -> None:
        local, remote = sock.getsockname()[:2], sock.getpeername()[:2]
        client, server = (local, remote) if we_are_client else (remote, local)
        super().__init__(we_are_client, client, server)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock

    @property
    def read_fd(self) -> int:
        return self.sock.fileno()

    @property
    def write_fd(self) -> int:
        return self.sock.fileno()

    def recv(self) -> bytes:
        try:
            return self.sock.recv(1 << 18)
        except ConnectionResetError:
            self.reset = True
            return b""

    def send(self, data: memoryview) -> int:
        return self.sock.send(data)

    def shutdown_write(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def abort(self) -> None:
        no_linger(self.sock)
        self.sock.close()  # an RST, not a FIN
        self.eof = True

    def close(self) -> None:
        self.sock.close()


def connect(address: tuple[str, int], timeout: float, retry: bool = False) -> TcpLink:
    """A TCP connection to ``address``; ``LinkError`` says why not (exit 2: nobody listening).
    ``retry``: a refused connection is tried again until ``timeout`` (a port the peer opens
    only once it accepted another)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic()))
            break
        except ConnectionRefusedError as err:
            if not retry or time.monotonic() >= deadline:
                raise LinkError(f"cannot connect to {address[0]}:{address[1]}: {err.strerror}") from None
            time.sleep(0.02)
        except OSError as err:
            raise LinkError(f"cannot connect to {address[0]}:{address[1]}: {err.strerror or err}") from None
    return TcpLink(sock, True)


class Listener:
    """A listening socket; ``port`` is the one bound (``--listen HOST:0`` picks a free one)."""

    def __init__(self, address: tuple[str, int]) -> None:
        try:
            self.sock = socket.create_server(address, reuse_port=False)
        except OSError as err:
            raise LinkError(f"cannot listen on {address[0]}:{address[1]}: {err.strerror or err}") from None
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]

    def accept(self) -> TcpLink | None:
        try:
            sock, _ = self.sock.accept()
        except BlockingIOError:
            return None
        return TcpLink(sock, False)

    def close(self) -> None:
        self.sock.close()


class SpawnLink(Link):
    """A process started the way its real peer starts it, spoken to over its stdin and stdout
    (the Kinesis MultiLangDaemon's record processors). Recorded as a TCP connection between
    the recording's own endpoints, so ``dissect`` reads it as it read the recording."""

    def __init__(self, command: str, client: tuple[str, int], server: tuple[str, int]) -> None:
        super().__init__(True, client, server)
        try:
            self.process = subprocess.Popen(  # noqa: S603 - the user's own command line
                shlex.split(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
            )
        except ValueError as err:  # shlex: an unclosed quote
            raise LinkError(f"--spawn {command!r}: {err}") from None
        except OSError as err:
            raise LinkError(f"cannot start {command!r}: {err.strerror or err}") from None
        assert self.process.stdin is not None and self.process.stdout is not None
        os.set_blocking(self.process.stdin.fileno(), False)
        os.set_blocking(self.process.stdout.fileno(), False)

    @property
    def read_fd(self) -> int:
        return self.process.stdout.fileno()  # type: ignore[union-attr]

    @property
    def write_fd(self) -> int:
        return self.process.stdin.fileno()  # type: ignore[union-attr]

    def recv(self) -> bytes:
        return os.read(self.read_fd, 1 << 18)

    def send(self, data: memoryview) -> int:
        if self.process.stdin.closed:  # type: ignore[union-attr]
            return len(data)  # our side was closed (fuzz's half-close): nothing more goes
        try:
            return os.write(self.write_fd, data)
        except BrokenPipeError:
            self.eof = True
            return len(data)

    def shutdown_write(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # type: ignore[union-attr]

    def close(self) -> None:
        self.shutdown_write()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()  # type: ignore[union-attr]
