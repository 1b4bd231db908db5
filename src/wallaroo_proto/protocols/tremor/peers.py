"""The mock node (asyncio server) and mock client (blocking socket), speaking WebSocket through wsproto.

No frame or handshake is written here: wsproto's ``WSConnection`` does the
HTTP upgrade, masking, fragmentation and control frames; these loops only move
bytes and hand whole text messages to ``node.NodeSession`` (server) or
``core.Session`` (client). Faults for testing clients: refuse the upgrade
(HTTP 503), drop the connection after N messages, delay every reply, send a
malformed reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from wallaroo_proto.pcap_writer import PcapWriter, TcpSession
from wallaroo_proto.runtime import quiet_accept_errors
from wallaroo_proto.write_watch import WriteWatch

from .core import CLIENT, SERVER, Session
from .messages import CONTROL, dumps
from .node import Broker, NodeSession

DEFAULT_PORT = 9899
#: A text message larger than this closes the connection with 1009 (bounded memory per client).
MAX_MESSAGE = 1 << 20
#: A client whose unsent replies pass this is too slow: its connection is closed (1008).
MAX_BACKLOG = 4 << 20
#: A message from the node larger than this ends the mock client's session with 1009 (bounded memory).
MAX_REPLY = 16 << 20
_READ = 1 << 16


@dataclass
class Faults:
    refuse: bool = False
    drop_after: int = 0  # abort the connection once a client sent N messages
    delay: float = 0.0  # seconds before every reply
    malformed_after: int = 0  # the Nth reply of a connection is not JSON


@dataclass
class NodeStats:
    connections: int = 0
    refused: int = 0
    sessions: int = 0
    messages_in: int = 0
    messages_out: int = 0
    violations: int = 0
    timeouts: int = 0
    internal_errors: int = 0
    dropped: int = 0
    violation_list: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


class MockNode:
    """Serves Tremor network-protocol sessions (echo and pub/sub) on one TCP port."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        faults: Faults | None = None,
        log: Callable[[str], None] | None = None,
        *,
        write_timeout: float = 30.0,
        handshake_timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.faults = faults or Faults()
        #: Seconds a client may leave our bytes unacknowledged, with no progress (0: never).
        self.write_timeout = write_timeout
        #: Seconds from accepting a connection to its whole upgrade request (0: never).
        self.handshake_timeout = handshake_timeout
        self.log = log or (lambda line: None)
        self.broker = Broker()
        self.stats = NodeStats()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._live: set[_NodeConnection] = set()
        self._next = 0

    async def start(self) -> tuple[str, int]:
        quiet_accept_errors("tremor mock-node")
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=_READ)
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def stop(self) -> None:
        """Stop listening; tell every open session the node is going away (1001), then end them."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._live):
            conn.close(CloseReason.GOING_AWAY, "node shutting down")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await asyncio.gather(*(c.writer.drain() for c in self._live), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        self.stats.connections += 1
        self._next += 1
        conn = _NodeConnection(self, self._next, reader, writer)
        self._live.add(conn)
        try:
            await conn.run()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a peer gone, or the node stopping: either way this connection is over
        except Exception as err:  # noqa: BLE001 - the node's own bug: one line, this peer closed
            self.stats.internal_errors += 1
            self.log(f"session {conn.node.ident}: internal error: {type(err).__name__}: {err}"[:300])
            with contextlib.suppress(Exception):
                conn.close(CloseReason.INTERNAL_ERROR, "internal error")
        finally:
            conn.ended()
            conn.node.gone()
            self._live.discard(conn)
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()


class _NodeConnection:
    def __init__(
        self, server: MockNode, ident: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.ws = WSConnection(ConnectionType.SERVER)
        self.node = NodeSession(server.broker, ident)
        self.node.connection = self
        self.parts: list[str] = []
        self.size = 0
        self.received = 0
        self.replies = 0
        self.closing = False
        self.timed_out = False
        self.watch = (
            WriteWatch(writer.transport, server.write_timeout, self._stalled, "the client")
            if server.write_timeout
            else None
        )
        self._handshake = (
            asyncio.get_running_loop().call_later(server.handshake_timeout, self._no_upgrade)
            if server.handshake_timeout
            else None
        )

    def _out(self, data: bytes) -> None:
        """Write, unless the connection is gone: a peer that floods pings and resets would
        otherwise have asyncio log "socket.send() raised exception." for every pong after it."""
        if self.writer.transport.is_closing():
            return
        self.writer.write(data)
        if self.watch is not None:
            self.watch.wrote(len(data))

    def _stalled(self, reason: str) -> None:
        self.timed_out = True
        self.server.stats.timeouts += 1
        self.server.log(f"session {self.node.ident}: {reason}")

    def _no_upgrade(self) -> None:
        """A peer that has not finished its upgrade request in time (a slowloris, or one cut short)."""
        self._handshake = None
        self.timed_out = True
        self.server.stats.timeouts += 1
        self.server.log(
            f"session {self.node.ident}: no WebSocket upgrade within {self.server.handshake_timeout:g} s; "
            "answered 408 and closed"
        )
        with contextlib.suppress(LocalProtocolError):
            self._out(self.ws.send(RejectConnection(status_code=408)))
        self.writer.close()

    def ended(self) -> None:
        """The connection is over: no upgrade deadline; the write watch stays until our bytes are taken."""
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None

    def _send_texts(self, texts: Iterable[str]) -> None:
        ws = self.ws
        if ws.state is not ConnectionState.OPEN:
            return
        out = bytearray()
        faults = self.server.faults
        for text in texts:
            self.replies += 1
            if faults.malformed_after and self.replies == faults.malformed_after:
                text = text[: max(1, len(text) // 2)]  # cut short: not JSON
            out += ws.send(TextMessage(data=text))
        self._out(out)

    def violation(self, reason: str) -> None:
        stats = self.server.stats
        stats.violations += 1
        line = f"session {self.node.ident}: {reason}"
        if len(stats.violation_list) < 100:
            stats.violation_list.append(line)
        self.server.log(f"violation: {line}")

    def deliver(self, text: str) -> None:
        if self.writer.transport.get_write_buffer_size() > MAX_BACKLOG:
            self.close(CloseReason.POLICY_VIOLATION, "too slow: replies backed up")
            return
        self._send_texts([text])
        self.server.stats.messages_out += 1

    def close(self, code: CloseReason, reason: str | None = None) -> None:
        """Send a Close frame (once the WebSocket is open); the read loop ends the connection."""
        if self.ws.state is ConnectionState.OPEN:
            data = self.ws.send(CloseConnection(code=code, reason=reason))
            self._out(data)
        self.closing = True

    async def run(self) -> None:
        stats = self.server.stats
        faults = self.server.faults
        ws = self.ws
        while True:
            data = await self.reader.read(_READ)
            if self.timed_out:
                return
            try:
                ws.receive_data(data or None)
                events = list(ws.events())
            except RemoteProtocolError as err:
                self.violation(f"WebSocket: {err}")
                with contextlib.suppress(LocalProtocolError):
                    self._out(ws.send(err.event_hint) if err.event_hint else b"")
                await self.writer.drain()
                return
            for event in events:
                if isinstance(event, Request):
                    if self._handshake is not None:
                        self._handshake.cancel()
                        self._handshake = None
                    if faults.refuse:
                        stats.refused += 1
                        self._out(ws.send(RejectConnection(status_code=503)))
                        await self.writer.drain()
                        return
                    stats.sessions += 1
                    self._out(ws.send(AcceptConnection()))
                    greeting = self.node.opened()
                    self._send_texts(greeting)
                    stats.messages_out += len(greeting)
                    try:
                        events.extend(self._early_frames())
                    except RemoteProtocolError as err:
                        self.violation(f"WebSocket: {err}")
                        await self.writer.drain()
                        return
                elif isinstance(event, TextMessage):
                    self.size += len(event.data)
                    if self.size > MAX_MESSAGE:
                        self.close(CloseReason.MESSAGE_TOO_BIG, f"message over {MAX_MESSAGE} bytes")
                        break
                    self.parts.append(event.data)
                    if not event.message_finished:
                        continue
                    text = "".join(self.parts) if len(self.parts) > 1 else self.parts[0]
                    self.parts.clear()
                    self.size = 0
                    self.received += 1
                    stats.messages_in += 1
                    if faults.drop_after and self.received >= faults.drop_after:
                        stats.dropped += 1
                        self.writer.transport.abort()
                        return
                    out = self.node.receive(text)
                    if out.violation is not None:
                        self.violation(out.violation)
                    if out.internal is not None:
                        stats.internal_errors += 1
                        self.server.log(f"session {self.node.ident}: internal error: {out.internal}")
                    if faults.delay:
                        await self.writer.drain()
                        await asyncio.sleep(faults.delay)
                    self._send_texts(out.replies)
                    stats.messages_out += len(out.replies)
                    for target, push in out.deliveries:
                        target.connection.deliver(push)
                    if out.close:
                        self.close(CloseReason.NO_STATUS_RCVD)  # the prototype's Close(None): 88 00
                        break
                elif isinstance(event, BytesMessage):
                    self.violation("binary frame (RFC 0019: text frames only); closed with 1003")
                    self.close(CloseReason.UNSUPPORTED_DATA, "binary frames are not part of the protocol")
                    break
                elif isinstance(event, CloseConnection):
                    if ws.state is ConnectionState.REMOTE_CLOSING:
                        self._out(ws.send(event.response()))
                    elif ws.state is ConnectionState.OPEN:
                        # wsproto's word for a frame it cannot parse: fail the connection (RFC 6455 7.1.7),
                        # a Close frame with its code, then hang up without waiting for an answer.
                        self.violation(f"WebSocket: {event.reason} (closed with {event.code})")
                        self._out(ws.send(CloseConnection(code=event.code, reason=event.reason)))
                        await self.writer.drain()
                        return
                    self.closing = True
                    break
                elif isinstance(event, Ping):
                    self._out(ws.send(event.response()))
            await self.writer.drain()
            if self.closing or not data:
                if self.closing and ws.state is not ConnectionState.CLOSED:
                    await self._await_close()
                return

    def _early_frames(self) -> list:
        """Frames that came in the same reads as the upgrade request, judged and then answered.

        RFC 6455 4.1 has a client wait for the 101 before it sends; one that does not has broken
        that rule, which is reported, but its frames are answered as if they came after the 101,
        as wsproto-based and most other servers do. (wsproto's server keeps the bytes after the
        request in its HTTP parser and drops them at the accept: they are taken from there.)
        """
        http = getattr(self.ws.handshake, "_h11_connection", None)
        early = http.trailing_data[0] if http is not None else b""
        if not early:
            return []
        self.violation(
            f"{len(early)} bytes came after the upgrade request before the node's 101 (RFC 6455 4.1: "
            "the client must wait for the handshake's answer before it sends); answered as if after it"
        )
        self.ws.receive_data(bytes(early))
        return list(self.ws.events())

    async def _await_close(self) -> None:
        """After our close frame, the client's answers it; wait a little for it, then hang up."""
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError, RemoteProtocolError):
            async with asyncio.timeout(5):
                while self.ws.state is not ConnectionState.CLOSED:
                    data = await self.reader.read(_READ)
                    self.ws.receive_data(data or None)
                    for _ in self.ws.events():
                        pass
                    if not data:
                        return


