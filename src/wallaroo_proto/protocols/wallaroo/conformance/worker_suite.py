"""``conformance worker HOST:PORT``: play connectors against a worker under test.

Each case uses fresh stream ids, so the worker's memory of other runs cannot
matter. Every case that expects an ERROR also checks that the worker keeps
serving: a connection opened before the bad one still gets answers, and a new
connection still gets its OK.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.conformance.probes import ProbeKeeper
from wallaroo_proto.conformance.runner import Case, CaseFailed, CaseSkipped, SuiteOption, Target, Trace
from wallaroo_proto.conformance.target import parse_address, reachable

from ..codec import encode
from ..frames import (
    SOURCE_VERSION,
    Ack,
    EosMessage,
    Error,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    show_text,
)
from ..protocol import Side, Use
from ..wire import U32
from .common import new_stream_id, notes, spec, tag
from .probe import PeerClosed, Probe

#: Most credits the credit cases will spend to reach the end of a grant.
MAX_CREDITS_TO_SPEND = 20_000


@dataclass
class WorkerUnderTest(ProbeKeeper):
    host: str = "127.0.0.1"
    port: int = 7100
    cookie: bytes = b""
    version: str = SOURCE_VERSION
    dialect: str = "spec"
    probes: list = field(default_factory=list)

    async def connect(self, trace: Trace, label: str = "c1") -> Probe:
        probe = await Probe.connect(
            self.host, self.port, use=Use.SOURCE, our_side=Side.CONNECTOR, trace=trace, label=label
        )
        return self.keep(probe)

    def hello(self, **changes: Any) -> Hello:
        fields = {
            "version": self.version,
            "cookie": self.cookie,
            "program_name": "wallaroo-proto conformance",
            "instance_name": f"conformance-{tag()}",
        }
        fields.update(changes)
        return Hello(**fields)

    async def handshake(self, trace: Trace, label: str = "c1") -> tuple[Probe, Ok]:
        probe = await self.connect(trace, label)
        probe.send(self.hello())
        ok = await probe.expect(Ok)
        return probe, ok

    async def open_stream(self, probe: Probe, stream_id: int | None = None) -> tuple[int, NotifyAck]:
        stream_id = new_stream_id() if stream_id is None else stream_id
        probe.send(Notify(stream_id, f"conformance-{stream_id:x}", 0))
        ack = await probe.expect(NotifyAck, lambda f: f.stream_id == stream_id)
        if not ack.success:
            raise CaseFailed(f"NOTIFY of a new stream {stream_id} was refused", probe.trace.tail())
        return stream_id, ack

    def eos(self, stream_id: int, last_id: int) -> EosMessage:
        return EosMessage(stream_id, None if self.dialect == "shipped" else last_id)

    async def bystander(self, trace: Trace) -> Probe:
        """A connection holding a stream, opened before a case misbehaves on another one."""
        probe, _ = await self.handshake(trace, "bystander")
        await self.open_stream(probe)
        return probe

    async def still_serving(self, trace: Trace, bystander: Probe) -> str:
        """The worker answers the bystander and a new connection after another one's ERROR."""
        stream_id, _ = await self.open_stream(bystander)
        bystander.send(Message(stream_id, 1, 0, b"", b"still here"))
        await self.handshake(trace, "newcomer")
        if bystander.closed:
            raise CaseFailed("the bystander connection was closed too", trace.tail())
        return "the worker still served another connection and a new one"


async def _error_case(ctx: WorkerUnderTest, trace: Trace, misbehave) -> str:
    """A connection that ``misbehave``s must get ERROR and a close; the others are still served."""
    bystander = await ctx.bystander(trace)
    probe = await misbehave(ctx, trace)
    reason = await probe.expect_error_and_close()
    return f"ERROR {reason!r} and a close; " + await ctx.still_serving(trace, bystander)


# --- handshake -------------------------------------------------------------------------------------


async def handshake_ok(ctx: WorkerUnderTest, trace: Trace) -> str:
    probe, ok = await ctx.handshake(trace)
    if ok.initial_credits < 1:
        raise CaseFailed("OK granted no credits: no frame could ever be sent", trace.tail())
    return f"OK with {ok.initial_credits} credits"


def _hello_with(**changes):
    async def misbehave(ctx: WorkerUnderTest, trace: Trace) -> Probe:
        probe = await ctx.connect(trace)
        probe.send(ctx.hello(**changes))
        return probe

    return misbehave


async def handshake_version(ctx: WorkerUnderTest, trace: Trace) -> str:
    wrong = ctx.version + ".1" if ctx.version else "0.0.1"
    return await _error_case(ctx, trace, _hello_with(version=wrong))


