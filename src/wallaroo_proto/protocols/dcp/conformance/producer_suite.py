"""``conformance producer HOST:PORT``: play a DCP consumer against a producer under test.

Each case opens its own connections with a fresh DCP connection name. Every packet
either way goes through ``core.Connection`` (see ``probe``), so the rules the core
knows (the failover log newest first, seqnos rising inside their snapshot marker,
each snapshot complete before the next, no message beyond the flow-control buffer
but the one the notes allow, one NOOP at a time, responses matched by opaque) are
judged in every case; each case adds the rule it is about. Where a ROLLBACK is due,
the seqno expected is worked out with the server's own rule (``core.needs_rollback``)
from the failover log and high seqno the producer gave.

The vbucket tested is ``--vbucket``, else the one with the highest seqno that
GET_ALL_VB_SEQNOS names (vbucket 0 if the producer does not answer it). Against a
Couchbase data node, ``--user``/``--password`` authenticate each connection (the
strongest SCRAM the producer lists, its signature checked, else PLAIN) and
``--bucket`` selects the bucket, as a real consumer does before DCP_OPEN.
"""

from __future__ import annotations

import contextlib
import json
import random
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.conformance.probes import ProbeKeeper
from wallaroo_proto.conformance.runner import (
    Case,
    CaseFailed,
    CaseSkipped,
    SuiteOption,
    SuiteUnavailable,
    Target,
    Trace,
)
from wallaroo_proto.conformance.target import parse_address, reachable

from .. import codec, sasl
from ..codec import FOREVER, StreamReq
from ..core import needs_rollback
from .probe import ProducerProbe

#: Where each rule is written: kv_engine's DCP docs and code, as the protocol notes cite them.
DOCS = "kv_engine docs"
CODE = "kv_engine"
VBUCKETS = 1024
_OPEN_EXTRAS = struct.Struct(">II")
_STREAM_REQ = struct.Struct(">IIQQQQQ")


def tag() -> str:
    return f"{random.getrandbits(32):08x}"


@dataclass
class ProducerUnderTest(ProbeKeeper):
    host: str
    port: int
    vbucket: int | None = None
    buffer_size: int = 1024
    noop_interval: float = 1.0
    window: float = 0.5
    user: str | None = None
    password: str = ""
    bucket: str | None = None
    probes: list[ProducerProbe] = field(default_factory=list)

    async def connect(self, trace: Trace, label: str = "c1", select: bool = True) -> ProducerProbe:
        """A connection, authenticated (SASL) and on the bucket when ``--user``/``--bucket`` say so."""
        probe = await ProducerProbe.connect(self.host, self.port, trace, label)
        self.probes.append(probe)
        if self.user is not None:
            await login(probe, self.user, self.password)
        if self.bucket is not None and select:
            opaque = probe.request(codec.SELECT_BUCKET, key=self.bucket.encode())
            await probe.expect_success(opaque, f"SELECT_BUCKET {self.bucket}")
        return probe

    async def opened(self, trace: Trace, label: str = "c1", **controls: str) -> ProducerProbe:
        """A connection after DCP_OPEN (producer) and the given controls, each answered SUCCESS."""
        probe = await self.connect(trace, label)
        opaque = probe.next_opaque()
        name = f"wallaroo-proto-conformance-{tag()}"
        probe.send(codec.open_request(name, codec.OPEN_PRODUCER, opaque))
        await probe.expect_success(opaque, "DCP_OPEN")
        for key, value in controls.items():
            opaque = probe.next_opaque()
            probe.send(codec.control_request(key, value, opaque))
            await probe.expect_success(opaque, f"DCP_CONTROL {key}={value}")
        return probe

    async def seqnos(self, probe: ProducerProbe) -> dict[int, int] | None:
        """vbucket -> high seqno from GET_ALL_VB_SEQNOS, None if the producer does not answer it."""
        p, msg = await probe.call(codec.GET_ALL_VB_SEQNOS)
        if p.status != codec.SUCCESS or msg.vb_seqnos is None:
            return None
        return dict(msg.vb_seqnos)

    async def target(self, probe: ProducerProbe) -> tuple[int, int | None]:
        """The vbucket under test and its high seqno (None if the producer would not say)."""
        seqnos = await self.seqnos(probe)
        if self.vbucket is not None:
            return self.vbucket, (seqnos or {}).get(self.vbucket)
        if not seqnos:
            return 0, None
        vb = max(sorted(seqnos), key=lambda v: seqnos[v])
        return vb, seqnos[vb]

    async def history(self, probe: ProducerProbe) -> tuple[int, int, list[tuple[int, int]]]:
        """(vbucket, high seqno, failover log) of the vbucket under test; skip if it has no items."""
        vb, high = await self.target(probe)
        opaque, p, msg = await stream_request(probe, vb, StreamReq(0, 0, 0, 0, 0, 0))
        if p.status != codec.SUCCESS:
            raise CaseFailed(
                f"a stream request from 0 on vbucket {vb} got {msg.status_name}", probe.trace.tail()
            )
        log = msg.failover_log
        close = probe.next_opaque()
        probe.send(codec.request(codec.CLOSE_STREAM, vbucket=vb, opaque=close))
        reply, _ = await probe.response(close)
        if reply.status == codec.SUCCESS:  # closed before its STREAM_END went: no stream is left
            probe.conn.end_stream(opaque, "closed")
        if high is None:
            raise CaseSkipped(f"the producer did not name vbucket {vb}'s high seqno (GET_ALL_VB_SEQNOS)")
        if high == 0:
            raise CaseSkipped(f"vbucket {vb} has no items")
        return vb, high, log


