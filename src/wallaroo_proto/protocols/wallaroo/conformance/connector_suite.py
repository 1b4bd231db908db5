"""``conformance connector -- COMMAND...``: play the worker for a connector source under test.

The suite listens (``--listen HOST:PORT``, or a free loopback port) and, per
case, starts the command with ``{host}`` and ``{port}`` in its arguments filled
in (and ``WALLAROO_PROTO_WORKER=HOST:PORT`` in its environment), then plays the
worker the case needs; the connector is stopped after each case. With
``--listen`` and no command, the connector is started by hand, once per case.
Some rules are about what a connector does *not* do (send before OK, before a
NOTIFY_ACK, beyond its credits); they are watched for ``--window-ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.conformance.runner import (
    FAIL,
    Case,
    CaseFailed,
    Result,
    SuiteOption,
    SuiteUnavailable,
    Target,
    Trace,
)
from wallaroo_proto.conformance.target import parse_address

from ..frames import SOURCE_VERSION, Ack, EosMessage, Error, Hello, Message, Notify, NotifyAck, Ok, Restart
from ..protocol import Side, StreamState, Use, check_hello
from .common import spec
from .probe import PeerClosed, Probe

OUTPUT_LINES = 15
OUTPUT_HEADER = "\nconnector output:\n"


@dataclass
class ConnectorUnderTest:
    command: tuple[str, ...]
    host: str
    port: int
    cookie: bytes | None
    credits: int
    window: float
    dialect: str
    connections: asyncio.Queue = field(default_factory=asyncio.Queue)
    trace: Trace | None = None
    process: asyncio.subprocess.Process | None = None
    output: deque = field(default_factory=lambda: deque(maxlen=OUTPUT_LINES))
    probes: list = field(default_factory=list)
    _count: int = 0
    _reader: asyncio.Task | None = None

    # --- connections ------------------------------------------------------------------

    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.trace is None:  # between cases: nobody is listening for it
            writer.transport.abort()
            return
        self._count += 1
        probe = Probe(
            reader,
            writer,
            use=Use.SOURCE,
            our_side=Side.WORKER,
            trace=self.trace,
            label=f"c{self._count}",
            strict_credits=True,
        )
        self.probes.append(probe)
        self.trace(f"c{self._count} connected from {writer.get_extra_info('peername')}")
        self.connections.put_nowait(probe)

    async def start(self, trace: Trace) -> Probe:
        """Start the connector (unless started by hand) and take its first connection."""
        self.trace = trace
        if self.command:
            args = [
                part.replace("{host}", self.host).replace("{port}", str(self.port)) for part in self.command
            ]
            env = {**os.environ, "WALLAROO_PROTO_WORKER": f"{self.host}:{self.port}"}
            trace(f"   starting {' '.join(args)}")
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *args,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            except OSError as err:
                raise CaseFailed(f"cannot start the connector: {err}") from None
            self.output.clear()
            self._reader = asyncio.create_task(self._keep_output(self.process))
        else:
            trace(f"   waiting for a connector on {self.host}:{self.port}")
        return await self.next_connection(trace)

    async def _keep_output(self, process: asyncio.subprocess.Process) -> None:
        async for line in process.stdout:
            self.output.append(line.decode(errors="replace").rstrip())

    async def next_connection(self, trace: Trace) -> Probe:
        trace("   waiting for a connection")
        get = asyncio.ensure_future(self.connections.get())
        waits = {get}
        if self.process is not None:
            waits.add(asyncio.ensure_future(self.process.wait()))
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also on the case's deadline: a stray get() would take the next case's connection
            for task in waits:
                task.cancel()
        if get in done:
            return get.result()
        raise CaseFailed(
            f"the connector exited with {self.process.returncode} without connecting", self.seen(trace)
        )

    def seen(self, trace: Trace) -> str:
        out = trace.tail()
        if self.output:
            out += OUTPUT_HEADER + "\n".join(f"  | {line}" for line in self.output)
        return out

    async def stop(self) -> int | None:
        """Stop the connector's process group: SIGTERM, then SIGKILL; its exit code."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)
        return process.returncode

    async def after_case(self, case: Case, result: Result) -> Result:
        self.trace = None
        await self.stop()  # first: the connector's last words (a traceback) are read to the end
        if result.status == FAIL and self.output:
            head = result.seen.split(OUTPUT_HEADER)[0]
            result.seen = head + OUTPUT_HEADER + "\n".join(f"  | {line}" for line in self.output)
        for probe in self.probes:
            probe.abort()
        self.probes.clear()
        while not self.connections.empty():
            self.connections.get_nowait().abort()
        return result

    # --- playing the worker -----------------------------------------------------------

    def check_handshake(self, hello: Hello, trace: Trace) -> None:
        reason = check_hello(
            hello, version=SOURCE_VERSION, cookie=self.cookie if self.cookie is not None else hello.cookie
        )
        if reason is not None:
            raise CaseFailed(f"its HELLO would be refused: {reason}", self.seen(trace))

    async def handshake(self, probe: Probe, trace: Trace, credits: int | None = None) -> Hello:
        hello = await probe.expect(Hello)
        self.check_handshake(hello, trace)
        probe.send(Ok(self.credits if credits is None else credits))
        return hello

    async def serve(
        self, probe: Probe, trace: Trace, *, until, notify_point=lambda sid: 0, acks: bool = True
    ) -> None:
        """Answer like a plain worker until ``until(state)`` holds: NOTIFY_ACK success, credit refills, and
        (``acks``) ACKs at the last id of each batch. ``state`` gathers what the connector sent."""
        state = ServeState()
        for record in list(probe.machine.streams.values()):  # NOTIFYs a case read and left unanswered
            if record.state is StreamState.NOTIFY_SENT:
                state.notified.setdefault(record.stream_id, [])
                probe.send(NotifyAck(True, record.stream_id, notify_point(record.stream_id)))
        while not until(state):
            try:
                frame = await probe.recv()
            except PeerClosed:
                raise CaseFailed("closed the connection", self.seen(trace)) from None
            probe.check_clean()
            kind = type(frame)
            if kind is Notify:
                state.notified.setdefault(frame.stream_id, [])
                probe.send(NotifyAck(True, frame.stream_id, notify_point(frame.stream_id)))
            elif kind is Message:
                state.messages += 1
                state.notified.setdefault(frame.stream_id, []).append(frame.message_id)
                if probe.machine.streams[frame.stream_id].replays:
                    state.replays += 1
            elif kind is EosMessage:
                state.eos[frame.stream_id] = frame.message_id
                ids = state.notified.get(frame.stream_id) or [0]
                probe.send(Ack(0, ((frame.stream_id, max(ids)),)))
            if probe.buffered:  # answer a whole batch at once, as a worker does
                continue
            pairs = ()
            if acks:
                pairs = tuple(
                    (sid, max(ids)) for sid, ids in state.notified.items() if ids and sid not in state.eos
                )
            refill = self.credits - probe.machine.credits if probe.machine.credits <= self.credits // 2 else 0
            if refill or pairs:
                probe.send(Ack(refill, pairs))
        return state


