"""``conformance node HOST:PORT``: play Tremor clients against a node under test.

Each case opens its own WebSocket sessions with fresh aliases and URLs. What the
node sends goes through ``core.Session``, which foretells every answer (the
connect-ack naming protocol and alias, the echo of the very value, the pub/sub
acks and lists), so a wrong reply fails with the core's reason. Every case that
expects the node to end a session first opens a bystander session holding an
echo stream, and afterwards checks that the bystander still gets its echoes and
that a new session still connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.conformance.probes import ProbeKeeper
from wallaroo_proto.conformance.runner import Case, CaseFailed, Target, Trace
from wallaroo_proto.conformance.target import parse_address, reachable

from ..messages import CONTROL, STATUS, ErrorClose, dumps
from ..wsframes import BINARY, TEXT, read_response
from .probe import NodeProbe, client_frame

RFC = "RFC 0019"
WS = "RFC 6455"
PROTO = "prototype"


def tag() -> str:
    return f"{random.getrandbits(32):08x}"


def connect(protocol: str | None, alias: str | None = None, **extra: Any) -> dict:
    body: dict[str, Any] = {} if protocol is None else {"protocol": protocol}
    if alias is not None:
        body["alias"] = alias
    body.update(extra)
    return {CONTROL: {"connect": body}}


@dataclass
class NodeUnderTest(ProbeKeeper):
    host: str
    port: int
    probes: list[NodeProbe] = field(default_factory=list)

    async def session(self, trace: Trace, label: str = "s1") -> NodeProbe:
        probe = await NodeProbe.open(self.host, self.port, trace, label)
        self.probes.append(probe)
        return probe

    async def stream(self, probe: NodeProbe, protocol: str = "echo", **extra: Any) -> str:
        """Connect a stream of a fresh alias; its connect-ack judged by the core."""
        alias = f"{protocol}-{tag()}"
        probe.send(connect(protocol, alias, **extra))
        await probe.expect("connect-ack")
        return alias

    async def echo(self, probe: NodeProbe, alias: str, value: Any) -> None:
        probe.send({alias: value})
        await probe.expect("echo")

    async def bystander(self, trace: Trace) -> tuple[NodeProbe, str]:
        """A session holding an echo stream, opened before a case misbehaves on another one."""
        probe = await self.session(trace, "bystander")
        return probe, await self.stream(probe)

    async def still_serving(self, trace: Trace, bystander: tuple[NodeProbe, str]) -> str:
        """The bystander still gets its echo, and a new session connects and echoes."""
        probe, alias = bystander
        await self.echo(probe, alias, {"still": "here"})
        newcomer = await self.session(trace, "newcomer")
        await self.echo(newcomer, await self.stream(newcomer), "hello again")
        return "the node still served another session and a new one"


# --- shared shapes of a case ---------------------------------------------------------------------------


async def expect_error_close(probe: NodeProbe, code: str) -> str:
    """The node's next message is the error close with ``code``, then the WebSocket ends."""
    probe.trace(f"   waiting for the error close {code}")
    try:
        verdict = await probe.message()
    except CaseFailed as failed:
        if probe.closed is not None:
            raise CaseFailed(
                f"the node {probe.closed.how} without the error close {code}", failed.seen
            ) from None
        raise
    message = verdict.message
    if not isinstance(message, ErrorClose):
        raise CaseFailed(f"{verdict.type} where the error close {code} was due", probe.trace.tail())
    if message.code != code:
        raise CaseFailed(
            f"error close {message.text!r}, expected code {code} ({STATUS[code]})", probe.trace.tail()
        )
    probe.trace("   waiting for the node to end the WebSocket")
    closed = await probe.closes()
    return f"error close {message.text!r}, then the node {closed.how}"