async def stream_request(probe: ProducerProbe, vb: int, req: StreamReq) -> tuple[int, Any, Any]:
    opaque = probe.next_opaque()
    probe.send(codec.stream_req_request(vb, opaque, req))
    p, msg = await probe.response(opaque)
    return opaque, p, msg


def ended(messages: list) -> bool:
    return bool(messages) and isinstance(messages[-1][1], codec.StreamEnd)


async def expect_status(probe: ProducerProbe, vb: int, req: StreamReq, status: int) -> str:
    _, p, msg = await stream_request(probe, vb, req)
    if p.status != status:
        raise CaseFailed(f"{msg.status_name} where {codec.STATUSES[status]} was due", probe.trace.tail())
    return codec.STATUSES[status]


async def expect_rollback(probe: ProducerProbe, vb: int, req: StreamReq, log: list, high: int) -> str:
    """A stream request the server's rule answers with ROLLBACK: the seqno must be the rule's."""
    due = needs_rollback(req.start, req.vbucket_uuid, req.snap_start, req.snap_end, log, high)
    assert due is not None, "the case built a request that needs no rollback"
    _, p, msg = await stream_request(probe, vb, req)
    if p.status != codec.ROLLBACK:
        raise CaseFailed(f"{msg.status_name} where ROLLBACK to {due} was due", probe.trace.tail())
    if msg.rollback_seqno != due:
        raise CaseFailed(f"ROLLBACK to {msg.rollback_seqno}, the rule gives {due}", probe.trace.tail())
    return f"ROLLBACK to {due}, as the rule gives"


# --- setup --------------------------------------------------------------------------------------------


async def open_producer(ctx: ProducerUnderTest, trace: Trace) -> str:
    await ctx.opened(trace)
    return "DCP_OPEN answered SUCCESS"


