"""``conformance ic HOST:PORT --send-connect HOST:PORT``: play language bindings against an IC under test.

Each case is one LB: it connects to the IC's receive port, then its send port
(retrying, since the IC listens there only once the receive port is connected),
follows the IC's start (a first start, or a recovery with the checkpoint record
and the replay) and answers every checkpoint request with a small state of its
own. Every record goes through ``core.Session`` with the check bytes verified, so
wrong check bytes, a gap in the sequence ids, a changed committer id, a record sent
while a checkpoint is asked for or a malformed record body fails the case with the
core's reason. The records a case needs it makes itself: self calls (an RPC to
the LB's own instance), which the IC must log and deliver back.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.conformance.runner import (
    Case,
    CaseFailed,
    Result,
    SuiteUnavailable,
    Target,
    Trace,
)
from wallaroo_proto.conformance.target import parse_address
from wallaroo_proto.judge import Kind

from ..codec import (
    CHECKPOINT_SEQ,
    CONTROL_SEQ,
    FORK,
    INITIAL_MESSAGE,
    RPC,
    TAKE_CHECKPOINT,
    Blob,
    Garbage,
    Header,
    Message,
    RecordFrame,
    RecordSplitter,
    batch_messages,
    decode_rpc,
    encode_checkpoint,
    encode_message,
    encode_outgoing_rpc,
    read_message,
    type_name,
)
from ..core import IC, LB, Phase, Session

IC_CODE = "IC code"
#: The method id of the suite's self calls: one the counter immortal does not know, so it is ours.
PROBE_METHOD = 63


@dataclass
class Record:
    header: Header
    body: bytes
    messages: tuple[Message, ...]
    replayed: bool


class LbProbe:
    """One LB's two sockets: messages out to the receive port, records in from the send port."""

    def __init__(
        self,
        to_ic: asyncio.StreamWriter,
        from_ic: asyncio.StreamReader,
        trace: Trace,
        label: str,
        memory: Memory,
    ):
        self.to_ic, self.from_ic, self.trace, self.label = to_ic, from_ic, trace, label
        self.memory = memory
        self.session = Session(verify_check_bytes=True)
        self.splitter = RecordSplitter()
        self.events: deque[Any] = deque()
        self._blob: list[bytes] = []
        self.closed = False
        self.records: list[Record] = []
        self.state = b""
        self.start: str | None = None  # "first start" or "recovery"
        self.recovered_from: bytes | None = None

    # --- out --------------------------------------------------------------------------------------

    def send(self, message: bytes, what: str, blob: bytes = b"") -> None:
        """One message (and a checkpoint's bytes after it), judged as the LB's."""
        verdict = self.session.feed(LB, read_message(message, 0, len(message))[0])
        mark = "" if verdict.ok else f"   (on purpose: {'; '.join(verdict.violations)})"
        self.trace(f"{self.label} -> {what}{mark}")
        self.to_ic.write(message + blob)

    def checkpoint(self) -> None:
        """Answer the checkpoint asked for with a new state; self calls made so far are now in it."""
        self.memory.checkpoints += 1
        self.state = b"conformance-lb:%s:%d" % (self.memory.name, self.memory.checkpoints)
        self.memory.since_checkpoint.clear()
        self.send(encode_checkpoint(len(self.state)), f"Checkpoint ({self.state.decode()})", self.state)

    def self_call(self, tag: bytes) -> None:
        wire = encode_outgoing_rpc("", PROBE_METHOD, FORK, tag)
        self.memory.since_checkpoint.append(wire)
        self.send(wire, f"self call {tag.decode()}")

    # --- in ---------------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            data = await self.from_ic.read(1 << 16)
        except ConnectionError:
            data = b""
        if not data:
            self.closed = True
            self.trace(f"{self.label} <- (the IC closed the send port)")
            return
        for frame in self.splitter.feed(data):
            if type(frame) is RecordFrame:
                verdict = self.session.feed(IC, (frame.header, frame.body))
                seq = frame.header.seq
                names = ", ".join(m.name for m in verdict.messages[:3]) or "no messages"
                if len(verdict.messages) > 3:
                    names += f" and {len(verdict.messages) - 3} more"
                self.trace(f"{self.label} <- record {seq} ({names})")
                if not verdict.ok:
                    raise CaseFailed("; ".join(verdict.violations), self.trace.tail())
                record = Record(frame.header, frame.body, verdict.messages, verdict.kind is Kind.REPLAYED)
                self.records.append(record)
                self.events.append(record)
            elif type(frame) is Blob:
                self._blob.append(frame.data)
                if not frame.remaining:
                    self.events.append(b"".join(self._blob))
                    self._blob.clear()
            elif type(frame) is Garbage:
                raise CaseFailed(f"framing: {frame.reason} (stream offset {frame.offset})", self.trace.tail())

    async def event(self) -> Any:
        while not self.events:
            if self.closed:
                raise CaseFailed(
                    f"the IC closed the send port; the LB expected {self.session.expects().text}",
                    self.trace.tail(),
                )
            await self._read()
        return self.events.popleft()

    async def begin(self) -> None:
        """Follow the IC's start to the normal phase: a first start or a recovery, answered."""
        first = await self.event()
        if not isinstance(first, Record):
            raise CaseFailed("checkpoint bytes before any record", self.trace.tail())
        if first.header.seq == CHECKPOINT_SEQ:
            self.start = "recovery"
            blob = await self.event()
            if not isinstance(blob, bytes):
                raise CaseFailed("the checkpoint record's bytes did not follow it", self.trace.tail())
            self.recovered_from = blob
            self.trace(f"{self.label} <- the checkpoint's {len(blob)} bytes")
            while self.session.phase is Phase.REPLAY:
                await self.event()
            # A deterministic immortal makes again, as it replays, the calls it made after that checkpoint.
            for wire in list(self.memory.since_checkpoint):
                self.send(wire, "self call made again in the replay")
            self.checkpoint()
        else:
            self.start = "first start"
            self.memory.since_checkpoint.clear()
            initial = b"conformance-lb:" + self.memory.name
            self.send(encode_message(INITIAL_MESSAGE, initial), "InitialMessage")
            self.checkpoint()

    async def quiet(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while not self.closed:
                    await self._read()

    async def delivered(self, tag: bytes) -> Record:
        """The record that delivers the self call ``tag`` back; checkpoint requests on the way answered."""
        self.trace(f"   waiting for the self call {tag.decode()} to come back in a record")
        while True:
            event = await self.event()
            if not isinstance(event, Record):
                continue
            if event.header.seq == CONTROL_SEQ:
                if self.session.checkpoint_asked is not None:
                    self.checkpoint()
                continue
            if any(tag in _args(m) for m in event.messages):
                return event

    def abort(self) -> None:
        for stream in (self.to_ic,):
            stream.transport.abort()


@dataclass
class Memory:
    """What one immortal remembers across its LBs: what a deterministic binding would make again."""

    name: bytes = field(default_factory=lambda: f"{random.getrandbits(32):08x}".encode())
    checkpoints: int = 0
    #: Self calls made since the last Checkpoint the LB gave: a recovery from it makes them again.
    since_checkpoint: list[bytes] = field(default_factory=list)


def _args(message: Message) -> list[bytes]:
    """The args of the RPCs a message holds (an RPC, or a batch of them)."""
    if message.type == RPC:
        with contextlib.suppress(Exception):
            return [decode_rpc(message.data, False).args]
        return []
    with contextlib.suppress(Exception):
        return [decode_rpc(m.data, False).args for m in batch_messages(message)[2] if m.type == RPC]
    return []


@dataclass
class IcUnderTest:
    host: str
    receive_port: int
    send_port: int
    window: float = 0.5
    send_host: str = ""  # the send port's host, when not ``host``
    memory: Memory = field(default_factory=Memory)
    probes: list[LbProbe] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def lb(self, trace: Trace, label: str = "lb1") -> LbProbe:
        """Connect as an LB (receive port, then send port) and follow the IC's start."""
        to_ic, from_ic = await self.connect_pair(trace, label)
        probe = LbProbe(to_ic, from_ic, trace, label, self.memory)
        self.probes.append(probe)
        await probe.begin()
        trace(f"   {label}: {probe.start}")
        return probe

    async def connect_pair(
        self, trace: Trace, label: str
    ) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        """The receive port, then the send port once the IC listens there."""
        _, to_ic = await asyncio.open_connection(self.host, self.receive_port)
        self.writers.append(to_ic)
        trace(f"{label} connected to the receive port")
        trace(f"   waiting for the IC to listen on its send port {self.send_port}")
        while True:
            try:
                from_ic, writer = await asyncio.open_connection(self.send_host or self.host, self.send_port)
                break
            except ConnectionRefusedError:
                await asyncio.sleep(0.05)
        self.writers.append(writer)
        trace(f"{label} connected to the send port")
        return to_ic, from_ic

    def close_all(self) -> None:
        writers, self.writers = self.writers, []
        for writer in writers:
            writer.transport.abort()
        self.probes.clear()

    async def gone(self, trace: Trace) -> None:
        """The LBs go away; give the IC a moment to see it before the next one connects."""
        self.close_all()
        trace("   the LB went away")
        await asyncio.sleep(0.05)

    async def after_case(self, case: Case, result: Result) -> Result:
        await self.gone(Trace())
        return result


# --- the cases ----------------------------------------------------------------------------------------


def tag() -> bytes:
    return f"probe-{random.getrandbits(32):08x}".encode()


async def start_sequence(ctx: IcUnderTest, trace: Trace) -> str:
    probe = await ctx.lb(trace)
    if probe.start == "recovery":
        size = len(probe.recovered_from or b"")
        return f"a recovery: the checkpoint record with {size} bytes, then the replay"
    trace("   waiting for record 0 to echo the InitialMessage")
    while True:
        event = await probe.event()
        if isinstance(event, Record) and event.header.seq >= 0:
            break
        if isinstance(event, Record) and probe.session.checkpoint_asked is not None:
            probe.checkpoint()
    echoed = [m for m in event.messages if m.type == INITIAL_MESSAGE]
    if not echoed or echoed[0].data != b"conformance-lb:" + ctx.memory.name:
        raise CaseFailed(f"record {event.header.seq} does not echo the InitialMessage", trace.tail())
    return "a first start: TakeBecomingPrimaryCheckpoint, then record 0 echoing the InitialMessage"


async def self_call_delivered(ctx: IcUnderTest, trace: Trace) -> str:
    probe = await ctx.lb(trace)
    tags = [tag() for _ in range(3)]
    for t in tags:
        probe.self_call(t)
        await probe.delivered(t)
    return f"{len(tags)} self calls logged and delivered back; check bytes and sequence ids right"


async def checkpoint_on_request(ctx: IcUnderTest, trace: Trace) -> str:
    probe = await ctx.lb(trace)
    probe.send(encode_message(TAKE_CHECKPOINT), "TakeCheckpoint")
    trace("   waiting for the IC to ask for a checkpoint")
    while probe.session.checkpoint_asked is None:
        await probe.event()
    asked = type_name(probe.session.checkpoint_asked)
    later = tag()
    probe.self_call(later)
    await probe.quiet(ctx.window)  # a record now is one the IC must hold back: the core fails it
    probe.checkpoint()
    await probe.delivered(later)
    return f"{asked} asked; no record while it was unanswered, the self call came after the Checkpoint"


async def recovery_replay(ctx: IcUnderTest, trace: Trace) -> str:
    first = await ctx.lb(trace, "lb1")
    first.send(encode_message(TAKE_CHECKPOINT), "TakeCheckpoint")
    while first.session.checkpoint_asked is None:
        await first.event()
    first.checkpoint()
    checkpoint = first.state
    mark = len(first.records)
    t = tag()
    first.self_call(t)
    await first.delivered(t)
    after = [(r.header.seq, r.body) for r in first.records[mark:] if r.header.seq >= 0]
    await ctx.gone(trace)
    second = await ctx.lb(trace, "lb2")
    if second.start != "recovery":
        raise CaseFailed("the next LB got a first start, not a recovery", trace.tail())
    if second.recovered_from != checkpoint:
        raise CaseFailed(
            f"the checkpoint record's bytes {second.recovered_from[:40]!r} are not the last checkpoint "
            f"the LB gave ({checkpoint!r})",
            trace.tail(),
        )
    replayed = [(r.header.seq, r.body) for r in second.records if r.replayed]
    if replayed[: len(after)] != after:
        raise CaseFailed(
            f"the replay ({[s for s, _ in replayed]}) is not the records logged after the checkpoint "
            f"({[s for s, _ in after]}), byte for byte",
            trace.tail(),
        )
    return (
        f"the last checkpoint's {len(checkpoint)} bytes, then {len(replayed)} records replayed byte for byte"
    )


def _cases() -> tuple[Case, ...]:
    return (
        Case(
            "start.sequence",
            f"{IC_CODE}: first start and recovery",
            "an LB gets TakeBecomingPrimaryCheckpoint and record 0 echoing its InitialMessage, "
            "or the checkpoint record and a replay",
            start_sequence,
        ),
        Case(
            "records.self-calls",
            f"{IC_CODE}: log records",
            "self calls come back in records with right check bytes, rising sequence ids, one committer",
            self_call_delivered,
        ),
        Case(
            "checkpoint.quiesce",
            f"{IC_CODE}: TakeCheckpoint",
            "the LB's TakeCheckpoint gets a checkpoint request, and no record until the Checkpoint",
            checkpoint_on_request,
        ),
        Case(
            "recovery.replay",
            f"{IC_CODE}: recovery",
            "the next LB gets the last checkpoint's bytes and the records logged after it, byte for byte",
            recovery_replay,
        ),
    )


CASES = _cases()


@contextlib.asynccontextmanager
async def open_ic_target(target: Target, options: Mapping[str, Any]) -> AsyncIterator[IcUnderTest]:
    host, rport, send_host, sport = _addresses(target.address or "", options.get("send_connect"))
    ctx = IcUnderTest(host, rport, sport, int(options.get("window_ms") or 500) / 1000, send_host)
    try:
        async with asyncio.timeout(10):
            _, from_ic = await ctx.connect_pair(Trace(), "reach")
            # An LB that leaves once the IC took it (its first record came), not before: a pair the IC
            # had not accepted yet would leave a connection behind for the next LB to be paired with.
            await from_ic.read(1)
    except (OSError, TimeoutError) as err:
        raise SuiteUnavailable(
            f"cannot connect to the IC's receive port {ctx.host}:{ctx.receive_port} and then its send port "
            f"{ctx.send_host}:{ctx.send_port}: {err or 'timed out'}"
        ) from None
    ctx.close_all()
    try:
        yield ctx
    finally:
        ctx.close_all()


def _addresses(address: str, send_connect: str | None) -> tuple[str, int, str, int]:
    """The IC's receive port (the argument, HOST:PORT) and send port (``--send-connect HOST:PORT``);
    the older single argument HOST:RECEIVE_PORT:SEND_PORT is still taken."""
    parts = address.rsplit(":", 2)
    if send_connect is None and len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        host, rport, sport = parts[0] or "127.0.0.1", int(parts[1]), int(parts[2])
        send_host = host
    else:
        host, rport = parse_address(address)
        if send_connect is None:
            raise SuiteUnavailable("give the IC's send port too: --send-connect HOST:PORT")
        send = str(send_connect)
        send_host, sport = (host, int(send)) if send.isdigit() else parse_address(send)
    for port in (rport, sport):
        if not 0 < port < 65536:
            raise SuiteUnavailable(f"{port} is not a port an IC listens on (1-65535)")
    return host, rport, send_host, sport