async def handshake_cookie(ctx: WorkerUnderTest, trace: Trace) -> str:
    return await _error_case(ctx, trace, _hello_with(cookie=ctx.cookie + b"-not-the-cookie"))


async def handshake_hello_first(ctx: WorkerUnderTest, trace: Trace) -> str:
    async def misbehave(ctx: WorkerUnderTest, trace: Trace) -> Probe:
        probe = await ctx.connect(trace)
        probe.send(Notify(new_stream_id(), "before-hello", 0))
        return probe

    return await _error_case(ctx, trace, misbehave)


async def handshake_once(ctx: WorkerUnderTest, trace: Trace) -> str:
    async def misbehave(ctx: WorkerUnderTest, trace: Trace) -> Probe:
        probe, _ = await ctx.handshake(trace)
        probe.send(ctx.hello())
        return probe

    return await _error_case(ctx, trace, misbehave)


# --- streams ---------------------------------------------------------------------------------------


async def notify_accepted(ctx: WorkerUnderTest, trace: Trace) -> str:
    probe, _ = await ctx.handshake(trace)
    stream_id, ack = await ctx.open_stream(probe)
    probe.check_clean()
    return f"NOTIFY_ACK success=1 for stream {stream_id}, point of reference {ack.point_of_ref}"


async def notify_repeat(ctx: WorkerUnderTest, trace: Trace) -> str:
    probe, _ = await ctx.handshake(trace)
    stream_id, _ = await ctx.open_stream(probe)
    probe.send(Notify(stream_id, "again", 0))
    ack = await probe.expect(NotifyAck, lambda f: f.stream_id == stream_id)
    if ack.success:
        raise CaseFailed("a repeated NOTIFY got NOTIFY_ACK success=1", trace.tail())
    return "NOTIFY_ACK success=0 for the repeat"


async def notify_held_elsewhere(ctx: WorkerUnderTest, trace: Trace) -> str:
    first, _ = await ctx.handshake(trace, "c1")
    stream_id, _ = await ctx.open_stream(first)
    second, _ = await ctx.handshake(trace, "c2")
    second.send(Notify(stream_id, "taken", 0))
    ack = await second.expect(NotifyAck, lambda f: f.stream_id == stream_id)
    if ack.success:
        raise CaseFailed(
            "a second connection got NOTIFY_ACK success=1 for a stream the first holds", trace.tail()
        )
    return "NOTIFY_ACK success=0 on the second connection"


async def notify_refused_then_message(ctx: WorkerUnderTest, trace: Trace) -> str:
    first, _ = await ctx.handshake(trace, "c1")
    stream_id, _ = await ctx.open_stream(first)

    async def misbehave(ctx: WorkerUnderTest, trace: Trace) -> Probe:
        second, _ = await ctx.handshake(trace, "c2")
        second.send(Notify(stream_id, "taken", 0))
        ack = await second.expect(NotifyAck, lambda f: f.stream_id == stream_id)
        if ack.success:
            raise CaseFailed("the NOTIFY for a stream another connection holds was accepted", trace.tail())
        second.send(Message(stream_id, 1, 0, b"", b"not mine"))
        return second

    return await _error_case(ctx, trace, misbehave)


async def message_unnotified(ctx: WorkerUnderTest, trace: Trace) -> str:
    async def misbehave(ctx: WorkerUnderTest, trace: Trace) -> Probe:
        probe, _ = await ctx.handshake(trace)
        probe.send(Message(new_stream_id(), 1, 0, b"", b"never notified"))
        return probe

    return await _error_case(ctx, trace, misbehave)


async def _final_ack(probe: Probe, stream_id: int) -> int:
    """The point of reference of the first ACK that names ``stream_id``."""
    ack = await probe.expect(
        Ack, lambda f: any(s == stream_id for s, _ in f.acks), what="an ACK naming the stream"
    )
    return dict(ack.acks)[stream_id]


async def message_replay_dropped(ctx: WorkerUnderTest, trace: Trace) -> str:
    probe, _ = await ctx.handshake(trace)
    stream_id, _ = await ctx.open_stream(probe)
    ids = (1, 2, 3, 2, 4)
    probe.send(*(Message(stream_id, i, 0, b"", b"m%d" % i) for i in ids), ctx.eos(stream_id, 4))
    point = await _final_ack(probe, stream_id)
    if point != 4:
        raise CaseFailed(f"sent ids {ids} then EOS; the final ACK says {point}, not 4", trace.tail())
    return f"ids {ids}: the re-sent 2 was dropped without ERROR; the EOS ACK says 4"


# --- credits ---------------------------------------------------------------------------------------


