"""``conformance daemon HOST:PORT``: play record processors against a daemon under test.

The daemon takes processors over TCP, one connection a shard (as erlmld's bridge
connects, or ``kinesis mock-daemon --listen``). Each case carries its shard's
lease to the end, since the MLD stops every shard when one processor breaks the
protocol, and judges every daemon line with the ``Conversation`` core.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.conformance.runner import (
    Case,
    CaseFailed,
    CaseSkipped,
    Result,
    Target,
    Trace,
)
from wallaroo_proto.conformance.target import parse_address

from ..codec import (
    Checkpoint,
    Fatal,
    Initialize,
    LineSplitter,
    Message,
    ProcessRecords,
    Record,
    Status,
    encode_kclpy,
)
from ..core import DAEMON, PROCESSOR, Conversation, Kind, seq_key


@dataclass
class DaemonUnderTest:
    """A daemon listening for processors, one connection per shard (as erlmld's bridge connects)."""

    host: str
    port: int
    shards: list = field(default_factory=list)

    async def shard(self, trace: Trace) -> ShardPeer:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        peer = ShardPeer(reader, writer, trace)
        self.shards.append(peer)
        trace(f"connected to {self.host}:{self.port}")
        return peer

    def close_all(self) -> None:
        shards, self.shards = self.shards, []
        for peer in shards:
            peer.writer.transport.abort()

    async def after_case(self, case: Case, result: Result) -> Result:
        self.close_all()
        return result


class ShardPeer:
    """One shard's conversation from the processor's end; the daemon's lines judged by the core."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trace: Trace) -> None:
        self.reader, self.writer, self.trace = reader, writer, trace
        self.conv = Conversation(None)
        self.lines = LineSplitter()
        self._pending: deque = deque()
        self.records: list[Record] = []
        self.requests: list[str] = []

    async def _next(self) -> Message:
        """The daemon's next message (request or checkpoint reply); a broken rule fails the case."""
        while True:
            while not self._pending:
                data = await self.reader.read(64 * 1024)
                if not data:
                    raise CaseFailed(
                        f"the daemon closed the connection; expecting {self.conv.expects().text}",
                        self.trace.tail(),
                    )
                self._pending.extend(self.lines.feed(data))
            try:
                verdict = self.conv.feed(DAEMON, self._pending.popleft())
            except Fatal as err:
                raise CaseFailed(f"a line the processor cannot read: {err}", self.trace.tail()) from None
            if verdict.kind is Kind.VIOLATION:
                self.trace(f"<- {verdict.describe()}")
                raise CaseFailed(verdict.reason or verdict.describe(), self.trace.tail())
            if verdict.kind is Kind.ACCEPTED and verdict.message is not None:
                msg = verdict.message
                if type(msg) is ProcessRecords:
                    self.records.extend(msg.records)
                    self.trace(f"<- processRecords ({len(msg.records)} records)")
                elif type(msg) is not Checkpoint:
                    self.trace(f"<- {msg.action}")
                    self.requests.append(msg.action)
                return msg

    def send(self, msg: Message) -> None:
        self.conv.feed(PROCESSOR, msg)
        self.writer.write(encode_kclpy(msg))

    async def request(self) -> Message:
        msg = await self._next()
        if type(msg) is Checkpoint:
            raise CaseFailed("a checkpoint reply nobody asked for", self.trace.tail())
        return msg

    async def checkpoint(self, sequence_number: str | None, sub: int | None = None) -> Checkpoint:
        self.trace(f"-> checkpoint {sequence_number or '(no sequence number)'}")
        self.send(Checkpoint(sequence_number, sub))
        reply = await self._next()
        if type(reply) is not Checkpoint:
            raise CaseFailed(f"{reply.action} instead of the checkpoint reply", self.trace.tail())
        self.trace(f"<- checkpoint reply: {reply.error or 'done'}")
        return reply

    async def answer(self, msg: Message) -> None:
        if msg.action == "shardEnded" or (
            msg.action == "shutdown" and getattr(msg, "reason", "") == "TERMINATE"
        ):
            reply = await self.checkpoint(None)
            if reply.error:
                raise CaseFailed(f"the end-of-shard checkpoint got {reply.error}", self.trace.tail())
        self.send(Status(msg.action))

    async def finish(self, first: Message | None = None) -> str:
        """Answer every request to the end of the lease: how it ended."""
        msg = first if first is not None else await self.request()
        while True:
            await self.answer(msg)
            if self.conv.done:
                return msg.action
            msg = await self.request()

    async def until_records(self) -> ProcessRecords:
        """Answer requests until a processRecords with records comes (skip if the lease ends first)."""
        while True:
            msg = await self.request()
            if type(msg) is ProcessRecords and msg.records:
                return msg
            if msg.action in ("leaseLost", "shardEnded", "shutdown", "shutdownRequested"):
                await self.finish(msg)
                raise CaseSkipped("the daemon sent this shard no records")
            await self.answer(msg)


async def initialize_first(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    first = await peer.request()
    if type(first) is not Initialize:
        raise CaseFailed(f"the first request is {first.action}", trace.tail())
    ended = await peer.finish(first)
    return f"initialize of {first.shard_id} at {first.sequence_number}; the lease ended with {ended}"


async def records_ordered(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    ended = await peer.finish()
    keys = [seq_key(r.sequence_number, r.sub_sequence_number) for r in peer.records]
    if any(b <= a for a, b in zip(keys, keys[1:], strict=False)):
        raise CaseFailed("sequence numbers do not grow within the shard", trace.tail())
    return f"{len(keys)} records in growing sequence order; the lease ended with {ended}"


async def checkpoint_in_initialize(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    first = await peer.request()
    reply = await peer.checkpoint(None)
    if reply.error != "InvalidStateException":
        raise CaseFailed(f"a checkpoint during initialize got {reply.error or 'success'}", trace.tail())
    await peer.finish(first)
    return "InvalidStateException for a checkpoint during initialize"


async def checkpoint_last_record(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    batch = await peer.until_records()
    last = batch.records[-1]
    reply = await peer.checkpoint(last.sequence_number, last.sub_sequence_number)
    if reply.error:
        raise CaseFailed(f"a checkpoint at the last record delivered got {reply.error}", trace.tail())
    await peer.finish(batch)
    return f"checkpoint at {last.sequence_number} succeeded"


async def checkpoint_beyond(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    batch = await peer.until_records()
    beyond = str(int(batch.records[-1].sequence_number) + 1)
    reply = await peer.checkpoint(beyond)
    if reply.error != "IllegalArgumentException":
        raise CaseFailed(
            f"a checkpoint beyond the largest record got {reply.error or 'success'}", trace.tail()
        )
    await peer.finish(batch)
    return "IllegalArgumentException for a checkpoint beyond the largest record delivered"


async def checkpoint_backwards(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    batch = await peer.until_records()
    if len(batch.records) < 2:
        await peer.finish(batch)
        raise CaseSkipped("the first batch has one record: nothing below it to go back to")
    first, last = batch.records[0], batch.records[-1]
    if (await peer.checkpoint(last.sequence_number)).error:
        raise CaseFailed("a checkpoint at the last record delivered failed", trace.tail())
    reply = await peer.checkpoint(first.sequence_number)
    if reply.error != "IllegalArgumentException":
        raise CaseFailed(f"a checkpoint below the last one got {reply.error or 'success'}", trace.tail())
    await peer.finish(batch)
    return "IllegalArgumentException for a checkpoint below the lease's checkpoint"


def _cases() -> tuple[Case, ...]:
    mld = "MultiLangDaemon protocol"
    kcl = "KCL checkpointer"
    return (
        Case(
            "initialize.first",
            f"{mld}: initialize",
            "each shard opens with initialize and its lease ends with a final request",
            initialize_first,
        ),
        Case(
            "records.ordered",
            f"{mld}: processRecords",
            "sequence numbers grow within a shard",
            records_ordered,
        ),
        Case(
            "checkpoint.in-initialize",
            kcl,
            "a checkpoint during initialize gets InvalidStateException",
            checkpoint_in_initialize,
        ),
        Case(
            "checkpoint.last-record",
            kcl,
            "a checkpoint at the last record delivered succeeds",
            checkpoint_last_record,
        ),
        Case(
            "checkpoint.beyond",
            kcl,
            "a checkpoint beyond the largest record delivered gets IllegalArgumentException",
            checkpoint_beyond,
        ),
        Case(
            "checkpoint.backwards",
            kcl,
            "a checkpoint below the lease's checkpoint gets IllegalArgumentException",
            checkpoint_backwards,
        ),
    )


@contextlib.asynccontextmanager
async def open_daemon(target: Target, options: Mapping[str, Any]) -> AsyncIterator[DaemonUnderTest]:
    host, port = parse_address(target.address or "")
    ctx = DaemonUnderTest(host, port)
    try:
        yield ctx
    finally:
        ctx.close_all()


CASES = _cases()