async def hello_features(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.connect(trace)
    asked = (0x03, 0x0B)  # TcpNoDelay, JSON: neither changes what a DCP packet looks like
    value = b"".join(f.to_bytes(2, "big") for f in asked)
    p, msg = await probe.call(codec.HELLO, key=b"wallaroo-proto-conformance", value=value)
    if p.status != codec.SUCCESS:
        raise CaseFailed(f"HELLO answered {msg.status_name}", trace.tail())
    if len(msg.value) % 2:
        raise CaseFailed(f"HELLO response value of {len(msg.value)} bytes is no list of u16", trace.tail())
    granted = [int.from_bytes(msg.value[i : i + 2], "big") for i in range(0, len(msg.value), 2)]
    extra = [f"0x{f:02x}" for f in granted if f not in asked]
    if extra:
        raise CaseFailed(f"HELLO granted features not asked for: {', '.join(extra)}", trace.tail())
    return "granted " + (", ".join(f"0x{f:02x}" for f in granted) or "no features") + " of 0x03, 0x0b"


async def control_unknown_key(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    opaque = probe.next_opaque()
    probe.send(codec.control_request(f"no_such_control_{tag()}", "true", opaque))
    p, msg = await probe.response(opaque)
    if p.status != codec.EINVAL:
        raise CaseFailed(f"an unknown control key answered {msg.status_name}, not EINVAL", trace.tail())
    return "EINVAL"


# --- stream requests ----------------------------------------------------------------------------------


async def stream_failover_log(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, _ = await ctx.target(probe)
    _, p, msg = await stream_request(probe, vb, StreamReq(0, 0, FOREVER, 0, 0, 0))
    if p.status != codec.SUCCESS:
        raise CaseFailed(f"a stream request from 0 answered {msg.status_name}", trace.tail())
    newest = msg.failover_log[0]
    return f"vbucket {vb}: failover log of {len(msg.failover_log)}, newest 0x{newest[0]:x} at {newest[1]}"


async def stream_snapshots(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, high, _ = await ctx.history(probe)
    opaque, p, _ = await stream_request(probe, vb, StreamReq(0, 0, high, 0, 0, 0))
    messages = await probe.stream_until(opaque, ended)
    end = messages[-1][1]
    if end.reason != codec.END_OK:
        raise CaseFailed(f"the stream to {high} ended {end.reason_name}, not ok", trace.tail())
    markers = [m for _, m in messages if isinstance(m, codec.SnapshotMarker)]
    items = [m for _, m in messages if isinstance(m, (codec.Mutation, codec.Deletion, codec.Expiration))]
    if not markers or markers[-1].end != high:
        raise CaseFailed(f"the last snapshot does not end at the high seqno {high}", trace.tail())
    return f"{len(items)} items in {len(markers)} snapshots up to {high}, then STREAM_END ok"


async def stream_empty_range(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, high, log = await ctx.history(probe)
    req = StreamReq(0, high, high, log[0][0], high, high)
    opaque, p, msg = await stream_request(probe, vb, req)
    if p.status != codec.SUCCESS:
        raise CaseFailed(f"a stream request from {high} to {high} answered {msg.status_name}", trace.tail())
    messages = await probe.stream_until(opaque, ended)
    if len(messages) != 1 or messages[0][1].reason != codec.END_OK:
        raise CaseFailed(
            f"{len(messages) - 1} messages before the STREAM_END, or it was not ok", trace.tail()
        )
    return "accepted, then STREAM_END ok with no items"


async def stream_erange_end(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, high, log = await ctx.history(probe)
    return await expect_status(probe, vb, StreamReq(0, high, high - 1, log[0][0], high, high), codec.ERANGE)


async def stream_erange_snapshot(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, high, log = await ctx.history(probe)
    req = StreamReq(0, high, FOREVER, log[0][0], high + 1, high + 2)
    return await expect_status(probe, vb, req, codec.ERANGE)


async def stream_key_eexists(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, _ = await ctx.target(probe)
    _, p, msg = await stream_request(probe, vb, StreamReq(0, 0, FOREVER, 0, 0, 0))
    if p.status != codec.SUCCESS:
        raise CaseFailed(f"the first stream request answered {msg.status_name}", trace.tail())
    return await expect_status(probe, vb, StreamReq(0, 0, FOREVER, 0, 0, 0), codec.KEY_EEXISTS)


async def stream_not_my_vbucket(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    seqnos = await ctx.seqnos(probe)
    if seqnos is None:
        raise CaseSkipped("the producer does not answer GET_ALL_VB_SEQNOS: which vbuckets it owns is unknown")
    foreign = [vb for vb in range(VBUCKETS - 1, -1, -1) if vb not in seqnos]
    if not foreign:
        raise CaseSkipped(f"the producer owns all {VBUCKETS} vbuckets")
    vb = foreign[0]
    await expect_status(probe, vb, StreamReq(0, 0, FOREVER, 0, 0, 0), codec.NOT_MY_VBUCKET)
    return f"NOT_MY_VBUCKET for vbucket {vb}, which GET_ALL_VB_SEQNOS does not name"


# --- rollback -----------------------------------------------------------------------------------------


async def rollback_unknown_uuid(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, high, log = await ctx.history(probe)
    uuid = next(u for u in iter(lambda: random.getrandbits(64), None) if u and u not in dict(log))
    return await expect_rollback(probe, vb, StreamReq(0, 1, FOREVER, uuid, 1, 1), log, high)


async def rollback_ahead(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, high, log = await ctx.history(probe)
    start = high + 10
    return await expect_rollback(probe, vb, StreamReq(0, start, FOREVER, log[0][0], start, start), log, high)


async def rollback_diverged(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, high, log = await ctx.history(probe)
    if len(log) < 2:
        raise CaseSkipped(f"vbucket {vb}'s failover log has one entry: no history has diverged")
    older, branch = log[1][0], log[0][1]  # the older uuid, and the seqno where the newer one took over
    start = branch + 1
    return await expect_rollback(probe, vb, StreamReq(0, start, FOREVER, older, start, start), log, high)


async def rollback_resume(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, high, log = await ctx.history(probe)
    start = high // 2
    req = StreamReq(0, start, high, log[0][0], start, start)
    assert needs_rollback(start, log[0][0], start, start, log, high) is None
    opaque, p, msg = await stream_request(probe, vb, req)
    if p.status != codec.SUCCESS:
        raise CaseFailed(
            f"a resume from {start} under the newest uuid answered {msg.status_name}", trace.tail()
        )
    messages = await probe.stream_until(opaque, ended)
    seqnos = [m.seqno for _, m in messages if hasattr(m, "seqno")]
    if any(s <= start for s in seqnos):
        raise CaseFailed(f"items at or below the resume point {start} were sent again", trace.tail())
    return f"accepted from {start}: {len(seqnos)} items above it, then STREAM_END"


# --- flow control and noops ---------------------------------------------------------------------------


async def _filled(ctx: ProducerUnderTest, trace: Trace) -> tuple[ProducerProbe, int, int]:
    """A stream under a small buffer, read without acknowledging until the producer filled it."""
    probe = await ctx.opened(trace, connection_buffer_size=str(ctx.buffer_size))
    vb, high, _ = await ctx.history(probe)
    opaque, p, msg = await stream_request(probe, vb, StreamReq(0, 0, high, 0, 0, 0))
    if p.status != codec.SUCCESS:
        raise CaseFailed(f"the stream request answered {msg.status_name}", trace.tail())
    conn = probe.conn
    trace(f"   waiting for {ctx.buffer_size} unacknowledged bytes")
    messages = await probe.stream_until(opaque, lambda m: ended(m) or conn.outstanding >= ctx.buffer_size)
    if ended(messages) and conn.outstanding < ctx.buffer_size:
        raise CaseSkipped(f"vbucket {vb}'s whole stream fits a {ctx.buffer_size}-byte buffer")
    return probe, opaque, high


async def flow_window(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe, opaque, _ = await _filled(ctx, trace)
    sent = len(probe.stream_messages[opaque])
    await probe.quiet(ctx.window)  # anything sent now is beyond the buffer: the core fails it
    if ended(probe.stream_messages[opaque]):
        return "the stream ended inside the buffer"
    return (
        f"paused after {sent} messages with {probe.conn.outstanding} of {ctx.buffer_size} bytes "
        f"unacknowledged, and stayed paused {ctx.window:g} s"
    )


async def flow_buffer_ack(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe, opaque, high = await _filled(ctx, trace)
    conn = probe.conn
    acks = 0
    while not ended(probe.stream_messages[opaque]):
        if conn.outstanding >= ctx.buffer_size // 2:
            probe.send(codec.buffer_ack(conn.outstanding))
            acks += 1
        await probe.until(lambda: bool(probe.inbox) or ended(probe.stream_messages[opaque]))
        probe.inbox.clear()
    return f"resumed after each BUFFER_ACK ({acks} sent); the stream reached {high} and ended"


async def noop_sent(ctx: ProducerUnderTest, trace: Trace) -> str:
    interval = f"{ctx.noop_interval:g}"
    probe = await ctx.opened(trace, enable_noop="true", set_noop_interval=interval)
    trace(f"   waiting for a DCP_NOOP (interval {interval} s)")
    await probe.until(lambda: bool(probe.noops))
    return f"DCP_NOOP opaque 0x{probe.noops[0]:08x}, answered with its opaque"


async def noop_one_at_a_time(ctx: ProducerUnderTest, trace: Trace) -> str:
    interval = f"{ctx.noop_interval:g}"
    probe = await ctx.opened(trace, enable_noop="true", set_noop_interval=interval)
    probe.answer_noops = False
    trace(f"   waiting for a DCP_NOOP (interval {interval} s)")
    await probe.until(lambda: bool(probe.noops))
    await probe.quiet(2.5 * ctx.noop_interval)  # a second NOOP now is one too many: the core fails it
    probe.answer_noop(probe.noops[0])
    probe.answer_noops = True
    trace("   waiting for the next DCP_NOOP")
    await probe.until(lambda: len(probe.noops) >= 2)
    quiet = 2.5 * ctx.noop_interval
    return f"no second NOOP in {quiet:g} s while the first was unanswered; the next came after the answer"


async def noop_wrong_opaque(ctx: ProducerUnderTest, trace: Trace) -> str:
    bystander = await ctx.opened(trace, "bystander")
    interval = f"{ctx.noop_interval:g}"
    probe = await ctx.opened(trace, enable_noop="true", set_noop_interval=interval)
    probe.answer_noops = False
    trace(f"   waiting for a DCP_NOOP (interval {interval} s)")
    await probe.until(lambda: bool(probe.noops))
    probe.answer_noop(probe.noops[0] ^ 0xFFFF)
    trace("   waiting for the producer to close the connection")
    await probe.closes()
    return "the producer closed the connection; " + await _still_serving(ctx, trace, bystander)


# --- stream end and close ----------------------------------------------------------------------------


async def close_stream_end(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace, send_stream_end_on_client_close_stream="true")
    vb, _ = await ctx.target(probe)
    opaque, p, msg = await stream_request(probe, vb, StreamReq(0, 0, FOREVER, 0, 0, 0))
    if p.status != codec.SUCCESS:
        raise CaseFailed(f"the stream request answered {msg.status_name}", trace.tail())
    close = probe.next_opaque()
    probe.send(codec.request(codec.CLOSE_STREAM, vbucket=vb, opaque=close))
    await probe.expect_success(close, "DCP_CLOSE_STREAM")
    trace("   waiting for STREAM_END closed")
    messages = await probe.stream_until(opaque, ended)
    if messages[-1][1].reason != codec.END_CLOSED:
        raise CaseFailed(f"STREAM_END {messages[-1][1].reason_name}, not closed", trace.tail())
    return "SUCCESS, then STREAM_END closed"


async def close_stream_unknown(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    vb, _ = await ctx.target(probe)
    p, msg = await probe.call(codec.CLOSE_STREAM, vbucket=vb)
    if p.status != codec.KEY_ENOENT:
        raise CaseFailed(
            f"closing a stream never opened answered {msg.status_name}, not KEY_ENOENT", trace.tail()
        )
    return "KEY_ENOENT"


# --- malformed packets --------------------------------------------------------------------------------


async def _still_serving(ctx: ProducerUnderTest, trace: Trace, bystander: ProducerProbe) -> str:
    opaque = bystander.next_opaque()
    bystander.send(codec.control_request("enable_noop", "false", opaque))
    await bystander.expect_success(opaque, "the bystander's DCP_CONTROL")
    await ctx.opened(trace, "newcomer")
    return "the producer still served another connection and a new one"


async def _malformed(
    ctx: ProducerUnderTest, trace: Trace, misbehave: Callable[[ProducerProbe], Awaitable[str]]
) -> str:
    bystander = await ctx.opened(trace, "bystander")
    probe = await ctx.opened(trace)
    seen = await misbehave(probe)
    return f"{seen}; " + await _still_serving(ctx, trace, bystander)


async def malformed_stream_req(ctx: ProducerUnderTest, trace: Trace) -> str:
    async def misbehave(probe: ProducerProbe) -> str:
        vb, _ = await ctx.target(probe)
        extras = _STREAM_REQ.pack(0, 0, 0, FOREVER, 0, 0, 0)[:40]
        p, msg = await probe.call(codec.STREAM_REQ, vbucket=vb, extras=extras)
        if p.status != codec.EINVAL:
            raise CaseFailed(f"a STREAM_REQ with 40 bytes of extras answered {msg.status_name}", trace.tail())
        return "EINVAL"

    return await _malformed(ctx, trace, misbehave)


async def malformed_control(ctx: ProducerUnderTest, trace: Trace) -> str:
    async def misbehave(probe: ProducerProbe) -> str:
        p, msg = await probe.call(codec.CONTROL, key=b"enable_noop")
        if p.status != codec.EINVAL:
            raise CaseFailed(f"a DCP_CONTROL with no value answered {msg.status_name}", trace.tail())
        return "EINVAL"

    return await _malformed(ctx, trace, misbehave)


async def malformed_magic(ctx: ProducerUnderTest, trace: Trace) -> str:
    async def misbehave(probe: ProducerProbe) -> str:
        header = bytes([0x42]) + codec.request(codec.NOOP, opaque=probe.next_opaque())[1:]
        probe.send_raw(header, "a header with magic 0x42")
        trace("   waiting for the producer to close the connection")
        await probe.closes()
        return "the producer closed the connection"

    return await _malformed(ctx, trace, misbehave)


# --- refusals, as kv_engine's validators and executors answer them -----------------------------------


#: An opcode kv_engine does not define (between GetFileFragment 0xe3 and 0xf0).
UNKNOWN_OPCODE = 0xEE


async def login(probe: ProducerProbe, user: str, password: str) -> str:
    """SASL as a client of a data node: the strongest SCRAM the producer lists, else PLAIN; the mechanism."""
    p, msg = await probe.call(codec.SASL_LIST_MECHS)
    offered = msg.value.decode("ascii", "replace").split() if p.status == codec.SUCCESS else []
    mechanism = sasl.choose(offered) or "PLAIN"
    if mechanism == "PLAIN":
        opaque = probe.request(codec.SASL_AUTH, key=b"PLAIN", value=sasl.plain_message(user, password))
        await probe.expect_success(opaque, "SASL PLAIN")
        return mechanism
    scram = sasl.ScramClient(user, password, mechanism)
    p, msg = await probe.call(codec.SASL_AUTH, key=mechanism.encode(), value=scram.first())
    if p.status != codec.AUTH_CONTINUE:
        raise CaseFailed(
            f"SASL_AUTH {mechanism} answered {msg.status_name}, not AUTH_CONTINUE", probe.trace.tail()
        )
    try:
        final = scram.final(msg.value)
        opaque = probe.request(codec.SASL_STEP, key=mechanism.encode(), value=final)
        scram.verify((await probe.expect_success(opaque, f"SASL_STEP {mechanism}")).value)
    except sasl.AuthFailed as err:
        raise CaseFailed(str(err), probe.trace.tail()) from None
    return mechanism


async def error_map(ctx: ProducerUnderTest, trace: Trace) -> str:
    """GET_ERROR_MAP before authentication, as a client asks right after HELLO."""
    probe = await ProducerProbe.connect(ctx.host, ctx.port, trace, "c1")
    ctx.probes.append(probe)
    p, msg = await probe.call(codec.GET_ERROR_MAP, value=b"\x00\x02")
    if p.status != codec.SUCCESS:
        raise CaseFailed(f"GET_ERROR_MAP version 2 answered {msg.status_name}", trace.tail())
    try:
        emap = json.loads(msg.value)
        errors = emap["errors"]
        version, revision = emap["version"], emap["revision"]
        named = all(int(k, 16) >= 0 and {"name", "desc", "attrs"} <= set(e) for k, e in errors.items())
    except (ValueError, KeyError, TypeError, AttributeError):
        named = False
    if not named:
        raise CaseFailed(
            f"GET_ERROR_MAP version 2 answer ({len(msg.value)} bytes) is no map of statuses "
            "(version, revision, errors by hex status with name, desc, attrs)",
            trace.tail(),
        )
    if version not in (1, 2) or "fetch-config" not in errors.get("7", {}).get("attrs", []):
        raise CaseFailed(
            f"error map version {version} (must be 1 or 2), NOT_MY_VBUCKET without fetch-config", trace.tail()
        )
    p, msg = await probe.call(codec.GET_ERROR_MAP, value=b"\x00\x00")
    if p.status != codec.KEY_ENOENT:
        raise CaseFailed(f"GET_ERROR_MAP version 0 answered {msg.status_name}, not KEY_ENOENT", trace.tail())
    return f"version {version} revision {revision}, {len(errors)} statuses; version 0: KEY_ENOENT"


def _needs_auth(ctx: ProducerUnderTest) -> None:
    if ctx.user is None:
        raise CaseSkipped("needs --user and --password: a producer that requires authentication")


async def _refused(probe: ProducerProbe, opaque: int, status: int, what: str) -> str:
    p, msg = await probe.response(opaque)
    if p.status != status:
        due = codec.STATUSES[status]
        raise CaseFailed(f"{what} answered {msg.status_name}, not {due}", probe.trace.tail())
    return codec.STATUSES[status]


async def _kept(probe: ProducerProbe) -> str:
    """The connection still answers: a VERSION comes back."""
    await probe.expect_success(probe.request(codec.VERSION), "VERSION after the refusal")
    return "the connection is kept"


async def auth_required(ctx: ProducerUnderTest, trace: Trace) -> str:
    _needs_auth(ctx)
    probe = await ProducerProbe.connect(ctx.host, ctx.port, trace, "c1")
    ctx.probes.append(probe)
    opaque = probe.next_opaque()
    probe.send(codec.open_request(f"wallaroo-proto-conformance-{tag()}", codec.OPEN_PRODUCER, opaque))
    seen = await _refused(probe, opaque, codec.EACCESS, "DCP_OPEN before authentication")
    mechanism = await login(probe, ctx.user, ctx.password)
    return f"{seen}; the same connection then authenticates ({mechanism})"


async def auth_wrong_password(ctx: ProducerUnderTest, trace: Trace) -> str:
    _needs_auth(ctx)
    probe = await ProducerProbe.connect(ctx.host, ctx.port, trace, "c1")
    ctx.probes.append(probe)
    plain = b"\0" + ctx.user.encode() + b"\0" + ctx.password.encode() + b"-wrong"
    opaque = probe.request(codec.SASL_AUTH, key=b"PLAIN", value=plain)
    return await _refused(probe, opaque, codec.AUTH_ERROR, "SASL PLAIN with a wrong password")


async def bucket_none(ctx: ProducerUnderTest, trace: Trace) -> str:
    _needs_auth(ctx)
    probe = await ctx.connect(trace, select=False)
    opaque = probe.next_opaque()
    probe.send(codec.open_request(f"wallaroo-proto-conformance-{tag()}", codec.OPEN_PRODUCER, opaque))
    return await _refused(probe, opaque, codec.NO_BUCKET, "DCP_OPEN with no bucket selected")


async def bucket_unknown(ctx: ProducerUnderTest, trace: Trace) -> str:
    _needs_auth(ctx)
    probe = await ctx.connect(trace, select=False)
    opaque = probe.request(codec.SELECT_BUCKET, key=f"no-such-bucket-{tag()}".encode())
    seen = await _refused(probe, opaque, codec.KEY_ENOENT, "SELECT_BUCKET of a bucket that does not exist")
    return f"{seen}; " + await _kept(probe)


async def open_twice(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    opaque = probe.next_opaque()
    probe.send(codec.open_request(f"wallaroo-proto-conformance-{tag()}", codec.OPEN_PRODUCER, opaque))
    seen = await _refused(probe, opaque, codec.EINVAL, "a second DCP_OPEN")
    return f"{seen}; " + await _kept(probe)


async def open_bad_flags(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.connect(trace)
    opaque = probe.next_opaque()
    flags = codec.OPEN_PRODUCER | 0x02  # 0x02: the old Notifier flag, outside the validator's mask
    probe.send(codec.open_request(f"wallaroo-proto-conformance-{tag()}", flags, opaque))
    seen = await _refused(probe, opaque, codec.EINVAL, "DCP_OPEN with flag 0x02")
    return f"{seen}; " + await _kept(probe)


async def stream_before_open(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.connect(trace)
    opaque = probe.next_opaque()
    probe.send(codec.stream_req_request(0, opaque, StreamReq(0, 0, FOREVER, 0, 0, 0)))
    seen = await _refused(probe, opaque, codec.EINVAL, "a STREAM_REQ before DCP_OPEN")
    return f"{seen}; " + await _kept(probe)


async def opcode_unknown(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    opaque = probe.request(UNKNOWN_OPCODE)
    seen = await _refused(probe, opaque, codec.UNKNOWN_COMMAND, f"opcode 0x{UNKNOWN_OPCODE:02x}")
    return f"{seen}; " + await _kept(probe)


async def malformed_control_extras(ctx: ProducerUnderTest, trace: Trace) -> str:
    probe = await ctx.opened(trace)
    opaque = probe.request(codec.CONTROL, extras=b"\0\0\0\0", key=b"enable_noop", value=b"true")
    seen = await _refused(probe, opaque, codec.EINVAL, "a DCP_CONTROL with 4 bytes of extras")
    return f"{seen}; " + await _kept(probe)


def _cases() -> tuple[Case, ...]:
    def case(id_: str, ref: str, expect: str, run, extra: float = 0.0) -> Case:
        return Case(id_, ref, expect, run, extra)

    return (
        case(
            "open.producer",
            f"{DOCS}: open-connection.md",
            "DCP_OPEN with the Producer flag is answered SUCCESS",
            open_producer,
        ),
        case(
            "hello.features",
            f"{DOCS}: BinaryProtocol.md, HELLO",
            "HELLO is answered with features the consumer asked for, and no others",
            hello_features,
        ),
        case(
            "control.unknown-key",
            f"{DOCS}: control.md",
            "a DCP_CONTROL of a key the producer does not know is answered EINVAL",
            control_unknown_key,
        ),
        case(
            "stream.failover-log",
            f"{DOCS}: stream-request.md, failover-log.md",
            "a stream request from 0 is answered SUCCESS with the failover log, newest first, no uuid 0",
            stream_failover_log,
        ),
        case(
            "stream.snapshots",
            f"{DOCS}: snapshot-marker.md",
            "items ride snapshot markers, seqnos rise inside each, each completes; STREAM_END ok at the end",
            stream_snapshots,
        ),
        case(
            "stream.empty-range",
            f"{CODE}: ActiveStream (start >= end)",
            "a stream request whose start is its end is accepted and ended at once, STREAM_END ok",
            stream_empty_range,
        ),
        case(
            "stream.erange-end",
            f"{CODE}: DcpProducer::streamRequest",
            "a stream request with start after end is answered ERANGE",
            stream_erange_end,
        ),
        case(
            "stream.erange-snapshot",
            f"{CODE}: DcpProducer::streamRequest",
            "a stream request whose snapshot range does not hold its start is answered ERANGE",
            stream_erange_snapshot,
        ),
        case(
            "stream.key-eexists",
            f"{CODE}: DcpProducer::streamRequest",
            "a second stream request for a vbucket with an open stream is answered KEY_EEXISTS",
            stream_key_eexists,
        ),
        case(
            "stream.not-my-vbucket",
            f"{CODE}: DcpProducer::streamRequest",
            "a stream request for a vbucket the producer does not own is answered NOT_MY_VBUCKET",
            stream_not_my_vbucket,
        ),
        case(
            "rollback.unknown-uuid",
            f"{CODE}: FailoverTable::needsRollback",
            "a request from seqno 1 with a uuid the failover log lacks gets ROLLBACK to 0",
            rollback_unknown_uuid,
        ),
        case(
            "rollback.ahead",
            f"{CODE}: FailoverTable::needsRollback",
            "a request from beyond the high seqno under the newest uuid gets ROLLBACK to the high seqno",
            rollback_ahead,
        ),
        case(
            "rollback.diverged",
            f"{CODE}: FailoverTable::needsRollback",
            "a request past a failover under the older uuid gets ROLLBACK to where the newer uuid began",
            rollback_diverged,
        ),
        case(
            "rollback.resume",
            f"{CODE}: FailoverTable::needsRollback",
            "a request from inside the history under the newest uuid resumes there, with no rollback",
            rollback_resume,
        ),
        case(
            "flow.window",
            f"{DOCS}: flow-control.md",
            "with connection_buffer_size and no BUFFER_ACK the producer stops at most one message over it",
            flow_window,
        ),
        case(
            "flow.buffer-ack",
            f"{DOCS}: buffer-ack.md",
            "each BUFFER_ACK lets the producer go on, so the stream completes",
            flow_buffer_ack,
        ),
        case(
            "noop.sent",
            f"{DOCS}: no-op.md",
            "after enable_noop and set_noop_interval a DCP_NOOP comes, and its answer is taken",
            noop_sent,
        ),
        case(
            "noop.one-at-a-time",
            f"{CODE}: DcpProducer::maybeSendNoop",
            "no second DCP_NOOP while one is unanswered; answering it with its opaque brings the next",
            noop_one_at_a_time,
            extra=10.0,
        ),
        case(
            "noop.wrong-opaque",
            f"{CODE}: DcpProducer::handleResponse",
            "a SUCCESS reply to a DCP_NOOP under another opaque: the producer disconnects, serves the others",
            noop_wrong_opaque,
        ),
        case(
            "close-stream.stream-end",
            f"{DOCS}: control.md",
            "with send_stream_end_on_client_close_stream, CLOSE_STREAM gets SUCCESS and STREAM_END closed",
            close_stream_end,
        ),
        case(
            "close-stream.unknown",
            f"{DOCS}: close-stream.md",
            "DCP_CLOSE_STREAM for a vbucket with no stream is answered KEY_ENOENT",
            close_stream_unknown,
        ),
        case(
            "malformed.stream-req",
            f"{CODE}: mcbp_validators",
            "a STREAM_REQ with 40 bytes of extras is answered EINVAL; the others are still served",
            malformed_stream_req,
        ),
        case(
            "malformed.control",
            f"{CODE}: mcbp_validators",
            "a DCP_CONTROL with no value is answered EINVAL; the others are still served",
            malformed_control,
        ),
        case(
            "malformed.control-extras",
            f"{CODE}: mcbp_validators, dcp_control_validator",
            "a DCP_CONTROL with extras is answered EINVAL and the connection is kept",
            malformed_control_extras,
        ),
        case(
            "error-map.versions",
            f"{CODE}: get_errmap_executor, ErrorMapManager",
            "GET_ERROR_MAP before authentication gets a map of version 1 or 2 (statuses by hex with "
            "name, desc, attrs; NOT_MY_VBUCKET fetch-config); version 0 gets KEY_ENOENT",
            error_map,
        ),
        case(
            "refuse.unauthenticated",
            f"{CODE}: Cookie::validateClientRequest",
            "DCP_OPEN before SASL is answered EACCESS; the connection may then authenticate (needs --user)",
            auth_required,
        ),
        case(
            "refuse.wrong-password",
            f"{CODE}: SASL (sasl_auth_command_context)",
            "SASL with a wrong password is answered AUTH_ERROR (needs --user)",
            auth_wrong_password,
        ),
        case(
            "refuse.no-bucket",
            f"{CODE}: NoBucket engine",
            "DCP_OPEN with no bucket selected is answered NO_BUCKET (needs --user)",
            bucket_none,
        ),
        case(
            "refuse.unknown-bucket",
            f"{CODE}: select_bucket_executor",
            "SELECT_BUCKET of a bucket that does not exist is answered KEY_ENOENT, connection kept "
            "(needs --user)",
            bucket_unknown,
        ),
        case(
            "refuse.open-twice",
            f"{CODE}: mcbp_validators, verify_common_dcp_restrictions",
            "a second DCP_OPEN on a connection is answered EINVAL, connection kept",
            open_twice,
        ),
        case(
            "refuse.open-flags",
            f"{CODE}: mcbp_validators, dcp_open_validator",
            "DCP_OPEN with a flag outside the validator's mask is answered EINVAL, connection kept",
            open_bad_flags,
        ),
        case(
            "refuse.before-open",
            f"{CODE}: mcbp_validators, verify_common_dcp_restrictions",
            "a STREAM_REQ before DCP_OPEN is answered EINVAL, connection kept",
            stream_before_open,
        ),
        case(
            "refuse.unknown-opcode",
            f"{CODE}: Cookie::validateClientRequest",
            "an opcode the server does not know is answered UNKNOWN_COMMAND, connection kept",
            opcode_unknown,
        ),
        case(
            "malformed.magic",
            f"{DOCS}: BinaryProtocol.md, magic",
            "a header of an unknown magic makes the producer close that connection; others are still served",
            malformed_magic,
        ),
    )


CASES = _cases()

OPTIONS = (
    SuiteOption("user", "Authenticate each connection as this user (the strongest SCRAM, else PLAIN).", None),
    SuiteOption("password", "The SASL password (with --user).", None),
    SuiteOption("bucket", "SELECT_BUCKET this bucket on each connection before DCP_OPEN.", None),
    SuiteOption("vbucket", "The vbucket to test (default: the one with the highest seqno).", None),
    SuiteOption("buffer-size", "connection_buffer_size of the flow-control cases, in bytes.", 1024),
    SuiteOption("noop-interval", "set_noop_interval of the NOOP cases, in seconds.", 1.0),
    SuiteOption("window-ms", "How long a paused producer is watched for messages it must not send.", 500),
)


@contextlib.asynccontextmanager
async def open_producer_target(
    target: Target, options: Mapping[str, Any]
) -> AsyncIterator[ProducerUnderTest]:
    host, port = parse_address(target.address or "")
    vbucket = options.get("vbucket")
    if vbucket is not None and (not str(vbucket).isdigit() or int(vbucket) >= VBUCKETS):
        raise SuiteUnavailable(f"--vbucket {vbucket}: a vbucket is 0 to {VBUCKETS - 1}")
    ctx = ProducerUnderTest(
        host,
        port,
        None if vbucket is None else int(vbucket),
        int(options.get("buffer_size") or 1024),
        float(options.get("noop_interval") or 1.0),
        int(options.get("window_ms") or 500) / 1000,
        options.get("user"),
        options.get("password") or "",
        options.get("bucket"),
    )
    await reachable(host, port)
    try:
        yield ctx
    finally:
        ctx.abort_all()