async def credits_replenished(ctx: WorkerUnderTest, trace: Trace) -> str:
    probe, ok = await ctx.handshake(trace)
    if ok.initial_credits > MAX_CREDITS_TO_SPEND:
        raise CaseSkipped(f"OK granted {ok.initial_credits} credits: more than this case spends")
    stream_id, _ = await ctx.open_stream(probe)
    credits, sent, target = ok.initial_credits - 1, 0, ok.initial_credits + 10
    trace(f"   spending {target} credits, no more than granted")
    while sent < target:
        while credits > 0 and sent < target:
            sent += 1
            credits -= 1
            probe.writer.write(_message_bytes(stream_id, sent))
        if sent < target:
            ack = await probe.expect(Ack, lambda f: f.credits > 0, what="an ACK with credits")
            credits += ack.credits
    probe.check_clean()
    return f"sent {sent} messages on {ok.initial_credits} initial credits; ACKs topped them up"


def _message_bytes(stream_id: int, message_id: int) -> bytes:
    return encode(Message(stream_id, message_id, 0, b"", b"x"))


async def credits_overdraft(ctx: WorkerUnderTest, trace: Trace) -> str:
    bystander = await ctx.bystander(trace)
    probe, ok = await ctx.handshake(trace)
    if ok.initial_credits > MAX_CREDITS_TO_SPEND:
        raise CaseSkipped(f"OK granted {ok.initial_credits} credits: more than this case spends")
    stream_id, _ = await ctx.open_stream(probe)
    left = ok.initial_credits - 1 + sum(a.credits for a in probe.passed_over if type(a) is Ack)
    beyond = new_stream_id()
    # One write: every credit spent on MESSAGEs, then a NOTIFY with none left. A worker that
    # takes it answers with a NOTIFY_ACK, which tells at once, without waiting for a timeout.
    probe.send(
        *(Message(stream_id, i, 0, b"", b"x") for i in range(1, left + 1)), Notify(beyond, "beyond", 0)
    )
    while True:
        try:
            frame = await probe.recv()
        except PeerClosed:
            raise CaseFailed("closed the connection without an ERROR", trace.tail()) from None
        if type(frame) is NotifyAck and frame.stream_id == beyond:
            raise CaseFailed(
                f"answered a NOTIFY sent with no credit left ({left} credits spent before it) instead of an "
                "ERROR; the shipped worker too takes it (docs/protocol-notes.md, Credits)",
                trace.tail(),
            )
        if type(frame) is Error:
            break
    reason = show_text(frame.reason)
    with contextlib.suppress(PeerClosed):
        while True:
            extra = await probe.recv()
            raise CaseFailed(f"ERROR, then {extra.TYPE.name}: nothing may follow an ERROR", trace.tail())
    return f"ERROR {reason!r} for the frame beyond the credit, and a close; " + await ctx.still_serving(
        trace, bystander
    )


# --- points of reference ------------------------------------------------------------------------------


async def ack_checkpoint_point(ctx: WorkerUnderTest, trace: Trace) -> str:
    probe, _ = await ctx.handshake(trace)
    stream_id, _ = await ctx.open_stream(probe)
    ids = list(range(10, 101, 10))
    probe.send(*(Message(stream_id, i, 0, b"", b"m%d" % i) for i in ids))
    point = await _final_ack(probe, stream_id)
    if point not in ids:
        raise CaseFailed(
            f"the checkpoint ACK says {point}: not the id of a message sent (ids {ids[0]}..{ids[-1]} by 10)",
            trace.tail(),
        )
    return f"ACK after a checkpoint: ({stream_id}, {point}), the id of the last message it holds"


async def notify_resume_point(ctx: WorkerUnderTest, trace: Trace) -> str:
    first, _ = await ctx.handshake(trace, "c1")
    stream_id, _ = await ctx.open_stream(first)
    ids = list(range(10, 101, 10))
    first.send(*(Message(stream_id, i, 0, b"", b"m%d" % i) for i in ids))
    acked = await _final_ack(first, stream_id)
    await first.close()
    trace(f"c1 closed after an ACK at {acked}")
    second, _ = await ctx.handshake(trace, "c2")
    while True:  # the first connection's close may not have released the stream yet
        second.send(Notify(stream_id, "resumed", 0))
        ack = await second.expect(NotifyAck, lambda f: f.stream_id == stream_id)
        if ack.success:
            break
    if ack.point_of_ref < acked or ack.point_of_ref not in ids:
        raise CaseFailed(
            f"NOTIFY_ACK point of reference {ack.point_of_ref}; the last ACK said {acked}", trace.tail()
        )
    return f"after the ACK at {acked} and a close, NOTIFY_ACK resumes at {ack.point_of_ref}"


