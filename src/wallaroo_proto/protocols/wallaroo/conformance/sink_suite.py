"""``conformance sink HOST:PORT``: play the worker side of the sink protocol against a connector sink.

Each case uses a new instance name, so it starts from an empty output and
transaction log. After every case the sink must still take a new worker's
handshake; one that stopped serving fails the case that stopped it, and
``--restart-cmd`` (which must kill the sink and start it again) brings it back
for the next case. The ``restart.*`` cases need that command.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shlex
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.conformance.probes import ProbeKeeper
from wallaroo_proto.conformance.runner import (
    FAIL,
    Case,
    CaseFailed,
    CaseSkipped,
    Result,
    SuiteOption,
    SuiteUnavailable,
    Target,
    Trace,
)
from wallaroo_proto.conformance.target import parse_address, reachable

from ..errors import ProtocolError
from ..frames import SINK_VERSION, Error, Hello, Message, Notify, NotifyAck, Ok, show_text
from ..protocol import Side, Use
from ..twopc import (
    SINK_DATA_STREAM,
    TWOPC_STREAM,
    ListUncommitted,
    Phase1,
    Phase2,
    Reply,
    ReplyUncommitted,
    decode_twopc,
    twopc_frame,
)
from ..wire import U32
from .common import notes, spec, tag
from .probe import PeerClosed, Probe

_rtags = itertools.count(1)


def _is_twopc(kind: type):
    def match(frame) -> bool:
        if type(frame) is not Message or frame.stream_id != TWOPC_STREAM:
            return False
        try:
            return type(decode_twopc(frame.payload)) is kind
        except ProtocolError:
            return False

    return match


@dataclass
class SinkUnderTest(ProbeKeeper):
    host: str = "127.0.0.1"
    port: int = 7200
    cookie: bytes = b""
    version: str = SINK_VERSION
    prefix: str = "conformance"
    restart_cmd: str | None = None
    #: Seconds the restart command and the sink's coming back may take.
    restart_timeout: float = 60.0
    probes: list = field(default_factory=list)

    def instance(self, case: str) -> str:
        return f"{self.prefix}-{case}-{tag()}"

    async def connect(self, trace: Trace, label: str = "w1") -> Probe:
        probe = await Probe.connect(
            self.host, self.port, use=Use.SINK, our_side=Side.WORKER, trace=trace, label=label
        )
        return self.keep(probe)

    def hello(self, instance: str, **changes: Any) -> Hello:
        fields = {
            "version": self.version,
            "cookie": self.cookie,
            "program_name": "wallaroo-proto conformance",
            "instance_name": instance,
        }
        fields.update(changes)
        return Hello(**fields)

    async def open(self, trace: Trace, instance: str, label: str = "w1") -> tuple[Probe, tuple]:
        """HELLO, NOTIFY(1) and LIST_UNCOMMITTED at once, as the shipped worker sends them; listed txns."""
        probe = await self.connect(trace, label)
        rtag = next(_rtags)
        probe.send(
            self.hello(instance),
            Notify(SINK_DATA_STREAM, f"conformance-output-{instance}", 0),
            twopc_frame(ListUncommitted(rtag)),
        )
        await probe.expect(Ok)
        ack = await probe.expect(NotifyAck)
        if not ack.success or ack.stream_id != SINK_DATA_STREAM:
            raise CaseFailed(f"NOTIFY of the output stream 1 was answered {ack}", trace.tail())
        reply = await self.expect_twopc(probe, ReplyUncommitted)
        if reply.rtag != rtag:
            raise CaseFailed(f"REPLY_UNCOMMITTED carries rtag {reply.rtag}, not {rtag}", trace.tail())
        return probe, reply.txn_ids

    async def expect_twopc(self, probe: Probe, kind: type):
        frame = await probe.expect(Message, _is_twopc(kind), what=f"2PC {kind.TAG.name}")
        return decode_twopc(frame.payload)

    @staticmethod
    def data(probe: Probe, start: int, *chunks: bytes) -> int:
        """Output MESSAGEs from byte offset ``start``; the offset after them."""
        frames = []
        for chunk in chunks:
            frames.append(Message(SINK_DATA_STREAM, start, 0, b"", chunk))
            start += len(chunk)
        probe.send(*frames)
        return start

    async def phase1(self, probe: Probe, txn: str, where: tuple) -> bool:
        probe.send(twopc_frame(Phase1(txn, where)))
        while True:
            reply = await self.expect_twopc(probe, Reply)
            if reply.txn_id == txn:
                return reply.commit

    async def phase2(self, probe: Probe, txn: str, commit: bool) -> None:
        """PHASE2, then a LIST_UNCOMMITTED round trip: the sink has taken the PHASE2 when it answers."""
        rtag = next(_rtags)
        probe.send(twopc_frame(Phase2(txn, commit)), twopc_frame(ListUncommitted(rtag)))
        while True:
            reply = await self.expect_twopc(probe, ReplyUncommitted)
            if reply.rtag == rtag:
                return

    async def serving(self, trace: Trace) -> bool:
        """Does the sink still take a new worker's handshake?"""
        try:
            async with asyncio.timeout(10):
                probe, _ = await self.open(trace, self.instance("alive"), label="check")
            probe.abort()
            return True
        except (CaseFailed, OSError, TimeoutError):
            return False

    async def restart(self, trace: Trace) -> None:
        if not self.restart_cmd:
            raise CaseSkipped("needs --restart-cmd to kill and restart the sink")
        await self.close_all()
        trace(f"   running the restart command: {self.restart_cmd}")
        async with asyncio.timeout(self.restart_timeout):
            proc = await asyncio.create_subprocess_shell(  # a group of its own: Ctrl-C is the suite's
                self.restart_cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
            code = await proc.wait()
            if code != 0:
                raise CaseFailed(f"the restart command exited with {code}", trace.tail())
            while True:
                try:
                    _, writer = await asyncio.open_connection(self.host, self.port)
                    writer.transport.abort()
                    break
                except OSError:
                    await asyncio.sleep(0.05)
        trace("   the sink is back")

    async def after_case(self, case: Case, result: Result) -> Result:
        await self.close_all()
        trace = Trace()
        if await self.serving(trace):
            return result
        note = "the sink stopped serving new workers after this case"
        if result.status == FAIL:
            result.reason = f"{result.reason}; {note}"
        else:
            result.status, result.reason = FAIL, note
        result.seen = "\n".join(filter(None, (result.seen, trace.tail(4))))
        if self.restart_cmd:
            with contextlib.suppress(CaseFailed, TimeoutError, OSError):
                await self.restart(trace)
        return result


# --- handshake -------------------------------------------------------------------------------------


async def handshake_ok(ctx: SinkUnderTest, trace: Trace) -> str:
    probe, listed = await ctx.open(trace, ctx.instance("hs"))
    if listed:
        raise CaseFailed(f"a new instance has uncommitted txns {listed}", trace.tail())
    probe.check_clean()
    return "OK, NOTIFY_ACK success=1 for stream 1, REPLY_UNCOMMITTED with the rtag and no txns"


async def _expect_refusal(ctx: SinkUnderTest, trace: Trace, hello: Hello) -> str:
    probe = await ctx.connect(trace)
    probe.send(hello)
    reason = await probe.expect_error_and_close()
    return f"ERROR {reason!r} and a close"


async def handshake_version(ctx: SinkUnderTest, trace: Trace) -> str:
    return await _expect_refusal(
        ctx, trace, ctx.hello(ctx.instance("version"), version=ctx.version.lstrip("v") + ".9")
    )


async def handshake_cookie(ctx: SinkUnderTest, trace: Trace) -> str:
    return await _expect_refusal(
        ctx, trace, ctx.hello(ctx.instance("cookie"), cookie=ctx.cookie + b"-not-the-cookie")
    )


async def duplicate_instance(ctx: SinkUnderTest, trace: Trace) -> str:
    instance = ctx.instance("dup")
    first, _ = await ctx.open(trace, instance, "w1")
    second = await ctx.connect(trace, "w2")
    second.send(ctx.hello(instance))
    while True:
        try:
            frame = await second.recv()
        except PeerClosed:
            return "the second connection was closed"
        if type(frame) is Error:
            return f"ERROR {show_text(frame.reason)!r} for the second connection"
        if type(frame) is Ok:
            raise CaseFailed(
                f"a second connection of instance {instance!r}, still connected, got OK", trace.tail()
            )


async def notify_stream0(ctx: SinkUnderTest, trace: Trace) -> str:
    probe = await ctx.connect(trace)
    probe.send(ctx.hello(ctx.instance("n0")), Notify(TWOPC_STREAM, "two-phase commit", 0))
    await probe.expect(Ok)
    while True:
        try:
            frame = await probe.recv()
        except PeerClosed:
            return "closed the connection"
        if type(frame) is Error:
            return f"ERROR {show_text(frame.reason)!r}"
        if type(frame) is NotifyAck:
            if frame.success:
                raise CaseFailed("NOTIFY of stream 0 (2PC) was accepted as a data stream", trace.tail())
            return "NOTIFY_ACK success=0"


# --- two-phase commit --------------------------------------------------------------------------------


async def commit_round(ctx: SinkUnderTest, trace: Trace) -> str:
    instance = ctx.instance("commit")
    probe, _ = await ctx.open(trace, instance)
    end = ctx.data(probe, 0, b"alpha\n", b"beta\n", b"gamma\n")
    if not await ctx.phase1(probe, f"{instance}:c_id=1", ((1, 0, end),)):
        raise CaseFailed(f"voted abort on PHASE1 over [0, {end}) of contiguous data", trace.tail())
    await ctx.phase2(probe, f"{instance}:c_id=1", True)
    await probe.close()
    again, listed = await ctx.open(trace, instance, "w2")
    if listed:
        raise CaseFailed(f"after PHASE2 commit the reconnected instance lists {listed}", trace.tail())
    end2 = ctx.data(again, end, b"delta\n")
    if not await ctx.phase1(again, f"{instance}:c_id=2", ((1, end, end2),)):
        raise CaseFailed(
            f"after a reconnect, PHASE1 from the committed offset {end} voted abort", trace.tail()
        )
    again.check_clean()
    return (
        f"commit vote over [0, {end}); after PHASE2 commit and a reconnect, "
        f"nothing listed and a round from {end} commits"
    )


async def _abort_vote(ctx: SinkUnderTest, trace: Trace, name: str, send, where) -> str:
    instance = ctx.instance(name)
    probe, _ = await ctx.open(trace, instance)
    send(ctx, probe)
    if await ctx.phase1(probe, f"{instance}:c_id=1", where):
        raise CaseFailed(f"voted commit on PHASE1 {list(where)}", trace.tail())
    return f"REPLY abort for PHASE1 {list(where)}"


async def gap_aborts(ctx: SinkUnderTest, trace: Trace) -> str:
    def send(ctx: SinkUnderTest, probe: Probe) -> None:
        ctx.data(probe, 0, b"0123456789")
        ctx.data(probe, 20, b"0123456789")  # bytes 10..20 never sent

    return await _abort_vote(ctx, trace, "gap", send, ((1, 0, 10),)) + " after data at 0 and at 20 (a gap)"


async def where_stream_aborts(ctx: SinkUnderTest, trace: Trace) -> str:
    return await _abort_vote(ctx, trace, "where", lambda c, p: c.data(p, 0, b"0123456789"), ((2, 0, 10),))


async def where_start_aborts(ctx: SinkUnderTest, trace: Trace) -> str:
    return await _abort_vote(ctx, trace, "start", lambda c, p: c.data(p, 0, b"0123456789" * 2), ((1, 5, 20),))


async def where_end_aborts(ctx: SinkUnderTest, trace: Trace) -> str:
    return await _abort_vote(ctx, trace, "end", lambda c, p: c.data(p, 0, b"0123456789"), ((1, 0, 50),))


async def where_short_aborts(ctx: SinkUnderTest, trace: Trace) -> str:
    return await _abort_vote(ctx, trace, "short", lambda c, p: c.data(p, 0, b"0123456789"), ((1, 0, 5),))


async def abort_discards(ctx: SinkUnderTest, trace: Trace) -> str:
    instance = ctx.instance("abort")
    probe, _ = await ctx.open(trace, instance)
    end = ctx.data(probe, 0, b"doomed bytes\n")
    await ctx.phase1(probe, f"{instance}:c_id=1", ((1, 0, end),))
    await ctx.phase2(probe, f"{instance}:c_id=1", False)
    end2 = ctx.data(probe, 0, b"other bytes, longer\n")
    if not await ctx.phase1(probe, f"{instance}:c_id=2", ((1, 0, end2),)):
        raise CaseFailed(
            "after PHASE2 abort, new bytes from offset 0 were not taken: PHASE1 voted abort", trace.tail()
        )
    probe.check_clean()
    return f"after PHASE2 abort of [0, {end}), different bytes from 0 committed as [0, {end2})"


async def undecided_listed(ctx: SinkUnderTest, trace: Trace) -> str:
    instance = ctx.instance("undecided")
    probe, _ = await ctx.open(trace, instance)
    end = ctx.data(probe, 0, b"in doubt\n")
    txn = f"{instance}:c_id=1"
    if not await ctx.phase1(probe, txn, ((1, 0, end),)):
        raise CaseFailed("voted abort on PHASE1 over contiguous data", trace.tail())
    await probe.close()
    again, listed = await ctx.open(trace, instance, "w2")
    if txn not in listed:
        raise CaseFailed(
            f"the reconnected instance lists {list(listed)}, not the undecided {txn!r}", trace.tail()
        )
    await ctx.phase2(again, txn, True)
    return f"REPLY_UNCOMMITTED lists {txn!r} after a reconnect"


# --- durability across a restart ----------------------------------------------------------------------


async def restart_lists_undecided(ctx: SinkUnderTest, trace: Trace) -> str:
    if not ctx.restart_cmd:
        raise CaseSkipped("needs --restart-cmd to kill and restart the sink")
    instance = ctx.instance("crash")
    probe, _ = await ctx.open(trace, instance)
    end = ctx.data(probe, 0, b"committed before the crash\n")
    await ctx.phase1(probe, f"{instance}:c_id=1", ((1, 0, end),))
    await ctx.phase2(probe, f"{instance}:c_id=1", True)
    end2 = ctx.data(probe, end, b"voted, not decided\n")
    txn = f"{instance}:c_id=2"
    if not await ctx.phase1(probe, txn, ((1, end, end2),)):
        raise CaseFailed("voted abort on PHASE1 over contiguous data", trace.tail())
    await ctx.restart(trace)
    again, listed = await ctx.open(trace, instance, "w2")
    if txn not in listed:
        raise CaseFailed(
            f"after the restart REPLY_UNCOMMITTED lists {list(listed)}, not {txn!r}", trace.tail()
        )
    await ctx.phase2(again, txn, True)
    end3 = ctx.data(again, end2, b"after the crash\n")
    if not await ctx.phase1(again, f"{instance}:c_id=3", ((1, end2, end3),)):
        raise CaseFailed(
            f"PHASE1 from {end2}, the end of the txn committed after the restart, voted abort", trace.tail()
        )
    return f"undecided {txn!r} listed after the restart; committed it, and a round from {end2} commits"


async def restart_keeps_committed(ctx: SinkUnderTest, trace: Trace) -> str:
    if not ctx.restart_cmd:
        raise CaseSkipped("needs --restart-cmd to kill and restart the sink")
    instance = ctx.instance("kept")
    probe, _ = await ctx.open(trace, instance)
    end = ctx.data(probe, 0, b"first\n", b"second\n")
    await ctx.phase1(probe, f"{instance}:c_id=1", ((1, 0, end),))
    await ctx.phase2(probe, f"{instance}:c_id=1", True)
    await ctx.restart(trace)
    again, listed = await ctx.open(trace, instance, "w2")
    if listed:
        raise CaseFailed(f"after the restart a fully committed instance lists {list(listed)}", trace.tail())
    end2 = ctx.data(again, end, b"third\n")
    if not await ctx.phase1(again, f"{instance}:c_id=2", ((1, end, end2),)):
        raise CaseFailed(
            f"after the restart PHASE1 from the committed offset {end} voted abort", trace.tail()
        )
    return f"after the restart the committed [0, {end}) is kept: a round from {end} commits"


# --- bad frames ----------------------------------------------------------------------------------------


async def _bad_then_others(ctx: SinkUnderTest, trace: Trace, send) -> str:
    bystander, _ = await ctx.open(trace, ctx.instance("bystander"), "bystander")
    probe, _ = await ctx.open(trace, ctx.instance("bad"), "w1")
    send(probe)
    reason = await probe.expect_error_and_close()
    end = ctx.data(bystander, 0, b"still here\n")
    if not await ctx.phase1(bystander, "bystander:c_id=1", ((1, 0, end),)):
        raise CaseFailed("the other worker's round voted abort", trace.tail())
    return f"ERROR {reason!r} and a close; another worker's round still commits"


async def bad_twopc(ctx: SinkUnderTest, trace: Trace) -> str:
    return await _bad_then_others(
        ctx, trace, lambda p: p.send(Message(TWOPC_STREAM, 0, 0, b"", bytes([99, 1, 2])))
    )


async def unknown_frame(ctx: SinkUnderTest, trace: Trace) -> str:
    body = bytes([42, 0, 0])
    return await _bad_then_others(
        ctx, trace, lambda p: p.send_raw(U32.pack(len(body)) + body, "a frame of type 42")
    )


def _cases() -> tuple[Case, ...]:
    sink = spec("Connector sink protocol")
    twopc = spec("Connector sink protocol, 5")
    durable = spec("Connector sink protocol, 6")
    shipped = notes("The shipped connector sink and 2PC")
    return (
        Case(
            "handshake.ok",
            shipped,
            "HELLO v0.0.1, NOTIFY(1), LIST_UNCOMMITTED get OK, NOTIFY_ACK(1) and an empty REPLY_UNCOMMITTED",
            handshake_ok,
        ),
        Case(
            "notify.stream-0",
            spec("Connector sink protocol, 2"),
            "NOTIFY of stream 0 (2PC) as a data stream is refused",
            notify_stream0,
        ),
        Case(
            "twopc.commit",
            twopc,
            "PHASE1 over contiguous data votes commit; after PHASE2 commit a reconnect lists nothing",
            commit_round,
        ),
        Case(
            "twopc.gap-aborts",
            shipped,
            "data with a gap in its offsets makes the next PHASE1 vote abort",
            gap_aborts,
        ),
        Case(
            "twopc.where-stream-aborts",
            shipped,
            "a PHASE1 naming a stream other than the output stream votes abort",
            where_stream_aborts,
        ),
        Case(
            "twopc.where-start-aborts",
            shipped,
            "a PHASE1 not starting at the last committed offset votes abort",
            where_start_aborts,
        ),
        Case(
            "twopc.abort-discards",
            twopc,
            "PHASE2 abort discards the txn's bytes: other bytes from the same offset commit",
            abort_discards,
        ),
        Case(
            "twopc.undecided-listed",
            durable,
            "a txn voted but undecided is listed by REPLY_UNCOMMITTED when the worker reconnects",
            undecided_listed,
        ),
        Case(
            "restart.lists-undecided",
            durable,
            "after a kill and restart the undecided txn is listed, and committing it keeps its bytes",
            restart_lists_undecided,
            extra_time=60,
        ),
        Case(
            "restart.keeps-committed",
            durable,
            "after a kill and restart the committed bytes are kept",
            restart_keeps_committed,
            extra_time=60,
        ),
        Case(
            "twopc.where-end-aborts",
            shipped,
            "a PHASE1 ending past the data received votes abort",
            where_end_aborts,
        ),
        Case(
            "twopc.where-short-aborts",
            shipped,
            "a PHASE1 ending short of the data received votes abort",
            where_short_aborts,
        ),
        Case(
            "handshake.duplicate-instance",
            shipped,
            "a second connection of an instance name already connected is refused",
            duplicate_instance,
        ),
        Case(
            "handshake.version",
            spec("Handshake, A1"),
            "a HELLO of another version gets ERROR and a close",
            handshake_version,
        ),
        Case(
            "handshake.cookie",
            spec("Handshake, A2"),
            "a HELLO with a wrong cookie gets ERROR and a close",
            handshake_cookie,
        ),
        Case(
            "malformed.twopc-tag",
            sink,
            "an unknown 2PC tag gets ERROR and a close; other workers are still served",
            bad_twopc,
        ),
        Case(
            "malformed.unknown-type",
            spec("Wire Format"),
            "a frame of an unknown type gets ERROR and a close; other workers are still served",
            unknown_frame,
        ),
    )


@contextlib.asynccontextmanager
async def open_sink(target: Target, options: Mapping[str, Any]) -> AsyncIterator[SinkUnderTest]:
    host, port = parse_address(target.address or "")
    await reachable(host, port)
    restart_cmd = options.get("restart_cmd") or None
    if restart_cmd:
        try:
            shlex.split(restart_cmd)
        except ValueError as err:
            raise SuiteUnavailable(f"--restart-cmd: {err}") from None
    ctx = SinkUnderTest(
        host,
        port,
        (options.get("cookie") or "").encode(),
        options.get("protocol_version") or SINK_VERSION,
        options.get("instance") or "conformance",
        restart_cmd,
    )
    try:
        yield ctx
    finally:
        await ctx.close_all()


OPTIONS = (
    SuiteOption("cookie", "The cookie the sink expects.", ""),
    SuiteOption(
        "protocol-version",
        "The protocol version the sink speaks.",
        SINK_VERSION,
        aliases=("version",),
    ),
    SuiteOption("instance", "Prefix of the worker instance names the cases use.", "conformance"),
    SuiteOption(
        "restart-cmd", "Shell command that kills the sink and starts it again (enables restart.*).", None
    ),
)

CASES = _cases()