@dataclass
class ServeState:
    notified: dict = field(default_factory=dict)
    eos: dict = field(default_factory=dict)
    messages: int = 0
    replays: int = 0


def _open_streams(state: ServeState) -> list[int]:
    return [sid for sid in state.notified if sid not in state.eos]


# --- cases ----------------------------------------------------------------------------------------


async def hello_first(ctx: ConnectorUnderTest, trace: Trace) -> str:
    probe = await ctx.start(trace)
    first = await probe.recv()
    if type(first) is not Hello:
        raise CaseFailed(f"the first frame is {first.TYPE.name}, not HELLO", ctx.seen(trace))
    ctx.check_handshake(first, trace)
    cookie = "the cookie given" if ctx.cookie is not None else "a cookie (not checked: no --cookie)"
    return f"HELLO version {first.version!r} with {cookie}"


async def waits_for_ok(ctx: ConnectorUnderTest, trace: Trace) -> str:
    probe = await ctx.start(trace)
    await probe.expect(Hello)
    early = await probe.quiet(ctx.window)
    if early:
        raise CaseFailed(f"sent {early[0].TYPE.name} before the worker's OK", ctx.seen(trace))
    if probe.closed:
        raise CaseFailed("closed the connection while waiting for OK", ctx.seen(trace))
    probe.send(Ok(ctx.credits))
    frame = await probe.recv()
    probe.check_clean()
    return f"nothing for {ctx.window:g} s after HELLO; after OK, {frame.TYPE.name}"