async def eos_acknowledged(ctx: WorkerUnderTest, trace: Trace) -> str:
    probe, _ = await ctx.handshake(trace)
    stream_id, _ = await ctx.open_stream(probe)
    probe.send(*(Message(stream_id, i, 0, b"", b"m%d" % i) for i in (1, 2, 3)), ctx.eos(stream_id, 3))
    point = await _final_ack(probe, stream_id)
    if point != 3:
        raise CaseFailed(f"the ACK after EOS_MESSAGE says {point}, not the last id 3", trace.tail())
    return f"EOS_MESSAGE ({ctx.dialect} form) answered with ACK ({stream_id}, 3)"


async def eos_renotify(ctx: WorkerUnderTest, trace: Trace) -> str:
    probe, _ = await ctx.handshake(trace)
    stream_id, _ = await ctx.open_stream(probe)
    probe.send(Message(stream_id, 1, 0, b"", b"one"), ctx.eos(stream_id, 1))
    await _final_ack(probe, stream_id)
    probe.send(Notify(stream_id, "again", 1))
    ack = await probe.expect(NotifyAck, lambda f: f.stream_id == stream_id)
    if not ack.success:
        raise CaseFailed("NOTIFY of a stream ended by EOS_MESSAGE was refused", trace.tail())
    probe.send(Message(stream_id, 2, 0, b"", b"two"))
    probe.check_clean()
    return f"NOTIFY_ACK success=1 at {ack.point_of_ref} after the stream ended"


# --- frames the worker must refuse ------------------------------------------------------------------


def _worker_frame(frame_for: Any):
    async def run(ctx: WorkerUnderTest, trace: Trace) -> str:
        async def misbehave(ctx: WorkerUnderTest, trace: Trace) -> Probe:
            probe, _ = await ctx.handshake(trace)
            probe.send(frame_for())
            return probe

        return await _error_case(ctx, trace, misbehave)

    return run


def _raw(data_for: Any, what: str, *, handshake: bool = True):
    async def run(ctx: WorkerUnderTest, trace: Trace) -> str:
        async def misbehave(ctx: WorkerUnderTest, trace: Trace) -> Probe:
            if handshake:
                probe, _ = await ctx.handshake(trace)
            else:
                probe = await ctx.connect(trace)
            probe.send_raw(data_for(), what)
            return probe

        return await _error_case(ctx, trace, misbehave)

    return run


def _notify_body() -> bytes:
    name = b"malformed"
    return bytes([3]) + (1).to_bytes(8, "big") + len(name).to_bytes(2, "big") + name + bytes(8)


def _framed(body: bytes) -> bytes:
    return U32.pack(len(body)) + body


async def oversize_length(ctx: WorkerUnderTest, trace: Trace) -> str:
    """The length prefix alone must be refused: the body never comes."""
    return await _raw(lambda: U32.pack(0xFFFF_FFF0) + bytes([5]), "length prefix 4294967280, no body")(
        ctx, trace
    )


