"""``conformance lb -- COMMAND``: play the Immortal Coordinator for a language binding under test.

The suite binds the IC's two ports and, as the IC does, listens on the send port
only once an LB has connected to the receive port. Each case starts COMMAND (with
``{host}``, ``{receive_port}``, ``{send_host}`` and ``{send_port}`` filled in, and
``AMBROSIA_IC=HOST:RECEIVE:SEND`` in its environment), or without a command waits
for an LB started by hand, and stops it afterwards. Every record the suite sends
and every message the LB sends goes through ``core.Session``, so an LB that breaks
a rule the core knows (a Checkpoint before its InitialMessage, an InitialMessage on
a recovery, an unsolicited Checkpoint, an Impulse during the replay, a message type
the IC does not accept, a malformed RPC or batch) fails with the core's reason.

The RPCs delivered are the counter immortal's ``add`` calls (method 1), as
``ambrosia mock-ic`` delivers them; ``--method`` sends another method id.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.conformance import process
from wallaroo_proto.conformance.runner import (
    Case,
    CaseFailed,
    CaseSkipped,
    Result,
    SuiteOption,
    SuiteUnavailable,
    Target,
    Trace,
)
from wallaroo_proto.conformance.target import parse_address

from ..codec import (
    CHECKPOINT,
    INITIAL_MESSAGE,
    TAKE_BECOMING_PRIMARY_CHECKPOINT,
    TAKE_CHECKPOINT,
    UPGRADE_TAKE_CHECKPOINT,
    Blob,
    Garbage,
    Message,
    MessageFrame,
    MessageSplitter,
    checkpoint_length,
    checkpoint_record,
    control_record,
    encode_message,
    encode_record,
    read_header,
    type_name,
)
from ..core import IC, LB, Session
from ..immortal import RpcSource

IC_CODE = "IC code"
#: Records of RPCs each case delivers, and RPCs in each.
RECORDS, PER_RECORD = 6, 10
#: Seconds a case may take beyond --timeout for each LB process it starts.
START_TIME = 5.0


def _bound(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


class LbPeer:
    """One LB's two sockets, seen from the IC: records out, messages (and checkpoint bytes) in."""

    def __init__(
        self, lb_reader, lb_writer, rec_reader, rec_writer, trace: Trace, output: deque[str]
    ) -> None:
        self.lb_reader, self.lb_writer = lb_reader, lb_writer
        self.rec_reader, self.rec_writer = rec_reader, rec_writer
        self.trace = trace
        self.output = output
        self.session = Session(verify_check_bytes=False, judge_own_bodies=False)
        self.splitter = MessageSplitter()
        self.events: deque[tuple[str, Any]] = deque()
        self._blob: list[bytes] = []
        self.closed = False
        self.committer = random.randint(-(1 << 30), (1 << 30) - 1)
        self.messages: list[Message] = []

    def fail(self, reason: str) -> CaseFailed:
        seen = self.trace.tail()
        if self.output:
            seen += "\nthe LB's last output:\n" + "\n".join(self.output)
        return CaseFailed(reason, seen)

    # --- records out ------------------------------------------------------------------------------

    def send(self, wire: bytes, what: str) -> None:
        header = read_header(wire)
        self.session.feed(IC, (header, wire[24 : header.size]))
        self.trace(f"ic -> record {header.seq}: {what}")
        self.rec_writer.write(wire)

    def control(self, kind: int) -> None:
        self.send(control_record(self.committer, kind), type_name(kind))

    def record(self, seq: int, body: bytes, what: str) -> bytes:
        wire = encode_record(self.committer, seq, body)
        self.send(wire, what)
        return wire

    # --- messages in ------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            data = await self.lb_reader.read(1 << 16)
        except ConnectionError:
            data = b""
        if not data:
            self.closed = True
            self.trace("lb -> (closed its socket)")
            return
        for frame in self.splitter.feed(data):
            if type(frame) is MessageFrame:
                msg = frame.message
                verdict = self.session.feed(LB, msg)
                self.trace(
                    f"lb -> {msg.name}" + ("" if msg.type == CHECKPOINT else f" ({len(msg.data)} bytes)")
                )
                if not verdict.ok:
                    raise self.fail("; ".join(verdict.violations))
                self.messages.append(msg)
                if msg.type == CHECKPOINT:
                    if not checkpoint_length(msg):
                        self.events.append(("checkpoint", b""))
                else:
                    self.events.append(("message", msg))
            elif type(frame) is Blob:
                self._blob.append(frame.data)
                if not frame.remaining:
                    blob = b"".join(self._blob)
                    self._blob.clear()
                    self.trace(f"lb -> the checkpoint's {len(blob)} bytes")
                    self.events.append(("checkpoint", blob))
            elif type(frame) is Garbage:
                raise self.fail(f"framing: {frame.reason} (stream offset {frame.offset})")

    async def event(self) -> tuple[str, Any]:
        while not self.events:
            if self.closed:
                raise self.fail(f"the LB closed its socket; the IC expected {self.session.expects().text}")
            await self._read()
        return self.events.popleft()

    async def checkpoint(self, asked: str) -> bytes:
        """The LB's Checkpoint and its bytes; what it sends before that is judged on the way."""
        self.trace(f"   waiting for the Checkpoint answering {asked}")
        while True:
            kind, value = await self.event()
            if kind == "checkpoint":
                return value

    async def initial_message(self) -> bytes:
        self.trace("   waiting for the InitialMessage")
        while True:
            kind, value = await self.event()
            if kind == "message" and value.type == INITIAL_MESSAGE:
                return value.data

    async def quiet(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while not self.closed:
                    await self._read()

    def close(self) -> None:
        for writer in (self.lb_writer, self.rec_writer):
            with contextlib.suppress(Exception):
                writer.close()


@dataclass
class IcPlayer:
    host: str
    command: tuple[str, ...]
    method: int = 1
    window: float = 0.5
    receive_port: int = 0
    send_port: int = 0
    send_host: str = ""  # the send port's host, when not ``host``
    rsock: socket.socket | None = None
    ssock: socket.socket | None = None
    runs: list[process.Started] = field(default_factory=list)
    peers: list[LbPeer] = field(default_factory=list)

    def bind(self, receive_port: int, send_port: int) -> None:
        self.send_host = self.send_host or self.host
        self.rsock = _bound(self.host, receive_port)
        self.rsock.listen(4)
        self.ssock = _bound(self.send_host, send_port)
        self.receive_port = self.rsock.getsockname()[1]
        self.send_port = self.ssock.getsockname()[1]

    def source(self) -> RpcSource:
        return RpcSource(RECORDS * PER_RECORD, method_id=self.method)

    async def start(self, trace: Trace) -> deque[str]:
        """Start the LB command (if any); its output's last lines, kept as it runs."""
        if not self.command:
            trace(f"   waiting for an LB started by hand (receive port {self.receive_port})")
            return deque()
        fill = {
            "host": self.host,
            "receive_port": str(self.receive_port),
            "send_host": self.send_host,
            "send_port": str(self.send_port),
        }
        env = {"AMBROSIA_IC": f"{self.host}:{self.receive_port}:{self.send_port}"}
        run = await process.start(self.command, fill, env)
        self.runs.append(run)
        trace(f"started the LB (pid {run.proc.pid})")
        return run.output

    async def lb(self, trace: Trace) -> LbPeer:
        """Start an LB and take its two connections in the IC's order: receive port, then send port."""
        output = await self.start(trace)
        conn_r = await self._accept(self.rsock, "receive port", trace, output)
        trace("lb connected to the receive port")
        self.ssock.listen(1)
        try:
            conn_s = await self._accept(
                self.ssock, "send port (listening only now, as the IC)", trace, output
            )
        finally:
            self.ssock.close()  # refused again until the next LB's receive-port connection
            self.ssock = _bound(self.send_host, self.send_port)
        trace("lb connected to the send port")
        lb_reader, lb_writer = await asyncio.open_connection(sock=conn_r)
        rec_reader, rec_writer = await asyncio.open_connection(sock=conn_s)
        peer = LbPeer(lb_reader, lb_writer, rec_reader, rec_writer, trace, output)
        self.peers.append(peer)
        return peer

    async def _accept(
        self, sock: socket.socket, port: str, trace: Trace, output: deque[str]
    ) -> socket.socket:
        """The LB's connection to ``port``; its process ending first fails the case with its output."""
        trace(f"   waiting for the LB to connect to the {port}")
        accept = asyncio.ensure_future(asyncio.get_running_loop().sock_accept(sock))
        if not self.command:
            return (await accept)[0]
        run = self.runs[-1]
        exited = asyncio.ensure_future(run.proc.wait())
        try:
            await asyncio.wait({accept, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if accept.done():
            return accept.result()[0]
        accept.cancel()
        seen = trace.tail() + "\n" + await run.exited()
        raise CaseFailed(
            f"the LB exited with code {run.proc.returncode} before connecting to the {port}", seen
        )

    async def stop_all(self) -> None:
        peers, self.peers = self.peers, []
        for peer in peers:
            peer.close()
        runs, self.runs = self.runs, []
        for run in runs:
            await run.stop()

    async def after_case(self, case: Case, result: Result) -> Result:
        await self.stop_all()
        return result

    def close(self) -> None:
        for sock in (self.rsock, self.ssock):
            if sock is not None:
                sock.close()


# --- the runs a case is made of -----------------------------------------------------------------------


@dataclass
class Run:
    """What one LB's first start left: the checkpoint the IC would recover from, and the log after it."""

    committer: int
    checkpoint: bytes
    after: list[bytes]  # the records logged after that checkpoint, as sent
    final: bytes  # the checkpoint taken once those records were in


async def first_start(ctx: IcPlayer, trace: Trace) -> tuple[LbPeer, bytes, bytes]:
    """TakeBecomingPrimaryCheckpoint: (the LB, its InitialMessage's data, its first checkpoint)."""
    peer = await ctx.lb(trace)
    peer.control(TAKE_BECOMING_PRIMARY_CHECKPOINT)
    initial = await peer.initial_message()
    blob = await peer.checkpoint(type_name(TAKE_BECOMING_PRIMARY_CHECKPOINT))
    return peer, initial, blob


def deliver(
    ctx: IcPlayer, peer: LbPeer, seq: int, first: int, count: int, prefix: bytes = b""
) -> list[bytes]:
    """``count`` records of RPCs from sequence id ``seq``: their wire bytes."""
    source = ctx.source()
    wires = []
    for i in range(count):
        at = first + i * PER_RECORD
        body = prefix + source.body(at, at + PER_RECORD)
        prefix = b""
        wires.append(peer.record(seq + i, body, f"{PER_RECORD} RPCs"))
    return wires


async def logged_run(ctx: IcPlayer, trace: Trace) -> Run:
    """A first start, half the RPCs, a checkpoint, the other half, a checkpoint; then the LB is stopped."""
    peer, initial, _ = await first_start(ctx, trace)
    half = RECORDS // 2
    deliver(ctx, peer, 0, 0, half, encode_message(INITIAL_MESSAGE, initial))
    peer.control(TAKE_CHECKPOINT)
    checkpoint = await peer.checkpoint(type_name(TAKE_CHECKPOINT))
    after = deliver(ctx, peer, half, half * PER_RECORD, RECORDS - half)
    peer.control(TAKE_CHECKPOINT)
    final = await peer.checkpoint(type_name(TAKE_CHECKPOINT))
    trace("   the IC goes away: the LB is stopped")
    await ctx.stop_all()
    return Run(peer.committer, checkpoint, after, final)


async def recovered(ctx: IcPlayer, trace: Trace, run: Run, ends_with: int) -> tuple[LbPeer, bytes]:
    """A new LB recovers: the checkpoint record, the log after it replayed, then ``ends_with``."""
    peer = await ctx.lb(trace)
    peer.committer = run.committer
    peer.send(checkpoint_record(run.committer, run.checkpoint), f"checkpoint of {len(run.checkpoint)} bytes")
    for wire in run.after:
        peer.send(wire, "replayed")
    peer.control(ends_with)
    return peer, await peer.checkpoint(type_name(ends_with))


# --- the cases ----------------------------------------------------------------------------------------


async def case_first_start(ctx: IcPlayer, trace: Trace) -> str:
    _, initial, blob = await first_start(ctx, trace)
    return f"InitialMessage of {len(initial)} bytes, then a Checkpoint of {len(blob)} bytes"


async def case_records_checkpoint(ctx: IcPlayer, trace: Trace) -> str:
    peer, initial, _ = await first_start(ctx, trace)
    deliver(ctx, peer, 0, 0, RECORDS, encode_message(INITIAL_MESSAGE, initial))
    peer.control(TAKE_CHECKPOINT)
    blob = await peer.checkpoint(type_name(TAKE_CHECKPOINT))
    await peer.quiet(ctx.window)  # a Checkpoint now is unsolicited: the core fails it
    calls = sum(1 for m in peer.messages if m.type in (0, 5))
    return (
        f"{RECORDS} records of {PER_RECORD} RPCs taken, a Checkpoint of {len(blob)} bytes; "
        f"RPC and RPCBatch messages sent back: {calls}, all well-formed"
    )


async def case_recovery_replay(ctx: IcPlayer, trace: Trace) -> str:
    run = await logged_run(ctx, trace)
    _, blob = await recovered(ctx, trace, run, TAKE_BECOMING_PRIMARY_CHECKPOINT)
    replayed = f"{len(run.checkpoint)} bytes and {len(run.after)} replayed records"
    return f"recovered from {replayed}; Checkpoint of {len(blob)} bytes"


async def case_recovery_state(ctx: IcPlayer, trace: Trace) -> str:
    run = await logged_run(ctx, trace)
    _, blob = await recovered(ctx, trace, run, TAKE_BECOMING_PRIMARY_CHECKPOINT)
    if blob != run.final:
        raise CaseFailed(
            f"the checkpoint after the recovery ({len(blob)} bytes) differs from the one taken at the same "
            f"point without a crash ({len(run.final)} bytes)",
            trace.tail() + f"\nwithout a crash: {run.final[:80]!r}\nafter recovery: {blob[:80]!r}",
        )
    return f"the {len(blob)}-byte checkpoint after the recovery equals the one taken without a crash"


async def case_recovery_upgrade(ctx: IcPlayer, trace: Trace) -> str:
    run = await logged_run(ctx, trace)
    peer, blob = await recovered(ctx, trace, run, UPGRADE_TAKE_CHECKPOINT)
    peer.control(TAKE_CHECKPOINT)
    again = await peer.checkpoint(type_name(TAKE_CHECKPOINT))
    return f"UpgradeTakeCheckpoint answered ({len(blob)} bytes), then TakeCheckpoint ({len(again)} bytes)"


async def case_close_exits(ctx: IcPlayer, trace: Trace) -> str:
    if not ctx.command:
        raise CaseSkipped("the LB was started by hand: its exit cannot be watched")
    peer, initial, _ = await first_start(ctx, trace)
    deliver(ctx, peer, 0, 0, 1, encode_message(INITIAL_MESSAGE, initial))
    peer.control(TAKE_CHECKPOINT)
    await peer.checkpoint(type_name(TAKE_CHECKPOINT))
    trace("ic closes both sockets")
    peer.close()
    trace("   waiting for the LB to exit")
    code = await ctx.runs[-1].proc.wait()
    return f"the LB exited with code {code}"


def _cases() -> tuple[Case, ...]:
    return (
        Case(
            "first-start.checkpoint",
            f"{IC_CODE}: first start",
            "TakeBecomingPrimaryCheckpoint is answered with InitialMessage, then a Checkpoint and its bytes",
            case_first_start,
            extra_time=START_TIME,
        ),
        Case(
            "records.checkpoint",
            f"{IC_CODE}: TakeCheckpoint",
            "after records of RPCs a TakeCheckpoint gets one Checkpoint; nothing unasked, RPCs well-formed",
            case_records_checkpoint,
            extra_time=START_TIME,
        ),
        Case(
            "recovery.replay",
            f"{IC_CODE}: recovery",
            "a recovery (checkpoint record, replay) ends in a Checkpoint, with no InitialMessage",
            case_recovery_replay,
            extra_time=2 * START_TIME,
        ),
        Case(
            "recovery.state",
            "AMBROSIA: virtual resiliency",
            "the checkpoint after a recovery equals the one taken at the same point without a crash",
            case_recovery_state,
            extra_time=2 * START_TIME,
        ),
        Case(
            "recovery.upgrade",
            f"{IC_CODE}: upgrade",
            "UpgradeTakeCheckpoint ending a replay gets a Checkpoint, and a TakeCheckpoint after it another",
            case_recovery_upgrade,
            extra_time=2 * START_TIME,
        ),
        Case(
            "close.exits",
            f"{IC_CODE}: shutdown",
            "when the IC closes both sockets the LB process ends",
            case_close_exits,
            extra_time=START_TIME,
        ),
    )


CASES = _cases()
OPTIONS = (
    SuiteOption(
        "send-listen",
        "The IC's send port, HOST:PORT, where the LB reads records [default: --listen's host, a free port]; "
        "--listen is its receive port.",
        aliases=("send-port",),
    ),
    SuiteOption("receive-port", "The receive port (older spelling of --listen's port).", hidden=True),
    SuiteOption("method", "The method id of the RPCs delivered (the counter immortal's add is 1).", 1),
    SuiteOption("window-ms", "How long the LB is watched for a Checkpoint nobody asked for.", 500),
)


def _addresses(target: Target, options: Mapping[str, Any]) -> tuple[str, int, str, int]:
    """The receive port (``--listen``, or the older ``--receive-port``) and the send port."""
    host, rport = parse_address(target.listen) if target.listen else ("127.0.0.1", 0)
    old = options.get("receive_port")
    if old is not None:
        if not str(old).isdigit() or not 0 < int(old) < 65536:
            raise SuiteUnavailable(f"--receive-port {old}: not a port")
        rport = int(old)
    send = str(options.get("send_listen") or "0")
    send_host, sport = (host, int(send)) if send.isdigit() else parse_address(send)
    if sport > 65535:
        raise SuiteUnavailable(f"--send-listen {send}: not a port")
    return host, rport, send_host, sport


@contextlib.asynccontextmanager
async def open_ic(target: Target, options: Mapping[str, Any]) -> AsyncIterator[IcPlayer]:
    host, rport, send_host, sport = _addresses(target, options)
    if not target.command and not (rport and sport):
        raise SuiteUnavailable(
            "give the LB's command (-- COMMAND ARGS...), "
            "or --listen HOST:PORT and --send-listen HOST:PORT (no port 0) for one started by hand"
        )
    ctx = IcPlayer(
        host,
        tuple(target.command),
        int(options.get("method") or 1),
        int(options.get("window_ms") or 500) / 1000,
        send_host=send_host,
    )
    try:
        ctx.bind(rport, sport)
    except OSError as err:
        ctx.close()
        raise SuiteUnavailable(
            f"cannot listen on {host}:{rport} (the receive port) and {send_host}:{sport} (the send port): "
            f"{err.strerror or err}"
        ) from None
    try:
        yield ctx
    finally:
        await ctx.stop_all()
        ctx.close()