async def waits_for_notify_ack(ctx: ConnectorUnderTest, trace: Trace) -> str:
    probe = await ctx.start(trace)
    await ctx.handshake(probe, trace)
    notify = await probe.expect(Notify)
    held = [f for f in await probe.quiet(ctx.window) if type(f) is Message]
    probe.check_clean()
    if held:
        raise CaseFailed("sent a MESSAGE before the NOTIFY_ACK", ctx.seen(trace))
    await ctx.serve(probe, trace, until=lambda s: s.messages > 0)
    held = f"while the NOTIFY_ACK of stream {notify.stream_id} was held"
    return f"no MESSAGE for {ctx.window:g} s {held}; one after it"


async def refused_no_data(ctx: ConnectorUnderTest, trace: Trace) -> str:
    probe = await ctx.start(trace)
    await ctx.handshake(probe, trace)
    notify = await probe.expect(Notify)
    probe.send(NotifyAck(False, notify.stream_id, 0))
    refused = 1
    loop = asyncio.get_running_loop()
    stop = loop.time() + ctx.window
    while loop.time() < stop and not probe.closed:
        for frame in await probe.quiet(max(stop - loop.time(), 0.01)):
            if type(frame) is Notify:
                probe.send(NotifyAck(False, frame.stream_id, 0))
                refused += 1
        probe.check_clean()
    ended = "then closed" if probe.closed else f"for {ctx.window:g} s"
    return f"{refused} NOTIFY refused with success=0; no MESSAGE on a refused stream ({ended})"


async def credits_respected(ctx: ConnectorUnderTest, trace: Trace) -> str:
    probe = await ctx.start(trace)
    await ctx.handshake(probe, trace, credits=3)
    sent = []
    while True:
        got = await probe.quiet(ctx.window)
        for frame in got:
            if type(frame) is Notify:
                probe.send(NotifyAck(True, frame.stream_id, 0))
        sent += got
        probe.check_clean()
        if not got:
            break
    return f"{len(sent)} frames on 3 credits, then nothing for {ctx.window:g} s: " + ", ".join(
        f.TYPE.name for f in sent
    )


async def credits_resume(ctx: ConnectorUnderTest, trace: Trace) -> str:
    probe = await ctx.start(trace)
    await ctx.handshake(probe, trace, credits=3)
    while got := await probe.quiet(ctx.window):
        for frame in got:
            if type(frame) is Notify:
                probe.send(NotifyAck(True, frame.stream_id, 0))
        probe.check_clean()
    probe.send(Ack(ctx.credits, ()))
    frame = await probe.recv()
    while type(frame) is Notify:
        probe.send(NotifyAck(True, frame.stream_id, 0))
        frame = await probe.recv()
    probe.check_clean()
    return (
        f"idle on 0 credits for {ctx.window:g} s; an ACK of {ctx.credits} credits brought {frame.TYPE.name}"
    )