async def _refused(
    ctx: NodeUnderTest, trace: Trace, code: str, misbehave: Callable[[NodeProbe], Awaitable[None]]
) -> str:
    """A session that ``misbehave``s gets the error close ``code``; the others are still served."""
    bystander = await ctx.bystander(trace)
    probe = await ctx.session(trace)
    await misbehave(probe)
    seen = await expect_error_close(probe, code)
    return f"{seen}; " + await ctx.still_serving(trace, bystander)


def _sends(*values: Any) -> Callable[[NodeProbe], Awaitable[None]]:
    async def misbehave(probe: NodeProbe) -> None:
        for value in values:
            probe.send(value)

    return misbehave


async def _closes_on_frame(ctx: NodeUnderTest, trace: Trace, frame: bytes, what: str) -> str:
    """A session that sends ``frame`` on a connected echo stream is closed, its frame never answered."""
    bystander = await ctx.bystander(trace)
    probe = await ctx.session(trace)
    await ctx.stream(probe)
    probe.send_raw(frame, what)
    probe.trace("   waiting for the node to close the connection")
    try:
        closed = await probe.closes_unanswered()
    except CaseFailed as failed:
        raise CaseFailed(
            f"the node took the {what} and answered it instead of closing", failed.seen
        ) from None
    return f"the node {closed.how}; " + await ctx.still_serving(trace, bystander)


# --- the upgrade --------------------------------------------------------------------------------------