# --------------------------------------------------------------------------- the client


class ClientError(Exception):
    """The client could not run its exchange (refused, connection lost, timed out)."""


@dataclass
class Step:
    """One message the client sent and what came back for it."""

    sent: str
    verdict: str
    replies: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class MockClient:
    """One session over a blocking socket; every server message is judged by ``core.Session``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float = 10.0,
        record: PcapWriter | None = None,
        path: str = "/",
    ) -> None:
        self.host, self.port, self.timeout, self.path = host, port, timeout, path
        self.session = Session()
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock: socket.socket | None = None
        self.pcap: TcpSession | None = None
        self._recorder = record
        self.inbox: list[str] = []
        self._parts: list[str] = []  # a text message arriving in pieces
        self._size = 0
        self.problems: list[str] = []
        self.sent = 0
        self.received = 0
        self.closed_by_server: int | None = None
        self.ws_closed = False
        self.accepted = False
        #: The TCP connection was made: what goes wrong after it is the node's doing.
        self.reached = False
        self.refused_status: int | None = None
        #: A line per step of the connection worth seeing (none unless set).
        self.trace: Callable[[str], None] = lambda line: None

    # bytes ----------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.pcap is not None:
            self.pcap.send(True, data)
        self.sock.settimeout(self.timeout)
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise ClientError(f"the node read none of our bytes for {self.timeout:g} s") from None
        except OSError as err:
            raise ClientError(f"connection lost while sending: {err.strerror or err}") from None

    def _read(self, deadline: float) -> bool:
        """Read what is there; False at EOF."""
        left = deadline - time.monotonic()
        waiting = self.session.expects().text if self.accepted else "its answer to the upgrade"
        if left <= 0:
            raise ClientError(f"timed out waiting for the server ({waiting})")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(_READ)
        except TimeoutError:
            raise ClientError(f"timed out waiting for the server ({waiting})") from None
        except OSError as err:
            raise ClientError(f"connection lost: {err.strerror or err}") from None
        if self.pcap is not None and data:
            self.pcap.send(False, data)
        if not data and not self.accepted:
            raise ClientError("the node closed the connection during the upgrade")
        try:
            self.ws.receive_data(data or None)
        except RemoteProtocolError as err:
            raise ClientError(f"server broke WebSocket: {err}") from None
        self._events()
        return bool(data)

    def _events(self) -> None:
        parts = self._parts
        for event in self.ws.events():
            if isinstance(event, AcceptConnection):
                self.accepted = True
                self.trace("the node accepted the WebSocket upgrade")
            elif isinstance(event, RejectConnection):
                self.refused_status = event.status_code
            elif isinstance(event, TextMessage):
                self._size += len(event.data)
                if self._size > MAX_REPLY:
                    self._fail(CloseReason.MESSAGE_TOO_BIG, f"the node sent a message over {MAX_REPLY} bytes")
                parts.append(event.data)
                if event.message_finished:
                    self.inbox.append("".join(parts))
                    parts.clear()
                    self._size = 0
            elif isinstance(event, BytesMessage):
                self._fail(
                    CloseReason.UNSUPPORTED_DATA, "the node sent a binary frame (RFC 0019: text frames only)"
                )
            elif isinstance(event, CloseConnection):
                self.closed_by_server = event.code
                self.ws_closed = True
                with contextlib.suppress(LocalProtocolError):
                    self._write(self.ws.send(event.response()))
            elif isinstance(event, Ping):
                self._write(self.ws.send(event.response()))

    def _fail(self, code: CloseReason, reason: str) -> None:
        """The node broke a rule of the connection: close it with ``code`` and give up."""
        self._parts.clear()
        with contextlib.suppress(ClientError, LocalProtocolError):
            self._write(self.ws.send(CloseConnection(code=code)))
        raise ClientError(f"{reason}; closed with {int(code)}")

    # session --------------------------------------------------------------------------

    def connect(self) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as err:
            raise ClientError(f"cannot connect to {self.host}:{self.port}: {err.strerror or err}") from None
        self.reached = True
        self.trace(f"connected to {self.host}:{self.port}")
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._recorder is not None:
            local = self.sock.getsockname()
            peer = self.sock.getpeername()
            self.pcap = self._recorder.tcp_session(_v4(local), _v4(peer))
        self._write(self.ws.send(Request(host=f"{self.host}:{self.port}", target=self.path)))
        while not self.accepted:
            if self.refused_status is not None:
                raise ClientError(f"the node refused the upgrade (HTTP {self.refused_status})")
            if not self._read(deadline):
                raise ClientError("the node closed the connection during the upgrade")

    def send(self, value: Any) -> Step:
        """Send one message (a JSON value or raw text) and judge it as the client's."""
        text = value if isinstance(value, str) else dumps(value)
        if self.session.state == "closed" and self.session.error_close is not None:
            raise ClientError(f"the node closed the session: {self.session.error_close}")
        if self.ws.state is not ConnectionState.OPEN:
            raise ClientError("the connection is closed")
        verdict = self.session.feed(CLIENT, text)
        self._write(self.ws.send(TextMessage(data=text)))
        self.sent += 1
        return Step(
            text,
            verdict.type if verdict.ok else f"{verdict.type}: violation {verdict.code}: {verdict.reason}",
        )

    def receive(self, until: Callable[[], bool], deadline: float, step: Step | None = None) -> None:
        """Judge server messages until ``until()`` holds (or the server closed)."""
        while True:
            while self.inbox:
                text = self.inbox.pop(0)
                self.received += 1
                verdict = self.session.feed(SERVER, text)
                if step is not None:
                    step.replies.append(text)
                if not verdict.ok:
                    if step is not None:
                        step.problems.append(verdict.reason)
                    raise ClientError(f"the node broke the protocol: {verdict.reason}")
            if until() or self.ws_closed:
                return
            if not self._read(deadline):
                self.ws_closed = True
                return

    def settle(self, step: Step | None = None) -> None:
        """Wait until the server owes nothing."""
        session = self.session

        def settled() -> bool:  # after a violation of ours, the server's error close is due
            return session.owed() == 0 and (session.failed is None or session.state == "closed")

        self.receive(settled, time.monotonic() + self.timeout, step)

    def close(self) -> None:
        """Close the WebSocket (if still open) and the socket."""
        with contextlib.suppress(ClientError, LocalProtocolError):
            if self.ws.state is ConnectionState.OPEN:
                self._write(self.ws.send(CloseConnection(code=CloseReason.NORMAL_CLOSURE)))
                deadline = time.monotonic() + self.timeout
                while self.ws.state is not ConnectionState.CLOSED and self._read(deadline):
                    pass
        if self.pcap is not None:
            self.pcap.close(True)
        if self.sock is not None:
            self.sock.close()