async def resume_from_notify_ack(ctx: ConnectorUnderTest, trace: Trace) -> str:
    first = await ctx.start(trace)
    await ctx.handshake(first, trace)

    def three_on_one(state: ServeState) -> bool:
        return any(len(ids) >= 3 for ids in state.notified.values())

    served = await ctx.serve(first, trace, until=three_on_one, acks=False)
    stream_id, ids = next((sid, ids) for sid, ids in served.notified.items() if len(ids) >= 3)
    point, expected = ids[1], ids[2]
    first.abort()
    trace(f"c1 dropped by the worker; stream {stream_id} is to resume after {point}")
    second = await ctx.next_connection(trace)
    await ctx.handshake(second, trace)
    served = await ctx.serve(
        second,
        trace,
        until=lambda s: bool(s.notified.get(stream_id)) or stream_id in s.eos,
        notify_point=lambda sid: point if sid == stream_id else 0,
        acks=False,
    )
    got = served.notified.get(stream_id, [])
    if not got or got[0] != expected:
        what = f"message id {got[0]}" if got else "no message"
        raise CaseFailed(
            f"NOTIFY_ACK said {point}: the next message is {expected}, but it sent {what}", ctx.seen(trace)
        )
    return f"ids {ids[:3]} on c1; NOTIFY_ACK at {point} on c2; it resumed with {expected}"


async def restart_reconnects(ctx: ConnectorUnderTest, trace: Trace) -> str:
    first = await ctx.start(trace)
    await ctx.handshake(first, trace)
    streams = set((await ctx.serve(first, trace, until=lambda s: s.messages >= 2)).notified)
    first.send(Restart(None if ctx.dialect == "spec" else f"{ctx.host}:{ctx.port}"))

    async def closes() -> None:
        with contextlib.suppress(PeerClosed):
            while True:
                await first.recv()

    async def renotifies() -> Probe:
        second = await ctx.next_connection(trace)
        await ctx.handshake(second, trace)
        await ctx.serve(second, trace, until=lambda s: streams <= set(s.notified) | set(s.eos), acks=False)
        return second

    await asyncio.gather(closes(), renotifies())
    return f"closed after RESTART, reconnected, HELLO and NOTIFY again for {len(streams)} stream(s)"


async def eos_sent(ctx: ConnectorUnderTest, trace: Trace) -> str:
    probe = await ctx.start(trace)
    await ctx.handshake(probe, trace)
    state = await ctx.serve(probe, trace, until=lambda s: bool(s.notified) and not _open_streams(s))
    for sid, last in state.eos.items():
        ids = state.notified.get(sid) or []
        if last is not None and ids and last != max(ids):
            raise CaseFailed(
                f"EOS_MESSAGE of stream {sid} says last id {last}; its last MESSAGE was {max(ids)}",
                ctx.seen(trace),
            )
    forms = {"shipped (no id)" if last is None else "spec" for last in state.eos.values()}
    exited = ""
    if ctx.process is not None:
        with contextlib.suppress(TimeoutError):
            code = await asyncio.wait_for(ctx.process.wait(), ctx.window * 4)
            if code != 0:
                raise CaseFailed(f"every stream ended, then it exited with {code}", ctx.seen(trace))
            exited = "; it exited 0"
    form = ", ".join(sorted(forms))
    return f"EOS_MESSAGE for {len(state.eos)} stream(s) ({form} form), {state.messages} messages{exited}"


async def ids_increase(ctx: ConnectorUnderTest, trace: Trace) -> str:
    probe = await ctx.start(trace)
    await ctx.handshake(probe, trace)
    state = await ctx.serve(probe, trace, until=lambda s: bool(s.notified) and not _open_streams(s))
    replays = [(sid, r.replays) for sid, r in probe.machine.streams.items() if r.replays]
    if replays:
        raise CaseFailed(f"message ids not strictly increasing on one connection: {replays}", ctx.seen(trace))
    return f"{state.messages} messages, ids strictly increasing on every stream"