async def upgrade_accept(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    response = probe.response
    return f"101 with Sec-WebSocket-Accept {response.accept if response else '?'} (the key's)"


async def upgrade_version(ctx: NodeUnderTest, trace: Trace) -> str:
    reader, writer = await asyncio.open_connection(ctx.host, ctx.port)
    try:
        request = (
            f"GET / HTTP/1.1\r\nHost: {ctx.host}:{ctx.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n"
        )
        writer.write(request.encode())
        trace("s1 -> GET / (upgrade, Sec-WebSocket-Version: 8)")
        trace("   waiting for the HTTP response")
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            raise CaseFailed(
                "the node closed the connection without an HTTP response", trace.tail()
            ) from None
    finally:
        writer.transport.abort()
    response = read_response(head, None)
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    trace(f"s1 <- {status_line}")
    if response.status is None:
        raise CaseFailed("; ".join(response.problems), trace.tail())
    if response.status == 101:
        raise CaseFailed("the node switched protocols for WebSocket version 8", trace.tail())
    versions = [
        line.partition(b":")[2].strip()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-version:")
    ]
    if not any(b"13" in v.split(b",") or v == b"13" for v in versions):
        raise CaseFailed(
            f"HTTP {response.status} without a Sec-WebSocket-Version header naming 13", trace.tail()
        )
    return f"HTTP {response.status} with Sec-WebSocket-Version: 13"


async def upgrade_greeting(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    await ctx.stream(probe)
    if probe.greeting is None:
        raise CaseFailed("the first message is the connect-ack, not the version announcement", trace.tail())
    return f"announced version {probe.greeting.version!r}"


# --- the control plane --------------------------------------------------------------------------------


async def control_version(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    await ctx.stream(probe)  # past any announcement
    probe.send({CONTROL: "version"})
    answer = await probe.expect("version-info")
    return f"version {answer.message.version!r}"


async def connect_echo(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    alias = await ctx.stream(probe)
    return f"connect-ack for {alias!r}"


async def connect_pubsub(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    url = f"/pipeline/conformance-{tag()}/out"
    alias = await ctx.stream(probe, "pubsub", properties={"subscriptions": [url]})
    probe.send({alias: "list"})
    await probe.expect("pubsub:list")
    return f"connect-ack for {alias!r}; list names {url}"


async def connect_default_alias(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    probe.send(connect("echo"))
    ack = await probe.expect("connect-ack")
    await ctx.echo(probe, "echo", "beep")
    return f"connect-ack for alias {ack.alias!r}; it echoes"


async def connect_alias_taken(ctx: NodeUnderTest, trace: Trace) -> str:
    async def misbehave(probe: NodeProbe) -> None:
        alias = await ctx.stream(probe)
        probe.send(connect("pubsub", alias))

    return await _refused(ctx, trace, "0.206", misbehave)


async def connect_control_alias(ctx: NodeUnderTest, trace: Trace) -> str:
    return await _refused(ctx, trace, "0.206", _sends(connect("echo", CONTROL)))


async def connect_unknown_protocol(ctx: NodeUnderTest, trace: Trace) -> str:
    return await _refused(ctx, trace, "0.200", _sends(connect(f"no-such-{tag()}", f"x-{tag()}")))


async def connect_no_protocol(ctx: NodeUnderTest, trace: Trace) -> str:
    return await _refused(ctx, trace, "0.201", _sends(connect(None, f"x-{tag()}")))


# --- echo ---------------------------------------------------------------------------------------------

ECHO_VALUES = (
    "beep",
    {"beep": "boop"},
    42,
    -3.5,
    True,
    None,
    [1, "two", {"three": [3]}],
    {"nested": {"deep": [1, 2, {"k": "v"}], "empty": {}}},
    "ünïcödé ✓ 🐉",
    "",
)


async def echo_same(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    alias = await ctx.stream(probe)
    for value in ECHO_VALUES:
        probe.send({alias: value})
    await probe.settle()
    return f"{len(ECHO_VALUES)} values of every JSON kind came back unchanged, in order"


async def echo_multiplexed(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    first, second = await ctx.stream(probe), await ctx.stream(probe)
    for n in range(3):
        probe.send({first: {"n": n}})
        probe.send({second: {"n": -n}})
    await probe.settle()
    return "two echo streams on one session answered under their own aliases"


async def echo_large(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    alias = await ctx.stream(probe)
    text = "".join(random.choice("abcdefghij") for _ in range(70_000))
    probe.send({alias: text})
    await probe.expect("echo")
    return "a 70,000-character message (64-bit length) came back unchanged"


# --- pub/sub ------------------------------------------------------------------------------------------


async def pubsub_subscribe(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    alias = await ctx.stream(probe, "pubsub")
    url = f"/pipeline/conformance-{tag()}/out"
    probe.send({alias: {"subscribe": [url]}})
    await probe.expect("pubsub:subscribe-ack")
    probe.send({alias: "list"})
    await probe.expect("pubsub:list")
    return f"subscribe-ack [{url}]; list names it"


async def pubsub_data(ctx: NodeUnderTest, trace: Trace) -> str:
    url = f"/pipeline/conformance-{tag()}/out"
    subscriber = await ctx.session(trace, "sub")
    sub = await ctx.stream(subscriber, "pubsub")
    subscriber.send({sub: {"subscribe": [url]}})
    await subscriber.expect("pubsub:subscribe-ack")
    publisher = await ctx.session(trace, "pub")
    pub = await ctx.stream(publisher, "pubsub")
    publisher.send({pub: {"publish": [url]}})
    await publisher.expect("pubsub:publish-ack")
    event = {"event": tag(), "n": 1}
    publisher.send({pub: {"send": {"to": url, "data": event}}})
    trace("   waiting for the event on the subscriber's stream")
    pushed = await subscriber.expect("pubsub:data")
    data = pushed.message.value.get("data")
    if data != event:
        raise CaseFailed(f"the event arrived as {data!r}, not as sent ({event!r})", trace.tail())
    return f"the event sent to {url} reached the subscriber's stream {sub!r} unchanged"


async def pubsub_strict_unsubscribe(ctx: NodeUnderTest, trace: Trace) -> str:
    async def misbehave(probe: NodeProbe) -> None:
        alias = await ctx.stream(probe, "pubsub")
        probe.send({alias: {"unsubscribe": [f"/pipeline/never-{tag()}/out"]}})

    return await _refused(ctx, trace, "2.201", misbehave)


# --- disconnect and close -----------------------------------------------------------------------------


async def disconnect_ack(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    alias = await ctx.stream(probe)
    probe.send({CONTROL: {"disconnect": {"alias": alias}}})
    await probe.expect("disconnect-ack")
    probe.send(connect("echo", alias))
    await probe.expect("connect-ack")
    await ctx.echo(probe, alias, "again")
    return f"disconnect-ack for {alias!r}; the alias connected again and echoes"


async def disconnect_rfc_form(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    alias = await ctx.stream(probe)
    probe.send({CONTROL: {"disconnect": alias}})
    await probe.expect("disconnect-ack")
    return f"disconnect-ack for {alias!r}"


async def disconnect_then_message(ctx: NodeUnderTest, trace: Trace) -> str:
    async def misbehave(probe: NodeProbe) -> None:
        alias = await ctx.stream(probe)
        keep = await ctx.stream(probe)  # the session stays active: only the stream is gone
        probe.send({CONTROL: {"disconnect": {"alias": alias}}})
        await probe.expect("disconnect-ack")
        await ctx.echo(probe, keep, "still connected")
        probe.send({alias: "after the disconnect"})

    return await _refused(ctx, trace, "0.207", misbehave)


async def disconnect_not_connected(ctx: NodeUnderTest, trace: Trace) -> str:
    async def misbehave(probe: NodeProbe) -> None:
        await ctx.stream(probe)
        probe.send({CONTROL: {"disconnect": {"alias": f"never-{tag()}"}}})

    return await _refused(ctx, trace, "0.207", misbehave)


async def stream_not_connected(ctx: NodeUnderTest, trace: Trace) -> str:
    async def misbehave(probe: NodeProbe) -> None:
        await ctx.stream(probe)
        probe.send({f"never-{tag()}": "hello"})

    return await _refused(ctx, trace, "0.207", misbehave)


async def close_ack(ctx: NodeUnderTest, trace: Trace) -> str:
    bystander = await ctx.bystander(trace)
    probe = await ctx.session(trace)
    await ctx.stream(probe)
    probe.send({CONTROL: "close"})
    await probe.expect("close-ack")
    probe.trace("   waiting for the node to end the WebSocket")
    closed = await probe.closes()
    return f"close-ack, then the node {closed.how}; " + await ctx.still_serving(trace, bystander)


# --- malformed messages -------------------------------------------------------------------------------


async def malformed_json(ctx: NodeUnderTest, trace: Trace) -> str:
    return await _refused(ctx, trace, "0.101", _sends('{"tremor": {"connect": '))


async def malformed_not_record(ctx: NodeUnderTest, trace: Trace) -> str:
    return await _refused(ctx, trace, "0.203", _sends('["tremor", "connect"]'))


async def malformed_two_keys(ctx: NodeUnderTest, trace: Trace) -> str:
    return await _refused(ctx, trace, "0.205", _sends({CONTROL: "version", "echo": "beep"}))


async def malformed_unknown_op(ctx: NodeUnderTest, trace: Trace) -> str:
    return await _refused(ctx, trace, "0.202", _sends({CONTROL: "dance"}))


# --- WebSocket framing --------------------------------------------------------------------------------


async def framing_ping(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    payload = f"conformance-{tag()}".encode()
    probe.ping(payload)
    pong = await probe.pong()
    if pong != payload:
        raise CaseFailed(f"Pong carries {pong!r}, not the Ping's {payload!r}", trace.tail())
    return f"Pong with the Ping's {len(payload)} bytes"


async def framing_fragmented(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    alias = await ctx.stream(probe)
    text = dumps({alias: {"fragmented": "x" * 300}})
    ping = b"between fragments"
    probe.send_fragments(text, 3, ping=ping)
    await probe.expect("echo")
    if ping not in probe.pongs:
        trace("   waiting for the Pong")
        if await probe.pong() != ping:
            raise CaseFailed("the Pong does not carry the Ping's data", trace.tail())
    return "a message in 3 fragments came back whole; the Ping between them got its Pong"


async def framing_unmasked(ctx: NodeUnderTest, trace: Trace) -> str:
    frame = client_frame(TEXT, b'{"echo":"unmasked"}', mask=False)
    return await _closes_on_frame(ctx, trace, frame, "unmasked text frame")


async def framing_binary(ctx: NodeUnderTest, trace: Trace) -> str:
    frame = client_frame(BINARY, b'{"echo":"binary"}')
    return await _closes_on_frame(ctx, trace, frame, "binary frame")


async def framing_invalid_utf8(ctx: NodeUnderTest, trace: Trace) -> str:
    frame = client_frame(TEXT, b'{"echo":"\xc3\x28"}')
    return await _closes_on_frame(ctx, trace, frame, "text frame that is not UTF-8")


async def framing_reserved_opcode(ctx: NodeUnderTest, trace: Trace) -> str:
    frame = client_frame(0x3, b'{"echo":"reserved"}')
    return await _closes_on_frame(ctx, trace, frame, "frame of reserved opcode 0x3")


async def framing_close(ctx: NodeUnderTest, trace: Trace) -> str:
    probe = await ctx.session(trace)
    await ctx.stream(probe)
    probe.close_frame(1000, "conformance")
    probe.trace("   waiting for the node's Close frame")
    closed = await probe.closes()
    if closed.how.startswith("closed the TCP"):
        raise CaseFailed("the node dropped the connection without answering with a Close frame", trace.tail())
    return f"the node {closed.how}"


def _case(id_: str, ref: str, expect: str, run) -> Case:
    return Case(id_, ref, expect, run)


CASES = (
    _case(
        "upgrade.accept",
        f"{WS}: 4.2.2",
        "an upgrade request gets 101 with the Sec-WebSocket-Accept of its key",
        upgrade_accept,
    ),
    _case(
        "upgrade.version",
        f"{WS}: 4.2.2",
        "an upgrade asking WebSocket version 8 is refused with Sec-WebSocket-Version: 13",
        upgrade_version,
    ),
    _case(
        "upgrade.greeting",
        f"{PROTO}: version on connect",
        'the first message after the upgrade announces the version ({"tremor":{"version":..}})',
        upgrade_greeting,
    ),
    _case(
        "control.version",
        f"{RFC}: version",
        '{"tremor":"version"} is answered with the version',
        control_version,
    ),
    _case(
        "connect.echo",
        f"{PROTO}: connect-ack",
        "a connect of echo gets a connect-ack naming its protocol and alias",
        connect_echo,
    ),
    _case(
        "connect.pubsub",
        "RFC 0020: connect properties",
        "a pubsub connect with subscriptions gets its connect-ack, and list names them",
        connect_pubsub,
    ),
    _case(
        "connect.default-alias",
        f"{RFC}: connect",
        "a connect without an alias takes the protocol's name as its alias",
        connect_default_alias,
    ),
    _case(
        "connect.alias-taken",
        f"{RFC}: connect",
        "a connect of an alias already connected gets the error close 0.206",
        connect_alias_taken,
    ),
    _case(
        "connect.control-alias",
        f"{PROTO}: status codes",
        'a connect with the alias "tremor" gets the error close 0.206',
        connect_control_alias,
    ),
    _case(
        "connect.unknown-protocol",
        f"{PROTO}: status codes",
        "a connect of an unknown protocol gets the error close 0.200",
        connect_unknown_protocol,
    ),
    _case(
        "connect.no-protocol",
        f"{PROTO}: status codes",
        "a connect without a protocol gets the error close 0.201",
        connect_no_protocol,
    ),
    _case(
        "echo.same", "RFC 0021: echo", "values of every JSON kind come back unchanged, in order", echo_same
    ),
    _case(
        "echo.multiplexed",
        f"{RFC}: streams",
        "two echo streams on one session each answer under their own alias",
        echo_multiplexed,
    ),
    _case(
        "echo.large",
        f"{WS}: 5.2",
        "a 70,000-character message (64-bit length) comes back unchanged",
        echo_large,
    ),
    _case(
        "pubsub.subscribe",
        f"{PROTO}: pubsub",
        "subscribe gets subscribe-ack with the URL, and list names it",
        pubsub_subscribe,
    ),
    _case(
        "pubsub.data",
        f"{PROTO}: pubsub",
        "an event sent to a URL reaches another session's stream subscribed to it, as data",
        pubsub_data,
    ),
    _case(
        "pubsub.strict-unsubscribe",
        "RFC 0020: pubsub",
        "unsubscribing a URL never subscribed gets the error close 2.201",
        pubsub_strict_unsubscribe,
    ),
    _case(
        "disconnect.ack",
        f"{PROTO}: disconnect-ack",
        "a disconnect gets a disconnect-ack, and the alias can be connected again",
        disconnect_ack,
    ),
    _case(
        "disconnect.rfc-form",
        f"{RFC}: disconnect",
        'a disconnect naming the alias as a bare string ({"disconnect":"a"}) gets a disconnect-ack',
        disconnect_rfc_form,
    ),
    _case(
        "disconnect.then-message",
        f"{PROTO}: status codes",
        "a message on a stream after its disconnect gets the error close 0.207",
        disconnect_then_message,
    ),
    _case(
        "disconnect.not-connected",
        f"{PROTO}: status codes",
        "a disconnect of an alias never connected gets the error close 0.207",
        disconnect_not_connected,
    ),
    _case(
        "stream.not-connected",
        f"{PROTO}: status codes",
        "a message on an alias never connected gets the error close 0.207",
        stream_not_connected,
    ),
    _case(
        "close.ack",
        f"{PROTO}: close",
        '{"tremor":"close"} gets close-ack "ok", then the node ends the WebSocket',
        close_ack,
    ),
    _case(
        "malformed.json",
        f"{RFC}: streams",
        "a text that is not JSON gets the error close 0.101",
        malformed_json,
    ),
    _case(
        "malformed.not-record",
        f"{PROTO}: status codes",
        "a JSON value that is not a record gets the error close 0.203",
        malformed_not_record,
    ),
    _case(
        "malformed.two-keys",
        f"{PROTO}: status codes",
        "a record of two keys gets the error close 0.205",
        malformed_two_keys,
    ),
    _case(
        "malformed.unknown-op",
        f"{PROTO}: status codes",
        "an unknown control operation gets the error close 0.202",
        malformed_unknown_op,
    ),
    _case("framing.ping", f"{WS}: 5.5.2", "a Ping gets a Pong with the same data", framing_ping),
    _case(
        "framing.fragmented",
        f"{WS}: 5.4",
        "a text message in 3 fragments, a Ping between them, comes back whole; the Ping gets its Pong",
        framing_fragmented,
    ),
    _case(
        "framing.unmasked",
        f"{WS}: 5.1",
        "an unmasked client frame makes the node close the connection, unanswered",
        framing_unmasked,
    ),
    _case(
        "framing.binary",
        f"{RFC}: drivers",
        "a binary frame makes the node close the connection, unanswered",
        framing_binary,
    ),
    _case(
        "framing.invalid-utf8",
        f"{WS}: 8.1",
        "a text frame that is not UTF-8 makes the node close the connection, unanswered",
        framing_invalid_utf8,
    ),
    _case(
        "framing.reserved-opcode",
        f"{WS}: 5.2",
        "a frame of a reserved opcode makes the node close the connection, unanswered",
        framing_reserved_opcode,
    ),
    _case("framing.close", f"{WS}: 5.5.1", "a Close frame is answered with a Close frame", framing_close),
)


@contextlib.asynccontextmanager
async def open_node(target: Target, options: Mapping[str, Any]) -> AsyncIterator[NodeUnderTest]:
    host, port = parse_address(target.address or "")
    await reachable(host, port)
    ctx = NodeUnderTest(host, port)
    try:
        yield ctx
    finally:
        ctx.abort_all()