def _v4(address: tuple) -> tuple[str, int]:
    host = address[0]
    return (host if "." in host else "127.0.0.1"), address[1]


# --------------------------------------------------------------------------- exchanges


@dataclass
class ExchangeResult:
    steps: list[Step] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    sent: int = 0
    received: int = 0
    echoes: int = 0
    published: int = 0
    delivered: int = 0
    seconds: float = 0.0
    error_close: str | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        rate = self.sent / self.seconds if self.seconds else 0.0
        return {
            "ok": not self.failures,
            "sent": self.sent,
            "received": self.received,
            "echoes": self.echoes,
            "published": self.published,
            "delivered": self.delivered,
            "seconds": round(self.seconds, 6),
            "messages_per_second": round(rate, 1),
            "error_close": self.error_close,
            "failures": self.failures,
            "notes": self.notes,
            "steps": [s.__dict__ for s in self.steps],
        }


def generated_exchange(
    client: MockClient, messages: int, window: int, payload: int, publish: int, seed: int = 1
) -> ExchangeResult:
    """Echo ``messages`` values (``window`` in flight), publish ``publish`` events to ourselves, close."""
    result = ExchangeResult()
    t0 = time.perf_counter()
    client.connect()
    try:
        _generated(client, result, messages, window, payload, publish, seed)
    except ClientError as err:
        result.failures.append(str(err))
    return _finish(client, result, t0)