async def error_ends_connection(ctx: ConnectorUnderTest, trace: Trace) -> str:
    probe = await ctx.start(trace)
    await probe.expect(Hello)
    probe.send(Error("Bad cookie (conformance test: this ERROR is on purpose)"))
    loop = asyncio.get_running_loop()
    sent_at, late = loop.time(), 0
    with contextlib.suppress(PeerClosed):
        while True:
            frame = await probe.recv()
            late += 1
            if loop.time() - sent_at > ctx.window:
                raise CaseFailed(
                    f"still sending ({frame.TYPE.name}) {ctx.window:g} s after the ERROR", ctx.seen(trace)
                )
    return f"closed the connection after the ERROR ({late} frame(s) were in flight)"


def _cases() -> tuple[Case, ...]:
    hs, sm = spec("Handshake"), spec("Stream State Machine")
    return (
        Case(
            "handshake.hello",
            hs,
            "the first frame is HELLO with version 0.0.1 (and the --cookie)",
            hello_first,
        ),
        Case(
            "handshake.waits-for-ok",
            spec("Protocol State Machine"),
            "nothing follows HELLO until the worker's OK",
            waits_for_ok,
        ),
        Case(
            "handshake.error-ends",
            hs,
            "an ERROR answering the HELLO makes it close that connection",
            error_ends_connection,
        ),
        Case(
            "notify.waits-for-ack",
            sm,
            "no MESSAGE for a stream before its NOTIFY_ACK success=1",
            waits_for_notify_ack,
        ),
        Case(
            "notify.refused", sm, "no MESSAGE for a stream whose NOTIFY_ACK said success=0", refused_no_data
        ),
        Case(
            "credits.respected",
            spec("Overview"),
            "with 3 credits and no ACK, no frame beyond the third",
            credits_respected,
        ),
        Case("credits.resume", spec("ACK"), "an ACK granting credits lets it send again", credits_resume),
        Case(
            "resume.notify-ack-point",
            sm,
            "after a reconnect a stream resumes with the message after the NOTIFY_ACK's point",
            resume_from_notify_ack,
        ),
        Case(
            "restart.reconnects",
            spec("RESTART"),
            "after RESTART it closes, reconnects, HELLOs and NOTIFYs its streams again",
            restart_reconnects,
        ),
        Case(
            "message.ids-increase",
            spec("Streaming"),
            "message ids rise strictly on each stream",
            ids_increase,
        ),
        Case(
            "eos.sent",
            spec("End of Stream"),
            "each finite stream ends with EOS_MESSAGE (at its last id, in the spec form)",
            eos_sent,
        ),
    )


@contextlib.asynccontextmanager
async def open_connector(target: Target, options: Mapping[str, Any]) -> AsyncIterator[ConnectorUnderTest]:
    if not target.command and not target.listen:
        raise SuiteUnavailable(
            "give the connector's command after --, or --listen HOST:PORT to start it by hand"
        )
    if target.command and shutil.which(target.command[0]) is None:
        raise SuiteUnavailable(f"cannot run {target.command[0]!r}: not found or not executable")
    host, port = parse_address(target.listen or "127.0.0.1:0")
    cookie = options.get("cookie")
    ctx = ConnectorUnderTest(
        target.command,
        host,
        port,
        None if cookie is None else cookie.encode(),
        int(options.get("credits") or 100),
        float(options.get("window_ms") or 500) / 1000,
        options.get("dialect") or "spec",
    )
    try:
        server = await asyncio.start_server(ctx.accept, host, port)
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise SuiteUnavailable(f"cannot listen on {host}:{port}: {reason}") from None
    ctx.port = server.sockets[0].getsockname()[1]
    try:
        async with server:
            yield ctx
    finally:
        ctx.trace = None
        await ctx.stop()


OPTIONS = (
    SuiteOption("cookie", "The cookie the connector must send (not checked when not given).", None),
    SuiteOption("credits", "Credits the worker grants in OK.", 100),
    SuiteOption("window-ms", "How long to watch for frames that must not come.", 500),
    SuiteOption(
        "dialect",
        "RESTART form: spec (empty) or shipped (with an address).",
        "spec",
        choices=("spec", "shipped"),
    ),
)

CASES = _cases()