def _cases() -> tuple[Case, ...]:
    hs, st, sm = spec("Handshake"), spec("Streaming"), spec("Stream State Machine")
    psm = spec("Protocol State Machine")
    return (
        Case("handshake.ok", hs, "HELLO with the version and cookie gets OK with credits > 0", handshake_ok),
        Case(
            "handshake.version",
            spec("Handshake, A1"),
            "a HELLO of another version gets ERROR and a close",
            handshake_version,
        ),
        Case(
            "handshake.cookie",
            spec("Handshake, A2 and C0"),
            "a HELLO with a wrong cookie gets ERROR and a close",
            handshake_cookie,
        ),
        Case(
            "handshake.hello-first",
            psm,
            "a NOTIFY before HELLO gets ERROR and a close",
            handshake_hello_first,
        ),
        Case("handshake.once", psm, "a second HELLO after OK gets ERROR and a close", handshake_once),
        Case(
            "notify.accepted", sm, "NOTIFY of a new stream gets NOTIFY_ACK success=1 for it", notify_accepted
        ),
        Case(
            "notify.repeat",
            sm,
            "a repeated NOTIFY of a stream the connection holds gets success=0",
            notify_repeat,
        ),
        Case(
            "notify.held-elsewhere",
            st,
            "NOTIFY of a stream another connection holds gets success=0",
            notify_held_elsewhere,
        ),
        Case(
            "notify.refused-then-message",
            sm,
            "a MESSAGE on a stream whose NOTIFY was refused gets ERROR and a close",
            notify_refused_then_message,
        ),
        Case(
            "message.unnotified",
            st,
            "a MESSAGE on a stream never NOTIFYed gets ERROR and a close",
            message_unnotified,
        ),
        Case(
            "message.replay-dropped",
            notes("What a point of reference means"),
            "an id not above the last is dropped without ERROR; the EOS ACK names the highest id",
            message_replay_dropped,
        ),
        Case(
            "credits.replenished",
            spec("ACK"),
            "ACKs top up the credits, so more frames than the first grant can be sent",
            credits_replenished,
        ),
        Case(
            "credits.overdraft",
            spec("Overview"),
            "a frame sent beyond the credit granted gets ERROR and a close",
            credits_overdraft,
        ),
        Case(
            "ack.checkpoint-point",
            spec("ACK"),
            "after a checkpoint an ACK names the stream at the id of the last message it holds",
            ack_checkpoint_point,
        ),
        Case(
            "notify.resume-point",
            sm,
            "after a close, NOTIFY_ACK of the stream resumes at or above the last ACKed id",
            notify_resume_point,
        ),
        Case(
            "eos.acknowledged",
            notes("What a point of reference means"),
            "EOS_MESSAGE is answered with an ACK at the stream's last id",
            eos_acknowledged,
        ),
        Case(
            "eos.renotify",
            spec("End of Stream"),
            "a stream ended by EOS_MESSAGE may be NOTIFYed again",
            eos_renotify,
        ),
        Case(
            "direction.ok",
            psm,
            "an OK sent by a connector gets ERROR and a close",
            _worker_frame(lambda: Ok(5)),
        ),
        Case(
            "direction.notify-ack",
            psm,
            "a NOTIFY_ACK sent by a connector gets ERROR and a close",
            _worker_frame(lambda: NotifyAck(True, 1, 0)),
        ),
        Case(
            "direction.ack",
            psm,
            "an ACK sent by a connector gets ERROR and a close",
            _worker_frame(lambda: Ack(5, ())),
        ),
        Case(
            "direction.restart",
            spec("RESTART"),
            "a RESTART sent by a connector gets ERROR and a close",
            _worker_frame(lambda: Restart(None)),
        ),
        Case(
            "malformed.unknown-type",
            spec("Wire Format"),
            "a frame of an unknown type gets ERROR and a close",
            _raw(lambda: _framed(bytes([42, 0, 0])), "a frame of type 42"),
        ),
        Case(
            "malformed.truncated",
            spec("Wire Format"),
            "a NOTIFY whose body ends inside a field gets ERROR and a close",
            _raw(lambda: _framed(_notify_body()[:-3]), "NOTIFY cut 3 bytes short"),
        ),
        Case(
            "malformed.trailing",
            spec("Wire Format"),
            "a NOTIFY with bytes after its last field gets ERROR and a close",
            _raw(lambda: _framed(_notify_body() + b"!!"), "NOTIFY with 2 trailing bytes"),
        ),
        Case(
            "malformed.zero-length",
            spec("Wire Format"),
            "a length prefix of 0 (no type byte) gets ERROR and a close",
            _raw(lambda: bytes(4), "length prefix 0"),
        ),
        Case(
            "malformed.hello-garbage",
            spec("Wire Format"),
            "a first frame that is no HELLO at all gets ERROR and a close",
            _raw(
                lambda: _framed(bytes([0, 0xFF, 0xFF, 1])),
                "HELLO whose version length runs past the body",
                handshake=False,
            ),
        ),
        Case(
            "malformed.oversize",
            spec("Wire Format, B1"),
            "a 4 GiB length prefix gets ERROR and a close at once, before any body",
            oversize_length,
        ),
    )


@contextlib.asynccontextmanager
async def open_worker(target: Target, options: Mapping[str, Any]) -> AsyncIterator[WorkerUnderTest]:
    host, port = parse_address(target.address or "")
    await reachable(host, port)
    cookie = options.get("cookie") or ""
    ctx = WorkerUnderTest(
        host,
        port,
        cookie.encode(),
        options.get("protocol_version") or SOURCE_VERSION,
        options.get("dialect") or "spec",
    )
    try:
        yield ctx
    finally:
        await ctx.close_all()


OPTIONS = (
    SuiteOption("cookie", "The cookie the worker expects.", ""),
    SuiteOption(
        "protocol-version",
        "The protocol version the worker speaks.",
        SOURCE_VERSION,
        aliases=("version",),
    ),
    SuiteOption(
        "dialect",
        "EOS_MESSAGE form: spec (stream id and last id) or shipped (stream id only).",
        "spec",
        choices=("spec", "shipped"),
    ),
)

CASES = _cases()