def _generated(
    client: MockClient,
    result: ExchangeResult,
    messages: int,
    window: int,
    payload: int,
    publish: int,
    seed: int,
) -> None:
    rng = random.Random(seed)
    url = "/pipeline/mock/out"
    for value in (
        {CONTROL: {"connect": {"protocol": "echo", "alias": "echo"}}},
        {
            CONTROL: {
                "connect": {
                    "protocol": "pubsub",
                    "alias": "ps",
                    "properties": {"subscriptions": [url], "publications": [url]},
                }
            }
        },
    ):
        step = client.send(value)
        client.settle(step)
        result.steps.append(step)
    filler = "x" * payload
    sent = 0
    stream = client.session.streams.get("echo")
    while sent < messages and stream is not None:
        burst = min(window - len(stream.pending), messages - sent)
        if burst > 0:
            texts = [
                dumps({"echo": {"n": sent + i, "r": rng.randrange(1 << 30), "p": filler}})
                for i in range(burst)
            ]
            for text in texts:
                client.send(text)
            sent += burst
        deadline = time.monotonic() + client.timeout
        client.receive(lambda: len(stream.pending) < window // 2 + 1 or not stream.pending, deadline)
        if client.ws_closed:
            break
    client.settle()
    result.echoes = sent
    before = client.received
    for i in range(publish):
        client.send({"ps": {"send": {"to": url, "data": {"event": i}}}})
    result.published = publish
    deadline = time.monotonic() + client.timeout
    with contextlib.suppress(ClientError):
        client.receive(lambda: client.received - before >= publish, deadline)
    result.delivered = client.received - before
    if result.delivered < publish:
        result.failures.append(f"pubsub: {result.delivered} of {publish} published events came back")
    for value in (
        {"ps": "list"},
        {"ps": {"unsubscribe": [url]}},
        {CONTROL: {"disconnect": {"alias": "ps"}}},
        {CONTROL: {"disconnect": "echo"}},
        {CONTROL: "close"},
    ):
        step = client.send(value)
        result.steps.append(step)
        client.settle(step)


def scripted_exchange(client: MockClient, script: Iterable[tuple[int, str]]) -> ExchangeResult:
    """Send each script line in turn and judge what comes back before the next."""
    result = ExchangeResult()
    t0 = time.perf_counter()
    client.connect()
    for number, line in script:
        if client.ws_closed or client.session.state == "closed":
            why = f"line {number} and on not sent: the node closed the session"
            if client.session.failed is not None and client.session.error_close is not None:
                result.notes.append(f"{why} (as it must after the script's violation)")
            else:
                result.failures.append(why)
            break
        step = client.send(line)
        step.sent = f"{number}: {step.sent}"
        result.steps.append(step)
        try:
            client.settle(step)
        except ClientError as err:
            result.failures.append(f"line {number}: {err}")
            break
    return _finish(client, result, t0)


def _finish(client: MockClient, result: ExchangeResult, t0: float) -> ExchangeResult:
    client.close()
    result.seconds = time.perf_counter() - t0
    result.sent, result.received = client.sent, client.received
    result.error_close = client.session.error_close
    result.failures.extend(client.problems)
    if client.session.owed():
        result.failures.append(f"unanswered: {client.session.expects().text}")
    if client.session.failed is not None and client.session.error_close is None:
        result.failures.append(
            f"the client broke the protocol ({client.session.failed}) and the server did not close"
        )
    return result


def read_script(lines: Iterable[bytes | str]) -> list[tuple[int, str]]:
    """A script: one message per line (JSON, sent as written); blank lines and ``#`` comments skipped.

    ``ValueError`` names the line and byte of one that is not UTF-8 (a text frame must be).
    """
    out = []
    for number, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"line {number}: not UTF-8 (byte {err.start + 1} of the line)") from None
        text = line.strip()
        if text and not text.startswith("#"):
            out.append((number, text))
    return out


__all__ = [
    "DEFAULT_PORT",
    "ClientError",
    "ExchangeResult",
    "Faults",
    "MockClient",
    "MockNode",
    "generated_exchange",
    "read_script",
    "scripted_exchange",
]
